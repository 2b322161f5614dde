import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

/**
 * The relay's connection handlers (`Handlers` in src/job/relay.py): a new connection's setup runs in
 * an idle thread when there is one (no thread started per connection), in a new one when every thread
 * is busy (a blocked setup delays no other connection), and idle threads end. Run in the real python3
 * against the module itself.
 */

const RELAY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../src/job/relay.py');

/** Runs SCRIPT in python3 with the relay module's path as its argument; its stdout. */
function againstRelay(script: string): Promise<string> {
  return new Promise<string>((resolve, reject) =>
    execFile('/usr/bin/python3', ['-c', script, RELAY], { timeout: 60_000 }, (err, out, errText) =>
      err ? reject(new Error(`${err.message}\n${errText}`)) : resolve(out),
    ),
  );
}

const SCRIPT = `
import importlib.util, json, sys, threading, time
spec = importlib.util.spec_from_file_location("relay", sys.argv[1])
relay = importlib.util.module_from_spec(spec)
spec.loader.exec_module(relay)
relay.HANDLER_IDLE_SECONDS = 0.5
seen = []
def job(n, gate=None, done=None):
    seen.append((n, threading.get_ident()))
    if gate is not None:
        gate.wait(10)
    if done is not None:
        done.set()
relay.handle = job
handlers = relay.Handlers()
out = {}

# 100 connections one after another: one thread does them all.
for n in range(100):
    done = threading.Event()
    handlers.submit((n, None, done))
    if not done.wait(10):
        sys.exit("job %d never ran" % n)
    time.sleep(0.001)
out["threads_for_sequential"] = len({ident for _, ident in seen})

# A setup that blocks: the next connection is still handled, by another thread.
gate = threading.Event()
blocked_done = threading.Event()
handlers.submit(("blocked", gate, blocked_done))
other = threading.Event()
handlers.submit(("other", None, other))
out["other_ran_while_blocked"] = other.wait(5) and not blocked_done.is_set()
gate.set()
out["blocked_finished"] = blocked_done.wait(5)

# Idle threads end.
time.sleep(1.5)
out["relay_threads_left"] = sum(1 for t in threading.enumerate() if t.name == "relay-conn")
print(json.dumps(out))
`;

describe('relay connection handlers', () => {
  it('reuse an idle thread, start another when all are busy, and end when idle', async () => {
    const stdout = await againstRelay(SCRIPT);
    expect(JSON.parse(stdout), stdout).toEqual({
      threads_for_sequential: 1,
      other_ran_while_blocked: true,
      blocked_finished: true,
      relay_threads_left: 0,
    });
  }, 60_000);
});

const FLOOD = `
import importlib.util, io, json, sys, threading, time
spec = importlib.util.spec_from_file_location("relay", sys.argv[1])
relay = importlib.util.module_from_spec(spec)
spec.loader.exec_module(relay)
out = {}

# 200 connections whose checks all block: at most MAX_HANDLERS threads, the rest wait; past the queue, refused.
gate = threading.Event()
ran = []
def job(n):
    ran.append(n)
    gate.wait(10)
relay.handle = job
handlers = relay.Handlers(max_threads=8, max_waiting=100)
accepted = sum(1 for n in range(8) if handlers.submit((n,)))
deadline = time.time() + 10
while len(ran) < 8 and time.time() < deadline:
    time.sleep(0.01)
accepted += sum(1 for n in range(8, 200) if handlers.submit((n,)))
time.sleep(0.2)
out["threads_while_blocked"] = sum(1 for t in threading.enumerate() if t.name == "relay-conn")
out["accepted"] = accepted
gate.set()
deadline = time.time() + 10
while len(ran) < accepted and time.time() < deadline:
    time.sleep(0.01)
out["ran"] = len(ran)

# 695 refusals in a burst: 20 lines, then one line counting the rest once the window has passed.
lines = []
relay.log = lambda message: lines.append(message)
refusals = relay.RefusalLog(window=0.5)
for n in range(695):
    refusals.refused("peer %d: uid 1001 is not the job's uid 1000" % n)
time.sleep(0.6)
refusals.refused("late peer")
out["lines"] = len(lines)
out["summary"] = [l for l in lines if "more connections refused" in l]
print(json.dumps(out))
`;

describe('relay under a flood of connections (issue 25, item 7)', () => {
  it('caps its handler threads and queue, and logs refusals by the window, not one line each', async () => {
    const stdout = await againstRelay(FLOOD);
    expect(JSON.parse(stdout), stdout).toEqual({
      threads_while_blocked: 8,
      // 8 taken by a thread, 100 waiting; the other 92 refused at once.
      accepted: 108,
      ran: 108,
      // 20 refusals, the count of the other 675, and the late one.
      lines: 22,
      summary: ['675 more connections refused in the last 0.5 s (not logged one by one)'],
    });
  }, 60_000);
});

const ORDER = `
import importlib.util, json, os, socket, sys
spec = importlib.util.spec_from_file_location("relay", sys.argv[1])
relay = importlib.util.module_from_spec(spec)
spec.loader.exec_module(relay)
events = []
relay.log = lambda message: events.append("log")
real_close = relay._close
def close(sock):
    events.append("close")
    real_close(sock)
relay._close = close
out = {}
me = os.getuid()
for case, owner in (("foreign uid", (me + 1, 0)), ("owner unknown", None), ("socket missing", (me, 0))):
    del events[:]
    relay.peer_owner = lambda local, peer, found=owner: found
    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(listener.getsockname())
    client, _ = listener.accept()
    relay.handle(client, "127.0.0.1:%d" % listener.getsockname()[1], "/nonexistent/backhaul.sock", me)
    peer.close()
    listener.close()
    out[case] = events[:]
print(json.dumps(out))
`;

describe('relay refusals', () => {
  it('are logged before the connection is closed, so whoever sees it end can already read why', async () => {
    const stdout = await againstRelay(ORDER);
    expect(JSON.parse(stdout), stdout).toEqual({
      'foreign uid': ['log', 'close'],
      'owner unknown': ['log', 'close'],
      // The unix side's close comes first (the client is not told anything by it), then the client's.
      'socket missing': ['log', 'close', 'close'],
    });
  }, 60_000);
});

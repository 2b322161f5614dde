import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

/**
 * The relay's connection handlers (`Handlers` in src/render/relay.py): a new connection's setup runs in
 * an idle thread when there is one (no thread started per connection), in a new one when every thread
 * is busy (a blocked setup delays no other connection), and idle threads end. Run in the real python3
 * against the module itself.
 */

const RELAY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../src/render/relay.py');

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
    const stdout = await new Promise<string>((resolve, reject) =>
      execFile('/usr/bin/python3', ['-c', SCRIPT, RELAY], { timeout: 60_000 }, (err, out, errText) =>
        err ? reject(new Error(`${err.message}\n${errText}`)) : resolve(out),
      ),
    );
    expect(JSON.parse(stdout), stdout).toEqual({
      threads_for_sequential: 1,
      other_ran_while_blocked: true,
      blocked_finished: true,
      relay_threads_left: 0,
    });
  }, 60_000);
});

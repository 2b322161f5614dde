#!/usr/bin/env python3
"""What admitting only the job's processes costs per new connection (relay --job-only, JobScope).

A stand-in job: this process is the job's shell; 8 child processes each hold 64 open files. Measured in
one run, side by side: the uid lookup every connection pays (sock_diag by 4-tuple), and the job lookup
(/proc/<pid>/fd of the job's processes) when one process connects per request (the common case: a
client without a pool) and when all 8 connect in turn (the worst order for its most-recent-first scan).

Usage: python3 bench/relay_job_scope.py src/job/relay.py [--count 200]
"""
import argparse, importlib.util, json, os, socket, subprocess, sys, time


def load(path):
    spec = importlib.util.spec_from_file_location("relay", path)
    relay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(relay)
    return relay


def pct(times, q):
    times = sorted(times)
    return round(times[min(len(times) - 1, int(len(times) * q))], 3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("relay")
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    relay = load(args.relay)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    port = listener.getsockname()[1]
    hold = "fs = [open('/dev/null') for _ in range(60)]\n"
    idle = [subprocess.Popen([sys.executable, "-c", hold + "import time\ntime.sleep(120)"]) for _ in range(7)]
    client = subprocess.Popen(
        [sys.executable, "-c", hold + "import socket, sys\nfor _ in range(%d):\n"
         "    s = socket.create_connection(('127.0.0.1', %d)); sys.stdin.readline(); s.close()\n" % (args.count, port)],
        stdin=subprocess.PIPE)
    scope = relay.JobScope(os.getpid(), "", os.getuid())
    uid_ms, job_ms = [], []
    try:
        for _ in range(args.count):
            accepted, _ = listener.accept()
            t = time.perf_counter()
            uid, inode = relay.peer_owner(accepted.getsockname(), accepted.getpeername())
            uid_ms.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            member, who = scope.owner(inode)
            job_ms.append((time.perf_counter() - t) * 1000)
            assert member and uid == os.getuid(), who
            accepted.close()
            client.stdin.write(b"\n")
            client.stdin.flush()
        # All 8 processes connected at once, looked up in turn.
        holders = [subprocess.Popen(
            [sys.executable, "-c", hold + "import socket, time\ns = socket.create_connection(('127.0.0.1', %d))\n"
             "print('c', flush=True)\ntime.sleep(60)" % port], stdout=subprocess.PIPE) for _ in range(8)]
        conns = []
        for h in holders:
            h.stdout.readline()
            conns.append(listener.accept()[0])
        turn_ms = []
        for _ in range(max(1, args.count // 8)):
            for c in conns:
                _, inode = relay.peer_owner(c.getsockname(), c.getpeername())
                t = time.perf_counter()
                member, who = scope.owner(inode)
                turn_ms.append((time.perf_counter() - t) * 1000)
                assert member, who
        for h in holders:
            h.kill()
    finally:
        for p in idle + [client]:
            p.kill()
    print(json.dumps({
        "processes_on_node": len([p for p in os.listdir("/proc") if p.isdigit()]),
        "uid_lookup_ms": {"p50": pct(uid_ms, 0.5), "p90": pct(uid_ms, 0.9)},
        "job_lookup_one_client_ms": {"p50": pct(job_ms, 0.5), "p90": pct(job_ms, 0.9), "max": pct(job_ms, 1)},
        "job_lookup_eight_in_turn_ms": {"p50": pct(turn_ms, 0.5), "p90": pct(turn_ms, 0.9), "max": pct(turn_ms, 1)},
    }))


if __name__ == "__main__":
    main()

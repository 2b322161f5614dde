#!/usr/bin/env python3
"""What the relay adds to one request/response, alone (no SSH): 64-byte ping-pongs through
`relay.py serve` to a unix socket echo, against the same echo dialled directly. Python 3 standard
library only; run as any user (the relay serves its own user).

  relay_rtt.py RELAY_PY [--count N] [--rounds R] [--clients C]

Prints one JSON line: p50 and p99 in microseconds for the direct unix socket and through the relay,
and the relay's added p50, per round (rounds alternate, so drifting load hits both alike).
With --clients C (C > 1), C connections each keep one 64-byte request in flight, driven by one
event loop in a process of their own, against an echo server in another: requests/s direct and
through the relay, and the relay's CPU (its relaying process, from /proc) per request: what its
per-message cost is under concurrency, where a round trip's wake-ups overlap.
"""

import argparse
import json
import selectors
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

PORT = 17000
SIZE = 64


def echo_server(path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(16)

    def serve(conn):
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                conn.sendall(data)

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server


def echo_loop(path):
    """An echo server on one event loop (for --clients: threads would share the client's GIL)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(256)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ, None)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                conn, _ = server.accept()
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, conn)
                continue
            conn = key.data
            try:
                data = conn.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            if not data:
                sel.unregister(conn)
                conn.close()
                continue
            conn.setblocking(True)
            conn.sendall(data)
            conn.setblocking(False)


def fork_echo(path):
    pid = os.fork()
    if pid == 0:
        try:
            echo_loop(path)
        finally:
            os._exit(0)
    deadline = time.time() + 5
    while not os.path.exists(path):
        if time.time() > deadline:
            raise RuntimeError("echo server did not start")
        time.sleep(0.01)
    return pid


def concurrent(connect, clients, requests):
    """requests 64-byte round trips over `clients` connections, one in flight on each: requests/s."""
    socks = [connect() for _ in range(clients)]
    sel = selectors.DefaultSelector()
    payload = b"x" * SIZE
    left = {}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        left[s] = SIZE
    sent = 0
    done = 0
    start = time.perf_counter()
    for s in socks:
        s.send(payload)
        sent += 1
    while done < requests:
        for key, _ in sel.select():
            s = key.fileobj
            data = s.recv(SIZE)
            if not data:
                raise RuntimeError("connection closed")
            left[s] -= len(data)
            if left[s] == 0:
                done += 1
                left[s] = SIZE
                if sent < requests:
                    s.send(payload)
                    sent += 1
    elapsed = time.perf_counter() - start
    for s in socks:
        s.close()
    return requests / elapsed


def cpu_times(pid):
    """(user, system) CPU seconds of a process, its reaped children included."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[13])) / tick, (int(fields[12]) + int(fields[14])) / tick


def start_socat(sock_path):
    """socat as a compiled relay to compare with (no owner check; a process per connection, each a
    select/read/write loop in C): (process, port)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proc = subprocess.Popen(
        ["socat", "TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork,nodelay,backlog=256" % port,
         "UNIX-CONNECT:%s" % sock_path],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 5
    while True:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return proc, port
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("socat did not listen on %d" % port)
            time.sleep(0.02)


def measured(pids, run):
    """(result of run(), user CPU s, system CPU s) of the processes pids (reaped children included)."""
    before = [cpu_times(p) for p in pids]
    result = run()
    time.sleep(0.3)  # socat's children exit when their client closes; their CPU counts once reaped
    after = [cpu_times(p) for p in pids]
    return (result, sum(a[0] - b[0] for a, b in zip(after, before)),
            sum(a[1] - b[1] for a, b in zip(after, before)))


def relay_pids(work):
    """The holder and the relaying process (written just after `ready`)."""
    path = os.path.join(work, "relay.pids")
    deadline = time.time() + 5
    while True:
        try:
            with open(path) as f:
                pids = [int(p) for p in f.read().split()]
            if len(pids) >= 2:
                return pids
        except FileNotFoundError:
            pass
        if time.time() > deadline:
            raise RuntimeError("the relay wrote no %s" % path)
        time.sleep(0.01)


def ping_pong(sock, count):
    payload = b"x" * SIZE
    times = []
    for i in range(count + 200):
        start = time.perf_counter()
        sock.sendall(payload)
        got = 0
        while got < SIZE:
            chunk = sock.recv(SIZE - got)
            if not chunk:
                raise RuntimeError("connection closed")
            got += len(chunk)
        if i >= 200:
            times.append((time.perf_counter() - start) * 1e6)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.99)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("relay")
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--socat", action="store_true",
                        help="with --clients: also through socat, a compiled relay, in each round")
    args = parser.parse_args()
    if args.socat and args.clients < 2:
        parser.error("--socat needs --clients C with C > 1")

    work = tempfile.mkdtemp(prefix="bh-relay-rtt-")
    os.chmod(work, 0o700)
    sock_path = os.path.join(work, "%d.sock" % PORT)
    echo_pid = None
    if args.clients > 1:
        echo_pid = fork_echo(sock_path)
        server = None
    else:
        server = echo_server(sock_path)
    # As the prelude and the fleet start it: the boot binds and says ready, then execs the relay it
    # finds in the socket dir (delivered there before it starts, here).
    shutil.copyfile(args.relay, os.path.join(work, "relay.py"))
    boot = os.path.join(os.path.dirname(os.path.abspath(args.relay)), "relay-boot.py")
    relay = subprocess.Popen(
        [sys.executable, boot, "serve", "--foreground", "--uid=" + str(uuid.uuid4()), "--socket-dir=" + work,
         "--forward=%d" % PORT],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = relay.stdout.readline().strip()
        running = relay.stdout.readline().strip()
        if not line.startswith("ready ") or not running.startswith("isolation "):
            raise RuntimeError("relay did not start: %r %r %s" % (line, running, relay.stderr.read()))
        address = line.split()[1]
        rounds = []
        if args.clients > 1:
            pids = relay_pids(work)
            socat, socat_port = start_socat(sock_path) if args.socat else (None, 0)
            try:
                for _ in range(args.rounds):
                    direct = concurrent(lambda: _unix(sock_path), args.clients, args.count)
                    through, user, system = measured(
                        pids, lambda: concurrent(lambda: _tcp(address), args.clients, args.count))
                    row = {"direct_rps": round(direct), "relay_rps": round(through),
                           "relay_share": round(through / direct, 3),
                           "relay_cpu_us_per_request": round((user + system) * 1e6 / args.count, 1),
                           "relay_user_us_per_request": round(user * 1e6 / args.count, 1)}
                    if socat is not None:
                        via, user, system = measured(
                            [socat.pid],
                            lambda: concurrent(lambda: _tcp("127.0.0.1", socat_port), args.clients, args.count))
                        row.update({"socat_rps": round(via), "socat_share": round(via / direct, 3),
                                    "socat_cpu_us_per_request": round((user + system) * 1e6 / args.count, 1),
                                    "socat_user_us_per_request": round(user * 1e6 / args.count, 1)})
                    rounds.append(row)
            finally:
                if socat is not None:
                    socat.terminate()
                    socat.wait(5)
            summary = {"clients": args.clients, "count": args.count, "rounds": rounds}
            for key in ("relay_cpu_us_per_request", "relay_user_us_per_request",
                        "socat_cpu_us_per_request", "socat_user_us_per_request"):
                if key in rounds[0]:
                    summary[key + "_median"] = sorted(r[key] for r in rounds)[len(rounds) // 2]
            print(json.dumps(summary))
            return
        for _ in range(args.rounds):
            direct = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            direct.connect(sock_path)
            d50, d99 = ping_pong(direct, args.count)
            direct.close()
            through = socket.create_connection((address, PORT))
            through.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            r50, r99 = ping_pong(through, args.count)
            through.close()
            rounds.append({"direct_p50_us": round(d50, 1), "direct_p99_us": round(d99, 1),
                           "relay_p50_us": round(r50, 1), "relay_p99_us": round(r99, 1),
                           "added_p50_us": round(r50 - d50, 1)})
        added = sorted(r["added_p50_us"] for r in rounds)[len(rounds) // 2]
        print(json.dumps({"count": args.count, "rounds": rounds, "added_p50_us_median": added}))
    finally:
        relay.terminate()
        relay.wait(5)
        if server is not None:
            server.close()
        if echo_pid is not None:
            os.kill(echo_pid, 15)
            os.waitpid(echo_pid, 0)
        shutil.rmtree(work, ignore_errors=True)


def _unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def _tcp(address, port=PORT):
    s = socket.create_connection((address, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


if __name__ == "__main__":
    main()

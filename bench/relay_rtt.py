#!/usr/bin/env python3
"""What the relay adds to one request/response, alone (no SSH): 64-byte ping-pongs through
`relay.py serve` to a unix socket echo, against the same echo dialled directly. Python 3 standard
library only; run as any user (the relay serves its own user).

  relay_rtt.py RELAY_PY [--count N] [--rounds R]

Prints one JSON line: p50 and p99 in microseconds for the direct unix socket and through the relay,
and the relay's added p50, per round (rounds alternate, so drifting load hits both alike).
"""

import argparse
import json
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
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="bh-relay-rtt-")
    os.chmod(work, 0o700)
    sock_path = os.path.join(work, "%d.sock" % PORT)
    server = echo_server(sock_path)
    relay = subprocess.Popen(
        [sys.executable, args.relay, "serve", "--uid", str(uuid.uuid4()), "--socket-dir", work,
         "--forward", str(PORT)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = relay.stdout.readline().strip()
        if not line.startswith("ready "):
            raise RuntimeError("relay did not start: %r %s" % (line, relay.stderr.read()))
        address = line.split()[1]
        rounds = []
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
        server.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

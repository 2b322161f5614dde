#!/usr/bin/env python3
"""Echo server and request/response client for bench/latency.ts (Python 3 standard library only).

Both run as their own processes, so the benchmark's event loop never sits on the path it times.
Every result is one JSON line on stdout.

  echo --port P [--host H]
      TCP echo server on H:P (127.0.0.1 unless told; 0: any free port; prints {"listening": port}). One selector
      loop, non-blocking sockets, TCP_NODELAY: it answers each read with the same bytes at once.
  client (--unix PATH | --tcp HOST:PORT) --size N --conns C (--count K | --seconds S) [--warmup W]
      C connections (TCP_NODELAY, as database and cache clients set it). Each sends N bytes, waits
      for all N to come back, and sends again: one request in flight per connection. With --count
      every connection makes K round trips; with --seconds the run lasts S seconds. W round trips
      per connection are made first and not counted. Prints {"rtts", "seconds", "rps", "p50_us",
      "p90_us", "p99_us", "mean_us", "max_us"}; every answer is checked byte for byte.
  client ... --connect --count K [--warmup W]
      K times, one after another: open a new connection, send N bytes, wait for them to come back,
      close. A sample is the whole of it (connect to answer): what a client that connects per request
      feels (psql from a script, HTTP without keep-alive, a CLI call).
"""

import argparse
import errno
import json
import os
import selectors
import socket
import sys
import time


def emit(line):
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- echo server

def serve_echo(port, host="127.0.0.1"):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(512)
    listener.setblocking(False)
    emit({"listening": listener.getsockname()[1]})
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    pending = {}  # socket -> bytes not yet written back
    while True:
        for key, events in selector.select():
            sock = key.fileobj
            if sock is listener:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                pending[conn] = b""
                selector.register(conn, selectors.EVENT_READ, None)
                continue
            try:
                if events & selectors.EVENT_READ:
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionResetError("eof")
                    pending[sock] += data
                if pending[sock]:
                    sent = sock.send(pending[sock])
                    pending[sock] = pending[sock][sent:]
                wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if pending[sock] else 0)
                selector.modify(sock, wanted, None)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                selector.unregister(sock)
                pending.pop(sock, None)
                sock.close()


# --------------------------------------------------------------------------- client

def connect(args):
    if args.unix:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(args.unix)
    else:
        host, _, port = args.tcp.rpartition(":")
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def percentile(sorted_values, fraction):
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, int(round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def round_trip(sock, payload, view):
    """Sends payload and reads as many bytes back into view (a buffer of its size)."""
    sock.sendall(payload)
    got = 0
    size = len(payload)
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            raise SystemExit("the tunnel closed the connection")
        got += n


def timed(payload, count, exchange):
    """count exchanges, one after another, each timed; exchange(view) fills view with the answer."""
    buf = bytearray(len(payload))
    view = memoryview(buf)
    samples = []
    clock = time.perf_counter_ns
    for _ in range(count):
        started = clock()
        exchange(view)
        samples.append(clock() - started)
        if buf != payload:
            raise SystemExit("an answer differed from the request")
    return samples


def sequential(sock, payload, count):
    """One connection, one request at a time: the purest round-trip figure."""
    return timed(payload, count, lambda view: round_trip(sock, payload, view))


class Conn:
    __slots__ = ("sock", "payload", "got", "buf", "started", "left")

    def __init__(self, sock, payload, left):
        self.sock = sock
        self.payload = payload
        self.buf = bytearray()
        self.got = 0
        self.started = 0
        self.left = left


def concurrent(socks, payload, count, seconds):
    """C connections in one selector loop, each with one request in flight."""
    selector = selectors.DefaultSelector()
    clock = time.perf_counter_ns
    samples = []
    conns = []
    for sock in socks:
        sock.setblocking(False)
        conn = Conn(sock, payload, count if count else -1)
        conns.append(conn)
        selector.register(sock, selectors.EVENT_READ, conn)
    deadline = clock() + int(seconds * 1e9) if seconds else None

    def send(conn):
        conn.buf = bytearray()
        conn.started = clock()
        sent = conn.sock.send(conn.payload)
        if sent < len(conn.payload):  # never with small payloads; stay correct anyway
            conn.sock.setblocking(True)
            conn.sock.sendall(conn.payload[sent:])
            conn.sock.setblocking(False)

    active = len(conns)
    for conn in conns:
        send(conn)
    size = len(payload)
    while active:
        for key, _ in selector.select(1.0):
            conn = key.data
            try:
                data = conn.sock.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                raise SystemExit("the tunnel closed a connection")
            conn.buf += data
            if len(conn.buf) < size:
                continue
            if conn.buf != conn.payload:
                raise SystemExit("an answer differed from the request")
            samples.append(clock() - conn.started)
            if conn.left > 0:
                conn.left -= 1
            finished = conn.left == 0 or (deadline is not None and clock() >= deadline)
            if finished:
                selector.unregister(conn.sock)
                active -= 1
            else:
                send(conn)
    return samples


def connect_each(args, payload, count):
    """A new connection per request: connect, one round trip, close."""

    def exchange(view):
        sock = connect(args)
        try:
            round_trip(sock, payload, view)
        finally:
            sock.close()

    return timed(payload, count, exchange)


def run_client(args):
    payload = os.urandom(args.size)
    if args.connect:
        if args.warmup:
            connect_each(args, payload, args.warmup)
        started = time.perf_counter_ns()
        samples = connect_each(args, payload, args.count)
        report(samples, (time.perf_counter_ns() - started) / 1e9)
        return
    socks = [connect(args) for _ in range(args.conns)]
    try:
        if args.warmup:
            for sock in socks:
                sequential(sock, payload, args.warmup)
        started = time.perf_counter_ns()
        if args.conns == 1 and args.count:
            samples = sequential(socks[0], payload, args.count)
        else:
            samples = concurrent(socks, payload, args.count, args.seconds)
        elapsed = (time.perf_counter_ns() - started) / 1e9
    finally:
        for sock in socks:
            try:
                sock.close()
            except OSError:
                pass
    report(samples, elapsed)


def report(samples, elapsed):
    ordered = sorted(samples)
    emit(
        {
            "rtts": len(samples),
            "seconds": elapsed,
            "rps": len(samples) / elapsed if elapsed > 0 else 0.0,
            "p50_us": percentile(ordered, 0.50) / 1e3,
            "p90_us": percentile(ordered, 0.90) / 1e3,
            "p99_us": percentile(ordered, 0.99) / 1e3,
            "mean_us": (sum(ordered) / len(ordered) / 1e3) if ordered else 0.0,
            "max_us": (ordered[-1] / 1e3) if ordered else 0.0,
        }
    )


def main(argv=None):
    parser = argparse.ArgumentParser(prog="latency_peer.py")
    sub = parser.add_subparsers(dest="command", required=True)
    echo = sub.add_parser("echo")
    echo.add_argument("--port", type=int, default=0)
    echo.add_argument("--host", default="127.0.0.1")
    client = sub.add_parser("client")
    where = client.add_mutually_exclusive_group(required=True)
    where.add_argument("--unix")
    where.add_argument("--tcp")
    client.add_argument("--size", type=int, default=64)
    client.add_argument("--conns", type=int, default=1)
    client.add_argument("--count", type=int, default=0)
    client.add_argument("--seconds", type=float, default=0.0)
    client.add_argument("--warmup", type=int, default=0)
    client.add_argument("--connect", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "echo":
        serve_echo(args.port, args.host)
        return 0
    if not args.count and not args.seconds:
        parser.error("client: give --count or --seconds")
    if args.connect and not args.count:
        parser.error("client: --connect takes --count")
    run_client(args)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            sys.exit("the tunnel closed the connection")
        raise

#!/usr/bin/env python3
"""Data source and sink for bench/tunnel.ts (Python 3 standard library only).

Run as separate processes so that the benchmark's own event loop never moves the bytes it times.
Every payload is a 1 MiB block file repeated and cut at the byte count; the sink hashes uploads
with sha256 so a figure is only reported for correct bytes.

Commands (every result is one JSON line on stdout):

  sink --port P --block FILE [--host H]
      TCP sink on H:P (127.0.0.1 unless told; 0: any free port; prints {"listening": port}). Per connection it
      reads a header line "up ID N" or "down ID N":
        up:   reads until EOF, hashes, then answers one line {"id", "bytes", "sha256"} and closes.
        down: writes N bytes of the block stream, then closes.
  client (--unix PATH | --tcp HOST:PORT) --mode up|down --bytes N --block FILE --id ID
      The job-side workload. Times from just before connect to the sink's answer (up) or to EOF
      (down) with CLOCK_MONOTONIC; prints {"id", "mode", "bytes", "seconds", "sha256"?}.
  srun-raw --how cat|out|in --bytes N --block FILE -- SRUN ARGV...
      Times N bytes through an srun step. The step runs this file again (`echo-step`,
      `emit-step`, `absorb-step`) and signals readiness first, so the step launch is not timed.
        cat: stdin -> step (cat-like echo) -> stdout, sha256 of what comes back;
        out: step writes N bytes to stdout (srun's step->client direction only);
        in:  N bytes written to srun's stdin, the step counts them (client->step only).
"""

import argparse
import hashlib
import json
import resource
import os
import socket
import subprocess
import sys
import threading
import time

CHUNK = 1 << 20


def now():
    return time.monotonic_ns() / 1e9


def load_block(path):
    with open(path, "rb") as handle:
        block = handle.read()
    if not block:
        raise SystemExit("empty block file")
    return memoryview(block)


def block_stream(block, total):
    """Yields memoryviews that together are `total` bytes of the repeated block."""
    left = total
    size = len(block)
    while left > 0:
        n = min(size, left)
        yield block[:n]
        left -= n


def cpu_seconds(who=resource.RUSAGE_SELF):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def emit(line):
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- sink

def read_header(conn):
    data = b""
    while b"\n" not in data:
        more = conn.recv(256)
        if not more:
            raise ValueError("no header")
        data += more
        if len(data) > 256:
            raise ValueError("header too long")
    line, _, rest = data.partition(b"\n")
    mode, ident, count = line.decode("ascii").split()
    return mode, ident, int(count), rest


def serve_one(conn, block):
    try:
        mode, ident, count, rest = read_header(conn)
        if mode == "up":
            digest = hashlib.sha256()
            total = len(rest)
            digest.update(rest)
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            while True:
                n = conn.recv_into(buf)
                if not n:
                    break
                digest.update(view[:n])
                total += n
            answer = {"id": ident, "bytes": total, "sha256": digest.hexdigest()}
            conn.sendall((json.dumps(answer) + "\n").encode("ascii"))
        elif mode == "down":
            for piece in block_stream(block, count):
                conn.sendall(piece)
        else:
            raise ValueError("bad mode %r" % mode)
    except Exception as exc:  # one bad connection never stops the sink
        sys.stderr.write("tunnel-peer sink: %s\n" % exc)
        sys.stderr.flush()
    finally:
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()


def sink(args):
    block = load_block(args.block)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((args.host, args.port))
    server.listen(64)
    emit({"listening": server.getsockname()[1]})
    while True:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve_one, args=(conn, block), daemon=True).start()


# --------------------------------------------------------------------------- client

def client(args):
    block = load_block(args.block)
    if args.unix:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        where = args.unix
    else:
        host, _, port = args.tcp.rpartition(":")
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        where = (host, int(port))
    started = now()
    conn.connect(where)
    conn.sendall(("%s %s %d\n" % (args.mode, args.id, args.bytes)).encode("ascii"))
    result = {"id": args.id, "mode": args.mode}
    if args.mode == "up":
        for piece in block_stream(block, args.bytes):
            conn.sendall(piece)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while True:
            more = conn.recv(4096)
            if not more:
                break
            answer += more
        ended = now()
        if not answer.strip():
            raise SystemExit("the sink did not answer (connection closed early?)")
        got = json.loads(answer.decode("ascii"))
        result.update(bytes=got["bytes"], sha256=got["sha256"])
    else:
        buf = bytearray(CHUNK)
        total = 0
        while True:
            n = conn.recv_into(buf)
            if not n:
                break
            total += n
        ended = now()
        result.update(bytes=total)
    conn.close()
    result["seconds"] = ended - started
    result["cpu"] = cpu_seconds()
    emit(result)


# --------------------------------------------------------------------------- srun

def read_exact(stream, n):
    data = b""
    while len(data) < n:
        more = stream.read(n - len(data))
        if not more:
            raise SystemExit("srun step ended early (got %d of %d bytes)" % (len(data), n))
        data += more
    return data


def srun_raw(args):
    block = load_block(args.block)
    me = os.path.abspath(__file__)
    step = {"cat": "echo-step", "out": "emit-step", "in": "absorb-step"}[args.how]
    argv = list(args.srun) + [sys.executable, me, step, "--bytes", str(args.bytes), "--block", args.block]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    result = {"how": args.how, "bytes": args.bytes}
    try:
        if read_exact(proc.stdout, 2) != b"R\n":
            raise SystemExit("srun step did not report ready")
        if args.how == "cat":
            got = {}

            def reader():
                digest = hashlib.sha256()
                total = 0
                buf = bytearray(CHUNK)
                view = memoryview(buf)
                while total < args.bytes:
                    n = proc.stdout.readinto(buf)
                    if not n:
                        break
                    digest.update(view[:n])
                    total += n
                got.update(bytes=total, sha256=digest.hexdigest(), ended=now())

            thread = threading.Thread(target=reader)
            started = now()
            thread.start()
            for piece in block_stream(block, args.bytes):
                write_all(proc.stdin, piece)
            proc.stdin.close()
            thread.join()
            result.update(bytes=got["bytes"], sha256=got["sha256"], seconds=got["ended"] - started)
        elif args.how == "out":
            started = now()
            proc.stdin.write(b"g")
            proc.stdin.flush()
            buf = bytearray(CHUNK)
            total = 0
            while total < args.bytes:
                n = proc.stdout.readinto(buf)
                if not n:
                    break
                total += n
            result.update(bytes=total, seconds=now() - started)
            proc.stdin.close()
        else:
            started = now()
            for piece in block_stream(block, args.bytes):
                write_all(proc.stdin, piece)
            if read_exact(proc.stdout, 2) != b"D\n":
                raise SystemExit("srun step did not report done")
            result.update(seconds=now() - started)
            proc.stdin.close()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    # this process and the srun client it waited for
    result["cpu"] = cpu_seconds() + cpu_seconds(resource.RUSAGE_CHILDREN)
    emit(result)


def write_all(stream, data):
    """FileIO.write may write less than asked (a signal, a non-blocking peer): loop until done."""
    view = memoryview(data)
    while view:
        n = stream.write(view)
        if n is None:
            raise SystemExit("non-blocking stream")
        view = view[n:]


def _stdio():
    return os.fdopen(0, "rb", buffering=0), os.fdopen(1, "wb", buffering=0)


def echo_step(args):
    stdin, stdout = _stdio()
    stdout.write(b"R\n")
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        n = stdin.readinto(buf)
        if not n:
            break
        write_all(stdout, view[:n])


def emit_step(args):
    stdin, stdout = _stdio()
    block = load_block(args.block)
    stdout.write(b"R\n")
    if stdin.read(1) != b"g":
        return
    for piece in block_stream(block, args.bytes):
        write_all(stdout, piece)


def absorb_step(args):
    stdin, stdout = _stdio()
    stdout.write(b"R\n")
    buf = bytearray(CHUNK)
    total = 0
    while total < args.bytes:
        n = stdin.readinto(buf)
        if not n:
            break
        total += n
    stdout.write(b"D\n" if total == args.bytes else b"E\n")


def main():
    parser = argparse.ArgumentParser(prog="tunnel_peer.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sink")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--block", required=True)
    p = sub.add_parser("client")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--unix")
    where.add_argument("--tcp")
    p.add_argument("--mode", choices=("up", "down"), required=True)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--block", required=True)
    p.add_argument("--id", required=True)
    p = sub.add_parser("srun-raw")
    p.add_argument("--how", choices=("cat", "out", "in"), required=True)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--block", required=True)
    p.add_argument("srun", nargs=argparse.REMAINDER)
    for name in ("echo-step", "emit-step", "absorb-step"):
        p = sub.add_parser(name)
        p.add_argument("--bytes", type=int, required=True)
        p.add_argument("--block", required=True)
    args = parser.parse_args()
    if getattr(args, "srun", None) and args.srun[0] == "--":
        args.srun = args.srun[1:]
    handlers = {
        "sink": sink,
        "client": client,
        "srun-raw": srun_raw,
        "echo-step": echo_step,
        "emit-step": emit_step,
        "absorb-step": absorb_step,
    }
    handlers[args.command](args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The relay's owner lookup with many sockets in the kernel's tables (bench/relay-owner.ts and
test/integration/relay-owner.test.ts). Python 3 standard library only.

  relay_owner_peer.py RELAY_PY --sockets N --lookups K [--proc-lookups P] [--orphans M]

Opens N/2 loopback TCP connections (N socket entries), then looks up the owner of K of them as the
relay does for each client: sock_diag (the exact 4-tuple) and /proc/net/tcp (the scan). With
--orphans, M more connections whose client side was closed (FIN_WAIT, inode 0: no process holds it)
are looked up too: they must not be found. Prints one JSON line: the uid found for each method, how
many lookups agreed with our uid, the orphans found, and the time per lookup (p50, max) in ms.
"""

import argparse
import importlib.util
import json
import os
import resource
import socket
import time

PER_PROCESS = 4000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("relay")
    parser.add_argument("--sockets", type=int, required=True)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--proc-lookups", type=int, default=10, help="the /proc scan is slow: fewer")
    parser.add_argument("--orphans", type=int, default=0)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("relay", args.relay)
    relay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(relay)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.sockets + args.orphans * 2 + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)

    def connect_pairs(count):
        made = []
        for _ in range(count):
            client = socket.create_connection(listener.getsockname())
            accepted, _ = listener.accept()
            made.append((client, accepted))
        return made

    # Descriptors are limited per process: helper processes hold the bulk of the connections (the
    # kernel's tables are the machine's), this one the ones it looks up.
    total = args.sockets // 2
    own = min(total, PER_PROCESS)
    helpers = []
    remaining = total - own
    while remaining > 0:
        count = min(remaining, PER_PROCESS)
        remaining -= count
        ready_r, ready_w = os.pipe()
        hold_r, hold_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.close(hold_w)
            kept = connect_pairs(count)
            os.write(ready_w, b"x")
            os.read(hold_r, 1)  # until the parent is done (or dies)
            del kept
            os._exit(0)
        os.close(ready_w)
        os.close(hold_r)
        os.read(ready_r, 1)
        os.close(ready_r)
        helpers.append((pid, hold_w))
    pairs = connect_pairs(own)

    def timed(method, accepted):
        start = time.perf_counter()
        uid = method(accepted.getsockname(), accepted.getpeername())
        return uid, (time.perf_counter() - start) * 1000

    def diag(local_name, peer_name):
        found = relay._diag_peer_owner(
            relay._ip16(local_name[0]), local_name[1], relay._ip16(peer_name[0]), peer_name[1]
        )
        if found is relay._DIAG_UNAVAILABLE:
            return "unavailable"
        return None if found is None else found[0]

    def proc(local_name, peer_name):
        found = relay.proc_peer_owner(local_name, peer_name)
        return None if found is None else found[0]

    step = max(1, len(pairs) // max(1, args.lookups))
    sample = pairs[::step][: args.lookups]
    result = {"sockets": total * 2, "lookups": len(sample), "uid": os.getuid()}
    for name, method, count in (("diag", diag, len(sample)), ("proc", proc, args.proc_lookups)):
        times = []
        right = 0
        for _, accepted in sample[:count]:
            uid, ms = timed(method, accepted)
            times.append(ms)
            right += uid == os.getuid()
        times.sort()
        result[name] = {"lookups": len(times), "right": right, "p50_ms": times[len(times) // 2], "max_ms": times[-1]}

    orphans = []
    for _ in range(args.orphans):
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        client.close()  # FIN sent; the client's socket lingers in FIN_WAIT with no owner
        orphans.append(accepted)
    time.sleep(0.05)
    result["orphans"] = len(orphans)
    result["orphans_found"] = {
        "diag": sum(1 for a in orphans if diag(a.getsockname(), a.getpeername()) is not None),
        "proc": sum(1 for a in orphans[: args.proc_lookups] if proc(a.getsockname(), a.getpeername()) is not None),
        "relay": sum(1 for a in orphans if relay.peer_uid(a.getsockname(), a.getpeername()) is not None),
    }
    # Every helper holds the earlier helpers' pipes too: close them all before waiting for any.
    for _, hold_w in helpers:
        os.close(hold_w)
    for pid, _ in helpers:
        os.waitpid(pid, 0)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

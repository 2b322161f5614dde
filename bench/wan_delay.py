#!/usr/bin/env python3
"""A WAN between two network namespaces, for bench/wan.ts (Python 3 standard library only).

This kernel has no sch_netem, so the delay is added in user space: one tun device in each namespace
(made beforehand by `ip tuntap add`, addressed point to point), and this process passes every packet
from one to the other after a fixed one-way delay, in order, dropping a given fraction at random.
Run it at a real-time priority (`chrt -f 5`) so the delay is the delay asked for, not the scheduler's.

  wan_delay.py --ns-a NS --tun-a DEV --ns-b NS --tun-b DEV --delay-ms D [--loss P] [--seed S]

Prints {"ready": true} once both devices are open; on SIGTERM or SIGINT prints the counters
({"passed", "dropped", "max_queue"}) and exits. With --parent PID it also exits when that process is
gone (checked every 200 ms): a delayer never outlives the bench that made it.
"""

import argparse
import collections
import ctypes
import errno
import fcntl
import json
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
MAX_PACKET = 65536 + 64
# Packets read from one device per wake-up before the other gets a turn.
BURST = 64

libc = ctypes.CDLL(None, use_errno=True)


def open_tun(netns, device):
    """Opens DEVICE (a persistent tun device in network namespace NETNS) non-blocking."""
    ns_fd = os.open("/run/netns/%s" % netns, os.O_RDONLY)
    try:
        if libc.setns(ns_fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "setns(%s): %s" % (netns, os.strerror(err)))
    finally:
        os.close(ns_fd)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", device.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns-a", required=True)
    parser.add_argument("--tun-a", required=True)
    parser.add_argument("--ns-b", required=True)
    parser.add_argument("--tun-b", required=True)
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay, each direction")
    parser.add_argument("--loss", type=float, default=0.0, help="fraction of packets dropped (0.001: 0.1 %%)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parent", type=int, default=0)
    args = parser.parse_args()
    if not 0 <= args.loss < 1:
        parser.error("--loss: expected a fraction from 0 to below 1, got %s" % args.loss)
    if not 0 <= args.delay_ms <= 10_000:
        parser.error("--delay-ms: expected 0 to 10000, got %s" % args.delay_ms)

    fd_a = open_tun(args.ns_a, args.tun_a)
    fd_b = open_tun(args.ns_b, args.tun_b)
    delay = args.delay_ms / 1000.0
    rng = random.Random(args.seed)
    # Per direction: packets waiting (due time, bytes), and where they go.
    queues = {fd_a: collections.deque(), fd_b: collections.deque()}
    other = {fd_a: fd_b, fd_b: fd_a}
    counters = {"passed": 0, "dropped": 0, "max_queue": 0}
    stop = []

    def on_signal(_signo, _frame):
        stop.append(True)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    poller = select.epoll()
    poller.register(fd_a, select.EPOLLIN)
    poller.register(fd_b, select.EPOLLIN)
    print(json.dumps({"ready": True}), flush=True)
    next_parent_check = time.monotonic()

    while not stop:
        now = time.monotonic()
        # Send whatever is due, oldest first, each direction.
        soonest = None
        for src, queue in queues.items():
            dst = other[src]
            while queue and queue[0][0] <= now:
                _, packet = queue.popleft()
                try:
                    os.write(dst, packet)
                    counters["passed"] += 1
                except OSError as exc:
                    # EAGAIN: the device's queue is full; EIO: its link is not up yet (or any more).
                    if exc.errno not in (errno.EAGAIN, errno.EIO):
                        raise
                    counters["dropped"] += 1
            if queue and (soonest is None or queue[0][0] < soonest):
                soonest = queue[0][0]
        if args.parent and now >= next_parent_check:
            next_parent_check = now + 0.2
            try:
                os.kill(args.parent, 0)
            except ProcessLookupError:
                break
        timeout = 0.2 if soonest is None else max(0.0, soonest - now)
        try:
            events = poller.poll(timeout)
        except InterruptedError:
            continue
        stamp = time.monotonic() + delay
        for fd, _ in events:
            queue = queues[fd]
            for _ in range(BURST):
                try:
                    packet = os.read(fd, MAX_PACKET)
                except BlockingIOError:
                    break
                if args.loss and rng.random() < args.loss:
                    counters["dropped"] += 1
                    continue
                queue.append((stamp, packet))
            if len(queue) > counters["max_queue"]:
                counters["max_queue"] = len(queue)

    print(json.dumps(counters), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

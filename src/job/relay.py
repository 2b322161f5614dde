#!/usr/bin/env python3
# -*- coding: utf-8 -*-
"""backhaul relay: per-pod loopback TCP listeners -> owner-only unix sockets.

Runs inside a Slurm job, as the job's user, on the compute node. The owner of
every TCP connection accepted on the pod's loopback address is asked of the
kernel (sock_diag by exact 4-tuple; /proc/net/tcp{,6} as the fallback): only a
connection made by the job's own user (the uid this process runs as) is passed
on, to the unix socket that the SSH reverse forward ended in
(``<socket dir>/<port>.sock``). Anything else is closed at once.

Python 3.6+ standard library only (compute nodes have python3, not Node.js).
The fleet delivers it over the carrier; the prelude's boot (relay-boot.py) binds
the pod's addresses and execs it on the listeners (ARCHITECTURE.md 3.5).

Command
-------
``relay.py serve --socket-dir DIR --shell PID --listen FD:SOCKETPATH [--listen ...] [--job-only]``
    * Each ``--listen`` is a listening TCP socket the boot bound and passed
      on as descriptor FD; connections on it are relayed to SOCKETPATH.
      PID is the job's shell (the boot's parent).
    * Writes ``isolation relay=<job|user> sockets=<job|user> via=<how>``
      to stdout once ``DIR/relay.pids`` is written (the boot wrote
      ``ready <addresses>`` before it): what
      separates the tunnel; the sockets are ``job`` only on a mount of the
      job's own (Slurm's job_container/tmpfs).
    * The process started (the holder) keeps the listeners and relays in a
      child process, which it starts again if it dies (kill -9, the OOM
      killer), with a logged line, after a backoff of 0.05 s doubling to 5 s;
      the listeners are never closed while the job runs, so no other user can
      bind the address meanwhile. ``DIR/relay.pids`` lists the live processes.
      If the holder dies, the child relays on alone.
    * For each accepted connection, the owner of the peer's socket is looked
      up by its exact 4-tuple through sock_diag (netlink), else in
      /proc/net/tcp{,6} (IPv4-mapped addresses included). Unless its uid equals
      this process's uid, the connection is closed at once and one line is
      logged::

          backhaul-relay: refused <peer> -> <addr>:<port>: uid <n> is not the job's uid <m>
          backhaul-relay: refused <peer> -> <addr>:<port>: owner unknown

      With ``--job-only`` the owner must also be a process of this Slurm job
      (SLURM_JOB_ID): of the job's cgroup where Slurm gives it one, else a
      descendant of the job's shell or of a ``slurmstepd: [<job>.<step>]``
      (its steps); the process holding the peer's socket is found by its
      inode in /proc/<pid>/fd. Another job of the same user is refused::

          backhaul-relay: refused <peer> -> <addr>:<port>: pid <p> (<comm>) is not a process of job <j> (process tree)

      The relay then also makes itself non-dumpable. Refusals are logged 20
      per 10 s, then counted in one line; connections are checked by at
      most 8 threads, with at most 1024 waiting (more are closed at once).
    * An accepted connection is joined to its unix socket, with half-close
      passed through both ways (EOF on one side becomes shutdown(SHUT_WR) on
      the other). If the unix socket cannot be reached the client is closed at
      once and a line is logged. One bad connection never stops the relay.
    * Exits with status 0 (listeners closed) when DIR disappears or is
      replaced (checked every 0.5 s), when the job's shell ends, and on
      SIGTERM, SIGINT or SIGHUP (which the boot blocks across the exec, so
      none is lost while this starts).
    * umask 077; nothing is created on disk but DIR/relay.pids.

Exit status: 0 done, 1 runtime failure (DIR missing, a bad descriptor), 2 bad
arguments. Every diagnostic line on stderr starts with ``backhaul-relay: ``.
"""

import argparse
import collections
import errno
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
import time

PROG = "backhaul-relay"
BUFFER_SIZE = 256 * 1024  # per direction of each connection (as the threaded relay had)
POLL_SECONDS = 0.5
UNIX_CONNECT_TIMEOUT = 10.0
PROC_NET_FILES = ("/proc/net/tcp", "/proc/net/tcp6")
PROC_LOOKUP_ATTEMPTS = 3
TCP_TIME_WAIT = b"06"
TCP_LISTEN = b"0A"
RELAY_PIDS_FILE = "relay.pids"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
RESTART_WINDOW_SECONDS = 60
RESTART_DELAY_MAX_SECONDS = 5.0

_log_lock = threading.Lock()


def log(message):
    line = "%s: %s\n" % (PROG, message)
    with _log_lock:
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except Exception:  # a broken stderr must not break the relay
            pass


class UsageError(Exception):
    """Bad command line; exit status 2."""


class Stop(BaseException):
    """Raised by the signal handler to leave the accept loop."""


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _build_parser():
    parser = _Parser(prog="relay.py", allow_abbrev=False,
                     description="backhaul relay (see the module docstring)")
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", allow_abbrev=False,
                           help="relay the listeners the boot passed on to unix sockets")
    serve.add_argument("--socket-dir", required=True, metavar="DIR")
    serve.add_argument("--shell", required=True, type=int, metavar="PID")
    serve.add_argument("--listen", action="append", default=[], metavar="FD:SOCKETPATH")
    serve.add_argument("--job-only", action="store_true",
                       help="admit only processes of this Slurm job (SLURM_JOB_ID), not every process of the user")
    return parser


def _listeners(specs):
    """[(listening socket, (label, socket path))] from the boot's --listen FD:SOCKETPATH."""
    if not specs:
        raise UsageError("--listen: at least one --listen FD:SOCKETPATH is required")
    data = []
    for spec in specs:
        fd_text, _, path = spec.partition(":")
        if not fd_text.isdigit() or not path:
            raise UsageError("--listen %s: not FD:SOCKETPATH" % spec)
        try:
            sock = socket.socket(fileno=int(fd_text))
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) != 1:
                raise OSError(errno.EINVAL, "not a listening socket")
        except OSError as exc:
            raise UsageError("--listen %s: descriptor %s: %s" % (spec, fd_text, _errtext(exc)))
        sock.setblocking(False)
        data.append((sock, (_fmt(sock.getsockname()), path)))
    return data


# --------------------------------------------------------------------------
# Peer ownership via /proc/net/tcp{,6}
# --------------------------------------------------------------------------

_V4_MAPPED_PREFIX = b"\x00" * 10 + b"\xff\xff"


def _ip16(address):
    """16-byte form of an address string (IPv4 becomes ::ffff:a.b.c.d)."""
    if ":" in address:
        return socket.inet_pton(socket.AF_INET6, address.split("%", 1)[0])
    return _V4_MAPPED_PREFIX + socket.inet_pton(socket.AF_INET, address)


def _proc_hex(ip16, port, v4):
    """The address:port text the kernel prints (%08X per native 32-bit word)."""
    raw = ip16[12:] if v4 else ip16
    words = struct.unpack("=%dI" % (len(raw) // 4), raw)
    return ("".join("%08X" % w for w in words) + ":%04X" % port).encode("ascii")


# sock_diag (linux/inet_diag.h): the kernel looks the peer's socket up by its exact 4-tuple, O(1),
# where /proc/net/tcp is a scan of every socket (54 ms at 18k entries). /proc stays the fallback for
# kernels without it.
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
TCPF_ALL_BUT_TIME_WAIT = 0xFFF & ~(1 << 6)  # every state but TIME_WAIT (owned by nobody)
TCPF_LISTEN = 1 << 10
_DIAG_UNAVAILABLE = "unavailable"
_diag_state = {"works": None}


def _diag_query(family, src_ip16, src_port, dst_ip16, dst_port):
    """(uid, inode) of the TCP socket with this exact 4-tuple; None if there is none;
    _DIAG_UNAVAILABLE if sock_diag cannot be used here."""
    raw_src = src_ip16[12:] if family == socket.AF_INET else src_ip16
    raw_dst = dst_ip16[12:] if family == socket.AF_INET else dst_ip16
    sockid = struct.pack(">HH", src_port, dst_port)
    sockid += raw_src.ljust(16, b"\x00") + raw_dst.ljust(16, b"\x00")
    sockid += struct.pack("=III", 0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE)
    states = TCPF_ALL_BUT_TIME_WAIT & ~TCPF_LISTEN
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, states) + sockid
    header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
    try:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return _DIAG_UNAVAILABLE
    try:
        nl.settimeout(1.0)
        nl.sendto(header + request, (0, 0))
        data = nl.recv(8192)
    except OSError:
        return _DIAG_UNAVAILABLE
    finally:
        nl.close()
    if len(data) < 20:
        return _DIAG_UNAVAILABLE
    length, kind = struct.unpack_from("=IH", data, 0)
    if kind == NLMSG_ERROR:
        code = -struct.unpack_from("=i", data, 16)[0]
        if code == errno.ENOENT:
            return None
        return _DIAG_UNAVAILABLE  # EINVAL, EOPNOTSUPP...: no inet_diag for this family here
    if kind != SOCK_DIAG_BY_FAMILY or len(data) < 16 + 72:
        return _DIAG_UNAVAILABLE
    state = struct.unpack_from("=B", data, 17)[0]
    uid, inode = struct.unpack_from("=II", data, 16 + 64)
    if state == 6:  # TIME_WAIT: no owner
        return None
    return (uid, inode)


def _diag_peer_owner(local16, local_port, peer16, peer_port):
    """(uid, inode) of the peer's socket by sock_diag; None if not found or orphaned;
    _DIAG_UNAVAILABLE to fall back to /proc."""
    families = []
    if local16.startswith(_V4_MAPPED_PREFIX) and peer16.startswith(_V4_MAPPED_PREFIX):
        families.append(socket.AF_INET)
    families.append(socket.AF_INET6)
    unavailable = 0
    for family in families:
        found = _diag_query(family, peer16, peer_port, local16, local_port)
        if found is _DIAG_UNAVAILABLE:
            unavailable += 1
            continue
        if found is None:
            continue
        uid, inode = found
        if inode == 0:
            return None  # orphaned (closed by its process): whoever it was, it is not asking now
        return (uid, inode)
    return _DIAG_UNAVAILABLE if unavailable == len(families) else None


def peer_owner(local_name, peer_name):
    """(uid, inode) of the peer's socket, or None if it cannot be found (sock_diag,
    else /proc/net/tcp{,6}); a socket no process holds (inode 0) is not found."""
    if _diag_state["works"] is not False:
        found = _diag_peer_owner(_ip16(local_name[0]), local_name[1], _ip16(peer_name[0]), peer_name[1])
        if found is not _DIAG_UNAVAILABLE:
            _diag_state["works"] = True
            return found
        if _diag_state["works"] is None:
            _diag_state["works"] = False
            log("sock_diag unavailable: owners are looked up in /proc/net/tcp")
    return proc_peer_owner(local_name, peer_name)


def peer_uid(local_name, peer_name):
    """uid owning the peer's socket, or None (peer_owner without the inode)."""
    found = peer_owner(local_name, peer_name)
    return None if found is None else found[0]


def proc_peer_owner(local_name, peer_name):
    """(uid, inode) of the peer's socket, or None if it cannot be found.

    local_name/peer_name are getsockname()/getpeername() of the accepted
    socket. The peer's own socket has local == peer and remote == local.
    """
    local16 = _ip16(local_name[0])
    peer16 = _ip16(peer_name[0])
    wanted = {}
    if local16.startswith(_V4_MAPPED_PREFIX) and peer16.startswith(_V4_MAPPED_PREFIX):
        wanted[PROC_NET_FILES[0]] = (_proc_hex(peer16, peer_name[1], True),
                                     _proc_hex(local16, local_name[1], True))
    wanted[PROC_NET_FILES[1]] = (_proc_hex(peer16, peer_name[1], False),
                                 _proc_hex(local16, local_name[1], False))
    for attempt in range(PROC_LOOKUP_ATTEMPTS):
        if attempt:
            time.sleep(0.005 * attempt)  # the kernel's listing can skip entries under churn
        for path in PROC_NET_FILES:
            if path not in wanted:
                continue
            want_local, want_remote = wanted[path]
            try:
                with open(path, "rb") as handle:
                    data = handle.read()
            except (IOError, OSError):
                continue
            if want_local not in data.upper():
                continue
            for line in data.split(b"\n")[1:]:
                fields = line.split()
                if len(fields) < 8:
                    continue
                if fields[1].upper() != want_local or fields[2].upper() != want_remote:
                    continue
                if fields[3].upper() in (TCP_TIME_WAIT, TCP_LISTEN):
                    continue  # a time-wait entry has no owner (uid 0)
                if len(fields) < 10 or fields[9] == b"0":
                    continue  # inode 0: no process holds it (orphaned); its uid says nothing
                try:
                    return (int(fields[7]), int(fields[9]))
                except ValueError:
                    continue
    return None


# --------------------------------------------------------------------------
# Job membership: only the job's own processes, not every process of its user
# --------------------------------------------------------------------------

def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def _stat_fields(pid):
    """(command, ppid) of a process from /proc/<pid>/stat, or None."""
    data = _read("/proc/%d/stat" % pid)
    if data is None:
        return None
    close = data.rfind(b")")
    if close < 0:
        return None
    rest = data[close + 2:].split()
    try:
        return data[data.find(b"(") + 1:close].decode("utf-8", "replace"), int(rest[1])
    except (IndexError, ValueError):
        return None


def _job_cgroup_marks(job_id):
    """The lines of /proc/self/cgroup that name this job's cgroup (`/job_<id>/` or at the end),
    empty where Slurm tracks the job by its process tree (proctrack/linuxproc, pgid)."""
    if not job_id:
        return []
    data = _read("/proc/self/cgroup") or b""
    mark = ("/job_%s" % job_id).encode("ascii")
    return [line for line in data.split(b"\n") if (mark + b"/") in line or line.endswith(mark)]


class JobScope(object):
    """Who belongs to the job: the processes of its cgroup where Slurm gives it one (its steps, srun
    --overlap included: Slurm's own rule for what is the job), else the descendants of the job's shell
    and the processes of the job's steps (a root-owned ``slurmstepd: [<job>.<step>]`` ancestor, which
    nobody else can start).

    A connection is admitted when the peer's socket (by inode, from sock_diag) is held by one of
    them: its file descriptors are read from /proc/<pid>/fd, members that owned a connection before
    first. Another job of the same user, or a login shell, is refused even though its uid matches."""

    def __init__(self, job_shell, job_id, my_uid):
        self.job_shell = job_shell
        self.job_id = job_id or ""
        self.my_uid = my_uid
        self.cgroup = bool(_job_cgroup_marks(self.job_id))
        self.kind = "cgroup" if self.cgroup else "process tree"
        self._mark = ("/job_%s" % self.job_id).encode("ascii")
        self._step = ("slurmstepd: [%s." % self.job_id).encode("ascii")
        self._lock = threading.Lock()
        self._members = []  # most recent owner first

    def describe(self):
        return "job %s (%s)" % (self.job_id or "?", self.kind)

    def _own_pids(self):
        pids = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.stat("/proc/" + name).st_uid != self.my_uid:
                    continue
            except OSError:
                continue
            pids.append(int(name))
        return pids

    def _is_member(self, pid, parents):
        if self.cgroup:
            data = _read("/proc/%d/cgroup" % pid) or b""
            return any((self._mark + b"/") in line or line.endswith(self._mark) for line in data.split(b"\n"))
        seen = 0
        while pid > 1 and seen < 64:
            if pid == self.job_shell:
                return True
            parent = parents.get(pid)
            if parent is None:
                # Not one of the user's: a job step's slurmstepd (root) says which job it serves.
                cmdline = _read("/proc/%d/cmdline" % pid) or b""
                return self.job_id != "" and cmdline.startswith(self._step)
            pid = parent
            seen += 1
        return False

    def _refresh(self):
        own = self._own_pids()
        parents = {}
        for pid in own:
            fields = _stat_fields(pid)
            if fields is not None:
                parents[pid] = fields[1]
        members = [pid for pid in own if self._is_member(pid, parents)]
        return members, own

    @staticmethod
    def _holds(pid, target):
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            return False
        for fd in fds:
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == target:
                    return True
            except OSError:
                continue
        return False

    def owner(self, inode):
        """(True, pid) when a process of the job holds the socket; (False, description of the
        process that does, when it can be seen) otherwise."""
        target = "socket:[%d]" % inode
        with self._lock:
            known = list(self._members)
        for pid in known:
            if self._holds(pid, target):
                self._remember(pid)
                return True, pid
        members, own = self._refresh()
        with self._lock:
            self._members = members
        tried = set(known)
        for pid in members:
            if pid not in tried and self._holds(pid, target):
                self._remember(pid)
                return True, pid
        for pid in own:
            if pid not in members and self._holds(pid, target):
                fields = _stat_fields(pid)
                return False, "pid %d (%s)" % (pid, fields[0] if fields else "?")
        return False, "a process this user cannot see into"

    def _remember(self, pid):
        with self._lock:
            if self._members and self._members[0] == pid:
                return
            if pid in self._members:
                self._members.remove(pid)
            self._members.insert(0, pid)


# --------------------------------------------------------------------------
# Relaying
# --------------------------------------------------------------------------

def _fmt(name):
    host, port = name[0], name[1]
    if ":" in host:
        return "[%s]:%d" % (host, port)
    return "%s:%d" % (host, port)


def _close(sock):
    try:
        sock.close()
    except OSError:
        pass


class Flow(object):
    """One direction of a joined pair: bytes read from src and not yet written to dst."""

    __slots__ = ("src", "dst", "name", "buffer", "pending", "eof", "shut")

    def __init__(self, src, dst, name):
        self.src = src
        self.dst = dst
        self.name = name
        # Read into the same buffer each time: src is read only once pending is written out, so
        # nothing is allocated or copied per read, and a partial send keeps a view, not a copy.
        self.buffer = memoryview(bytearray(BUFFER_SIZE))
        self.pending = self.buffer[:0]
        self.eof = False   # src said EOF
        self.shut = False  # and dst was told (shutdown SHUT_WR)


class Link(object):
    """A client joined to its unix socket, both non-blocking, moved by the Pump's loop."""

    def __init__(self, client, upstream, label):
        self.label = label
        self.client = client
        self.upstream = upstream
        self.flows = (Flow(client, upstream, "from client"), Flow(upstream, client, "from unix socket"))
        self.registered = {}  # socket -> events it is registered for
        self.closed = False

    def events_of(self, sock):
        """Read from sock while what it sent before is written; write to it while bytes wait."""
        events = 0
        for flow in self.flows:
            if flow.src is sock and not flow.eof and not flow.pending:
                events |= selectors.EVENT_READ
            if flow.dst is sock and flow.pending:
                events |= selectors.EVENT_WRITE
        return events


class Pump(threading.Thread):
    """Moves the bytes of every connection on one thread with one selector.

    A thread per direction made every request/response pay for a thread
    wake-up and the GIL changing hands, and many connections fought over it;
    here a round trip costs a select, a recv and a send.
    """

    def __init__(self):
        threading.Thread.__init__(self, name="relay-pump")
        self.daemon = True
        self.selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._incoming = []

    def add(self, link):
        with self._lock:
            self._incoming.append(link)
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # a wake-up is already pending

    def run(self):
        while True:
            for key, mask in self.selector.select():
                if key.data is None:
                    self._take_incoming()
                else:
                    self._serve(key.data, key.fileobj, mask)

    def _take_incoming(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        with self._lock:
            links, self._incoming = self._incoming, []
        for link in links:
            link.client.setblocking(False)
            link.upstream.setblocking(False)
            self._update(link)

    def _serve(self, link, sock, mask):
        if mask == selectors.EVENT_READ and self._pass_on(link, sock):
            return
        try:
            for flow in link.flows:
                if flow.dst is sock and mask & selectors.EVENT_WRITE:
                    self._flush(flow)
            for flow in link.flows:
                if flow.src is sock and mask & selectors.EVENT_READ:
                    count = sock.recv_into(flow.buffer)
                    if count:
                        flow.pending = flow.buffer[:count]
                        self._flush(flow)
                    else:
                        flow.eof = True
            for flow in link.flows:
                if flow.eof and not flow.pending and not flow.shut:
                    flow.shut = True
                    try:
                        flow.dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
        except (BlockingIOError, InterruptedError):
            pass
        except Exception as exc:
            self._fail(link, sock, exc)
            return
        if all(flow.shut for flow in link.flows):
            self._close(link)
        else:
            self._update(link)

    def _pass_on(self, link, sock):
        """The common case of a request or a response: what sock sent is read and sent on whole at
        once, and nothing is re-registered: with 32 clients this took the relay's CPU per request
        from 12.5-13.5 to 9.0-9.3 us (npm run bench:relay-conc). False when sock said EOF (the
        general path reads the EOF again and passes it on)."""
        flow = link.flows[0] if link.flows[0].src is sock else link.flows[1]
        if flow.pending or flow.eof:
            return False
        try:
            count = sock.recv_into(flow.buffer)
            if not count:
                return False
            try:
                sent = flow.dst.send(flow.buffer[:count])
            except (BlockingIOError, InterruptedError):
                sent = 0
        except (BlockingIOError, InterruptedError):
            return True
        except Exception as exc:
            self._fail(link, sock, exc)
            return True
        if sent < count:
            flow.pending = flow.buffer[sent:count]
            self._update(link)
        return True

    def _fail(self, link, sock, exc):
        failed = next((f.name for f in link.flows if f.src is sock), "?")
        log("%s: %s: %s" % (link.label, failed, _errtext(exc)))
        self._close(link)

    @staticmethod
    def _flush(flow):
        while flow.pending:
            sent = flow.dst.send(flow.pending)
            flow.pending = flow.pending[sent:]

    def _update(self, link):
        for sock in (link.client, link.upstream):
            wanted = link.events_of(sock)
            had = link.registered.get(sock, 0)
            if wanted == had:
                continue
            if had and wanted:
                self.selector.modify(sock, wanted, link)
            elif wanted:
                self.selector.register(sock, wanted, link)
            else:
                self.selector.unregister(sock)
            link.registered[sock] = wanted

    def _close(self, link):
        if link.closed:
            return
        link.closed = True
        for sock in (link.client, link.upstream):
            if link.registered.get(sock):
                try:
                    self.selector.unregister(sock)
                except (KeyError, ValueError):
                    pass
            _close(sock)


_pump = None
_pump_lock = threading.Lock()


def pump():
    """The process's one Pump, started on first use."""
    global _pump
    with _pump_lock:
        if _pump is None:
            _pump = Pump()
            _pump.start()
        return _pump


REFUSALS_LOGGED = 20


class RefusalLog(object):
    """Refused connections, logged without flooding: the first REFUSALS_LOGGED of each window one line
    each, then one line saying how many more there were (695 refusals in 4 s once wrote 695 lines)."""

    def __init__(self, window=10.0, lines=REFUSALS_LOGGED):
        self._lock = threading.Lock()
        self._window = window
        self._lines = lines
        self._start = 0.0
        self._count = 0
        self._quiet = 0

    def refused(self, text):
        now = time.time()
        summary = None
        with self._lock:
            if now - self._start >= self._window:
                if self._quiet:
                    summary = "%d more connections refused in the last %g s (not logged one by one)" % (
                        self._quiet, self._window)
                self._start, self._count, self._quiet = now, 0, 0
            self._count += 1
            if self._count > self._lines:
                self._quiet += 1
                return
        if summary:
            log(summary)
        log("refused %s" % text)


_refusals = RefusalLog()
_scope = {"job": None}


def _refuse(client, text):
    """Logs the refusal, then closes: whoever sees the connection end can already read why."""
    _refusals.refused(text)
    _close(client)


def handle(client, listen_label, socket_path, my_uid):
    """Checks and connects one client, in a thread of Handlers (the /proc lookup
    and the unix connect may take a while); then hands the pair to the Pump.
    Never raises."""
    peer_label = "?"
    label = "? -> %s" % listen_label
    try:
        peer_name = client.getpeername()
        local_name = client.getsockname()
        peer_label = _fmt(peer_name)
        label = "%s -> %s" % (peer_label, listen_label)
        found = peer_owner(local_name, peer_name)
        if found is None:
            _refuse(client, "%s: owner unknown" % label)
            return
        owner, inode = found
        if owner != my_uid:
            _refuse(client, "%s: uid %d is not the job's uid %d" % (label, owner, my_uid))
            return
        scope = _scope["job"]
        if scope is not None:
            member, who = scope.owner(inode)
            if not member:
                _refuse(client, "%s: %s is not a process of %s" % (label, who, scope.describe()))
                return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.settimeout(UNIX_CONNECT_TIMEOUT)
            upstream.connect(socket_path)
            upstream.settimeout(None)
        except Exception as exc:
            log("%s: cannot connect %s: %s" % (label, socket_path, _errtext(exc)))
            _close(upstream)
            _close(client)
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pump().add(Link(client, upstream, label))
    except Exception as exc:
        log("%s: %s" % (label, _errtext(exc)))
        _close(client)


MAX_HANDLERS = 8
MAX_WAITING = 1024


class Handlers(object):
    """Threads that check and connect new clients (``handle``).

    A connection's setup may block (the /proc fallback, a unix connect to a
    stalled sshd), so none waits for another's: an idle thread takes it, else
    a new one starts, up to MAX_HANDLERS; beyond that it waits in a queue of at
    most MAX_WAITING (a flood of connections, refused or not, costs a bounded
    number of threads; past the queue a connection is closed at once). Starting
    a thread costs about 200 CPU-us, a hand-off to an idle one about 45: a
    client that connects per request pays it every time. A thread idle for
    HANDLER_IDLE_SECONDS ends.
    """

    def __init__(self, max_threads=None, max_waiting=None):
        self._cond = threading.Condition()
        self._jobs = collections.deque()
        self._idle = 0
        self._threads = 0
        self._max_threads = max_threads or MAX_HANDLERS
        self._max_waiting = max_waiting or MAX_WAITING

    @property
    def threads(self):
        return self._threads

    def submit(self, job):
        """False when the queue is full (the caller closes the connection)."""
        with self._cond:
            if len(self._jobs) >= self._max_waiting:
                return False
            self._jobs.append(job)
            if self._idle >= len(self._jobs):
                self._cond.notify()
                return True
            if self._threads >= self._max_threads:
                return True  # a busy thread takes it when it is done
            self._threads += 1
        worker = threading.Thread(target=self._run, name="relay-conn")
        worker.daemon = True
        worker.start()
        return True

    def _run(self):
        try:
            while True:
                with self._cond:
                    if not self._jobs:
                        self._idle += 1
                        notified = self._cond.wait(HANDLER_IDLE_SECONDS)
                        self._idle -= 1
                        if not self._jobs:
                            if notified:
                                continue  # another thread took it first: stay
                            return
                    job = self._jobs.popleft()
                handle(*job)
        finally:
            with self._cond:
                self._threads -= 1


HANDLER_IDLE_SECONDS = 30.0
_handlers = Handlers()


def _errtext(exc):
    if isinstance(exc, OSError) and exc.errno is not None:
        return "%s (%s)" % (os.strerror(exc.errno), errno.errorcode.get(exc.errno, exc.errno))
    if isinstance(exc, socket.timeout):
        return "timed out"
    return str(exc) or exc.__class__.__name__


# --------------------------------------------------------------------------
# serve
# --------------------------------------------------------------------------

def _dir_identity(path):
    """(st_dev, st_ino) of the directory, or None if it is gone."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ELOOP):
            return None
        return "unknown"
    if not stat.S_ISDIR(st.st_mode):
        return None
    return (st.st_dev, st.st_ino)


def _on_signal(signum, frame):
    raise Stop()


def _isolation_line(directory):
    """`isolation relay=<job|user> sockets=<job|user> via=<how>`: what separates this pod's tunnel
    from other jobs of the same user. The relay admits only the job's processes with --job-only; the
    sockets are the job's own only on a mount private to the job (Slurm's job_container/tmpfs, with a
    carrier inside the job), else every process of the user can open them."""
    scope = _scope["job"]
    relay = "job" if scope is not None else "user"
    via = scope.kind.replace(" ", "-") if scope is not None else "uid"
    job_id = scope.job_id if scope is not None else os.environ.get("SLURM_JOB_ID", "")
    sockets = "job" if _on_job_private_mount(directory, job_id) else "user"
    return "isolation relay=%s sockets=%s via=%s" % (relay, sockets, via)


def _on_job_private_mount(directory, job_id):
    """Whether DIRECTORY lies on a mount of this job's own (job_container/tmpfs mounts
    <BasePath>/<job>/.<job> on /tmp in the job's mount namespace)."""
    if not job_id:
        return False
    try:
        path = os.path.realpath(directory)
    except OSError:
        return False
    best, private = -1, False
    for line in (_read("/proc/self/mountinfo") or b"").decode("utf-8", "replace").split("\n"):
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        root, point = fields[3], fields[4]
        if point != "/" and not (path == point or path.startswith(point.rstrip("/") + "/")):
            continue
        if len(point) > best:
            best = len(point)
            private = ("/%s/" % job_id) in (root + "/") or root.endswith("/.%s" % job_id)
    return private


def _set_not_dumpable():
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception as exc:  # noqa: BLE001 - a relay without it still refuses other jobs
        log("cannot make the relay non-dumpable: %s" % exc)


def _write_pids(directory, pids):
    """<dir>/relay.pids: the processes holding the listeners, for the session host's watch (it
    reports a relay that is gone; kill -0 works across processes of one user)."""
    path = os.path.join(directory, RELAY_PIDS_FILE)
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as out:
            out.write(" ".join(str(pid) for pid in pids) + "\n")
        os.rename(tmp, path)
    except OSError as exc:
        log("cannot write %s: %s" % (path, _errtext(exc)))


def serve(args):
    directory = args.socket_dir
    if not directory:
        raise UsageError("--socket-dir: the directory is empty")
    data = _listeners(args.listen)
    os.umask(0o077)
    job_shell = args.shell
    my_uid = os.getuid()
    try:
        for signum in STOP_SIGNALS:
            signal.signal(signum, _on_signal)
        # The boot blocked them across the exec: one that came meanwhile lands here, handled. SIGUSR1
        # woke the boot (a delivery); one sent again to this pid (a second session's) means nothing.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS + (signal.SIGUSR1,))
        if args.job_only:
            _scope["job"] = JobScope(job_shell, os.environ.get("SLURM_JOB_ID", ""), my_uid)
            # Another process of the user may not read this one's memory or descriptors, nor trace it.
            _set_not_dumpable()
        identity = _dir_identity(directory)
        if identity is None or identity == "unknown":
            log("socket dir %s does not exist or cannot be reached" % directory)
            return 1
        return _hold(data, directory, identity, job_shell, my_uid, _isolation_line(directory))
    except Stop:
        return 0
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        for sock, _ in data:
            _close(sock)


def _hold(data, directory, identity, job_shell, my_uid, isolation):
    """The holder: keeps the listeners open for the life of the job and runs the relaying in a child
    process, started again whenever it dies (OOM killer, kill -9). The address and ports are never
    released while the job runs, so no other user can bind them and receive the workload's
    connections; the holder itself stays small and starts no threads, so forking is safe."""
    holder = os.getpid()
    deaths = []
    child = None
    announced = False
    try:
        while True:
            # Blocked across the fork, so that a SIGTERM cannot land between the fork and `child =`
            # (the holder would leave without stopping it) nor in the child before its handlers.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                child = _spawn_server(data, directory, identity, job_shell, holder, my_uid)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            _write_pids(directory, [holder, child])
            if not announced:
                # Said once relay.pids is there: the line tells the fleet the relay is up, and nothing
                # is written into the socket dir after it (a trap's rm -rf racing a late write left
                # the dir behind) unless a relay process dies.
                sys.stdout.write("%s\n" % isolation)
                sys.stdout.flush()
                announced = True
            status = _wait_server(child, directory, identity, job_shell)
            child = None
            if status is None:
                return 0
            now = time.time()
            deaths = [t for t in deaths if now - t < RESTART_WINDOW_SECONDS] + [now]
            delay = min(RESTART_DELAY_MAX_SECONDS, 0.05 * 2 ** (len(deaths) - 1))
            log("the relay process %s %s; starting another on the same listeners in %.2f s "
                "(%d deaths in %d s)" % (status[0], status[1], delay, len(deaths), RESTART_WINDOW_SECONDS))
            time.sleep(delay)
            if _job_gone(directory, identity, job_shell):
                return 0
    finally:
        if child is not None:
            _stop_server(child)


def _spawn_server(data, directory, identity, job_shell, holder, my_uid):
    pid = os.fork()
    if pid != 0:
        return pid
    status = 1
    try:
        for signum in STOP_SIGNALS:
            signal.signal(signum, _on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        status = _relay(data, directory, identity, job_shell, holder, my_uid)
    except Stop:
        status = 0
    except BaseException as exc:  # noqa: B036 - a child must never return into the holder's code
        log("relay process failed: %s" % _errtext(exc))
    finally:
        try:
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(status)


def _describe_status(status):
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "signal %d" % sig
        return "was killed by %s" % name
    return "exited with status %d" % os.WEXITSTATUS(status)


def _wait_server(child, directory, identity, job_shell):
    """None when the relaying ended as it should (job over); (pid, how) when it died."""
    while True:
        try:
            pid, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            return ("%d" % child, "vanished")
        if pid == child:
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                return None
            if _job_gone(directory, identity, job_shell):
                return None
            return ("%d" % child, _describe_status(status))
        if _job_gone(directory, identity, job_shell):
            _stop_server(child)
            return None
        time.sleep(POLL_SECONDS)


def _stop_server(child):
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass
        deadline = time.time() + wait
        while time.time() < deadline:
            try:
                pid, _ = os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == child:
                return
            time.sleep(0.02)


def _dir_gone(directory, identity):
    """The socket dir was removed (the job's trap) or replaced by another."""
    now = _dir_identity(directory)
    return now is None or (now != "unknown" and now != identity)


def _job_gone(directory, identity, job_shell):
    """For the holder, whose parent is the job's shell."""
    return not _alive(job_shell) or _dir_gone(directory, identity)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _relay(data, directory, identity, job_shell, holder, my_uid):
    """The relaying process: accepts on the inherited listeners until the job ends. If the holder
    dies first, it carries on alone (the listeners stay open as long as one of the two lives)."""
    selector = selectors.DefaultSelector()
    for sock, item in data:
        selector.register(sock, selectors.EVENT_READ, item)
    orphaned = False
    while True:
        for key, _ in selector.select(POLL_SECONDS):
            _accept_all(key.fileobj, key.data, my_uid)
        if not orphaned and os.getppid() != holder:
            orphaned = True
            log("the relay's holder process %d ended; relaying on in process %d, which nothing "
                "restarts should it die" % (holder, os.getpid()))
            _write_pids(directory, [os.getpid()])
        if not _alive(job_shell):
            log("parent process %d ended; exiting" % job_shell)
            return 0
        if _dir_gone(directory, identity):
            log("socket dir %s is gone; exiting" % directory)
            return 0


def _accept_all(listener, data, my_uid):
    label, path = data
    for _ in range(64):
        try:
            client, _addr = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log("accept on %s failed: %s" % (label, _errtext(exc)))
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                time.sleep(0.05)  # do not spin while out of descriptors
            return
        try:
            client.setblocking(True)
            if not _handlers.submit((client, label, path, my_uid)):
                _refuse(client, "%s: %d connections are waiting to be checked already" % (label, MAX_WAITING))
        except Exception as exc:
            log("%s: cannot handle a connection: %s" % (label, _errtext(exc)))
            _close(client)


def main(argv=None):
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "serve":
            return serve(args)
        raise UsageError("a command is required: serve")
    except UsageError as exc:
        log("usage: %s" % exc)
        log("run 'relay.py --help' for the commands")
        return 2


if __name__ == "__main__":
    status = main()
    try:
        sys.stdout.flush()
    except Exception:
        pass
    try:
        sys.stderr.flush()
    except Exception:
        pass
    # daemon pump threads may be blocked in recv/send; do not wait for them
    os._exit(status)

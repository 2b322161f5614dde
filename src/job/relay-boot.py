# backhaul relay boot: what every prelude carries (ARCHITECTURE.md 3.4, 3.5). Python >= 3.6, stdlib only.
# prepare --uid=U --socket-root=R [--private] --shell=PID: checks U, makes the socket dir (with --private
#   the root too) the user's own and 0700, removes stale sockets, makes relay.fifo, writes job-shell.pid,
#   hosts, slurm-job (SLURM_JOB_ID) and, from B (the source the prelude's wrapper decompressed), relay-boot.py;
#   prints the dir.
# serve --uid=U --socket-dir=D --forward='[G:]PORT[=SOCKET] ...' [--bind=A]... [--job-only] [--foreground]:
#   binds each address group, prints 'ready <addresses>' (also to descriptor 3, then closed, unless
#   --foreground), then holds the listeners, closing what connects, until the fleet delivers
#   D/relay.py (D/relay.want names the hand-off) and sends SIGUSR1, and execs it on them.
# wait --socket-dir=D --forward=... --limit=S: until every forward's socket is there, at most S s.
# Exit 0 when done (serve: the job ended first), 1 on failure, 2 on bad arguments.
import errno, hashlib, os, random, select, signal, socket, stat, string, sys, time

HANDOFF = "handoff 1"
STOPS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class Fail(Exception):
    pass


class Usage(Fail):
    pass


def log(m):
    sys.stderr.write("backhaul: %s\n" % m)
    sys.stderr.flush()


def own_dir(path, what):
    # Another user may have made it first (a shared root) to receive the forwards: refused.
    try:
        os.mkdir(path, 0o700)
        return False
    except FileExistsError:
        st = os.lstat(path)
        why = stat.S_ISLNK(st.st_mode) and "a symbolic link" or not stat.S_ISDIR(st.st_mode) and "not a " \
            "directory" or st.st_uid != os.getuid() and "another user's, who may intercept the forwards: remove it"
        if why:
            raise Fail("refusing the %s %s: it is %s" % (what, path, why))
        os.chmod(path, 0o700)
        return True
    except OSError as e:
        raise Fail("cannot create the %s %s: %s (Network.SSH.Reverse.SocketRoot)" % (what, path, e.strerror))


def address(uid, g):
    h = 0x811C9DC5  # FNV-1a-32 of the UID, or of UID/G for group G (src/contract/derivations.ts)
    for b in bytearray(uid.encode() + b"/%d" % g * (g > 0)):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return "127.%d.%d.%d" % (1 + (h >> 16 & 255) % 254, h >> 8 & 255, 1 + (h & 255) % 254)


def socket_dir(root, uid):
    return (root.rstrip("/") or "") + "/bh-" + hashlib.sha256(uid.encode()).hexdigest()[:16]


def prepare(o):
    for s in STOPS:  # the shell's trap cleans up once this has printed the dir
        signal.signal(s, signal.SIG_IGN)
    uid, root = o.get("--uid", ""), o["--socket-root"]
    ok = string.ascii_letters + string.digits
    if not uid or uid[0] not in ok or set(uid) - set(ok + "._-"):
        raise Fail("%r is not a pod UID (BACKHAUL_POD_UID, else SLURM_JOB_NAME: letters, digits, '.', '_', "
                   "'-'), so the reverse forwards cannot be set up" % uid)
    d = socket_dir(root, uid)
    if "--private" in o:
        own_dir(root, "socket root")
    reused = own_dir(d, "socket dir")
    print(d, flush=True)
    for name in os.listdir(d) if reused else []:  # left by a run killed before its trap: lead nowhere
        if name.endswith(".sock"):
            os.unlink(d + "/" + name)
    if not os.path.exists(d + "/relay.fifo"):  # the shell reads the ready line from it
        os.mkfifo(d + "/relay.fifo")
    files = {"job-shell.pid": o["--shell"] + "\n", "hosts": open("/etc/hosts").read() if os.path.isfile("/etc/hosts") else "",
             "slurm-job": os.environ.get("SLURM_JOB_ID", "") + "\n"}  # for the site's epilog: backhaul render epilog
    if "B" in globals():  # ps shows the serve step as relay-boot.py, not as this text
        files["relay-boot.py"] = globals()["B"].decode()  # B: set by the wrapper (render/prelude.ts UNPACK)
    for name, text in files.items():
        with open(d + "/" + name, "w") as out:
            out.write(text)


def holder(port):
    # Who listens on 0.0.0.0 or [::] at PORT: then no address of the range can have it.
    for path, width, shown in (("/proc/net/tcp", 8, "0.0.0.0"), ("/proc/net/tcp6", 32, "[::]")):
        for row in [line.split() for line in open(path)][1:] if os.path.exists(path) else []:
            if row[1] == "0" * width + ":%04X" % port and row[3] == "0A":
                uid = int(row[7])
                try:
                    import pwd
                    who = "uid %d (%s)" % (uid, pwd.getpwuid(uid).pw_name)
                except (ImportError, KeyError):
                    who = "uid %d" % uid
                return "%s:%d is held by %s%s" % (shown, port, who, ", a process of another user" * (uid != os.getuid()))


def listen(addr, exact, ports):
    # The derived address held by another process (a squatter, a UID that hashes alike): random ones of
    # the range. The hosts file is written from the ready line, so a squatter gets no connection.
    for _ in range(1 if exact else 33):
        held = []
        try:
            for port in ports:
                held.append(socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET))
                held[-1].setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                held[-1].bind((addr, port))
                held[-1].listen(128)
            return addr, held
        except OSError as e:
            for s in held:
                s.close()
            why = "cannot listen on %s:%d (port %d): %s" % (addr, port, port, e.strerror)
            who = e.errno == errno.EADDRINUSE and holder(port)
            if exact or who or e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                raise Fail(why + (": %s, which takes the port on every address of this node; choose another "
                                  "listen port for this forward" % who if who else ""))
            log(why + "; trying another address")
            r = random.SystemRandom().randint
            addr = "127.%d.%d.%d" % (r(1, 254), r(0, 255), r(1, 254))
    raise Fail(why + "; gave up after 33 addresses")


def forwards(o):
    # [(group, port, socket path)]: the n-th forward on a port has <port>.<n>.sock (withSlots).
    out, seen, d = [], {}, o["--socket-dir"]
    for spec in " ".join(o["--forward"]).split():
        head, eq, path = spec.partition("=")
        g, _, p = head.rpartition(":")
        try:
            g, p = int(g or 0), int(p)
            n = seen[p] = seen.get(p, 0) + 1
            path = os.path.join(d, path or "%d%s.sock" % (p, ".%d" % n * (n > 1)))
            assert 0 < p < 65536 and 0 <= g < 64 and (g, p) not in [f[:2] for f in out] and len(path) < 108
        except (ValueError, AssertionError):
            raise Usage("--forward %s: not [GROUP:]PORT[=SOCKET] (PORT 1-65535 once per GROUP 0-63, the path "
                        "under 108 bytes)" % spec)
        out.append((g, p, path))
    if not out or sorted(set(f[0] for f in out)) != list(range(1 + max(f[0] for f in out))):
        raise Usage("--forward: none, or address groups not numbered 0..n-1")
    return out


def serve(o):
    d, binds, fw, job_only, shell = o["--socket-dir"], o["--bind"], forwards(o), "--job-only" in o, os.getppid()
    groups = 1 + max(f[0] for f in fw)
    if binds and len(binds) != groups:
        raise Usage("--bind: %d given for %d address groups" % (len(binds), groups))
    os.umask(0o077)
    ident, addrs, held = os.stat(d), [], []
    try:
        for g in range(groups):
            a, socks = listen(binds[g] if binds else address(o["--uid"], g), binds, [f[1] for f in fw if f[0] == g])
            addrs.append(a)
            held += zip(socks, [f[2] for f in fw if f[0] == g])
    except Fail as e:
        log(e)
        job = os.environ.get("SLURM_JOB_ID", "")
        if job.isdigit():  # the job's comment (squeue %k) tells the session host, which tells the pod
            import subprocess
            text = "".join(c if " " <= c <= "~" else " " for c in str(e))[:400]
            subprocess.call(["scontrol", "update", "jobid=" + job, "Comment=backhaul: relay could not start: " + text],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        return 1
    ready = ("ready %s\n" % " ".join(addrs)).encode()
    os.write(1, ready)
    if "--foreground" not in o:  # the prelude reads it from the fifo, waiting no longer than this takes
        os.write(3, ready)
        os.close(3)
    if job_only:  # the user's other processes may not take the listeners (ptrace, /proc/<pid>/fd)
        try:
            import ctypes
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
        except Exception as e:
            log("cannot make the relay non-dumpable: %s" % e)
    wake = os.pipe()  # the delivery's SIGUSR1 (to the pid in relay.pids) ends the select: set before that
    os.set_blocking(wake[1], False)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGUSR1, lambda *a: None)
    for name, text in (("relay.pids", str(os.getpid())), ("relay.want", HANDOFF)):
        with open(d + "/" + name + ".tmp", "w") as out:
            out.write(text + "\n")
        os.rename(d + "/" + name + ".tmp", d + "/" + name)
    relay, tried = d + "/relay.py", None
    while os.path.exists("/proc/%d" % shell) and os.path.exists(d) and os.path.samestat(ident, os.stat(d)):
        if os.path.isfile(relay) and tried != os.stat(relay).st_mtime:
            tried = os.stat(relay).st_mtime
            argv = [sys.executable] + ["-I"] * sys.flags.isolated + [relay, "serve", "--socket-dir=" + d,
                                                                     "--shell=%d" % shell] + ["--job-only"] * job_only
            for s, path in held:
                os.set_inheritable(s.fileno(), True)
                argv.append("--listen=%d:%s" % (s.fileno(), path))
            signal.pthread_sigmask(signal.SIG_BLOCK, STOPS | {signal.SIGUSR1})  # until the relay has its handlers
            try:
                os.execv(argv[0], argv)
            except OSError as e:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS | {signal.SIGUSR1})
                log("cannot start the relay %s: %s" % (relay, e))
        # Closing what connects (no relay yet: as if no forward); a look every 5 s should the signal not come.
        for s in select.select([s for s, _ in held] + [wake[0]], [], [], 5)[0]:
            os.read(s, 64) if s == wake[0] else s.accept()[0].close()


def wait(o):
    fw, limit, start = forwards(o), int(o.get("--limit") or 0), time.time()
    ports = [f[1] for f in fw]

    def named(these):  # the port, and the socket where Services share it
        return " ".join("%d%s" % (p, " (%s)" % s[s.rfind("/") + 1:] * (ports.count(p) > 1)) for _, p, s in these)
    log("waiting up to %d s for the forwards of ports %s" % (limit, named(fw)))
    while True:
        missing = [f for f in fw if not (os.path.exists(f[2]) and stat.S_ISSOCK(os.stat(f[2]).st_mode))]
        waited = time.time() - start
        if not missing:
            return log("forwards ready after %d s" % waited)
        if waited >= limit:
            return log("warning: forwards not ready after %d s, missing ports: %s; starting the workload anyway "
                       "(connections to those ports are closed until their forwards are up)%s" % (limit, named(missing),
                       "; the fleet has not reached this job yet" * (not os.path.exists(o["--socket-dir"] + "/relay.py"))))
        time.sleep(0.2)


def main(argv):
    o, commands = {"--bind": [], "--forward": []}, {"prepare": prepare, "serve": serve, "wait": wait}
    try:
        for arg in argv[2:]:
            key, eq, value = arg.partition("=")
            if key[2:] not in "uid socket-root socket-dir shell limit job-only private foreground forward bind".split():
                raise Usage("%s: not an option of relay-boot.py" % key)
            o[key] = o[key] + [value] if key in ("--forward", "--bind") else value
        if argv[1:2] != ["prepare"] and not o.get("--socket-dir") or argv[1:2] == ["prepare"] and "--shell" not in o:
            raise Usage("usage: relay-boot.py prepare|serve|wait --socket-dir=DIR ... (see its head)")
        return commands[argv[1]](o) or 0
    except Fail as e:
        log(e)
        return 2 if isinstance(e, Usage) else 1
    except KeyError as e:
        log("%s is missing or not a command" % e)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

# shellcheck shell=sh
# The pod's prelude (ARCHITECTURE.md, "The prelude"): interLink's Slurm plugin pastes it verbatim into
# the batch script, between the markers render/prelude.ts adds. POSIX sh, so that dash runs it too, and
# safe under `set -e` and `set -u` should the script have them. Variables start with bh_ to stay clear of
# the plugin's own. Filled in by render/job-template.ts: every @VALUE@ arrives single-quoted.

# The socket dir, hosts file and boot copy must be private to the job's user from the start.
bh_umask=$(umask)
umask 077

# Set before anything is made: a TERM that lands while the boot makes the socket dir is handled when it
# returns (the boot ignores it meanwhile and prints the dir first), and without a trap by then the shell
# would die and leave the new dir behind (seen in CI: an empty socket dir of a job cancelled at its
# start). So the cleanup removes only a real directory of this user: a refused one (another user's, a
# symbolic link) is never printed. HUP, INT and TERM become a plain exit so that the EXIT trap runs in
# dash too (dash does not run it when a signal kills the shell); inside the cleanup they are ignored.
bh_dir=
bh_relay_pid=
bh_cleanup() {
  # A second signal (a TERM again from Slurm or from a second scancel) must not cut the cleanup short:
  # ignored here, and so in the rm it starts, it would otherwise leave half the dir behind.
  trap '' HUP INT TERM
  if [ -n "$bh_relay_pid" ]; then
    kill "$bh_relay_pid" 2>/dev/null || :
  fi
  if [ -n "$bh_dir" ] && [ -d "$bh_dir" ] && [ ! -L "$bh_dir" ] && [ -O "$bh_dir" ]; then
    # The relay's relaying process, finding its holder gone (a TERM storm can kill the holder before it
    # stops its child), writes relay.pids once: an rm that raced with that write is run again, with its
    # error in the job's output.
    rm -rf -- "$bh_dir" 2>/dev/null || { sleep 1; rm -rf -- "$bh_dir"; }
  fi
}
trap bh_cleanup EXIT
# Each ignores the three before it exits: a second TERM that came between the exit and the cleanup's own
# `trap ''` would run `exit` again inside the EXIT trap, and dash then leaves at once with the dir in
# place (seen: 6 TERMs 2 ms apart, every file left; Slurm's TERM to the job can come twice).
trap 'trap "" HUP INT TERM; exit 129' HUP
trap 'trap "" HUP INT TERM; exit 130' INT
trap 'trap "" HUP INT TERM; exit 143' TERM

bh_py=@PYTHON@
bh_uid=${BACKHAUL_POD_UID:-${SLURM_JOB_NAME:-}}
# The boot, compressed (zlib, then base85: render/prelude.ts). Single quotes rather than a heredoc inside
# $(...): every shell reads them the same way (old bash versions mis-parse some heredocs in command
# substitutions), and nothing in them expands.
# shellcheck disable=SC2016
bh_boot=@BOOT@

# The boot checks the UID, makes the socket dir (and a per-user root) private or refuses one another
# user made, removes stale sockets, writes the shell's pid (the session host tells a trap still to come
# from one that never ran: remove-dead-job-dir.sh) and the hosts file the fleet adds the names to. It
# says why itself when it refuses; the trap runs `rm -rf` on the dir, so its shape is checked too.
bh_rc=0
# PRIVATE is --private (Network.SSH.Reverse.PrivateSocketRoot) or nothing.
bh_dir=$("$bh_py" -c @UNPACK@ "$bh_boot" prepare --uid="$bh_uid" --socket-root=@SOCKET_ROOT@ --shell=$$ @PRIVATE@) || bh_rc=$?
case $bh_rc:$bh_dir in
  0:/*/bh-*) ;;
  12[67]:*)
    printf 'backhaul: cannot run %s: Python 3 is needed on the compute node (Network.SSH.Reverse.PythonPath)\n' "$bh_py" >&2
    exit 1 ;;
  *)
    printf 'backhaul: the relay boot failed (status %s)\n' "$bh_rc" >&2
    exit 1 ;;
esac

#@if RELAY
# A plain background child (no setsid or nohup): scancel signals the whole job, and the boot, and the
# relay it becomes, also leave when their parent, this script, ends. It binds the pod's addresses (each
# Service's own) and holds them from now on, before the workload starts, closing what connects until the
# fleet has delivered the relay. Its ready line comes through the fifo the boot made: the read returns
# as soon as it is written, or empty when the boot exits without it (its messages say why). It runs
# from the copy in the socket dir, so ps shows a short command line.
bh_fw=@FORWARDS@
"$bh_py" "$bh_dir"/relay-boot.py serve --job-only --uid="$bh_uid" --socket-dir="$bh_dir" --forward="$bh_fw" >"$bh_dir"/relay.ready 3>"$bh_dir"/relay.fifo &
bh_relay_pid=$!
bh_ready=
IFS= read -r bh_ready <"$bh_dir"/relay.fifo || :
case $bh_ready in 'ready 127.'*) ;; *)
  echo 'backhaul: the relay could not start (its messages are above)' >&2
  exit 1 ;;
esac
bh_addrs=${bh_ready#ready }
#@else
bh_addrs=
#@end

BACKHAUL_HOSTS_FILE=$bh_dir/hosts
BACKHAUL_BIND_ADDRESS=${bh_addrs%% *}
BACKHAUL_SOCKET_DIR=$bh_dir
export BACKHAUL_HOSTS_FILE BACKHAUL_BIND_ADDRESS BACKHAUL_SOCKET_DIR

#@if API
# In-cluster clients (client-go, the Python, Java and JavaScript clients) build
# https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; kubernetes.default.svc is a name the hosts
# file maps to the relay and every API server's certificate carries, so the certificate is still
# verified (and the prelude's length does not grow with the cluster's domain).
KUBERNETES_SERVICE_HOST=@API_HOST@
KUBERNETES_SERVICE_PORT=@API_PORT@
KUBERNETES_SERVICE_PORT_HTTPS=@API_PORT@
export KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT KUBERNETES_SERVICE_PORT_HTTPS
#@end

#@if SOCKS
# For the workload: `ALL_PROXY=$BACKHAUL_SOCKS_PROXY curl …`.
BACKHAUL_SOCKS_PROXY=socks5h://$BACKHAUL_BIND_ADDRESS:@SOCKS_PORT@
export BACKHAUL_SOCKS_PROXY
#@end

# Apptainer reads APPTAINER_BIND and ignores SINGULARITY_BIND when both are set, so binds that were only
# in SINGULARITY_BIND are carried into APPTAINER_BIND; SingularityCE reads SINGULARITY_BIND.
bh_bind=$BACKHAUL_HOSTS_FILE:/etc/hosts
APPTAINER_BIND=${APPTAINER_BIND:-${SINGULARITY_BIND:-}}
APPTAINER_BIND=${APPTAINER_BIND:+$APPTAINER_BIND,}$bh_bind
SINGULARITY_BIND=${SINGULARITY_BIND:+$SINGULARITY_BIND,}$bh_bind
export APPTAINER_BIND SINGULARITY_BIND

#@if RELAY
# Up to WaitForForwards for the fleet's forwards; the workload starts either way.
"$bh_py" "$bh_dir"/relay-boot.py wait --socket-dir="$bh_dir" --forward="$bh_fw" --limit=@WAIT_S@ || :
#@end
umask "$bh_umask"
# bh_dir and bh_relay_pid stay: the EXIT trap needs them.
unset bh_umask bh_uid bh_py bh_boot bh_fw bh_rc bh_ready bh_addrs bh_bind

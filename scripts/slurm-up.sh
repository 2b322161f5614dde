#!/usr/bin/env bash
# Brings up a real single-node Slurm on this machine for the loopback test site (ARCHITECTURE.md §6):
# munge, slurmctld and slurmd, with a slurm.conf written here. Idempotent: when everything is
# already up with the same configuration it only checks and exits (about 0.1-0.2 s).
#
# The one compute node is called bhnode1: a name that is NOT this machine's host name and that
# resolves to 127.0.0.1 (a line in /etc/hosts, added only when missing), so that `squeue -o %B`
# prints bhnode1 and a session host reaches the node's sshd as bhnode1:<port>, as it would reach
# a real compute node by its name. slurmd runs here with `-N bhnode1` (NodeHostname is this host).
#
# A second node, bhnode2 (partition `jobtmp`, never the default), runs Slurm's job_container/tmpfs: every
# job there gets a private /tmp (under /var/lib/backhaul-jobtmp, root-only 0700 per job), as sites that
# separate jobs of one user have. Its slurmd is a second slurmd on this host (`-N bhnode2`, port 6828)
# reading $CONF_DIR/bhnode2/slurm.conf: the same file but for its spool, pid and log paths and
# JobContainerType (the controller only logs that the two files differ). PrologFlags=Contain, which
# job_container/tmpfs needs, is set for the whole cluster: every job has an `extern` step, as on most sites.
# Where the cgroup v1 freezer hierarchy is mounted (this VM: v1 + v2 hybrid, no systemd), bhnode2 also
# tracks jobs by cgroup (proctrack/cgroup, cgroup/v1): its jobs' processes sit in
# freezer:/slurm_bhnode2/uid_<u>/job_<id>/step_<s>, the case of the relay's cgroup rule; bhnode1 keeps
# proctrack/linuxproc (the relay's process-tree rule).
#
# Needs root, no systemd (daemons are started directly; pid files in /run).
# Environment: BH_SLURM_NODE (bhnode1), BH_SLURM_PRIVATE_NODE (bhnode2), BH_SLURM_CPUS (64), BH_SLURM_QUIET=1 (print less),
#              BH_SLURM_WAIT (seconds to wait for the node, 60).
set -euo pipefail

NODE=${BH_SLURM_NODE:-bhnode1}
PRIVATE_NODE=${BH_SLURM_PRIVATE_NODE:-bhnode2}
CPUS=${BH_SLURM_CPUS:-64}
WAIT=${BH_SLURM_WAIT:-60}
QUIET=${BH_SLURM_QUIET:-0}
HOST=$(hostname)
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
LOG_DIR=/var/log/slurm
CTLD_LOG=$LOG_DIR/slurmctld.log
SLURMD_LOG=$LOG_DIR/slurmd.log
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
PRIVATE_CONF_DIR=$CONF_DIR/$PRIVATE_NODE
PRIVATE_CONF=$PRIVATE_CONF_DIR/slurm.conf
PRIVATE_SLURMD_PID=/run/slurmd-$PRIVATE_NODE.pid
PRIVATE_SLURMD_LOG=$LOG_DIR/slurmd-$PRIVATE_NODE.log
PRIVATE_SPOOL=/var/spool/slurmd-$PRIVATE_NODE
JOB_TMP_BASE=/var/lib/backhaul-jobtmp
MUNGE_RUN=/run/munge
MUNGE_PID=$MUNGE_RUN/munged.pid
MUNGE_SOCK=$MUNGE_RUN/munge.socket.2
MUNGE_LOG=/var/log/munge/munged.log
LOCK=/run/backhaul-slurm.lock

say() { [ "$QUIET" = 1 ] || echo "slurm-up: $*"; }
die() {
  local log=${2:-}
  echo "slurm-up: ERROR: $1" >&2
  if [ -n "$log" ] && [ -r "$log" ]; then
    echo "---- last lines of $log ----" >&2
    tail -n 25 "$log" >&2 || true
    echo "----" >&2
  fi
  exit 1
}

[ "$(id -u)" = 0 ] || die "must run as root (it starts munged, slurmctld and slurmd)"
for bin in munged munge unmunge slurmctld slurmd sinfo scontrol; do
  command -v "$bin" >/dev/null 2>&1 || die "$bin not found: apt-get install --no-install-recommends munge slurmctld slurmd slurm-client"
done
case $NODE in "$HOST") die "the node name must not be the host name ($HOST)";; esac
case $PRIVATE_NODE in "$HOST"|"$NODE") die "the private node's name must be neither the host name ($HOST) nor $NODE";; esac

# One run at a time (test files and a person at a shell may call this together).
exec 9>"$LOCK"
flock -w 120 9 || die "could not lock $LOCK within 120 s"

# alive PIDFILE COMM: prints the pid when the pid file names a live process called COMM.
# (Shell builtins only: forks are slow here, and this runs on every call.)
alive() {
  local pid='' comm=''
  [ -s "$1" ] || return 1
  read -r pid <"$1" || [ -n "$pid" ] || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  { read -r comm <"/proc/$pid/comm"; } 2>/dev/null || return 1
  [ "$comm" = "$2" ] || return 1
  echo "$pid"
}

# ---------------------------------------------------------------- /etc/hosts: NODE, PRIVATE_NODE -> 127.0.0.1
for name in "$NODE" "$PRIVATE_NODE"; do
  if ! awk -v n="$name" '$1 == "127.0.0.1" { for (i = 2; i <= NF; i++) if ($i == n) found = 1 } END { exit !found }' /etc/hosts; then
    # Append in place (no rename: /etc/hosts may be a bind mount).
    printf '127.0.0.1 %s # backhaul loopback test site\n' "$name" >>/etc/hosts
    say "added '127.0.0.1 $name' to /etc/hosts"
  fi
  resolved=$(getent ahostsv4 "$name" | awk 'NR == 1 { print $1 }')
  [ "$resolved" = 127.0.0.1 ] || die "$name resolves to '${resolved:-nothing}', not 127.0.0.1 (check /etc/hosts and /etc/nsswitch.conf)"
done

# ---------------------------------------------------------------- slurm.conf
mem_total=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1)
mem=$(( ${mem_total:-2000} * 9 / 10 ))
desired=$(cat <<EOF
# Written by backhaul scripts/slurm-up.sh: a single-node Slurm for the loopback test site.
ClusterName=backhaul
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$CTLD_LOG
SlurmdLogFile=$SLURMD_LOG
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Declare more CPUs than the machine has so that 20+ one-CPU test jobs run side by side.
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
PrologFlags=Contain
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$NODE NodeHostname=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$mem State=UNKNOWN
NodeName=$PRIVATE_NODE NodeHostname=$HOST NodeAddr=127.0.0.1 Port=6828 CPUs=$CPUS RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=jobtmp Nodes=$PRIVATE_NODE Default=NO MaxTime=INFINITE State=UP
EOF
)
private_desired=$(printf '%s\n' "$desired" | sed \
  -e "s#^SlurmdSpoolDir=.*#SlurmdSpoolDir=$PRIVATE_SPOOL#" \
  -e "s#^SlurmdPidFile=.*#SlurmdPidFile=$PRIVATE_SLURMD_PID#" \
  -e "s#^SlurmdLogFile=.*#SlurmdLogFile=$PRIVATE_SLURMD_LOG#"
  printf 'JobContainerType=job_container/tmpfs\n')
jc_desired="AutoBasePath=true
BasePath=$JOB_TMP_BASE"
cg_desired=""
if mountpoint -q /sys/fs/cgroup/freezer 2>/dev/null; then
  private_desired=$(printf '%s\n' "$private_desired" | sed -e "s#^ProctrackType=.*#ProctrackType=proctrack/cgroup#")
  cg_desired="CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
CgroupAutomount=no"
fi
conf_changed=0
if [ ! -f "$CONF" ] || [ "$(<"$CONF")" != "$desired" ]; then
  install -d -m 0755 "$CONF_DIR"
  printf '%s\n' "$desired" >"$CONF.new"
  chmod 0644 "$CONF.new"
  mv -f "$CONF.new" "$CONF"
  conf_changed=1
  say "wrote $CONF (node $NODE, host $HOST, CPUs=$CPUS)"
fi
install -d -m 0755 "$PRIVATE_CONF_DIR"
if [ ! -f "$PRIVATE_CONF" ] || [ "$(<"$PRIVATE_CONF")" != "$private_desired" ] \
  || [ "$(cat "$PRIVATE_CONF_DIR/job_container.conf" 2>/dev/null)" != "$jc_desired" ] \
  || [ "$(cat "$PRIVATE_CONF_DIR/cgroup.conf" 2>/dev/null)" != "$cg_desired" ]; then
  printf '%s\n' "$private_desired" >"$PRIVATE_CONF.new"
  printf '%s\n' "$jc_desired" >"$PRIVATE_CONF_DIR/job_container.conf"
  if [ -n "$cg_desired" ]; then
    printf '%s\n' "$cg_desired" >"$PRIVATE_CONF_DIR/cgroup.conf"
    chmod 0644 "$PRIVATE_CONF_DIR/cgroup.conf"
  else
    rm -f "$PRIVATE_CONF_DIR/cgroup.conf"
  fi
  chmod 0644 "$PRIVATE_CONF.new" "$PRIVATE_CONF_DIR/job_container.conf"
  mv -f "$PRIVATE_CONF.new" "$PRIVATE_CONF"
  conf_changed=1
  say "wrote $PRIVATE_CONF (node $PRIVATE_NODE: job_container/tmpfs under $JOB_TMP_BASE${cg_desired:+, proctrack/cgroup})"
fi

install -d -o slurm -g slurm -m 0755 /var/spool/slurmctld "$LOG_DIR"
install -d -o root -g root -m 0755 /var/spool/slurmd "$PRIVATE_SPOOL" "$JOB_TMP_BASE"

# Daemons must keep nothing of their caller: not this script's lock (fd 9), not a caller's lock or a
# test runner's pipes (a caller waiting for EOF on its pipe would wait for as long as the daemon lives).
# They start with only 0-2 open, on /dev/null (they log to their own files).
detached() {
  (
    for fd in /proc/self/fd/*; do
      n=${fd##*/}
      if [ "$n" -gt 2 ] 2>/dev/null; then eval "exec $n>&-"; fi
    done
    exec "$@" </dev/null >/dev/null 2>&1
  )
}

# ---------------------------------------------------------------- munge
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if alive "$MUNGE_PID" munged >/dev/null && munge_ok; then
  :
else
  install -d -o munge -g munge -m 0755 "$MUNGE_RUN"
  install -d -o munge -g munge -m 0700 /var/log/munge
  install -d -o munge -g munge -m 0711 /var/lib/munge
  [ -f /etc/munge/munge.key ] || die "/etc/munge/munge.key is missing (mungekey --create, owned by munge, mode 0400)"
  if pid=$(alive "$MUNGE_PID" munged); then
    kill "$pid" 2>/dev/null || true
    sleep 0.3
  fi
  force=()
  # A munged that died (kill -9, reboot without /run cleanup) leaves its socket and pid file:
  # a new munged refuses to start over them unless told --force.
  if [ -e "$MUNGE_SOCK" ] || [ -e "$MUNGE_PID" ]; then force=(--force); fi
  detached runuser -u munge -- munged "${force[@]}" || die "munged did not start" "$MUNGE_LOG"
  for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
  munge_ok || die "munge -n | unmunge fails after starting munged" "$MUNGE_LOG"
  say "started munged (pid $(cat "$MUNGE_PID" 2>/dev/null || echo ?))${force:+ with --force}"
fi

# ---------------------------------------------------------------- slurmctld / slurmd
stop_daemon() { # PIDFILE COMM
  local pid
  if pid=$(alive "$1" "$2"); then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    if [ -d "/proc/$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
    say "stopped $2 (pid $pid)"
  fi
  rm -f "$1"
}

if [ "$conf_changed" = 1 ]; then
  stop_daemon "$SLURMD_PID" slurmd
  stop_daemon "$PRIVATE_SLURMD_PID" slurmd
  stop_daemon "$CTLD_PID" slurmctld
fi

started_ctld=0
if ! alive "$CTLD_PID" slurmctld >/dev/null; then
  rm -f "$CTLD_PID"
  detached slurmctld || die "slurmctld did not start" "$CTLD_LOG"
  started_ctld=1
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
  scontrol ping 2>/dev/null | grep -q 'is UP' || die "slurmctld does not answer scontrol ping" "$CTLD_LOG"
  say "started slurmctld (pid $(cat "$CTLD_PID" 2>/dev/null || echo ?))"
fi

slurmd_since=0 private_since=0
if ! alive "$SLURMD_PID" slurmd >/dev/null; then
  rm -f "$SLURMD_PID"
  slurmd_since=$(date +%s)
  detached slurmd -N "$NODE" || die "slurmd did not start" "$SLURMD_LOG"
  say "started slurmd -N $NODE (pid $(cat "$SLURMD_PID" 2>/dev/null || echo ?))"
fi
if ! alive "$PRIVATE_SLURMD_PID" slurmd >/dev/null; then
  rm -f "$PRIVATE_SLURMD_PID"
  private_since=$(date +%s)
  detached slurmd -f "$PRIVATE_CONF" -N "$PRIVATE_NODE" || die "slurmd -N $PRIVATE_NODE did not start" "$PRIVATE_SLURMD_LOG"
  say "started slurmd -N $PRIVATE_NODE (pid $(cat "$PRIVATE_SLURMD_PID" 2>/dev/null || echo ?))"
fi

# ---------------------------------------------------------------- wait for the nodes
node_state() { sinfo -h -n "$1" -o %t 2>/dev/null | head -n1; }
slurmd_start_epoch() {
  local t
  t=$(scontrol show node "$1" -o 2>/dev/null | sed -n 's/.*SlurmdStartTime=\([^ ]*\).*/\1/p')
  case $t in ''|None|Unknown) echo 0;; *) date -d "$t" +%s 2>/dev/null || echo 0;; esac
}
last_state=''
ready() { # NODE SINCE
  local state
  state=$(node_state "$1")
  last_state=$state
  # idle, mix or alloc without a suffix (`*` not responding, `~` powered off, `#` powering up, `$` maint).
  case $state in idle|mix|alloc) ;; *) return 1;; esac
  # After a restart, the node must have registered from the new slurmd (not a state saved earlier).
  [ "$2" = 0 ] || [ "$(slurmd_start_epoch "$1")" -ge "$(($2 - 1))" ]
}

wait_node() { # NODE SINCE PIDFILE LOG
  local node=$1 since=$2 pidfile=$3 log=$4 deadline resumed=0 state
  if [ "$started_ctld$since" = 00 ] && ready "$node" "$since"; then
    say "already up: node $node $last_state"
    return
  fi
  deadline=$(( $(date +%s) + WAIT ))
  until ready "$node" "$since"; do
    state=$last_state
    # A node left down or drained by an earlier crash: put it back once its slurmd is up.
    case $state in down*|drain*|drng*|fail*)
      if [ "$resumed" = 0 ] && alive "$pidfile" slurmd >/dev/null; then
        scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
        resumed=1
        say "node $node was '$state': asked scontrol to resume it"
      fi;;
    esac
    if ! alive "$pidfile" slurmd >/dev/null; then die "slurmd -N $node exited while starting" "$log"; fi
    if ! alive "$CTLD_PID" slurmctld >/dev/null; then die "slurmctld exited while starting" "$CTLD_LOG"; fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      scontrol show node "$node" >&2 || true
      die "node $node not ready after ${WAIT}s (sinfo state '${state:-none}')" "$log"
    fi
    sleep 0.1
  done
  say "node $node is $(node_state "$node") (SlurmdStartTime $(scontrol show node "$node" -o | sed -n 's/.*SlurmdStartTime=\([^ ]*\).*/\1/p'))"
}

wait_node "$NODE" "$slurmd_since" "$SLURMD_PID" "$SLURMD_LOG"
wait_node "$PRIVATE_NODE" "$private_since" "$PRIVATE_SLURMD_PID" "$PRIVATE_SLURMD_LOG"

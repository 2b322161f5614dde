#!/usr/bin/env bash
# Stops what scripts/slurm-up.sh started: both slurmds, slurmctld, munged (by their pid files) and
# removes the pid files they leave behind (a stale /run/slurm*.pid breaks `apt-get purge`).
# Leaves slurm.conf, the spool directories and the /etc/hosts line in place.
# BH_SLURM_KEEP_MUNGE=1 keeps munged running.
set -uo pipefail

[ "$(id -u)" = 0 ] || { echo "slurm-down: must run as root" >&2; exit 1; }

exec 9>/run/backhaul-slurm.lock
flock -w 120 9 || { echo "slurm-down: could not lock /run/backhaul-slurm.lock" >&2; exit 1; }

status=0
stop() { # PIDFILE COMM
  local pidfile=$1 comm=$2 pid
  if [ ! -s "$pidfile" ]; then
    echo "slurm-down: $comm: no pid file ($pidfile)"
    rm -f "$pidfile"
    return
  fi
  pid=$(tr -dc 0-9 <"$pidfile")
  if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$comm" ]; then
    echo "slurm-down: $comm: not running (stale pid file removed)"
    rm -f "$pidfile"
    return
  fi
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  if [ -d "/proc/$pid" ]; then
    kill -9 "$pid" 2>/dev/null || true
    sleep 0.2
  fi
  if [ -d "/proc/$pid" ]; then
    echo "slurm-down: $comm (pid $pid) does not stop" >&2
    status=1
  else
    echo "slurm-down: stopped $comm (pid $pid)"
  fi
  rm -f "$pidfile"
}

stop /run/slurmd.pid slurmd
stop "/run/slurmd-${BH_SLURM_PRIVATE_NODE:-bhnode2}.pid" slurmd
stop /run/slurmctld.pid slurmctld
if [ "${BH_SLURM_KEEP_MUNGE:-0}" != 1 ]; then
  stop /run/munge/munged.pid munged
fi
exit "$status"

# shellcheck shell=sh
# What the session host delivers into a job whose prelude carries only the boot (ARCHITECTURE.md, "The
# relay"; render/relay-delivery.ts; after relay-alive.sh): the Services' names on the addresses the boot
# holds (the hosts file), and the relay, which the boot then execs on its listeners. Run over the carrier
# before the forwards are bound, so that no socket appears (and the prelude lets the workload start)
# before the relay runs. The last line printed says how it went.
d=@DIR@
missing=@DIR_MISSING@
groups=@GROUPS@
unsafe=@DIR_UNSAFE@
if [ ! -d "$d" ]; then exit "$missing"; fi
if [ -L "$d" ] || [ ! -O "$d" ]; then echo 'socket dir is not owned by this user' >&2; exit "$unsafe"; fi
n=0
until [ -f "$d"/relay.want ]; do
  if [ ! -d "$d" ]; then exit "$missing"; fi
  # A prelude of before the boot carries its own relay and writes its own hosts file.
  if [ -f "$d"/relay.py ] && [ ! -f "$d"/relay-boot.py ]; then echo @EMBEDDED@; exit 0; fi
  n=$((n + 1)); if [ "$n" -gt 100 ]; then echo @NO_BOOT@; exit 0; fi
  sleep 0.1 2>/dev/null || sleep 1
done
IFS= read -r want <"$d"/relay.want || :
if [ "$want" != @HANDOFF@ ]; then printf '%s %s\n' @UNSUPPORTED@ "$want"; exit 0; fi
ready=
IFS= read -r ready <@READY_FILE@ || :
set -f
# shellcheck disable=SC2086
set -- $ready
set +f
if [ "${1:-}" != ready ] || [ $# -le "$groups" ]; then printf '%s %s\n' @NO_BOOT@ "$ready"; exit 0; fi
shift
addrs=$*
# The K-th of the words after K.
nth() { shift "$1"; printf '%s' "$1"; }
{
  cat /etc/hosts 2>/dev/null || :
  # The leading newline guards against an /etc/hosts whose last line has no newline.
  printf '\n# backhaul: Services forwarded to pod %s\n' @UID@
  # HOSTS is group, names, group, names, ...: each line of names on its group's address.
  set -- @HOSTS@
  while [ $# -ge 2 ]; do
    set -f
    # shellcheck disable=SC2086
    printf '%s %s\n' "$(nth "$1" $addrs)" "$2"
    set +f
    shift 2
  done
} >"$d"/hosts.new
# Written in place: a container the job started already (WaitForForwards ran out) has it bound.
cat "$d"/hosts.new >"$d"/hosts
rm -f "$d"/hosts.new
if ! grep -q '^isolation ' @READY_FILE@; then
  printf '%s' @RELAY@ >"$d"/relay.py.new
  mv -f "$d"/relay.py.new "$d"/relay.py
  # The boot looks every second; the signal wakes it at once. Only a live boot of this dir gets it (a pid
  # reused by another process of the user must not: SIGUSR1 ends most programs).
  p=$(cat "$d"/@PIDS_NAME@ 2>/dev/null) || p=
  case $p in
    '' | *[!0-9]*) ;;
    *) if grep -qaF -- "$d"/relay-boot.py "/proc/$p/cmdline" 2>/dev/null; then kill -USR1 "$p" 2>/dev/null || :; fi ;;
  esac
fi
n=0
until grep -q '^isolation ' @READY_FILE@; do
  if [ ! -d "$d" ]; then exit "$missing"; fi
  # The job's own processes (kill -0 works on the user's): a job being cancelled need not be waited for.
  if ! relay_alive; then echo @GONE@; exit 0; fi
  n=$((n + 1)); if [ "$n" -gt 200 ]; then echo @SILENT@; exit 0; fi
  sleep 0.05 2>/dev/null || sleep 1
done
echo @DELIVERED@

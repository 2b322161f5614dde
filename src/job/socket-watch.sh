# shellcheck shell=sh
# Runs for the life of the forwards (after relay-alive.sh): ends, printing VANISHED, when the socket dir
# or one of the sockets disappears (the job's trap removes the dir when the batch script ends), or
# RELAY_DEAD when none of the relay's processes is alive and the dir is still there a moment later (at
# the job's end the relay stops just before the trap removes the dir). It prints a dot each round so
# that, once the carrier is gone, the next write kills it (SIGPIPE) instead of leaving a loop behind.
# The dir and every socket (a function: its arguments are its own).
all_there() {
  [ -d @DIR@ ] || return 1
  set -- @SOCKETS@
  for s in "$@"; do
    [ -S "$s" ] || return 1
  done
}
while all_there; do
  if ! relay_alive; then
    sleep 2
    if [ -d @DIR@ ] && ! relay_alive; then echo @RELAY_DEAD@; exit 0; fi
  fi
  printf .
  sleep @INTERVAL_S@
done
echo @VANISHED@

# shellcheck shell=sh
# Removes only the sockets a session bound itself: each path whose inode is still the one recorded (sshd
# never unlinks them). A socket bound at the same path by a later session of the pod (after a takeover)
# has another inode and stays: a stale session host that wakes up never removes its successor's sockets.
# OWNED is path, inode, path, inode, ...
set -- @OWNED@
while [ $# -ge 2 ]; do
  i=$(ls -di -- "$1" 2>/dev/null) && [ "${i%% *}" = "$2" ] && rm -f -- "$1"
  shift 2
done

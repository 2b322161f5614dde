# shellcheck shell=sh
# Before forwards on the node's own sshd: the socket dir must be the one the prelude made, and sockets
# left by an earlier attempt must go: sshd never unlinks them, and with the default
# `StreamLocalBindUnlink no` a stale file makes the bind fail.
d=@DIR@
missing=@DIR_MISSING@
unsafe=@DIR_UNSAFE@
if [ ! -d "$d" ]; then exit "$missing"; fi
if [ -L "$d" ] || [ ! -O "$d" ]; then echo 'socket dir is not owned by this user' >&2; exit "$unsafe"; fi
rm -f -- @SOCKETS@

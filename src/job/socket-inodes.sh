# shellcheck shell=sh
# Prints `<inode> <path>` for each socket that exists: what a session bound, so that its teardown can
# later remove exactly those (`ls -di` is POSIX, unlike stat's options).
set -- @SOCKETS@
for s in "$@"; do
  ls -di -- "$s" 2>/dev/null
done

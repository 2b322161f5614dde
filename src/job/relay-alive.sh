# shellcheck shell=sh
# relay_alive: whether a process of the relay's pids file answers `kill -0` (the user's own processes).
# Put in front of the scripts that ask it (render/node-scripts.ts). Without the file it answers by the
# flag: the socket watch takes a prelude too old to write one for alive.
relay_alive() {
#@if ALIVE_WITHOUT_FILE
  [ -f @PIDS@ ] || return 0
#@end
  # The file holds pids, one word each.
  # shellcheck disable=SC2013
  for p in $(cat @PIDS@ 2>/dev/null); do
    case $p in *[!0-9]*) continue ;; esac
    if kill -0 "$p" 2>/dev/null; then return 0; fi
  done
  return 1
}

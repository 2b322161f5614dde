# shellcheck shell=sh
# Removes the socket dir of a job that ended without running its trap (SIGKILL, the OOM killer): the
# hosts file, the relay's copy and files, what sshd bound (render/node-scripts.ts says when; after
# relay-alive.sh). Only a real directory of this user, only once the job's shell is gone and no relay
# process of its pids file is alive, and only with no socket left in it. At most 3.5 s. Prints REMOVED
# when it removed the dir.
own_dir() { [ -d @DIR@ ] && [ ! -L @DIR@ ] && [ -O @DIR@ ]; }
own_dir || exit 0
shell_alive() {
  s=$(cat @SHELL_PID_FILE@ 2>/dev/null) || return 1
  case $s in "" | *[!0-9]*) return 1 ;; esac
  kill -0 "$s" 2>/dev/null
}
tick() {
  sleep 0.1 2>/dev/null || { sleep 1; t=$((t + 9)); }
  t=$((t + 1))
}
# A trap in flight removes the dir within milliseconds of the workload's exit: wait for it while the
# shell lives (or, without its pid, for 2 s), up to 2 s.
t=0
while [ -d @DIR@ ] && [ "$t" -lt 20 ]; do
  if [ -f @SHELL_PID_FILE@ ] && ! shell_alive; then break; fi
  tick
done
own_dir || exit 0
# The shell lives on (a workload that ignores TERM): its trap is still to come.
if shell_alive; then exit 0; fi
# Gone, with its dir left: the trap did not run. Its relay follows it within half a second (it watches
# the shell); up to 1.5 s. Without the shell's pid, a live relay means the job is ending.
if [ -f @SHELL_PID_FILE@ ]; then
  t=0
  while relay_alive && [ "$t" -lt 15 ]; do tick; done
fi
if relay_alive; then exit 0; fi
# A socket left is another session's, of a newer job of the pod (the session's own went first).
for s in @DIR@/*.sock; do
  if [ -S "$s" ]; then exit 0; fi
done
rm -rf -- @DIR@ && echo @REMOVED@

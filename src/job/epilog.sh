#!/bin/sh
# backhaul: removes the socket dir of the job that just ended if its prelude's trap did not run.
# Install as (or call from) slurm.conf Epilog= on the compute nodes.
# Rendered by `backhaul render epilog` (render/epilog.ts says when it acts). It acts only for the site's
# backhaul user, as that user (runuser: root never removes a path the user could have pointed
# elsewhere), only on real directories the user owns whose job file names this job, and it always exits
# 0 (a failing epilog drains the node).
PATH=/usr/sbin:/usr/bin:/sbin:/bin
user=@USER@
root=@SOCKET_ROOT@
[ "${SLURM_JOB_USER:-}" = "$user" ] || exit 0
case ${SLURM_JOB_ID:-} in "" | *[!0-9]*) exit 0 ;; esac
[ -d "$root" ] || exit 0
# shellcheck disable=SC2016
runuser -u "$user" -- /bin/sh -c '
for d in "$1"/bh-*; do
  [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] || continue
  j=$(cat "$d/$3" 2>/dev/null) || continue
  [ "$j" = "$2" ] || continue
  rm -rf -- "$d" && echo "backhaul: removed $d (job $2 ended without its trap)"
done
' sh "$root" "$SLURM_JOB_ID" @JOB_FILE@ || :
exit 0

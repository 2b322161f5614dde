// biome-ignore-all lint/suspicious/noTemplateCurlyInString: these strings are shell code; ${...} is shell parameter expansion.
import { shellQuote } from './shell-quote.js';

/** The file the relay boot writes into each job's socket dir: the job's SLURM_JOB_ID. */
export const SLURM_JOB_FILE = 'slurm-job';

export interface EpilogSettings {
  /** Network.SSH.User: the Unix user the site runs the pods' jobs as. */
  user: string;
  /** Network.SSH.Reverse.SocketRoot, `%u` already replaced. */
  socketRoot: string;
}

/**
 * A Slurm `Epilog=` script (run by slurmd as root on the compute node after every job) that removes the
 * socket dir of the job that just ended when its own EXIT trap did not: a batch shell SIGKILLed at
 * KillWait before its trap ran (seen with 1,010 jobs cancelled at once on a loaded node), or by the OOM
 * killer. The dir is the job's own by the `slurm-job` file the boot wrote (Slurm gives an epilog the job
 * id, not its name). It acts only for the site's backhaul user, as that user (runuser: root never
 * removes a path the user could have pointed elsewhere), only on real directories the user owns, and it
 * always exits 0 (a failing epilog drains the node).
 */
export function renderEpilog(settings: EpilogSettings): string {
  return [
    '#!/bin/sh',
    "# backhaul: removes the socket dir of the job that just ended if its prelude's trap did not run.",
    '# Install as (or call from) slurm.conf Epilog= on the compute nodes.',
    'PATH=/usr/sbin:/usr/bin:/sbin:/bin',
    `user=${shellQuote(settings.user)}`,
    `root=${shellQuote(settings.socketRoot)}`,
    '[ "${SLURM_JOB_USER:-}" = "$user" ] || exit 0',
    'case ${SLURM_JOB_ID:-} in "" | *[!0-9]*) exit 0 ;; esac',
    '[ -d "$root" ] || exit 0',
    'runuser -u "$user" -- /bin/sh -c \'',
    'for d in "$1"/bh-*; do',
    '  [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] || continue',
    `  j=$(cat "$d/${SLURM_JOB_FILE}" 2>/dev/null) || continue`,
    '  [ "$j" = "$2" ] || continue',
    '  rm -rf -- "$d" && echo "backhaul: removed $d (job $2 ended without its trap)"',
    'done',
    '\' sh "$root" "$SLURM_JOB_ID" || :',
    'exit 0',
    '',
  ].join('\n');
}

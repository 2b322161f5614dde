import { renderJobFile } from './job-template.js';

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
  return renderJobFile('epilog.sh', {
    values: { USER: settings.user, SOCKET_ROOT: settings.socketRoot, JOB_FILE: SLURM_JOB_FILE },
    keepComments: true,
  });
}

/**
 * Brings the loopback test site up by hand and keeps it up until Ctrl-C:
 *
 *   sudo npx tsx scripts/loopback-site.ts [--refused] [--no-slurm]
 *
 * Real Slurm (node bhnode1 -> 127.0.0.1), a login sshd and a node sshd on loopback ports, one client
 * key for bhjob, known_hosts, an OpenSSH client config and a site configuration. Prints the commands
 * to try it. Ctrl-C (or SIGTERM) stops both sshds and removes their files; Slurm stays up
 * (scripts/slurm-down.sh stops it).
 */
import { startLoopbackSite } from '../tools/sandbox/loopback-site.js';

const args = new Set(process.argv.slice(2));
for (const a of args) {
  if (!['--refused', '--no-slurm', '-h', '--help'].includes(a)) {
    console.error(`unknown argument ${a}\nusage: npx tsx scripts/loopback-site.ts [--refused] [--no-slurm]`);
    process.exit(2);
  }
}
if (args.has('-h') || args.has('--help')) {
  console.log('usage: npx tsx scripts/loopback-site.ts [--refused] [--no-slurm]');
  process.exit(0);
}

const site = await startLoopbackSite({
  nodeForwarding: args.has('--refused') ? 'refused' : 'allowed',
  slurm: !args.has('--no-slurm'),
});
const cfg = site.sshConfigPath;
const asJob = `setpriv --reuid=${site.user.name} --regid=${site.user.name} --init-groups --`;
console.log(`loopback site up (node forwarding ${site.nodeForwarding})
  login sshd  127.0.0.1:${site.loginPort}  pid ${site.login.pid}  log ${site.login.logPath}
  node sshd   bhnode1:${site.nodePort} (127.0.0.1)  pid ${site.node.pid}  log ${site.node.logPath}
  user        ${site.user.name}
  key         ${site.keyFile}
  known_hosts ${site.knownHostsPath}
  ssh config  ${cfg}
  site config ${site.siteConfigPath}

Try:
  ssh -F ${cfg} bh-login id -un
  ssh -F ${cfg} -J ${site.jumpSpec} -p ${site.nodePort} ${site.user.name}@bhnode1 id -un
  ${asJob} sh -c 'mkdir -p -m 0700 /tmp/bh-try'
  ssh -F ${cfg} -N -o ExitOnForwardFailure=yes -R /tmp/bh-try/x.sock:127.0.0.1:<port> bhnode1
  J=$(cd /tmp && ${asJob} sbatch --parsable --output=/dev/null --wrap 'sleep 600'); squeue -h -j $J -o '%T %B'
  ${asJob} srun --jobid=$J --overlap -u -N1 -n1 -w bhnode1 hostname

--- site.yaml ---
${site.siteConfigYaml}---
Ctrl-C stops the sshds.`);

let stopping = false;
const stop = async (signal: string): Promise<void> => {
  if (stopping) return;
  stopping = true;
  console.log(`\n${signal}: stopping the sshds`);
  await site.stop();
  process.exit(0);
};
process.on('SIGINT', () => void stop('SIGINT'));
process.on('SIGTERM', () => void stop('SIGTERM'));
setInterval(() => {}, 1 << 30);

import type { Command } from 'commander';
import type { PodRef } from '../../contract/pod.js';
import { parseReverseRequest, type ReverseRequest, requestContext } from '../../contract/reverse-request.js';
import type { SiteConfig } from '../../contract/site-config.js';
import { renderEpilog } from '../../render/epilog.js';
import { renderPrelude } from '../../render/prelude.js';
import { bootSource } from '../../render/relay-source.js';
import { renderSessionPlan } from '../../render/session-plan.js';
import { CliError, EXIT } from '../exit-codes.js';
import { type ConfigOption, fromFile, loadPod, loadSiteConfig } from '../inputs.js';

async function loadRequest(
  podFile: string,
  opts: ConfigOption,
): Promise<{ pod: PodRef; site: SiteConfig; request: ReverseRequest }> {
  const site = await loadSiteConfig(opts);
  const pod = await loadPod(podFile);
  const request = fromFile(podFile, () => parseReverseRequest(pod.annotations, requestContext(site, pod.namespace)));
  if (!request) {
    throw new CliError(`${podFile}: the pod has no interlink.eu/reverse-* annotations: nothing to render`, EXIT.usage);
  }
  return { pod, site, request };
}

export function registerRender(program: Command): void {
  const render = program.command('render').description('print what backhaul would put on the site for a pod');
  render
    .command('prelude')
    .description('print the job prelude (the shell fragment for slurm-job.vk.io/pre-exec)')
    .argument('<pod.yaml>', 'pod manifest')
    .option('-c, --config <file>', 'site configuration (default: $BACKHAUL_CONFIG)')
    .action(async (podFile: string, opts: ConfigOption) => {
      const { site, request } = await loadRequest(podFile, opts);
      process.stdout.write(renderPrelude(request, site.Network.SSH.Reverse));
    });
  render
    .command('boot')
    .description(
      "print the relay boot every prelude carries compressed (its sha256's first 16 hex digits are in the prelude's comment)",
    )
    .action(() => {
      process.stdout.write(`${bootSource()}\n`);
    });
  render
    .command('epilog')
    .description(
      "print a Slurm Epilog script for the compute nodes: it removes the socket dir of a job whose prelude's trap did not run (KillWait's SIGKILL, the OOM killer)",
    )
    .option('-c, --config <file>', 'site configuration (default: $BACKHAUL_CONFIG)')
    .action(async (opts: ConfigOption) => {
      const site = await loadSiteConfig(opts);
      process.stdout.write(
        renderEpilog({ user: site.Network.SSH.User, socketRoot: site.Network.SSH.Reverse.SocketRoot }),
      );
    });
  render
    .command('plan')
    .description('print the session plan as JSON: bind address, socket paths, endpoints, carrier')
    .argument('<pod.yaml>', 'pod manifest (with metadata.uid)')
    .option('-c, --config <file>', 'site configuration (default: $BACKHAUL_CONFIG)')
    .action(async (podFile: string, opts: ConfigOption) => {
      const { pod, site, request } = await loadRequest(podFile, opts);
      const plan = fromFile(podFile, () => renderSessionPlan(pod, request, site));
      process.stdout.write(`${JSON.stringify(plan, null, 2)}\n`);
    });
}

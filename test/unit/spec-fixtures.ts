import type { RequestContext } from '../../src/spec/reverse-request.js';
import { parseSiteConfig, type ReverseConfig, type SiteConfig } from '../../src/spec/site-config.js';

/** A valid site configuration with the Reverse section overridden. */
export function siteWith(reverse: Record<string, unknown> = {}): SiteConfig {
  return parseSiteConfig({
    Network: {
      SSH: {
        LoginHost: 'login.example.org',
        User: 'hpc',
        KeyFile: '/secrets/id_ed25519',
        KnownHostsFile: '/secrets/known_hosts',
        Reverse: { Enabled: true, ...reverse },
      },
    },
  });
}

export function contextWith(reverse: Partial<ReverseConfig> = {}, podNamespace = 'user'): RequestContext {
  const site = siteWith(reverse);
  return { reverse: site.Network.SSH.Reverse, podNamespace, clusterDomain: site.Backhaul.ClusterDomain };
}

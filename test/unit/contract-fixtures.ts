import { type RequestContext, requestContext } from '../../src/contract/reverse-request.js';
import { parseSiteConfig, type ReverseConfig, type SiteConfig } from '../../src/contract/site-config.js';

/**
 * An endpoint policy that admits every endpoint it can: the grammar tests are about the grammar
 * (the policy has its own, test/unit/endpoint-policy.test.ts).
 */
export const ANY_ENDPOINT = {
  Allow: { Namespaces: ['*'], Hosts: ['*'], CIDRs: ['0.0.0.0/0', '127.0.0.0/8', '169.254.0.0/16', '0.0.0.0/8'] },
};

/** A valid site configuration with the Reverse section overridden. */
export function siteWith(reverse: Record<string, unknown> = {}, endpointPolicy: unknown = ANY_ENDPOINT): SiteConfig {
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
    Backhaul: { EndpointPolicy: endpointPolicy },
  });
}

export function contextWith(
  reverse: Partial<ReverseConfig> = {},
  podNamespace = 'user',
  endpointPolicy: unknown = ANY_ENDPOINT,
): RequestContext {
  const site = siteWith(reverse, endpointPolicy);
  return requestContext(site, podNamespace);
}

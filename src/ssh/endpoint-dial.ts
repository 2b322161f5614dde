import { lookup as dnsLookup, type LookupAddress, type LookupOptions } from 'node:dns';
import { connect, isIP, Socket } from 'node:net';
import { type EndpointPolicy, NamespaceEndpointPolicy } from '../spec/endpoint-policy.js';
import { serviceAddress } from '../spec/host-names.js';
import type { SiteConfig } from '../spec/site-config.js';
import { dialAddress, type HostAliases } from './host-aliases.js';

/** What the fleet dials for a pod with, as plain data (it crosses into tunnel threads). */
export interface DialRules {
  /** `Backhaul.HostAliases`: looked up before a name goes to the resolver. */
  hostAliases: HostAliases;
  /** `Backhaul.EndpointPolicy`, checked again here on the address a name resolved to. */
  endpointPolicy: EndpointPolicy;
  clusterDomain: string;
}

/** The site's dial rules. */
export function dialRulesOf(config: SiteConfig): DialRules {
  return {
    hostAliases: config.Backhaul.HostAliases,
    endpointPolicy: config.Backhaul.EndpointPolicy,
    clusterDomain: config.Backhaul.ClusterDomain,
  };
}

/** An endpoint the policy refused at dial time (the socket is destroyed with it). */
export class EndpointRefusedError extends Error {
  override readonly name = 'EndpointRefusedError';
  readonly code = 'EENDPOINTREFUSED';
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/**
 * Dials endpoints for the pods of one namespace: every connection is checked against the endpoint
 * policy on the address it goes to, so a name that resolves to loopback, link-local or the fleet itself
 * (a hostile DNS answer, an ExternalName Service) is refused even though the name was allowed.
 */
export class EndpointDialer {
  private readonly policy: NamespaceEndpointPolicy;

  constructor(
    private readonly rules: DialRules,
    readonly podNamespace: string,
  ) {
    this.policy = new NamespaceEndpointPolicy(rules.endpointPolicy, podNamespace);
  }

  /** A declared forward's endpoint: its name was checked when the pod was validated. */
  dial(dialHost: string, port: number): Socket {
    return this.connectChecked(dialHost, port);
  }

  /**
   * A SOCKS destination, checked by name here (nothing validated it before); a bare or short name is a
   * Service of the pod's namespace, dialled by its full name (the fleet's resolver would search its own).
   */
  dialSocks(destination: string, port: number): Socket {
    const host = destination.toLowerCase();
    const address = serviceAddress(host, this.podNamespace, this.rules.clusterDomain);
    const refusal = this.policy.refusalOfName({ host, port, service: address.service });
    if (refusal !== undefined) return refusedSocket(refusal);
    return this.connectChecked(address.dialHost, port);
  }

  private connectChecked(name: string, port: number): Socket {
    const host = dialAddress(name, this.rules.hostAliases);
    if (isIP(host) !== 0) {
      const refusal = this.policy.refusalOfAddress(host, name);
      if (refusal !== undefined) return refusedSocket(refusal);
      return connect({ host, port, allowHalfOpen: true, noDelay: true });
    }
    return connect({ host, port, allowHalfOpen: true, noDelay: true, lookup: this.checkedLookup(name) });
  }

  /** dns.lookup, keeping only the addresses the policy admits (Node asks for all of them to race them). */
  private checkedLookup(name: string) {
    return (hostname: string, options: LookupOptions, callback: LookupCallback): void => {
      dnsLookup(hostname, { ...options, all: true }, (err, addresses) => {
        if (err) return callback(err, options.all ? [] : '');
        const list = addresses as LookupAddress[];
        const refusals = list.map((a) => this.policy.refusalOfAddress(a.address, name));
        const allowed = list.filter((_, i) => refusals[i] === undefined);
        const first = allowed[0];
        if (!first)
          return callback(new EndpointRefusedError(refusals[0] ?? `${name}: no address`), options.all ? [] : '');
        if (options.all) return callback(null, allowed);
        return callback(null, first.address, first.family);
      });
    };
  }
}

/** A socket that fails at once with the refusal, like a connect error, so callers handle one path. */
function refusedSocket(reason: string): Socket {
  const socket = new Socket();
  process.nextTick(() => socket.destroy(new EndpointRefusedError(reason)));
  return socket;
}

/** `Backhaul.HostAliases`: host name → IPv4 address, as a pod's `hostAliases` in Kubernetes. */
export type HostAliases = Readonly<Record<string, string>>;

/**
 * The address the fleet dials for HOST: its alias when the site declares one (names compare
 * case-insensitively, as DNS does), else HOST itself, left to the resolver.
 */
export function dialAddress(host: string, aliases: HostAliases = {}): string {
  const wanted = host.toLowerCase();
  for (const [name, address] of Object.entries(aliases)) {
    if (name.toLowerCase() === wanted) return address;
  }
  return host;
}

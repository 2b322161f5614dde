import type { Client } from 'ssh2';
import type { CarrierMode } from '../../contract/carrier-mode.js';
import type { SiteConfig } from '../../contract/site-config.js';
import type { KnownHostEntry } from '../../ssh/known-hosts.js';
import type { ServerMessages } from '../../ssh/ssh-connect.js';

export interface OpenConnection {
  client: Client;
  /** What the server said in SSH debug messages (its reasons for refusals). */
  serverMessages: ServerMessages;
}

/** What one doctor run knows so far; each check reads what earlier checks found and adds its own. */
export interface DoctorContext {
  config: SiteConfig;
  configPath: string;
  mode: CarrierMode;
  /** Time limit of one check (a check that cleans up on the node gets a little more for that). */
  timeoutMs: number;
  /** `--node`: the compute node to test instead of the first one sinfo lists. */
  requestedNode: string | undefined;

  /** The private key, once the key check found one ssh2 can use. */
  privateKey?: Buffer;
  /** Its public half's SHA256 fingerprint, for messages about authorized_keys. */
  keyFingerprint?: string;
  /** The known_hosts entries, once the file was read (empty when the site has none and accepts any key). */
  knownHosts?: KnownHostEntry[];
  login?: OpenConnection;
  /** The compute node the node-side checks run on. */
  nodeName?: string;
  node?: OpenConnection;
}

/** `InsecureAcceptAnyHostKey` only counts when no known_hosts file is given (as in src/ssh/site-access.ts). */
export function acceptsAnyLoginKey(config: SiteConfig): boolean {
  return config.Network.SSH.InsecureAcceptAnyHostKey && !config.Network.SSH.KnownHostsFile;
}

/** SocketRoot without trailing slashes, as src/contract/derivations.ts joins it. */
export function socketRoot(config: SiteConfig): string {
  const root = config.Network.SSH.Reverse.SocketRoot;
  const trimmed = root.length > 1 ? root.replace(/\/+$/, '') : root;
  return trimmed === '/' ? '' : trimmed;
}

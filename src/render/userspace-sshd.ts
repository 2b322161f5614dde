import { InputError } from '../contract/input-error.js';
import { renderJobFile } from './job-template.js';
import { isPlainWord } from './shell-quote.js';

/**
 * The user-space sshd a carrier runs on the batch host (ARCHITECTURE.md, "Carriers and shadow sessions", modes userspace and srun), and
 * the bootstrap script that prepares it. Everything lives in `<socket dir>/carrier`, which the
 * prelude's trap removes with the socket dir when the job ends.
 */

export interface CarrierPaths {
  dir: string;
  hostKey: string;
  hostPublicKey: string;
  authorizedKeys: string;
  config: string;
}

export function carrierPaths(socketDir: string): CarrierPaths {
  const dir = `${socketDir}/carrier`;
  return {
    dir,
    hostKey: `${dir}/host_ed25519`,
    hostPublicKey: `${dir}/host_ed25519.pub`,
    authorizedKeys: `${dir}/authorized_keys`,
    config: `${dir}/sshd_config`,
  };
}

/** Exit statuses of the bootstrap, so the session host can tell the causes apart. */
export const BOOTSTRAP_EXIT = {
  dirMissing: 10,
  dirNotDirectory: 11,
  dirNotOwned: 12,
  dirBadMode: 13,
  carrierDir: 14,
  hostKey: 15,
  writeFiles: 16,
  sshdConfig: 17,
} as const;

/** The one line the bootstrap prints on success: `backhaul-hostkey <type> <base64>`. */
export const HOSTKEY_PREFIX = 'backhaul-hostkey';

const KEY_TYPES = ['ssh-ed25519', 'ecdsa-sha2-nistp256', 'ssh-rsa'] as const;
const KEY_LINE = /^(ssh-ed25519|ecdsa-sha2-nistp256|ssh-rsa) ([A-Za-z0-9+/]+={0,2})(?: [\x20-\x7e]*)?$/;

/**
 * Checks the session host's public key and returns it as `<type> <base64>` (any comment dropped).
 * The key ends up in authorized_keys, where an option prefix or a second line would widen what the
 * key may do, so anything but one plain key of a known type is refused. The base64 blob must also
 * decode to a key of the type the line names.
 */
export function validateAuthorizedKey(key: string): string {
  const match = KEY_LINE.exec(key.trim());
  const fail = (problem: string): never => {
    throw new InputError('authorizedKey', problem, {
      entry: key.length > 120 ? `${key.slice(0, 120)}…` : key,
      accepted: `one OpenSSH public key line of type ${KEY_TYPES.join(', ')}`,
    });
  };
  if (!match) return fail('not a single OpenSSH public key line');
  const [, type = '', blob = ''] = match;
  const bytes = Buffer.from(blob, 'base64');
  if (bytes.toString('base64') !== blob) fail('the key is not valid base64');
  const nameLength = bytes.length >= 4 ? bytes.readUInt32BE(0) : -1;
  if (
    nameLength < 0 ||
    4 + nameLength > bytes.length ||
    bytes.subarray(4, 4 + nameLength).toString('latin1') !== type
  ) {
    fail(`the key data is not a ${type} key`);
  }
  return `${type} ${blob}`;
}

export interface SshdConfigInput {
  socketDir: string;
  clientAliveIntervalS: number;
  clientAliveCountMax?: number;
  logLevel?: 'QUIET' | 'FATAL' | 'ERROR' | 'INFO' | 'VERBOSE' | 'DEBUG';
}

/**
 * Only what a carrier needs: remote unix-socket forwards (which also need AllowTcpForwarding remote,
 * while PermitListen keeps every TCP listener closed: SOCKS is a unix socket too), no local forwards, no
 * terminals, no agent or X11, no user rc. StrictModes is off because the files live under /tmp; the
 * bootstrap checks the owner and mode of the socket dir instead.
 */
export function renderSshdConfig(input: SshdConfigInput): string {
  checkPath(input.socketDir, 'socketDir');
  checkPositiveInt(input.clientAliveIntervalS, 'clientAliveIntervalS');
  const countMax = input.clientAliveCountMax ?? 3;
  checkPositiveInt(countMax, 'clientAliveCountMax');
  const paths = carrierPaths(input.socketDir);
  return [
    '# backhaul user-space sshd for one carrier; written fresh by every bootstrap',
    `HostKey ${paths.hostKey}`,
    `AuthorizedKeysFile ${paths.authorizedKeys}`,
    'PidFile none',
    'UsePAM no',
    'StrictModes no',
    'PubkeyAuthentication yes',
    'AuthenticationMethods publickey',
    'PasswordAuthentication no',
    'KbdInteractiveAuthentication no',
    'HostbasedAuthentication no',
    'PermitRootLogin no',
    'PermitTTY no',
    'X11Forwarding no',
    'AllowAgentForwarding no',
    'PermitTunnel no',
    'PermitUserRC no',
    'PermitUserEnvironment no',
    'GatewayPorts no',
    'AllowTcpForwarding remote',
    'AllowStreamLocalForwarding remote',
    'PermitListen none',
    'PermitOpen none',
    'StreamLocalBindUnlink yes',
    'StreamLocalBindMask 0177',
    `ClientAliveInterval ${input.clientAliveIntervalS}`,
    `ClientAliveCountMax ${countMax}`,
    `LogLevel ${input.logLevel ?? 'INFO'}`,
    '',
  ].join('\n');
}

export interface BootstrapInput extends SshdConfigInput {
  sshdPath: string;
  /** The session host's public key for this attempt. */
  authorizedKey: string;
  /** Where ssh-keygen is on the batch host; the login PATH by default. */
  sshKeygenPath?: string;
}

/**
 * A POSIX sh script for `/bin/sh -s`: the HPC user's login shell may be csh, so the command the
 * session host execs stays a few plain words and the script itself travels on stdin. For the same
 * reason the commands that might read stdin (ssh-keygen asks questions) read /dev/null instead: they
 * would eat the rest of the script.
 *
 * It prints exactly one line on stdout, `backhaul-hostkey <type> <base64>`, which the session host
 * pins for the sshd it starts next; failures print one `backhaul-bootstrap: ...` line on stderr and
 * exit with a BOOTSTRAP_EXIT status.
 */
export function renderBootstrap(input: BootstrapInput): string {
  checkPath(input.sshdPath, 'sshdPath');
  const keygen = input.sshKeygenPath ?? 'ssh-keygen';
  if (!isPlainWord(keygen)) throw new InputError('sshKeygenPath', 'not a plain command name or path');
  const key = validateAuthorizedKey(input.authorizedKey);
  const config = renderSshdConfig(input);
  const paths = carrierPaths(input.socketDir);
  const E = BOOTSTRAP_EXIT;
  return renderJobFile('bootstrap.sh', {
    values: {
      DIR: input.socketDir,
      CARRIER: paths.dir,
      HOST_KEY: paths.hostKey,
      HOST_PUBLIC_KEY: paths.hostPublicKey,
      AUTHORIZED_KEYS: paths.authorizedKeys,
      CONFIG_FILE: paths.config,
      SSHD: input.sshdPath,
      KEYGEN: keygen,
      AUTHORIZED_LINE: `restrict,port-forwarding ${key}`,
      SSHD_CONFIG: config,
      HOSTKEY_PREFIX,
      DIR_MISSING: E.dirMissing,
      DIR_NOT_DIRECTORY: E.dirNotDirectory,
      DIR_NOT_OWNED: E.dirNotOwned,
      DIR_BAD_MODE: E.dirBadMode,
      CARRIER_DIR: E.carrierDir,
      HOST_KEY_FAILED: E.hostKey,
      WRITE_FILES: E.writeFiles,
      SSHD_CONFIG_REFUSED: E.sshdConfig,
    },
  });
}

/** Paths reach sshd_config unquoted (sshd would split them at blanks) and commands run by csh. */
function checkPath(path: string, field: string): void {
  if (!/^\/[A-Za-z0-9._/+-]*$/.test(path)) {
    throw new InputError(field, `${JSON.stringify(path)} is not an absolute path of letters, digits and . _ / + -`);
  }
}

function checkPositiveInt(value: number, field: string): void {
  if (!Number.isInteger(value) || value < 1) throw new InputError(field, `${value} is not a positive whole number`);
}

import { MAX_SOCKET_PATH_BYTES, socketDir } from '../contract/derivations.js';
import { InputError } from '../contract/input-error.js';

const FIELD = 'Network.SSH.Reverse.SocketRoot';

/**
 * Refuses a SocketRoot whose socket paths would not fit a unix socket address. The socket dir's
 * length does not depend on the pod UID (a fixed-size hash), so this can be checked before a pod
 * has a UID: at admission as well as when a session is planned.
 */
export function checkSocketPaths(socketRoot: string, socketNames: readonly string[]): void {
  const dir = socketDir(socketRoot, '');
  for (const name of socketNames) {
    const path = `${dir}/${name}`;
    const bytes = Buffer.byteLength(path, 'utf8');
    if (bytes > MAX_SOCKET_PATH_BYTES) {
      throw new InputError(
        FIELD,
        `socket path ${path} is too long: ${bytes} bytes, but a unix socket path is limited to ${MAX_SOCKET_PATH_BYTES} bytes`,
        {
          entry: socketRoot,
          accepted: `a shorter SocketRoot (${bytes - MAX_SOCKET_PATH_BYTES} bytes shorter at least), e.g. /tmp`,
        },
      );
    }
  }
}

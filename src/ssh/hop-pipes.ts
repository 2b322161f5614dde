import { randomBytes } from 'node:crypto';
import { chmod, lstat, mkdtemp, readdir, rm } from 'node:fs/promises';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';

/** A token is 32 hex characters and a newline: the first bytes a thread writes on a pipe. */
const TOKEN_BYTES = 16;
const TOKEN_LINE = TOKEN_BYTES * 2 + 1;
/** A stream not claimed by its thread within this time is closed (the thread died meanwhile). */
const CLAIM_MS = 30_000;

interface Offer {
  stream: Duplex;
  timer: NodeJS.Timeout;
}

/** `bh-pipes-<pid>-XXXXXX`: the session host's pid in the name, so that a later one can tell a dead host's dir. */
const DIR_PREFIX = 'bh-pipes-';
const DIR_NAME = /^bh-pipes-(\d+)-[A-Za-z0-9]{6}$/;

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    // EPERM: alive, another user's.
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Removes the pipe dirs in `root` that this user's session hosts left when they died without stopping
 * (kill -9, the OOM killer): those whose pid is no live process. A pid taken by another process since is
 * taken as alive, and its dir left to a later start. Symbolic links and other users' entries are left.
 */
export async function removeStalePipeDirs(root = tmpdir()): Promise<string[]> {
  const names = await readdir(root).catch(() => [] as string[]);
  const uid = process.getuid?.();
  const removed: string[] = [];
  for (const name of names) {
    const pid = Number(DIR_NAME.exec(name)?.[1] ?? Number.NaN);
    if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid || isAlive(pid)) continue;
    const path = join(root, name);
    const entry = await lstat(path).catch(() => undefined);
    if (!entry?.isDirectory() || entry.uid !== uid) continue;
    await rm(path, { recursive: true, force: true });
    removed.push(path);
  }
  return removed;
}

/**
 * Byte pipes from the session host's login channels to its tunnel threads: the jump channel of a node
 * carrier, the `sshd -i` exec channel of an srun carrier. A unix socket, as between OpenSSH's `ssh -W`
 * and `ssh`: the kernel moves the bytes while both threads run. The socket lives in a fresh 0700
 * directory, and a connection must present the token of one offered stream, once.
 */
export class HopPipeServer {
  private readonly offers = new Map<string, Offer>();
  private readonly open = new Set<Socket>();

  private constructor(
    readonly path: string,
    private readonly dir: string,
    private readonly server: Server,
    /** The dirs of dead session hosts removed at the start (removeStalePipeDirs). */
    readonly staleRemoved: readonly string[],
  ) {
    server.on('connection', (socket) => this.claim(socket));
  }

  static async start(root = tmpdir()): Promise<HopPipeServer> {
    const staleRemoved = await removeStalePipeDirs(root);
    const dir = await mkdtemp(join(root, `${DIR_PREFIX}${process.pid}-`));
    const path = join(dir, 'hops.sock');
    // Not half-open: an SSH transport never half-closes, and an EOF must close the pipe (ssh2 only
    // notices a transport's 'close', not its 'end').
    const server = createServer();
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(path, () => {
        server.off('error', reject);
        resolve();
      });
    });
    await chmod(path, 0o600);
    return new HopPipeServer(path, dir, server, staleRemoved);
  }

  /** Holds `stream` for the thread that connects with the returned token. */
  offer(stream: Duplex): string {
    const token = randomBytes(TOKEN_BYTES).toString('hex');
    const timer = setTimeout(() => {
      this.offers.delete(token);
      stream.destroy();
    }, CLAIM_MS);
    timer.unref();
    this.offers.set(token, { stream, timer });
    // A channel closed by the far side before its thread came for it.
    stream.once('close', () => {
      const offer = this.offers.get(token);
      if (offer?.stream === stream) {
        clearTimeout(offer.timer);
        this.offers.delete(token);
      }
    });
    return token;
  }

  /** Closes every pipe and stream offered, and the socket; removes the directory. */
  async close(): Promise<void> {
    for (const { stream, timer } of this.offers.values()) {
      clearTimeout(timer);
      stream.destroy();
    }
    this.offers.clear();
    for (const socket of this.open) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    await rm(this.dir, { recursive: true, force: true });
  }

  private claim(socket: Socket): void {
    let head = Buffer.alloc(0);
    const fail = () => socket.destroy();
    const timer = setTimeout(fail, 5_000);
    socket.once('error', fail);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      if (head.length < TOKEN_LINE) return;
      socket.off('data', onData);
      clearTimeout(timer);
      const token = head.subarray(0, TOKEN_LINE - 1).toString('latin1');
      const offer = head[TOKEN_LINE - 1] === 0x0a ? this.offers.get(token) : undefined;
      if (!offer) return fail();
      clearTimeout(offer.timer);
      this.offers.delete(token);
      socket.pause();
      // What the thread sent right after its token (an SSH version line) belongs to the stream.
      const rest = head.subarray(TOKEN_LINE);
      if (rest.length > 0) socket.unshift(rest);
      this.join(socket, offer.stream);
    };
    socket.on('data', onData);
  }

  private join(socket: Socket, stream: Duplex): void {
    this.open.add(socket);
    socket.removeAllListeners('error');
    const end = () => {
      socket.destroy();
      stream.destroy();
    };
    socket.on('error', end);
    stream.on('error', end);
    socket.once('close', () => {
      this.open.delete(socket);
      stream.destroy();
    });
    stream.once('close', () => socket.destroy());
    socket.pipe(stream);
    stream.pipe(socket);
  }
}

/** A tunnel thread's end of an offered stream. */
export function connectHopPipe(path: string, token: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect({ path });
    socket.once('error', reject);
    socket.once('connect', () => {
      socket.off('error', reject);
      socket.write(`${token}\n`);
      resolve(socket);
    });
  });
}

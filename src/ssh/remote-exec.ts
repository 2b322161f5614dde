import type { Client, ClientChannel } from 'ssh2';

export interface ExecResult {
  code: number | null;
  signal: string | undefined;
  stdout: string;
  stderr: string;
}

export type ExitListener = (code: number | null, signal?: string) => void;

/**
 * Opens an exec channel (never a pty: a pty would mangle the bytes of a carrier). ONEXIT, when given, is
 * listening before the channel is handed over: ssh2 emits `exit` (a plain event, not buffered like the
 * channel's data) from inside its packet loop, so a command whose output, status and close arrived in the
 * same read as the channel's confirmation, as they do from a quick command while this process is busy,
 * has reported its status before any `await` could attach a listener (test/integration/remote-exec.test.ts).
 */
export function openExec(client: Client, command: string, onExit?: ExitListener): Promise<ClientChannel> {
  return new Promise((resolve, reject) => {
    client.exec(command, (err, channel) => {
      if (err) {
        reject(err);
        return;
      }
      if (onExit) channel.on('exit', onExit);
      resolve(channel);
    });
  });
}

/**
 * A remote command out of time: `open` when the server never opened its channel (its sshd is stuck),
 * `run` when the command ran and did not finish (what it talks to is stuck).
 */
export class RemoteTimeoutError extends Error {
  override readonly name = 'RemoteTimeoutError';
  constructor(
    readonly phase: 'open' | 'run',
    message: string,
  ) {
    super(message);
  }
}

/**
 * Runs a command to completion on the far side, optionally feeding `stdin` (scripts travel on
 * stdin because the remote login shell may be csh, which mangles multi-line quoted arguments).
 */
export async function execCapture(
  client: Client,
  command: string,
  opts: { stdin?: string; timeoutMs?: number; maxBytes?: number } = {},
): Promise<ExecResult> {
  const timeoutMs = opts.timeoutMs ?? 30_000;
  const deadline = performance.now() + timeoutMs;
  let code: number | null = null;
  let signal: string | undefined;
  const channel = await openWithin(client, command, timeoutMs, (c, s) => {
    code = c;
    signal = s;
  });
  const maxBytes = opts.maxBytes ?? 1 << 20;
  return new Promise((resolve, reject) => {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let size = 0;
    const timer = setTimeout(
      () => {
        channel.close();
        reject(new RemoteTimeoutError('run', `remote command timed out after ${timeoutMs} ms: ${command}`));
      },
      Math.max(0, deadline - performance.now()),
    );
    const keep = (into: Buffer[]) => (chunk: Buffer) => {
      size += chunk.length;
      if (size <= maxBytes) into.push(chunk);
    };
    channel.on('data', keep(out));
    channel.stderr.on('data', keep(err));
    channel.on('close', () => {
      clearTimeout(timer);
      resolve({
        code,
        signal,
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
      });
    });
    channel.on('error', (e: Error) => {
      clearTimeout(timer);
      reject(e);
    });
    if (opts.stdin !== undefined) channel.end(opts.stdin);
    else channel.end();
  });
}

/**
 * The channel open counts against the command's time too: a server that never answers it (a loaded
 * sshd) must not hold the caller, nor everyone waiting on the same query, forever.
 */
function openWithin(client: Client, command: string, timeoutMs: number, onExit: ExitListener): Promise<ClientChannel> {
  return new Promise((resolve, reject) => {
    let late = false;
    const timer = setTimeout(() => {
      late = true;
      reject(
        new RemoteTimeoutError(
          'open',
          `remote command timed out after ${timeoutMs} ms opening its channel: ${command}`,
        ),
      );
    }, timeoutMs);
    openExec(client, command, onExit).then(
      (channel) => {
        clearTimeout(timer);
        if (late) channel.close();
        else resolve(channel);
      },
      (err: unknown) => {
        clearTimeout(timer);
        reject(err);
      },
    );
  });
}

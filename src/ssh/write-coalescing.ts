import type { Writable } from 'node:stream';

/**
 * What an SSH connection writes in one turn of the event loop leaves as one write, as OpenSSH's main
 * loop does: it reads every ready descriptor, then writes its output buffer once.
 *
 * ssh2 writes every packet with its own `write()`. Through a node carrier under concurrency that is a
 * login-socket `write` syscall, an outer packet for the login sshd to decrypt and forward, and a segment
 * for the node sshd to read, per inner packet: with 32 connections the login sshd spent 17 CPU-µs per
 * request against OpenSSH's 7 (docs/history/performance-notebook.md). Coalesced, the inner packets written while one turn's
 * ready sockets are read go to the jump channel as one CHANNEL_DATA, and the outer packets of the turn go
 * to the login socket as one `writev`.
 *
 * Nothing waits: the stream is corked at its first write of a turn and uncorked in the same turn's check
 * phase (setImmediate), after the poll phase has run every callback that was ready. A stream written
 * while the check phase flushes (the login socket, when the jump channel's batch becomes an outer packet)
 * is flushed in that same pass, not a turn later.
 */
export function coalesceWrites(stream: Writable): void {
  const s = stream as CoalescedStream;
  if (s[COALESCED] || process.env.BACKHAUL_WRITE_COALESCING === 'off') return;
  s[COALESCED] = { corked: false };
  // A stream without _writev (ssh2's Channel) gets one that hands the batch to _write as one buffer;
  // Channel._write splits it by the window and the peer's packet size as it does any write.
  if (typeof s._writev !== 'function') {
    s._writev = (chunks, callback) => {
      const buffers = chunks.map(({ chunk, encoding }) =>
        Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string, encoding as BufferEncoding),
      );
      s._write(buffers.length === 1 ? buffers[0] : Buffer.concat(buffers), 'buffer' as BufferEncoding, callback);
    };
  }
  const write = s.write;
  s.write = function coalescedWrite(this: Writable, ...args: Parameters<Writable['write']>): boolean {
    const state = s[COALESCED];
    if (state && !state.corked && !s.writableEnded && !s.destroyed) {
      state.corked = true;
      s.cork();
      pending.push(s);
      if (!scheduled) {
        scheduled = true;
        setImmediate(flush);
      }
    }
    return write.apply(this, args);
  } as Writable['write'];
}

/** Whether coalesceWrites was applied to this stream. */
export function isCoalesced(stream: Writable): boolean {
  return (stream as CoalescedStream)[COALESCED] !== undefined;
}

const COALESCED = Symbol('backhaul.coalesced');

type CoalescedStream = Writable & {
  [COALESCED]?: { corked: boolean };
  _writev?:
    | ((chunks: Array<{ chunk: unknown; encoding: string }>, callback: (err?: Error | null) => void) => void)
    | null;
};

/** Streams corked this turn, in the order of their first write. Per thread: each worker has its own. */
const pending: CoalescedStream[] = [];
let scheduled = false;

function flush(): void {
  // Uncorking one stream may write to another (the jump channel's batch becomes an outer packet on the
  // login socket): that one is appended and flushed in this pass.
  for (let i = 0; i < pending.length; i++) {
    const s = pending[i] as CoalescedStream;
    const state = s[COALESCED];
    if (state) state.corked = false;
    if (s.writableCorked > 0) s.uncork();
  }
  pending.length = 0;
  scheduled = false;
}

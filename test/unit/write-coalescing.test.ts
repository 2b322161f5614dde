import { once } from 'node:events';
import { createServer, type Socket, connect as tcpConnect } from 'node:net';
import { Writable } from 'node:stream';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { coalesceWrites, isCoalesced } from '../../src/ssh/write-coalescing.js';

/** A Writable without _writev (as ssh2's Channel) that records each _write it gets. */
function recorder(log: string[], name: string, onWrite?: (chunk: Buffer) => void) {
  const writes: Buffer[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      writes.push(chunk);
      log.push(`${name}:${chunk.toString()}`);
      onWrite?.(chunk);
      callback();
    },
  });
  return { stream, writes };
}

describe('coalesceWrites', () => {
  it('hands the writes of one turn to _write as one buffer, in order, in the same turn', async () => {
    const log: string[] = [];
    const { stream, writes } = recorder(log, 'a');
    coalesceWrites(stream);
    expect(isCoalesced(stream)).toBe(true);
    stream.write(Buffer.from('one,'));
    stream.write(Buffer.from('two,'));
    stream.write('three');
    expect(writes, 'nothing is written before the turn ends').toEqual([]);
    await nextTurn();
    expect(writes.map((w) => w.toString())).toEqual(['one,two,three']);

    // The next turn's writes make their own batch.
    stream.write(Buffer.from('four'));
    await nextTurn();
    expect(writes.map((w) => w.toString())).toEqual(['one,two,three', 'four']);
  });

  it('writes from several callbacks of one turn (sockets read in one poll phase) leave as one batch', async () => {
    const log: string[] = [];
    const { stream, writes } = recorder(log, 'a');
    coalesceWrites(stream);
    // Three timers due at once run in one timers phase, as ready sockets run in one poll phase. Each
    // setTimeout reads the clock anew, so the three may start a millisecond apart (the test failed so, once,
    // in a full run): holding this turn for 5 ms makes all of them due when the timers phase comes.
    await new Promise<void>((resolve) => {
      for (const word of ['x', 'y', 'z']) setTimeout(() => stream.write(Buffer.from(word)), 1);
      setTimeout(() => setImmediate(resolve), 1);
      const until = performance.now() + 5;
      while (performance.now() < until) {
        // busy: no turn of the event loop may start before all three are due
      }
    });
    expect(writes.map((w) => w.toString())).toEqual(['xyz']);
  });

  it('a stream written while the turn flushes (the login socket under a jump channel) goes out in the same pass', async () => {
    const log: string[] = [];
    const outer = recorder(log, 'outer');
    const inner = recorder(log, 'inner', (chunk) => outer.stream.write(Buffer.from(`[${chunk.toString()}]`)));
    coalesceWrites(inner.stream);
    coalesceWrites(outer.stream);
    inner.stream.write(Buffer.from('p1'));
    inner.stream.write(Buffer.from('p2'));
    // Scheduled after the flush: it must find the outer packet written already.
    setImmediate(() => log.push('next callback of the check phase'));
    await nextTurn();
    await nextTurn();
    expect(log).toEqual(['inner:p1p2', 'outer:[p1p2]', 'next callback of the check phase']);
  });

  it('end() before the turn ends writes what is buffered, then ends', async () => {
    const log: string[] = [];
    const { stream } = recorder(log, 'a');
    coalesceWrites(stream);
    stream.write(Buffer.from('last'));
    stream.end();
    await once(stream, 'finish');
    expect(log).toEqual(['a:last']);
    await nextTurn();
    expect(log).toEqual(['a:last']);
  });

  it('is applied once: a second call changes nothing', async () => {
    const log: string[] = [];
    const { stream, writes } = recorder(log, 'a');
    coalesceWrites(stream);
    coalesceWrites(stream);
    stream.write(Buffer.from('a'));
    stream.write(Buffer.from('b'));
    await nextTurn();
    expect(writes.map((w) => w.toString())).toEqual(['ab']);
  });

  it('on a TCP socket: the bytes of many writes arrive whole and in order (writev)', async () => {
    const server = createServer();
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const address = server.address();
    if (address === null || typeof address === 'string') throw new Error('no port');
    const accepted = once(server, 'connection') as Promise<[Socket]>;
    const client = tcpConnect(address.port, '127.0.0.1');
    await once(client, 'connect');
    const [peer] = await accepted;
    try {
      coalesceWrites(client);
      const received: Buffer[] = [];
      peer.on('data', (chunk: Buffer) => received.push(chunk));
      const sent: Buffer[] = [];
      for (let turn = 0; turn < 50; turn++) {
        for (let i = 0; i < 20; i++) {
          const packet = Buffer.from(`${turn}.${i};`);
          sent.push(packet);
          client.write(packet);
        }
        await nextTurn();
      }
      const total = Buffer.concat(sent).length;
      for (let i = 0; i < 200 && Buffer.concat(received).length < total; i++)
        await new Promise((r) => setTimeout(r, 10));
      expect(Buffer.concat(received).toString()).toBe(Buffer.concat(sent).toString());
    } finally {
      client.destroy();
      peer.destroy();
      server.close();
    }
  });
});

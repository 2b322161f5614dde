import { createServer } from 'node:net';
import { Client } from 'ssh2';
import { describe, expect, it } from 'vitest';
import { ReverseForwards } from '../../src/ssh/reverse-forwards.js';
import { loopbackDialer } from '../../tools/sandbox/dial-rules.js';

describe('ReverseForwards', () => {
  it('rejects a connection for a socket path it did not declare, without dialing anything', async () => {
    let dialed = 0;
    const server = createServer((s) => {
      dialed += 1;
      s.destroy();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as { port: number }).port;
    // A real (unconnected) ssh2 client: the event is what ssh2 emits for a forwarded-streamlocal channel.
    const client = new Client();
    const forwards = new ReverseForwards(
      client,
      [{ socketPath: '/tmp/bh-x/9000.sock', dialHost: '127.0.0.1', port }],
      [],
      { warn: () => undefined },
      { dialer: loopbackDialer() },
    );
    let rejected = 0;
    let accepted = 0;
    client.emit(
      'unix connection',
      { socketPath: '/tmp/bh-x/other.sock' },
      () => {
        accepted += 1;
        throw new Error('accepted an undeclared socket');
      },
      () => {
        rejected += 1;
      },
    );
    await new Promise((r) => setTimeout(r, 100));
    expect({ rejected, accepted, dialed }).toEqual({ rejected: 1, accepted: 0, dialed: 0 });
    expect(forwards.stats.refused).toBe(1);
    server.close();
  });

  it('rejects when the declared endpoint is down (the job sees its connection closed at once)', async () => {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as { port: number }).port;
    await new Promise<void>((resolve) => server.close(() => resolve()));
    const client = new Client();
    const warnings: string[] = [];
    new ReverseForwards(
      client,
      [{ socketPath: '/s', dialHost: '127.0.0.1', port }],
      [],
      { warn: (m) => warnings.push(m) },
      { dialer: loopbackDialer() },
    );
    const outcome = await new Promise<string>((resolve) =>
      client.emit(
        'unix connection',
        { socketPath: '/s' },
        () => resolve('accepted'),
        () => resolve('rejected'),
      ),
    );
    expect(outcome).toBe('rejected');
    expect(warnings).toEqual(['endpoint unreachable']);
  });
});

import type { HopPipeServer } from './hop-pipes.js';
import type { LoginHopLease, LoginHops } from './login-hop.js';
import { isSessionError } from './session-error.js';
import type { HopCall, HopValue, ToThread, WireError } from './tunnel-protocol.js';

/**
 * The session host's side of one tunnel thread's login hops: answers its calls with the session host's
 * login connections (LoginPool) and hands it the channels it streams through byte pipes. Everything it
 * lent is given back when the thread ends (`releaseAll`), so a crashed thread leaks no login session.
 */
export class LoginHopService {
  private readonly leases = new Map<number, LoginHopLease>();
  private nextLease = 1;

  constructor(
    private readonly pool: LoginHops,
    private readonly pipes: HopPipeServer,
    private readonly post: (message: ToThread) => void,
  ) {}

  /** Answers one call; the answer (or error) goes back as a `reply` message. */
  serve(call: number, request: HopCall): void {
    this.handle(request).then(
      (value) => this.post({ type: 'reply', call, ok: true, value }),
      (err: unknown) => this.post({ type: 'reply', call, ok: false, error: toWire(err) }),
    );
  }

  get leased(): number {
    return this.leases.size;
  }

  releaseAll(): void {
    for (const lease of this.leases.values()) lease.release();
    this.leases.clear();
  }

  private async handle(request: HopCall): Promise<HopValue> {
    if (request.method === 'acquire') {
      const lease = await this.pool.acquire(request.sessions);
      const id = this.nextLease++;
      this.leases.set(id, lease);
      return { lease: id };
    }
    if (request.method === 'fence' || request.method === 'service' || request.method === 'slot') {
      throw new Error(`${request.method} calls are answered by the tunnel thread's owner`);
    }
    if (request.method === 'release') {
      this.leases.get(request.lease)?.release();
      this.leases.delete(request.lease);
      return null;
    }
    const lease = this.leases.get(request.lease);
    if (!lease) throw new Error(`login lease ${request.lease} is not held`);
    switch (request.method) {
      case 'jump':
        return { pipe: this.pipes.offer(await lease.hop.jump(request.host, request.port)) };
      case 'exec': {
        const exec = await lease.hop.exec(request.command);
        const pipe = this.pipes.offer(exec.stream);
        exec.stderr.on('data', (data: Buffer) => this.post({ type: 'stderr', pipe, data: new Uint8Array(data) }));
        return { pipe };
      }
      case 'run':
        return lease.hop.run(request.command, request.opts);
      case 'findJob':
        return { job: await lease.hop.findJob(request.user, request.jobName) };
    }
  }
}

function toWire(err: unknown): WireError {
  if (isSessionError(err)) return { message: err.message, kind: err.kind };
  return { message: err instanceof Error ? err.message : String(err) };
}

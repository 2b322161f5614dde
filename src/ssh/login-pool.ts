import type { Client } from 'ssh2';
import {
  DEFAULT_MAX_WINDOW,
  pingMs,
  RTT_SAMPLES_MS,
  RttEstimate,
  sampleRtt,
  setChannelWindow,
  windowForRtt,
} from './channel-window.js';
import { type LoginHop, type LoginHopLease, type LoginHops, sshLoginHop } from './login-hop.js';
import { connectSsh, type ServerMessages, type SshTarget } from './ssh-connect.js';

interface PooledLogin {
  client: Client;
  serverMessages: ServerMessages;
  hop: LoginHop;
  /** Exec channels held (they count against the login sshd's MaxSessions; jump channels do not). */
  sessions: number;
  users: number;
  closed: boolean;
  idleTimer: NodeJS.Timeout | undefined;
}

export interface LoginLease extends LoginHopLease {
  client: Client;
  serverMessages: ServerMessages;
  /** Gives back the session slots and the connection; idempotent. */
  release(): void;
}

/**
 * Login connections of one site, shared by the carriers of many pods. A carrier that needs exec
 * channels on the login node (srun) reserves them, so no connection goes over MaxSessions; an idle
 * connection is closed.
 */
export class LoginPool implements LoginHops {
  private readonly logins: PooledLogin[] = [];
  private pending: Promise<PooledLogin> | undefined;

  constructor(
    private readonly target: SshTarget,
    private readonly maxSessions: number,
    private readonly idleMs = 30_000,
    private readonly maxChannelWindow = DEFAULT_MAX_WINDOW,
  ) {}

  async acquire(sessions: number): Promise<LoginLease> {
    if (sessions > this.maxSessions) {
      throw new RangeError(`a carrier needs ${sessions} sessions but the login sshd allows ${this.maxSessions}`);
    }
    const login = await this.pick(sessions);
    clearTimeout(login.idleTimer);
    login.sessions += sessions;
    login.users += 1;
    let released = false;
    return {
      client: login.client,
      serverMessages: login.serverMessages,
      hop: login.hop,
      release: () => {
        if (released) return;
        released = true;
        login.sessions -= sessions;
        login.users -= 1;
        // Keep an idle connection a little while: carriers of a new pod often follow.
        if (login.users === 0) login.idleTimer = setTimeout(() => this.retire(login), this.idleMs).unref();
      },
    };
  }

  get size(): number {
    return this.logins.length;
  }

  close(): void {
    for (const login of [...this.logins]) this.retire(login);
  }

  private async pick(sessions: number): Promise<PooledLogin> {
    const free = this.logins.find((l) => !l.closed && l.sessions + sessions <= this.maxSessions);
    if (free) return free;
    // Carriers starting together share one new connection instead of each opening its own.
    if (!this.pending) {
      this.pending = this.open().finally(() => {
        this.pending = undefined;
      });
    }
    const login = await this.pending;
    if (login.sessions + sessions <= this.maxSessions) return login;
    return this.pick(sessions);
  }

  private async open(): Promise<PooledLogin> {
    const { client, serverMessages } = await connectSsh(this.target);
    // One round trip per login connection (they are pooled): the jump and exec channels made on it carry
    // a carrier's whole stream, so their window must cover the path to the site (channel-window.ts).
    // Later samples lower it for the channels made after them (the first one waits behind the login's set-up).
    const rtt = new RttEstimate();
    const size = (ms: number) => setChannelWindow(client, 2 * windowForRtt(ms, this.maxChannelWindow));
    try {
      const first = await pingMs(client);
      rtt.sample(first);
      size(first);
      sampleRtt(client, rtt, size, RTT_SAMPLES_MS.slice(1));
    } catch (err) {
      client.end();
      throw err;
    }
    const login: PooledLogin = {
      client,
      serverMessages,
      hop: sshLoginHop(client, { slurmQueryTimeoutMs: this.target.slurmQueryTimeoutMs }),
      sessions: 0,
      users: 0,
      closed: false,
      idleTimer: undefined,
    };
    const drop = () => {
      login.closed = true;
      const at = this.logins.indexOf(login);
      if (at >= 0) this.logins.splice(at, 1);
    };
    client.on('close', drop);
    client.on('error', drop);
    this.logins.push(login);
    return login;
  }

  private retire(login: PooledLogin): void {
    clearTimeout(login.idleTimer);
    login.closed = true;
    const at = this.logins.indexOf(login);
    if (at >= 0) this.logins.splice(at, 1);
    login.client.end();
  }
}

import type { Duplex, Readable } from 'node:stream';
import type { Client } from 'ssh2';
import { DirectTcpipError, openDirectTcpip } from './direct-tcpip.js';
import { type ExecResult, execCapture, openExec } from './remote-exec.js';
import { SessionError } from './session-error.js';
import type { SlurmJob } from './slurm-job.js';
import { findPodJob } from './slurm-queries.js';

/** A command's channel on the far side, streamed: stdin and stdout as a Duplex, stderr apart. */
export interface ExecStream {
  stream: Duplex;
  stderr: Readable;
  close(): void;
}

export interface RunOptions {
  stdin?: string;
  timeoutMs?: number;
  maxBytes?: number;
}

/**
 * What a carrier and its shadow need from the login node: the jump to a compute node's sshd, commands
 * (the srun carrier's bootstrap and `sshd -i`) and the pod's job as squeue sees it. The session host
 * holds the login connections; a tunnel thread reaches them through this interface
 * (tunnel-thread.ts), so the outer SSH layer of a tunnel runs on another core than its inner one.
 */
export interface LoginHop {
  /** A `direct-tcpip` channel from the login node to host:port (`ssh -J`). */
  jump(host: string, port: number): Promise<Duplex>;
  /** An exec channel (no pty), for a command whose stdin/stdout carry a protocol. */
  exec(command: string): Promise<ExecStream>;
  /** Runs a command to completion (scripts go on stdin). */
  run(command: string, opts?: RunOptions): Promise<ExecResult>;
  /** The job named `jobName` of `user`, or undefined when Slurm knows none (lookups are batched). */
  findJob(user: string, jobName: string): Promise<SlurmJob | undefined>;
}

/** A login hop lent to one carrier; `release` gives its login connection back (idempotent). */
export interface LoginHopLease {
  hop: LoginHop;
  release(): void;
}

/** Where shadows get their login hop: the session host's LoginPool, or its proxy in a tunnel thread. */
export interface LoginHops {
  /** `sessions`: exec channels the carrier keeps open on the login node (MaxSessions counts them). */
  acquire(sessions: number): Promise<LoginHopLease>;
}

/** The login hop over an ssh2 connection held by this thread. */
export function sshLoginHop(client: Client, opts: { slurmQueryTimeoutMs?: number | undefined } = {}): LoginHop {
  return {
    jump: async (host, port) => {
      try {
        return await openDirectTcpip(client, host, port);
      } catch (err) {
        const why = err instanceof DirectTcpipError ? (err.cause as Error | undefined)?.message : undefined;
        throw new SessionError(
          'carrier-lost',
          `the login node could not reach ${host}:${port}: ${why ?? (err as Error).message}`,
          { cause: err },
        );
      }
    },
    exec: async (command) => {
      const channel = await openExec(client, command);
      return { stream: channel as unknown as Duplex, stderr: channel.stderr, close: () => channel.close() };
    },
    run: (command, opts) => execCapture(client, command, opts),
    findJob: (user, jobName) => findPodJob(client, user, jobName, opts.slurmQueryTimeoutMs),
  };
}

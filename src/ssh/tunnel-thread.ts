/**
 * A tunnel thread (worker_threads) of a session host: runs shadow sessions whose login hop is the
 * session host's (LoginHopService answers the calls made here). The carrier's SSH connection, the
 * forwards and the endpoint sockets live here, on this thread's event loop and its own small heap;
 * the login connection's encryption stays on the session host's. Started by tunnel-threads.ts only.
 */
import { PassThrough } from 'node:stream';
import { getHeapStatistics } from 'node:v8';
import { parentPort, workerData } from 'node:worker_threads';
import type { CarrierSite } from './carrier.js';
import { DATA_PLANE_REPORT_MS, dataPlane } from './data-plane-meter.js';
import { connectHopPipe } from './hop-pipes.js';
import type { ExecStream, LoginHop, LoginHopLease, LoginHops } from './login-hop.js';
import type { ExecResult } from './remote-exec.js';
import type { ServiceAnswer, ServiceDirectory } from './service-directory.js';
import { SESSION_ERROR_KINDS, SessionError, type SessionErrorKind } from './session-error.js';
import { ShadowSession } from './shadow-session.js';
import { accessFromData } from './site-access.js';
import type { FromThread, HopCall, HopValue, ToThread, TunnelThreadData, WireError } from './tunnel-protocol.js';

const port = parentPort;
if (!port) throw new Error('tunnel-thread.ts runs as a worker thread of a session host');
const { pipeSocket, access, fleetAddresses: initialFleet } = workerData as TunnelThreadData;
const post = (message: FromThread) => port.postMessage(message);

// ------------------------------------------------------------------------------------------ calls

const calls = new Map<number, { resolve(value: HopValue): void; reject(err: Error): void }>();
let nextCall = 1;

function call(request: HopCall): Promise<HopValue> {
  const id = nextCall++;
  return new Promise((resolve, reject) => {
    calls.set(id, { resolve, reject });
    post({ type: 'call', call: id, request });
  });
}

const KINDS: ReadonlySet<string> = new Set<string>(SESSION_ERROR_KINDS);

function fromWire(error: WireError): Error {
  return error.kind && KINDS.has(error.kind)
    ? new SessionError(error.kind as SessionErrorKind, error.message)
    : new Error(error.message);
}

/** stderr of exec pipes, by pipe; a chunk that comes before its pipe is known waits here. */
const stderrs = new Map<string, PassThrough>();

function stderrOf(pipe: string): PassThrough {
  let stream = stderrs.get(pipe);
  if (!stream) {
    stream = new PassThrough();
    stderrs.set(pipe, stream);
  }
  return stream;
}

function remoteHop(lease: number): LoginHop {
  const pipeOf = async (request: HopCall) => {
    const value = await call(request);
    if (!value || !('pipe' in value)) throw new Error(`${request.method}: the session host sent no pipe`);
    return value.pipe;
  };
  return {
    jump: async (host, portNumber) =>
      connectHopPipe(pipeSocket, await pipeOf({ method: 'jump', lease, host, port: portNumber })),
    exec: async (command): Promise<ExecStream> => {
      const pipe = await pipeOf({ method: 'exec', lease, command });
      const stderr = stderrOf(pipe);
      const stream = await connectHopPipe(pipeSocket, pipe).catch((err: unknown) => {
        stderrs.delete(pipe);
        throw err;
      });
      stream.once('close', () => {
        stderr.end();
        stderrs.delete(pipe);
      });
      return { stream, stderr, close: () => stream.destroy() };
    },
    run: async (command, opts = {}) => (await call({ method: 'run', lease, command, opts })) as ExecResult,
    findJob: async (user, jobName) => {
      const value = await call({ method: 'findJob', lease, user, jobName });
      return value && 'job' in value ? value.job : undefined;
    },
  };
}

const remoteHops: LoginHops = {
  acquire: async (sessions): Promise<LoginHopLease> => {
    const value = await call({ method: 'acquire', sessions });
    if (!value || !('lease' in value)) throw new Error('acquire: the session host sent no lease');
    const lease = value.lease;
    let released = false;
    return {
      hop: remoteHop(lease),
      release: () => {
        if (released) return;
        released = true;
        call({ method: 'release', lease }).catch(() => undefined);
      },
    };
  },
};

/** The thread's own login connections (`login: 'per-thread'`), or the session host's through calls. */
const hops: LoginHops = access ? accessFromData(access).pool : remoteHops;

// ------------------------------------------------------------------------------------------ services

/** How long a thread reuses the session host's answer for a Service (that one is cached as well). */
const SERVICE_TTL_MS = 2_000;
let fleetAddresses: ReadonlySet<string> = new Set(initialFleet);
const answers = new Map<string, { at: number; answer: Promise<ServiceAnswer> }>();

/** The session host's ServiceDirectory, asked through calls; its fleet addresses pushed here. */
const directory: ServiceDirectory = {
  lookup: (service) => {
    const key = `${service.namespace}/${service.name}`;
    const now = performance.now();
    const hit = answers.get(key);
    if (hit && now - hit.at < SERVICE_TTL_MS) return hit.answer;
    if (answers.size > 1_000) answers.clear();
    const answer = call({ method: 'service', namespace: service.namespace, name: service.name }).then((value) => {
      if (!value || !('service' in value)) throw new Error('service: the session host sent no answer');
      return value.service;
    });
    answers.set(key, { at: now, answer });
    answer.catch(() => answers.delete(key));
    return answer;
  },
  fleetAddresses: () => fleetAddresses,
  onFleetAddresses: () => () => undefined,
};

// ------------------------------------------------------------------------------------------ shadows

/** Buffers arrive as plain Uint8Arrays (structured clone): the key checks need Buffers back. */
function reviveSite(site: CarrierSite): CarrierSite {
  return {
    ...site,
    privateKey: typeof site.privateKey === 'string' ? site.privateKey : Buffer.from(site.privateKey),
    knownHosts: site.knownHosts.map((entry) => ({ ...entry, key: Buffer.from(entry.key) })),
  };
}

const shadows = new Map<string, ShadowSession>();
/** The traffic last sent for each shadow: a report only when it changed. */
const trafficSent = new Map<string, string>();

port.on('message', (message: ToThread) => {
  switch (message.type) {
    case 'reply': {
      const pending = calls.get(message.call);
      if (!pending) return;
      calls.delete(message.call);
      if (message.ok) pending.resolve(message.value);
      else pending.reject(fromWire(message.error));
      return;
    }
    case 'stderr':
      stderrOf(message.pipe).write(Buffer.from(message.data));
      return;
    case 'start': {
      const { id, shadow } = message;
      const { fenced, slotted, ...options } = shadow;
      const session = new ShadowSession({
        ...options,
        site: reviveSite(shadow.site),
        pool: hops,
        directory,
        ...(fenced
          ? {
              fence: async (): Promise<boolean> => {
                const value = await call({ method: 'fence', shadow: id });
                return value !== null && 'held' in value && value.held === true;
              },
            }
          : {}),
        ...(slotted
          ? {
              // The session host gives the slot back when the shadow ends (its `end` message).
              carrierSlot: async (namespace: string) => {
                await call({ method: 'slot', shadow: id, namespace });
                return () => undefined;
              },
            }
          : {}),
        onPhase: (phase) => post({ type: 'phase', id, phase }),
        log: {
          info: (text, detail) =>
            post({ type: 'log', id, level: 'info', message: text, ...(detail ? { detail } : {}) }),
          warn: (text, detail) =>
            post({ type: 'log', id, level: 'warn', message: text, ...(detail ? { detail } : {}) }),
        },
      });
      shadows.set(id, session);
      void session.run().then((end) => {
        shadows.delete(id);
        post({ type: 'end', id, end });
      });
      return;
    }
    case 'close':
      void shadows.get(message.id)?.close(message.reason);
      return;
    case 'fleet-addresses':
      fleetAddresses = new Set(message.addresses);
      return;
    case 'heap': {
      const gc = (globalThis as { gc?: () => void }).gc;
      if (message.collect && gc) for (let i = 0; i < 4; i += 1) gc();
      post({ type: 'heap', call: message.call, usedBytes: getHeapStatistics().used_heap_size });
      return;
    }
  }
});

// The forwards' counts go to the session host's registry every couple of seconds.
setInterval(() => {
  const report = dataPlane.flush();
  if (report) post({ type: 'metrics', report });
  for (const [id, session] of shadows) {
    const traffic = session.traffic();
    if (!traffic) continue;
    const text = JSON.stringify(traffic);
    if (text === trafficSent.get(id)) continue;
    trafficSent.set(id, text);
    post({ type: 'traffic', id, traffic });
  }
  for (const id of trafficSent.keys()) if (!shadows.has(id)) trafficSent.delete(id);
}, DATA_PLANE_REPORT_MS).unref();

post({ type: 'ready' });

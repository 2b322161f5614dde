import { Redis, type RedisOptions } from 'ioredis';

/** What the fleet's connections are made with: RESP replies as ioredis' default ("legacy") maps them. */
export type FleetRedisOptions = Omit<RedisOptions, 'replyMapping'> & { replyMapping?: 'legacy' };

/**
 * The fleet's Redis connections that closed for good without their owner closing them. A worker
 * connection reconnects forever, so status `end` means ioredis gave up on it (seen: a failover announced
 * in the middle of a reconnect's sentinel lookup, patches/ioredis+6.0.0.patch). Nothing in the process
 * uses such a connection again, BullMQ's workers included, and only a restart brings it back: `/livez`
 * fails while one is listed, so the kubelet restarts the process instead of leaving it idle and ready.
 */
export class LostConnections {
  private readonly names: string[] = [];

  constructor(private readonly onLost: (name: string) => void = () => {}) {}

  /** Names of the connections lost so far. */
  list(): readonly string[] {
    return this.names;
  }

  /** A connection with OPTIONS watched under NAME, and every duplicate of it (BullMQ makes them for its workers). */
  connect(options: FleetRedisOptions, name: string): Redis {
    return new WatchedRedis(options, name, this);
  }

  lost(name: string): void {
    this.names.push(name);
    this.onLost(name);
  }
}

/** A connection that tells its watch when it ends without `disconnect()` or `QUIT` from its owner. */
class WatchedRedis extends Redis {
  private closedByOwner = false;
  private duplicates = 0;

  constructor(
    options: FleetRedisOptions,
    private readonly watchName: string,
    private readonly lostTo: LostConnections,
  ) {
    super(options);
    this.on('end', () => {
      if (!this.closedByOwner) this.lostTo.lost(this.watchName);
    });
    // A duplicate is watched too (under NAME#n). Assigned, not declared: ioredis types duplicate() by the
    // reply mapping its override asks for, which a duplicate of a fleet connection never changes.
    this.duplicate = ((override?: Partial<RedisOptions>) => {
      this.duplicates += 1;
      return new WatchedRedis(
        { ...(this.options as FleetRedisOptions), ...(override as Partial<FleetRedisOptions> | undefined) },
        `${this.watchName}#${this.duplicates}`,
        this.lostTo,
      );
    }) as Redis['duplicate'];
  }

  override disconnect(reconnect = false): void {
    if (!reconnect) this.closedByOwner = true;
    super.disconnect(reconnect);
  }

  override sendCommand(...args: Parameters<Redis['sendCommand']>): unknown {
    // QUIT is how BullMQ closes its connections; ioredis ends the connection after its reply.
    if (args[0].name === 'quit') this.closedByOwner = true;
    return super.sendCommand(...args);
  }
}

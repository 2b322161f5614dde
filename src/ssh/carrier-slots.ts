/**
 * The carriers a session host holds at once (`Backhaul.SessionCapacity`), and how many of them one
 * namespace may hold (`Backhaul.NamespaceCapacity`). A shadow takes a slot once its job runs, before it
 * opens its carrier; a shadow still waiting for its job holds none (they are cheap: one batched squeue
 * per login connection), so pods whose jobs are pending never keep another's running job from its
 * tunnel. Waiters are served in order, skipping those whose namespace is at its cap.
 */
export class CarrierSlots {
  private used = 0;
  private readonly byNamespace = new Map<string, number>();
  private readonly waiting: Array<{ namespace: string; grant: (release: () => void) => void }> = [];

  constructor(
    readonly capacity: number,
    readonly perNamespace: number = capacity,
  ) {}

  /** Resolves with the slot's release once one is free for NAMESPACE; rejects when SIGNAL aborts first. */
  acquire(namespace: string, signal?: AbortSignal): Promise<() => void> {
    if (signal?.aborted) return Promise.reject(new Error('closed while waiting for a carrier slot'));
    return new Promise((resolve, reject) => {
      const entry = { namespace, grant: resolve };
      // Behind the waiters, then served as they are: no waiter can be served now (serve() ran at the last
      // release), so only this one may be, and a namespace with room never waits behind one at its share.
      this.waiting.push(entry);
      this.serve();
      if (!this.waiting.includes(entry)) return;
      signal?.addEventListener(
        'abort',
        () => {
          const at = this.waiting.indexOf(entry);
          if (at < 0) return;
          this.waiting.splice(at, 1);
          reject(new Error('closed while waiting for a carrier slot'));
          this.serve();
        },
        { once: true },
      );
    });
  }

  get inUse(): number {
    return this.used;
  }

  get waiters(): number {
    return this.waiting.length;
  }

  private free(namespace: string): boolean {
    return this.used < this.capacity && (this.byNamespace.get(namespace) ?? 0) < this.perNamespace;
  }

  private take(namespace: string): () => void {
    this.used += 1;
    this.byNamespace.set(namespace, (this.byNamespace.get(namespace) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.used -= 1;
      const left = (this.byNamespace.get(namespace) ?? 1) - 1;
      if (left > 0) this.byNamespace.set(namespace, left);
      else this.byNamespace.delete(namespace);
      this.serve();
    };
  }

  private serve(): void {
    for (let i = 0; i < this.waiting.length && this.used < this.capacity; ) {
      const entry = this.waiting[i];
      if (entry && this.free(entry.namespace)) {
        this.waiting.splice(i, 1);
        entry.grant(this.take(entry.namespace));
      } else i += 1;
    }
  }
}

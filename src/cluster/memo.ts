/** Values read recently, by key; one read in flight per key. Entries are dropped once stale. */
export class Memo<T> {
  private readonly entries = new Map<string, { at: number; value: Promise<T> }>();

  constructor(private readonly ttlMs: number) {}

  get(key: string, now: number, read: () => Promise<T>): Promise<T> {
    const hit = this.entries.get(key);
    if (hit && now - hit.at < this.ttlMs) return hit.value;
    // A sweep now and then keeps the map to what was read within the last TTL.
    if (this.entries.size > 1_000) {
      for (const [k, entry] of this.entries) if (now - entry.at >= this.ttlMs) this.entries.delete(k);
    }
    const value = read();
    this.entries.set(key, { at: now, value });
    value.catch(() => this.entries.delete(key));
    return value;
  }
}

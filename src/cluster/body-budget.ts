/**
 * What the webhook may hold of request bodies at once, across all its connections: a request takes its
 * share before it is read (its Content-Length, or chunk by chunk when it has none) and gives it back
 * when answered. Without it, 60 unfinished 4 MiB bodies took a webhook from 90 to 325 MiB, past its
 * pod's limit, and `failurePolicy: Fail` then blocked pod creation in every opted-in namespace.
 */
export class BodyBudget {
  private used = 0;
  private requests = 0;

  constructor(
    readonly maxBytes: number,
    readonly maxRequests: number,
  ) {}

  /** A request begins; false when as many are being read as may be. */
  begin(): boolean {
    if (this.requests >= this.maxRequests) return false;
    this.requests += 1;
    return true;
  }

  end(): void {
    this.requests = Math.max(0, this.requests - 1);
  }

  /** Takes `bytes` of the budget; false (and nothing taken) when that would pass the cap. */
  take(bytes: number): boolean {
    if (this.used + bytes > this.maxBytes) return false;
    this.used += bytes;
    return true;
  }

  give(bytes: number): void {
    this.used = Math.max(0, this.used - bytes);
  }

  get bytesInUse(): number {
    return this.used;
  }
}

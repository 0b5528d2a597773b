// One upstream engine as the proxy sees it: a keep-alive connection pool, a separate one-connection
// pool for health probes (a probe must never queue behind busy request connections: a busy engine
// is not a dead one), an up/down state, the last error, when it last sent any byte (progress), and
// the abort handles of the calls in flight on it (a backend found hung has its stalled calls
// aborted so they fail over). Requests that cannot connect or time out mark the backend down at
// once; an answered 5xx only asks for a probe (the request may be what failed); the health loop
// (server.ts) probes backends back. Round-robin selection skips backends that are down.
import { Pool } from 'undici';
import type { Endpoint } from './topology.js';

export type Role = 'prefiller' | 'decoder';

/** A call in flight on a backend (upstream.ts): aborted with `err` when the backend is found hung or dead. */
export interface InflightCall {
  kill(err: Error): void;
}

export class Backend {
  readonly url: string;
  readonly name: string;
  readonly pool: Pool;
  up = true;
  lastError: string | null = null;
  lastChange = Date.now();
  /** Consecutive failed health probes; a probe alone needs two to mark a backend down. */
  probeFailures = 0;
  /** The health probes' own connection (see the file comment). */
  readonly probePool: Pool;
  /** performance-clock ms of the last byte (headers or body) received from this backend. */
  lastProgress = 0;
  /** Request headers of every call (shared, never modified: undici only reads them). */
  readonly getHeaders: Record<string, string>;
  readonly postHeaders: Record<string, string>;
  /** The calls in flight on this backend (and those that wait on it, like a prefill on its decoder). */
  readonly inflight = new Set<InflightCall>();

  constructor(
    readonly role: Role,
    readonly index: number,
    readonly endpoint: Endpoint,
    connections = 128,
    /** The client API key the engines expect, sent on every call (null: none). */
    apiKey: string | null = null,
  ) {
    const auth: Record<string, string> = apiKey === null ? {} : { authorization: `Bearer ${apiKey}` };
    this.getHeaders = auth;
    this.postHeaders = { ...auth, 'content-type': 'application/json' };
    this.url = `http://${endpoint.host}:${endpoint.port}`;
    this.name = `${role}-${index}(${endpoint.host}:${endpoint.port})`;
    this.pool = new Pool(this.url, {
      connections,
      // Fail fast on a dead port: a refused or unreachable backend must not hold a request.
      connect: { timeout: 3_000 },
      keepAliveTimeout: 30_000,
    });
    this.probePool = new Pool(this.url, { connections: 1, connect: { timeout: 3_000 }, keepAliveTimeout: 30_000 });
  }

  /** Aborts every call in flight on this backend with `err` (it was found hung or dead). */
  abortInflight(err: Error): number {
    const all = [...this.inflight];
    this.inflight.clear();
    for (const c of all) c.kill(err);
    return all.length;
  }

  markDown(reason: string): boolean {
    this.lastError = reason;
    if (!this.up) return false;
    this.up = false;
    this.lastChange = Date.now();
    return true;
  }

  markUp(): boolean {
    this.probeFailures = 0;
    if (this.up) return false;
    this.up = true;
    this.lastChange = Date.now();
    return true;
  }

  status() {
    return {
      url: this.url,
      up: this.up,
      since: new Date(this.lastChange).toISOString(),
      last_error: this.lastError,
    };
  }

  async close(): Promise<void> {
    await Promise.all([this.pool.destroy().catch(() => undefined), this.probePool.destroy().catch(() => undefined)]);
  }
}

/**
 * Round-robin over a list of backends, skipping those that are down. The turn advances past
 * the backend a request actually gets (the first healthy one from the current turn), not by
 * one slot per request: with backend k down, its load is shared by all healthy backends
 * instead of falling entirely on k+1.
 */
export class RoundRobin {
  private next = 0;
  constructor(readonly backends: Backend[]) {}

  /**
   * The healthy backends in the order this request should try them (first = its turn); the
   * next request starts after that first one. With none healthy: an empty list, and the turn
   * moves on by one (see `orderOrAny`).
   */
  order(): Backend[] {
    const n = this.backends.length;
    const start = this.next;
    const out: Backend[] = [];
    for (let i = 0; i < n; i++) {
      const b = this.backends[(start + i) % n]!;
      if (b.up) {
        if (out.length === 0) this.next = (start + i + 1) % n;
        out.push(b);
      }
    }
    if (out.length === 0) this.next = (start + 1) % n;
    return out;
  }

  /** Like order(), but with none healthy the one whose turn it is anyway (its state may be stale). */
  orderOrAny(): Backend[] {
    const start = this.next;
    const out = this.order();
    if (out.length === 0 && this.backends.length) out.push(this.backends[start % this.backends.length]!);
    return out;
  }
}

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

/**
 * A call in flight (upstream.ts): aborted with `err` when its backend, or the backend it waits
 * on, is found hung or dead. `at` holds its index in those two backends' lists (-1: not on it);
 * InflightList keeps them right.
 */
export interface InflightCall {
  kill(err: Error): void;
  at: [own: number, waitsOn: number];
}

/** Which of a call's two places a list entry is: on its own backend, or on the one it waits on. */
export type InflightRole = 0 | 1;

/**
 * The calls in flight on one backend. Three calls per client request come and go through here,
 * so adding and removing is a push and a swap with the last element: no hashing and no
 * allocation once the arrays have grown.
 */
export class InflightList {
  private readonly calls: InflightCall[] = [];
  private readonly roles: InflightRole[] = [];

  get size(): number {
    return this.calls.length;
  }

  add(c: InflightCall, role: InflightRole): void {
    c.at[role] = this.calls.length;
    this.calls.push(c);
    this.roles.push(role);
  }

  delete(c: InflightCall, role: InflightRole): void {
    const i = c.at[role];
    if (i < 0 || this.calls[i] !== c) return; // not on this list (or taken by take())
    c.at[role] = -1;
    const last = this.calls.pop()!;
    const lastRole = this.roles.pop()!;
    if (last !== c || lastRole !== role) {
      this.calls[i] = last;
      this.roles[i] = lastRole;
      last.at[lastRole] = i;
    }
  }

  /** Empties the list and returns the calls it held. */
  take(): InflightCall[] {
    for (let i = 0; i < this.calls.length; i++) this.calls[i]!.at[this.roles[i]!] = -1;
    this.roles.length = 0;
    return this.calls.splice(0);
  }
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
  /** The model's context length as this backend's /health gave it (null: not known yet). */
  maxModelLen: number | null = null;
  /** performance-clock ms of the last byte (headers or body) received from this backend. */
  lastProgress = 0;
  /** Request headers of every call (shared, never modified: undici only reads them). */
  readonly getHeaders: Record<string, string>;
  readonly postHeaders: Record<string, string>;
  /** The calls in flight on this backend (and those that wait on it, like a prefill on its decoder). */
  readonly inflight = new InflightList();

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
    const all = this.inflight.take();
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

// One upstream engine as the proxy sees it: a keep-alive connection pool, an up/down state
// and the last error. Requests that fail to connect, time out or answer 5xx mark the backend
// down at once; the health loop (health.ts) probes it back. Round-robin selection skips
// backends that are down.
import { Pool } from 'undici';
import type { Endpoint } from './topology.js';

export type Role = 'prefiller' | 'decoder';

export class Backend {
  readonly url: string;
  readonly name: string;
  readonly pool: Pool;
  up = true;
  lastError: string | null = null;
  lastChange = Date.now();
  /** Consecutive failed health probes; a probe alone needs two to mark a backend down. */
  probeFailures = 0;

  constructor(
    readonly role: Role,
    readonly index: number,
    readonly endpoint: Endpoint,
    connections = 128,
  ) {
    this.url = `http://${endpoint.host}:${endpoint.port}`;
    this.name = `${role}-${index}(${endpoint.host}:${endpoint.port})`;
    this.pool = new Pool(this.url, {
      connections,
      // Fail fast on a dead port: a refused or unreachable backend must not hold a request.
      connect: { timeout: 3_000 },
      keepAliveTimeout: 30_000,
    });
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
    await this.pool.destroy().catch(() => undefined);
  }
}

/** Round-robin over a list of backends, skipping those that are down. */
export class RoundRobin {
  private next = 0;
  constructor(readonly backends: Backend[]) {}

  /** The healthy backends in the order this request should try them (first = its turn). */
  order(): Backend[] {
    const n = this.backends.length;
    const start = this.next;
    this.next = (this.next + 1) % n;
    const out: Backend[] = [];
    for (let i = 0; i < n; i++) {
      const b = this.backends[(start + i) % n]!;
      if (b.up) out.push(b);
    }
    return out;
  }

  /** Next backend whose turn it is among the healthy ones; with none healthy, the next in line anyway. */
  pick(): Backend {
    const healthy = this.order();
    if (healthy.length) return healthy[0]!;
    return this.backends[(this.next + this.backends.length - 1) % this.backends.length]!;
  }
}

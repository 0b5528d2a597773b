// P2P prefix sharing (LMCache's enable_p2p; docs/p2p.md). After the local tiers (and the remote
// tier, when configured) stop at the first chunk they lack, the engine's connector hands the
// prompt's remaining chunk keys here:
//   1. the controller is asked which other instances hold the leading ones (p2p_lookup over the
//      monitor connection, answered from its index: src/protocol/p2p_holders.ts);
//   2. the run is pulled from the best holder's peer port (src/kvc/p2p_fetch.ts), every chunk
//      verified; when a holder fails part way, the next holder is asked for the rest; then the
//      runs that continue it (later chunks another instance holds without the prefix's head),
//      stepping over keys this instance holds itself;
//   3. what arrived is promoted into the local CPU tier (the controller sees the admit) and
//      returned, so the connector imports it exactly like a local hit.
// One time bound covers all of it: p2p_timeout_ms for the holder query, extended once the holders
// are known by the bytes they named at the transfer contract's slowest rate
// (transferDeadlineMs, src/common/transfer_seam.ts); whatever has arrived by then is used and the
// rest is computed. Nothing here throws: any failure means "compute the rest".
import { chunkBytes, type KvLayout } from '../common/chunk.js';
import { transferDeadlineMs } from '../common/transfer_seam.js';
import { logger } from '../common/log.js';
import type { P2pHolder } from '../protocol/p2p_holders.js';
import { fetchFromPeer, type P2pFailure } from './p2p_fetch.js';
import { PeerConnPool } from './p2p_pool.js';
import type { P2pMetrics, P2pOutcome } from './p2p_metrics.js';
import type { KvcStore } from './store.js';
import type { PutOptions } from './types.js';

const log = logger('kvc.p2p');

export interface P2pClientOptions {
  store: KvcStore;
  /** This instance's id: its own chunks are never fetched from itself. */
  instanceId: string;
  layout: KvLayout;
  chunkSize: number;
  timeoutMs: number;
  /** Asks the controller (rejects when it is not connected or does not answer in time). */
  askHolders: (keys: readonly string[], timeoutMs: number) => Promise<P2pHolder[]>;
  metrics: P2pMetrics;
  /** Keep connections to holders between fetches (default true; docs/p2p.md "Connection reuse"). */
  reuseConnections?: boolean;
}

/** One warning per failure reason per this many ms (a controller that is down would otherwise log once per request). */
const WARN_EVERY_MS = 10_000;

export class P2pClient {
  private readonly warned = new Map<P2pFailure, { at: number; suppressed: number }>();
  private readonly pool: PeerConnPool | undefined;

  constructor(private readonly o: P2pClientOptions) {
    const m = o.metrics;
    this.pool =
      o.reuseConnections === false
        ? undefined
        : new PeerConnPool({ onConnection: (how) => m.connections.inc({ how }), onIdle: (d) => m.idleConnections.inc(d) });
  }

  /** Closes the connections kept to holders. */
  close(): void {
    this.pool?.close();
  }

  /**
   * Fetches the leading run of `keys` (consecutive chunk keys the local tiers lack) from peers.
   * Returns the verified chunks that arrived, by key; never throws, never takes longer than the
   * time bound (plus the CPU-tier copies of what arrived). `admit` says how the copies enter the
   * CPU tier (evictFirst: at the cold end, since the holder keeps its own).
   */
  async fetch(keys: readonly string[], admit: PutOptions = {}): Promise<Map<string, Uint8Array>> {
    const out = new Map<string, Uint8Array>();
    if (keys.length === 0) return out;
    const m = this.o.metrics;
    const t0 = performance.now();
    const start = Date.now();
    let deadline = start + this.o.timeoutMs;
    m.inFlight.inc();
    let outcome: P2pOutcome = 'failed';
    try {
      let holders: P2pHolder[];
      try {
        holders = await this.o.askHolders(keys, this.o.timeoutMs);
      } catch (e) {
        this.fail('controller', `holder query failed: ${(e as Error).message}`);
        return out;
      }
      if (holders.length === 0) {
        outcome = 'no_holder';
        return out;
      }
      const named = coverage(holders, keys.length);
      // Bounded by size too: p2p_timeout_ms is the floor of a fetch of `named` full chunks.
      deadline = start + transferDeadlineMs(this.o.timeoutMs, named * chunkBytes(this.o.layout, this.o.chunkSize));
      let next = 0;
      let bytes = 0;
      for (const h of holders) {
        const from = h.from ?? 0;
        // A continuing run starts past keys this instance holds itself (the controller stepped
        // over them): the connector reads those from its own tiers. Still there, or the chain breaks.
        if (from > next && keys.slice(next, from).every((k) => this.o.store.has(k))) next = from;
        const end = Math.min(keys.length, from + h.chunks);
        if (from > next || end <= next) continue;
        if (Date.now() >= deadline) {
          this.fail('timeout', `no time left for ${h.instance_id} (${next}/${named} chunks arrived)`);
          break;
        }
        const r = await fetchFromPeer({ peerUrl: h.peer_url, keys: keys.slice(next, end), from: this.o.instanceId, deadline, layout: this.o.layout, chunkSize: this.o.chunkSize, ...(this.pool ? { pool: this.pool } : {}) });
        for (const c of r.chunks) {
          out.set(keys[next]!, c);
          bytes += c.byteLength;
          next++;
        }
        if (r.failure) this.fail(r.failure, `from ${h.instance_id}: ${r.error}`);
        // A holder that answered FETCH_END ok but sent fewer than the index said lost them
        // meanwhile (evicted): the next holder may still have them.
        if (next >= named) break;
      }
      outcome = next === 0 ? 'failed' : next >= named ? 'hit' : 'partial';
      if (next > 0) {
        m.chunks.inc(next);
        m.bytes.inc(bytes);
        this.promote(out, admit);
      }
      return out;
    } finally {
      m.inFlight.dec();
      m.fetches.inc({ outcome });
      m.seconds.observe({ outcome }, (performance.now() - t0) / 1000);
    }
  }

  private fail(reason: P2pFailure, msg: string): void {
    this.o.metrics.failures.inc({ reason });
    const now = Date.now();
    const w = this.warned.get(reason);
    if (w && now - w.at < WARN_EVERY_MS) {
      w.suppressed++;
      return;
    }
    const more = w?.suppressed ? ` (${w.suppressed} more "${reason}" failure(s) since the last warning)` : '';
    this.warned.set(reason, { at: now, suppressed: 0 });
    log.warn(`P2P fetch: ${msg}; computing the rest${more}`);
  }

  /** Into the CPU tier, like a disk or remote hit: the next request finds them locally. */
  private promote(chunks: Map<string, Uint8Array>, admit: PutOptions): void {
    for (const [key, c] of chunks) {
      try {
        this.o.store.promoteFetched(key, c, admit);
      } catch (e) {
        // A full CPU tier (everything pinned): the request still uses the bytes it holds.
        log.debug(`P2P chunk ${key} not promoted: ${(e as Error).message}`);
      }
    }
  }
}

/**
 * How far the answer reaches: the end of its last run. The leading runs start at key 0 and the
 * continuing ones each start at or past the end of the run before (past it by the asker's own
 * keys), so the chain is unbroken up to there.
 */
export function coverage(holders: readonly P2pHolder[], keys: number): number {
  let end = 0;
  for (const h of holders) end = Math.max(end, (h.from ?? 0) + h.chunks);
  return Math.min(keys, end);
}

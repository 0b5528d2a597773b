// Replica hints (docs/storage.md "Replica-aware eviction"; message: src/protocol/replica_hint.ts).
//
// The controller sees every admission and eviction of every instance, so it alone knows whether a
// chunk is a duplicate. Each instance's tiers hold only part of the working set; when they fill
// with the same hot prefixes (a prefiller's computed chunks and the copies its decoder received,
// in lockstep), the other prefixes are evicted everywhere and must be computed again. The rule:
//   - an instance that admits a chunk another instance already holds is told `held_elsewhere`:
//     its copy joins the replica segment of its eviction order (src/kvc/lru_index.ts: after the
//     cold chunks, before everything else, newest first; a read there keeps it a replica, moved
//     to the oldest end of the segment),
//   - when evictions, or a worker leaving the index (sign-off, reap, re-registration: the keys
//     come from ChunkIndex.dropHolders' rebuild walk), leave a chunk on one instance only, that
//     instance is told it holds the last copy: the chunk is evicted by plain recency again;
//   - when the first copy leaves and several remain, the oldest remaining holder (the index keeps
//     holders in admission order) gets the same hint: it keeps the chunk from now on.
// So exactly one copy of each chunk is ordinary (the first one), every other is a replica. A later
// copy never demotes the first one (where the chunk was computed, or where it survived), a read of
// a replica keeps it a replica, and a replica or any evict-first copy never displaces an ordinary
// chunk still in use (src/kvc/lru_index.ts; one unused for a while goes stale): a deployment keeps
// every prefix in use somewhere for as long as its tiers together can hold them, before keeping
// any prefix twice.
//
// Hints are batched per (instance, location) and sent once the current event-loop turn's ops are
// applied; at most MAX_PENDING keys wait per instance (more are dropped and counted: a lost hint
// only makes eviction less informed, never wrong).
import { REPLICA_HINT_MAX_KEYS, type ReplicaHintMsg } from '../protocol/replica_hint.js';
import type { Registry, WorkerRec } from './registry.js';

/** Keys waiting per instance before further hints to it are dropped. */
const MAX_PENDING = 4 * REPLICA_HINT_MAX_KEYS;

interface Pending {
  w: WorkerRec;
  /** location → keys as (hi, lo) pairs and one flag per key (1 = held elsewhere). */
  byLocation: Map<string, { halves: number[]; flags: number[] }>;
  count: number;
}

export class ReplicaHints {
  private readonly pending = new Map<string, Pending>();
  private scheduled = false;
  private readonly scratch: number[] = [];

  constructor(
    private readonly registry: Registry,
    private readonly send: (routingId: string, msg: ReplicaHintMsg) => void,
  ) {}

  /** An admission of `w` beside other holders: a duplicate when some other instance holds it. */
  admittedShared(w: WorkerRec, location: string, hi: number, lo: number): void {
    const holders = this.holders(hi, lo);
    if (holders.some((h) => this.registry.holder(h)?.worker !== w)) this.queue(w, location, hi, lo, 1);
  }

  /**
   * An eviction or a departure that left holders. When what remains is on one instance, it holds
   * the last copy; when the first copy left (`firstLeft`) and several remain, the oldest remaining
   * holder keeps it from now on. Either way that instance is told its copy is not held elsewhere,
   * so it is evicted by recency again, and every other holder's copy stays a duplicate.
   */
  evictedLeft(hi: number, lo: number, firstLeft = false): void {
    const holders = this.holders(hi, lo);
    const keeper = this.registry.holder(holders[0]!)?.worker;
    if (!keeper) return;
    if (!firstLeft && holders.some((h) => this.registry.holder(h)?.worker !== keeper)) return;
    for (const h of holders) {
      const rec = this.registry.holder(h);
      if (rec?.worker === keeper) this.queue(keeper, rec.location, hi, lo, 0);
    }
  }

  private holders(hi: number, lo: number): number[] {
    this.scratch.length = 0;
    return this.registry.index.holdersOf(hi, lo, this.scratch);
  }

  private queue(w: WorkerRec, location: string, hi: number, lo: number, elsewhere: 0 | 1): void {
    let p = this.pending.get(w.routingId);
    if (!p) this.pending.set(w.routingId, (p = { w, byLocation: new Map(), count: 0 }));
    if (p.count >= MAX_PENDING) {
      this.registry.stats.replicaHintsDropped++;
      return;
    }
    let l = p.byLocation.get(location);
    if (!l) p.byLocation.set(location, (l = { halves: [], flags: [] }));
    l.halves.push(hi, lo);
    l.flags.push(elsewhere);
    p.count++;
    if (elsewhere) this.registry.stats.replicaHeldElsewhere++;
    else this.registry.stats.replicaLastCopy++;
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => this.flush());
    }
  }

  private flush(): void {
    this.scheduled = false;
    for (const [routingId, p] of this.pending) {
      // An instance that left (or re-registered as a new session) since: its hints are moot.
      if (this.registry.worker(routingId) !== p.w) continue;
      for (const [location, l] of p.byLocation) {
        for (let k = 0; k < l.flags.length; k += REPLICA_HINT_MAX_KEYS) {
          const n = Math.min(REPLICA_HINT_MAX_KEYS, l.flags.length - k);
          const keys = new Uint8Array(n * 8);
          const dv = new DataView(keys.buffer);
          for (let i = 0; i < n; i++) {
            dv.setUint32(i * 8, l.halves[2 * (k + i)]!);
            dv.setUint32(i * 8 + 4, l.halves[2 * (k + i) + 1]!);
          }
          this.send(routingId, { t: 'replicas', location, keys, held_elsewhere: Uint8Array.from(l.flags.slice(k, k + n)) });
        }
      }
    }
    this.pending.clear();
  }
}

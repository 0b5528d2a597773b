// What an instance worker does when the controller asks: lookups, pins, clears and moves on
// its own KvcStore. A move/copy is "copy everything, confirm everything, then delete": the
// source removes its chunks only after the destination (another location here, or another
// instance over distributed_url) has confirmed that it holds every one of them at the end of
// the transfer, so a failure at any point leaves the source exactly as it was.
//
// The delete phase is the point of no return, and it is guarded: it starts only if the
// command's deadline has not passed and the controller's request is still there (a controller
// that gave up has already marked the event failed, so the source must then stay).
//
// Pins (docs/controller.md "Pins, moves and copies"): a move carries each chunk's pin to the
// destination (pinned there once committed, before its source copy is deleted); a copy leaves the
// source's pins where they are and its new copies unpinned (evictable replicas).
import type { MoveCommand, RecodeCommand } from '../protocol/worker_api.js';
import { codecByName } from '../common/chunk_codec.js';
import { ERRORS, KvcError, kvcError, timedOut, upstreamFailed } from '../common/errors.js';
import type { KvcStore } from './store.js';
import { chunkForSend, transferHolds, type TransferHolds } from './transfer_holds.js';
import { StoreFullError, type LocationName } from './types.js';
import { sendChunks } from './worker_peer.js';

export type { MoveCommand } from '../protocol/worker_api.js';

export interface WorkerOpsOptions {
  /** Clock for deadlines (tests inject one to pass a deadline at an exact point). */
  now?: () => number;
}

export class WorkerOps {
  private readonly holds: TransferHolds;
  private readonly now: () => number;
  /** Moves/copies currently executing (reported by GET /health). */
  movesInFlight = 0;

  constructor(
    private readonly store: KvcStore,
    private readonly instanceId: string,
    o: WorkerOpsOptions = {},
  ) {
    this.holds = transferHolds(store);
    this.now = o.now ?? Date.now;
  }

  lookup(keys: string[], location: LocationName): number {
    this.store.assertLocation(location);
    return this.store.lookupPrefix(keys, location);
  }

  /** Pins each present key; returns how many are pinned afterwards. */
  pin(keys: string[], location: LocationName): number {
    return this.forEachPresent(keys, location, (k) => this.holds.pin(k, location));
  }

  /** Unpins each present key; returns how many were unpinned. */
  unpin(keys: string[], location: LocationName): number {
    return this.forEachPresent(keys, location, (k) => this.holds.unpin(k, location));
  }

  // Pins and unpins go through the hold registry: a chunk a transfer holds stays pinned until the
  // transfer ends, and the request decides what it is afterwards.
  private forEachPresent(keys: string[], location: LocationName, op: (key: string) => void): number {
    this.store.assertLocation(location);
    let n = 0;
    for (const k of keys) {
      if (!this.store.has(k, location)) continue;
      op(k);
      n++;
    }
    return n;
  }

  /**
   * Re-encodes each held key of the location with the command's codec, in place (KvcStore.recode),
   * one chunk at a time; returns how many are held in that codec afterwards. A chunk that cannot be
   * re-encoded (no room to grow it, a non-finite value) stops the command with an error naming it
   * and the count done: every chunk, re-encoded or not, stays a valid chunk under its key.
   */
  async recode(cmd: RecodeCommand): Promise<number> {
    this.store.assertLocation(cmd.location);
    const codec = codecByName(cmd.codec);
    const deadline = this.now() + cmd.deadline_ms;
    let n = 0;
    for (const k of cmd.keys) {
      if (this.now() > deadline) throw timedOut(`recode to ${cmd.codec} on instance "${this.instanceId}" ${cmd.location} did not complete within ${cmd.deadline_ms} ms (${n} of ${cmd.keys.length} chunks done)`);
      try {
        if (await this.store.recode(k, cmd.location, codec)) n++;
      } catch (e) {
        throw upstreamFailed(`recode to ${cmd.codec} on instance "${this.instanceId}" ${cmd.location} stopped at chunk ${k} (${n} of ${cmd.keys.length} done): ${(e as Error).message}`);
      }
    }
    return n;
  }

  /**
   * Clears a location; pinned chunks stay unless `includePinned` (the controller's /clear rule).
   * Returns what it removed and what stayed (pinned, or held by a transfer in flight).
   */
  async clear(location: LocationName, includePinned = false): Promise<{ removed: number; kept: number }> {
    this.store.assertLocation(location);
    const removed = await this.store.clear(location, { keepPinned: !includePinned });
    const kept = this.store.stats().find((s) => s.location === location)?.chunks ?? 0;
    return { removed, kept };
  }

  async move(cmd: MoveCommand, signal?: AbortSignal): Promise<number> {
    this.movesInFlight++;
    try {
      return await this.moveInner(cmd, signal);
    } catch (e) {
      if (e instanceof KvcError) throw e;
      if (e instanceof StoreFullError) throw kvcError(ERRORS.store_full, `destination has no room: ${e.message}`);
      throw upstreamFailed(`move from instance "${this.instanceId}" ${cmd.location} failed, source kept intact: ${(e as Error).message}`);
    } finally {
      this.movesInFlight--;
    }
  }

  /** Throws when the move must not go on: the controller's request went away, or the deadline passed. */
  private checkAlive(cmd: MoveCommand, deadline: number, signal: AbortSignal | undefined, what: string): void {
    if (signal?.aborted) {
      throw timedOut(`move from instance "${this.instanceId}" ${cmd.location} cancelled ${what}: the controller's request went away; source kept intact`);
    }
    if (this.now() > deadline) {
      throw timedOut(`move from instance "${this.instanceId}" ${cmd.location} did not complete within ${cmd.deadline_ms} ms (${what}); source kept intact`);
    }
  }

  private async moveInner(cmd: MoveCommand, signal?: AbortSignal): Promise<number> {
    this.store.assertLocation(cmd.location);
    for (const k of cmd.keys) {
      if (!this.store.has(k, cmd.location)) throw kvcError(ERRORS.chunk_gone, `chunk ${k} is no longer in ${cmd.location} of instance "${this.instanceId}"`);
    }
    const deadline = this.now() + cmd.deadline_ms;
    // Which chunks a move must keep pinned at the destination (read before any transfer hold).
    const pinned = cmd.copy ? [] : cmd.keys.flatMap((k, i) => (this.holds.isPinnedForItself(k, cmd.location) ? [i] : []));
    if (cmd.target.distributed_url) {
      // Resolves only once the peer confirmed (COMMIT_OK) that it holds every chunk.
      await sendChunks(cmd.keys, {
        distributedUrl: cmd.target.distributed_url,
        location: cmd.target.location,
        from: `${this.instanceId}/${cmd.location}`,
        deadlineMs: cmd.deadline_ms,
        read: chunkForSend(this.store, cmd.location),
        signal,
        pinned,
      });
      await this.deleteSource(cmd, deadline, signal);
    } else {
      await this.moveLocal(cmd, deadline, signal, pinned, () => this.deleteSource(cmd, deadline, signal));
    }
    return cmd.keys.length;
  }

  /** The delete phase of a move (nothing for a copy). */
  private async deleteSource(cmd: MoveCommand, deadline: number, signal: AbortSignal | undefined): Promise<void> {
    if (cmd.copy) return;
    // Point of no return: the controller must still be waiting for this answer. Checked again
    // before every removal (a disk remove queues behind the tier's writes): once the controller has
    // given up, the rest of the source stays, and the event it reports as failed keeps its chunks.
    let removed = 0;
    for (const k of cmd.keys) {
      this.checkAlive(cmd, deadline, signal, removed ? `after deleting ${removed}/${cmd.keys.length} source chunks` : 'before deleting the source');
      await this.store.remove(k, cmd.location);
      removed++;
    }
  }

  /**
   * Copies the chunks into another location of this instance. Each stored chunk is held (pinned)
   * there until every one is stored and checked, so a destination smaller than the move cannot
   * evict the move's own earlier chunks: the put that finds no room fails instead. `commit` (the
   * delete phase) runs while they are still held.
   */
  private async moveLocal(cmd: MoveCommand, deadline: number, signal: AbortSignal | undefined, pinned: readonly number[], commit: () => Promise<void>): Promise<void> {
    const dst = this.store.backend(cmd.target.location).location;
    const held: string[] = [];
    try {
      for (const k of cmd.keys) {
        this.checkAlive(cmd, deadline, signal, `after ${held.length}/${cmd.keys.length} chunks`);
        const chunk = await this.store.get(k, undefined, cmd.location);
        if (!chunk) throw kvcError(ERRORS.chunk_gone, `chunk ${k} disappeared from ${cmd.location} during the move`);
        await this.store.put(k, chunk, dst);
        if (!this.holds.hold(k, dst)) throw kvcError(ERRORS.chunk_gone, `chunk ${k} was evicted from ${dst} right after it was stored`);
        held.push(k);
      }
      // The destination must still hold every chunk before the source lets go of any.
      const missing = cmd.keys.filter((k) => !this.store.has(k, dst));
      if (missing.length) {
        throw kvcError(ERRORS.chunk_gone, `${dst} of instance "${this.instanceId}" no longer holds ${missing.length} of the ${cmd.keys.length} chunks moved into it (first: ${missing[0]}); source kept intact`);
      }
      // The pins travel before the source lets go (they outlive the holds released below): a
      // move that fails while deleting may leave a pinned duplicate, never a chunk without its pin.
      for (const i of pinned) this.holds.pin(cmd.keys[i]!, dst);
      await commit();
    } finally {
      for (const k of held) this.holds.release(k, dst);
    }
  }
}

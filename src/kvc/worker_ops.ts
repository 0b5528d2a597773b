// What an instance worker does when the controller asks: lookups, pins, clears and moves on
// its own KvcStore. A move/copy is "copy everything, confirm everything, then delete": the
// source removes its chunks only after the destination (another location here, or another
// instance over distributed_url) has confirmed every one of them, so a failure at any point
// leaves the source exactly as it was.
//
// The delete phase is the point of no return, and it is guarded: it starts only if the
// command's deadline has not passed and the controller's request is still there (a controller
// that gave up has already marked the event failed, so the source must then stay).
import { conflict, KvcError, timedOut, upstreamFailed } from '../common/errors.js';
import type { KvcStore } from './store.js';
import { StoreFullError, type LocationName } from './types.js';
import { sendChunks } from './worker_peer.js';

export interface MoveCommand {
  keys: string[];
  location: LocationName;
  copy: boolean;
  target: { location: string; instance_id?: string; distributed_url?: string | null };
  deadline_ms: number;
}

export interface WorkerOpsOptions {
  /** Clock for deadlines (tests inject one to pass a deadline at an exact point). */
  now?: () => number;
}

export class WorkerOps {
  private readonly now: () => number;
  /** Moves/copies currently executing (reported by GET /health). */
  movesInFlight = 0;

  constructor(
    private readonly store: KvcStore,
    private readonly instanceId: string,
    o: WorkerOpsOptions = {},
  ) {
    this.now = o.now ?? Date.now;
  }

  lookup(keys: string[], location: LocationName): number {
    this.store.backend(location);
    return this.store.lookupPrefix(keys, location);
  }

  /** Pins (or unpins) each present key; returns how many are pinned (unpinned) afterwards. */
  pin(keys: string[], location: LocationName, unpin: boolean): number {
    this.store.backend(location);
    let n = 0;
    for (const k of keys) {
      if (!this.store.has(k, location)) continue;
      if (unpin) this.store.unpin(k, location);
      else this.store.pin(k, location);
      n++;
    }
    return n;
  }

  clear(location: LocationName): Promise<number> {
    this.store.backend(location);
    return this.store.clear(location);
  }

  /** Reads a chunk for sending: a zero-copy view from the CPU tier, a copy from elsewhere. */
  private read(location: LocationName): (key: string) => Promise<Uint8Array | null> {
    const cpu = location === 'LocalCPUBackend' ? this.store.cpu() : undefined;
    if (cpu) return async (key) => cpu.peek(key);
    return (key) => this.store.get(key, undefined, location);
  }

  async move(cmd: MoveCommand, signal?: AbortSignal): Promise<number> {
    this.movesInFlight++;
    try {
      return await this.moveInner(cmd, signal);
    } catch (e) {
      if (e instanceof KvcError) throw e;
      if (e instanceof StoreFullError) throw conflict(`destination has no room: ${e.message}`, 'store_full');
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
    this.store.backend(cmd.location);
    for (const k of cmd.keys) {
      if (!this.store.has(k, cmd.location)) throw conflict(`chunk ${k} is no longer in ${cmd.location} of instance "${this.instanceId}"`, 'chunk_gone');
    }
    const deadline = this.now() + cmd.deadline_ms;
    if (cmd.target.distributed_url) {
      await sendChunks(cmd.keys, {
        distributedUrl: cmd.target.distributed_url,
        location: cmd.target.location,
        from: `${this.instanceId}/${cmd.location}`,
        deadlineMs: cmd.deadline_ms,
        read: this.read(cmd.location),
        signal,
      });
    } else {
      const dst = this.store.backend(cmd.target.location).location;
      for (const k of cmd.keys) {
        this.checkAlive(cmd, deadline, signal, `after ${cmd.keys.indexOf(k)}/${cmd.keys.length} chunks`);
        const chunk = await this.store.get(k, undefined, cmd.location);
        if (!chunk) throw conflict(`chunk ${k} disappeared from ${cmd.location} during the move`, 'chunk_gone');
        await this.store.put(k, chunk, dst);
      }
    }
    // Every chunk is confirmed at the destination: only now may the source let go, and only if
    // the controller is still waiting for this answer (point of no return).
    if (!cmd.copy) {
      this.checkAlive(cmd, deadline, signal, 'before deleting the source');
      for (const k of cmd.keys) await this.store.remove(k, cmd.location);
    }
    return cmd.keys.length;
  }
}

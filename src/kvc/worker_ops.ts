// What an instance worker does when the controller asks: lookups, pins, clears and moves on
// its own KvcStore. A move/copy is "copy everything, confirm everything, then delete": the
// source removes its chunks only after the destination (another location here, or another
// instance over distributed_url) has confirmed every one of them, so a failure at any point
// leaves the source exactly as it was.
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

export class WorkerOps {
  constructor(
    private readonly store: KvcStore,
    private readonly instanceId: string,
  ) {}

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

  async move(cmd: MoveCommand): Promise<number> {
    try {
      return await this.moveInner(cmd);
    } catch (e) {
      if (e instanceof KvcError) throw e;
      if (e instanceof StoreFullError) throw conflict(`destination has no room: ${e.message}`, 'store_full');
      throw upstreamFailed(`move from instance "${this.instanceId}" ${cmd.location} failed, source kept intact: ${(e as Error).message}`);
    }
  }

  private async moveInner(cmd: MoveCommand): Promise<number> {
    this.store.backend(cmd.location);
    for (const k of cmd.keys) {
      if (!this.store.has(k, cmd.location)) throw conflict(`chunk ${k} is no longer in ${cmd.location} of instance "${this.instanceId}"`, 'chunk_gone');
    }
    const deadline = Date.now() + cmd.deadline_ms;
    if (cmd.target.distributed_url) {
      await sendChunks(cmd.keys, {
        distributedUrl: cmd.target.distributed_url,
        location: cmd.target.location,
        from: `${this.instanceId}/${cmd.location}`,
        deadlineMs: cmd.deadline_ms,
        read: this.read(cmd.location),
      });
    } else {
      const dst = this.store.backend(cmd.target.location).location;
      for (const k of cmd.keys) {
        if (Date.now() > deadline) throw timedOut(`move within instance "${this.instanceId}" did not complete within ${cmd.deadline_ms} ms`);
        const chunk = await this.store.get(k, undefined, cmd.location);
        if (!chunk) throw conflict(`chunk ${k} disappeared from ${cmd.location} during the move`, 'chunk_gone');
        await this.store.put(k, chunk, dst);
      }
    }
    // Every chunk is confirmed at the destination: only now may the source let go.
    if (!cmd.copy) for (const k of cmd.keys) await this.store.remove(k, cmd.location);
    return cmd.keys.length;
  }
}

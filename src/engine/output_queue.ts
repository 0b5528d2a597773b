// Output that may wait for the next model forward: the socket writes of a decode step's events.
//
// A decode step at batch 8 ends with eight SSE events, each one system call into a socket, which on
// loopback also runs the receiver's side of TCP: tens of µs each, on the main thread, while the
// kernel's second thread sleeps between forwards. Queued here instead, they are written during the
// next forward, by the main thread, while the kernel's helper thread computes a shared product
// (kernel.ts SideWork): the writes then take time the main thread would have spent on its own
// share of that product, not time between steps. A token's event leaves up to one step later
// than it would otherwise (at the first shared product of the next forward: early in it); the
// interval between a stream's events is unchanged.
//
// The queue is flushed in full when the forward ends with writes left (its products were too
// short to hide them), when the scheduler has nothing to run, and by a writer that ends its
// answer (SseWriter.end writes what it has queued first). So no write waits longer than one step.
import { logger } from '../common/log.js';
import type { SideWork } from './model/kernel.js';

const log = logger('engine.output');

/** Something holding output back until the queue flushes it. */
export interface Deferred {
  /** Writes what it holds (nothing when it was flushed already). Called once per add(). */
  flushDeferred(): void;
}

export class OutputQueue implements SideWork {
  private items: Deferred[] = [];
  private head = 0;

  /** Number of entries not yet flushed. */
  get size(): number {
    return this.items.length - this.head;
  }

  add(d: Deferred): void {
    this.items.push(d);
  }

  /** Flushes one entry; true when entries are left. */
  runOne(): boolean {
    if (this.head >= this.items.length) return false;
    const d = this.items[this.head++]!;
    try {
      d.flushDeferred();
    } catch (e) {
      // A socket error surfaces on the response ('close'/'error' events); it must not reach the
      // kernel product this runs inside of.
      log.warn(`deferred write failed: ${(e as Error).message}`);
    }
    if (this.head < this.items.length) return true;
    this.items.length = 0;
    this.head = 0;
    return false;
  }

  flushAll(): void {
    while (this.runOne());
  }
}

// xfer receiver (decoder side; design: docs/xfer.md): the engine's kv_consumer API over a receive
// buffer (receive_buffer.ts: chunks, reservations, ALLOC queue, byte accounting) that two
// listeners fill (receiver_listeners.ts: the init port's HELLO and DATA, the alloc port's ALLOC).
//
// Consumer API: lookup(keys), take(keys, reqId?) → leading ready chunks + release(),
// release(reqId), stats(); event 'complete' (reqId, keys) when every chunk of a reservation is
// here and verified. Reservations never taken expire after ttlMs.
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { XFER_DEADLINE_FLOOR_DEFAULT_MS } from '../common/config.js';
import { chunkBytes, describeLayout, type KvLayout } from '../common/chunk.js';
import { logger } from '../common/log.js';
import { ReceiveBuffer, type ReceiverStats, type Taken } from './receive_buffer.js';
import { ReceiverListeners } from './receiver_listeners.js';

export type { ReceiverStats, Taken, TransferOutcome } from './receive_buffer.js';
export { TRANSFER_OUTCOMES } from './receive_buffer.js';

const log = logger('xfer-recv');
/** How long a reservation nobody takes (its request ended, or never came) is kept before the sweep frees it. */
export const RESERVATION_TTL_MS = 120_000;
/**
 * How long after its transfer ended a reservation waits for its request to arrive: the proxy calls
 * the decoder as soon as the prefiller answers, which it does when the transfer ends, so only a
 * request whose proxy died (or is stalled) in between misses it; the decoder then computes.
 */
export const RESERVATION_CLAIM_MS = 10_000;

export interface ReceiverOptions {
  host: string;
  initPort: number;
  allocPort: number;
  /** xfer_buffer_size: upper bound of reserved bytes. */
  bufferBytes: number;
  layout: KvLayout;
  chunkSize: number;
  modelId: string;
  receiverId?: string;
  /** Reservations not taken within this time are freed (default RESERVATION_TTL_MS). */
  ttlMs?: number;
  /** Unclaimed reservations are freed this long after their transfer ended (default RESERVATION_CLAIM_MS). */
  claimWindowMs?: number;
  /**
   * xfer_deadline_floor_ms: a transfer not complete within this + its bytes / TRANSFER_MIN_RATE
   * after its reservation was granted is abandoned (default 5 s).
   */
  deadlineFloorMs?: number;
  /** Upper bound on how long an ALLOC may wait for space, whatever the sender asks (default 30 s). */
  maxAllocWaitMs?: number;
  /** A sender whose HELLO does not arrive within this time is dropped (default 10 s). */
  helloTimeoutMs?: number;
  /**
   * Most bytes one sender session may hold reserved at once (default: half of bufferBytes while
   * more than one sender is connected, all of it for a lone sender), so one sender cannot take the
   * whole buffer from the others; an ALLOC over it waits like one for a
   * full buffer, without holding up other senders' ALLOCs.
   */
  maxReservedPerSender?: number;
  /**
   * Keys the engine's own cache already holds: an ALLOC reports them in `have` (so the sender
   * skips them) without reserving room, and take() steps over them (the engine reads them from
   * its cache). A key evicted in between is simply missing at load: the engine computes from there.
   */
  heldLocally?: (key: string) => boolean;
}

export class XferReceiver extends EventEmitter {
  readonly receiverId: string;
  private readonly buffer: ReceiveBuffer;
  private ports: ReceiverListeners | null = null;
  private sweepTimer: NodeJS.Timeout | null = null;
  private readonly ttlMs: number;

  private constructor(readonly opts: ReceiverOptions) {
    super();
    this.receiverId = opts.receiverId ?? `recv-${randomBytes(4).toString('hex')}`;
    this.ttlMs = opts.ttlMs ?? RESERVATION_TTL_MS;
    this.buffer = new ReceiveBuffer({
      bufferBytes: opts.bufferBytes,
      maxChunkBytes: chunkBytes(opts.layout, opts.chunkSize),
      ttlMs: this.ttlMs,
      claimWindowMs: opts.claimWindowMs ?? RESERVATION_CLAIM_MS,
      maxAllocWaitMs: opts.maxAllocWaitMs ?? 30_000,
      deadlineFloorMs: opts.deadlineFloorMs ?? XFER_DEADLINE_FLOOR_DEFAULT_MS,
      cutSession: (session, why) => this.ports?.cut(session, why),
      ...(opts.maxReservedPerSender !== undefined ? { maxReservedPerSender: opts.maxReservedPerSender } : {}),
      ...(opts.heldLocally ? { heldLocally: opts.heldLocally } : {}),
      onComplete: (reqId, keys) => this.emit('complete', reqId, keys),
    });
  }

  /** Starts both listeners; rejects (e.g. port in use) with a message naming the port. */
  static async start(opts: ReceiverOptions): Promise<XferReceiver> {
    const r = new XferReceiver(opts);
    r.ports = await ReceiverListeners.start(
      {
        host: opts.host,
        initPort: opts.initPort,
        allocPort: opts.allocPort,
        helloTimeoutMs: opts.helloTimeoutMs ?? 10_000,
        modelId: opts.modelId,
        chunkSize: opts.chunkSize,
        layout: opts.layout,
        receiverId: r.receiverId,
        maxChunkBytes: chunkBytes(opts.layout, opts.chunkSize),
      },
      r.buffer,
    );
    r.buffer.prepare();
    const every = Math.max(50, Math.min(5000, Math.floor(r.ttlMs / 4), Math.floor((opts.claimWindowMs ?? RESERVATION_CLAIM_MS) / 4)));
    r.sweepTimer = setInterval(() => r.buffer.sweep(), every);
    r.sweepTimer.unref();
    log.info(
      `receiver ${r.receiverId} listening on ${opts.host} init ${opts.initPort} alloc ${opts.allocPort}; ` +
        `buffer ${opts.bufferBytes} bytes (grown on demand); ${describeLayout(opts.layout)} chunk_size=${opts.chunkSize} model=${opts.modelId}`,
    );
    return r;
  }

  /** Number of leading keys whose chunks are here, complete and verified. */
  lookup(keys: readonly string[]): number {
    return this.buffer.lookup(keys);
  }

  /**
   * Hands out the leading ready chunks for `keys`, holding them until release(). The
   * reservation made for this request (by `reqId`, or without a reqId the oldest unclaimed one
   * whose keys are all among `keys`) is claimed and freed by release() too. When some leading
   * chunk is still arriving, waits up to `waitMs` for it.
   */
  take(keys: readonly string[], reqId?: string, waitMs = 0): Promise<Taken> {
    return this.buffer.take(keys, reqId, waitMs);
  }

  /** Milliseconds until request `reqId`'s transfer must have ended, or null (none in flight). */
  msUntilEnded(reqId: string): number | null {
    return this.buffer.msUntilEnded(reqId);
  }

  /** Frees a request's reservation (e.g. the consumer decided not to use it). */
  release(reqId: string): boolean {
    return this.buffer.release(reqId);
  }

  /**
   * Request `reqId` ended without using its transfer: frees its reservation unless a consumer
   * took it, and refuses an ALLOC for it arriving later (ReceiveBuffer.endRequest).
   */
  endRequest(reqId: string, own = false): 'released' | 'taken' | 'none' {
    return this.buffer.endRequest(reqId, own);
  }

  /** Request `reqId` reached the engine: its reservation waits for it (ReceiveBuffer.claim). */
  claim(reqId: string): boolean {
    return this.buffer.claim(reqId);
  }

  stats(): ReceiverStats {
    return this.buffer.stats();
  }

  async close(): Promise<void> {
    if (this.sweepTimer) clearInterval(this.sweepTimer);
    this.buffer.close();
    await this.ports?.close();
  }
}

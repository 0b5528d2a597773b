// The xfer receiver's buffer: which chunks it holds or expects, the reservations that name them,
// the ALLOC queue and the byte accounting (design: docs/xfer.md). No sockets: the listeners
// (receiver_listeners.ts) turn frames into calls here, and the consumer API (receiver.ts) reads
// chunks out, so every rule below can be exercised directly (test/receive_buffer.test.ts).
//
// Memory: chunks are entries shared by reservations (refcounted). Space is accounted in bytes at
// reservation time, in size classes, bounded by xfer_buffer_size; the memory itself comes from a
// SlotArenaPool (src/common/slot_arena.ts) that grows on demand and recycles slots, so an idle
// receiver costs nothing and a busy one writes into warm pages.
import { randomBytes } from 'node:crypto';
import { sizeClass } from '../common/buffer_pool.js';
import { HEADER_BYTES, verifyStreamed } from '../common/chunk.js';
import { logger } from '../common/log.js';
import { SlotArenaPool } from '../common/slot_arena.js';
import type { StreamHash } from '../common/stream_hash.js';
import { transferDeadlineMs } from '../common/transfer_seam.js';
import { allocMetaSchema, describeMeta, type AllocMeta, type DataMeta } from '../protocol/xfer_frames.js';
import type { AllocReply, AllocWaiter, ArrivedChunk, Entry, ReceiveBufferOptions, ReceiverStats, Reservation, Taken, TransferOutcome } from './receive_types.js';

export type { AllocReply, ArrivedChunk, Entry, ReceiveBufferOptions, ReceiverStats, Taken, TransferOutcome } from './receive_types.js';
export { TRANSFER_OUTCOMES } from './receive_types.js';

const log = logger('xfer-recv');
/** Most ended request ids remembered (endRequest); ~100 bytes each. */
const ENDED_CAPACITY = 50_000;

export class ReceiveBuffer {
  private readonly pool: SlotArenaPool;
  private readonly entries = new Map<string, Entry>();
  private readonly reservations = new Map<string, Reservation>();
  private readonly sessions = new Set<string>();
  private readonly allocQueue: AllocWaiter[] = [];
  private reserved = 0;
  private readonly counters = { chunksReceived: 0, bytesReceived: 0, chunksRejected: 0, allocRefused: 0, reservationsExpired: 0, reservationsReleased: 0, reservationsTaken: 0 };
  /**
   * Requests that ended before their transfer was granted or used (endRequest), until their TTL:
   * an ALLOC that arrives for one later (a prefiller still finishing the prompt of a client that
   * left) is refused instead of reserving room nobody will take. Insertion order is expiry order.
   */
  private readonly ended = new Map<string, number>();
  private readonly outcomes: Record<TransferOutcome, number> = { done: 0, failed: 0, abandoned: 0 };
  /** ALLOC / DATA frames seen; the sweep gives idle pool memory back when this did not move. */
  private activity = 0;
  private activityAtSweep = 0;
  private readonly now: () => number;

  constructor(private readonly opts: ReceiveBufferOptions) {
    this.now = opts.now ?? Date.now;
    // Pool budget = accounted capacity: reservations are accounted in size classes, so the
    // pool can always satisfy an entry that fits the reservation budget. Slack of a few chunks:
    // a buffer whose reservation expired mid-transfer is returned only when its last byte has
    // arrived, while its bytes are already free for others.
    this.pool = new SlotArenaPool(opts.bufferBytes + 4 * sizeClass(opts.maxChunkBytes));
  }

  /**
   * Creates the arenas of every slot size up to a full chunk now: their WASM memory grows and the
   * garbage collections V8 answers them with would otherwise land between the decode steps of
   * the transfers that first need each size (src/common/slot_arena.ts).
   */
  prepare(): void {
    this.pool.prepare(this.opts.maxChunkBytes);
  }

  /** Hashes a DATA body in place, in its slot's WASM memory (the frame reader's payload hasher). */
  hasher(body: Uint8Array): StreamHash {
    return this.pool.hasher(body);
  }

  // ---- consumer side ---------------------------------------------------------------------

  /** Number of leading keys whose chunks are here, complete and verified. */
  lookup(keys: readonly string[]): number {
    let n = 0;
    for (const k of keys) {
      if (this.entries.get(k)?.state !== 'ready') break;
      n++;
    }
    return n;
  }

  /**
   * Hands out the leading ready chunks for `keys`, holding them until release(). The
   * reservation made for this request (by `reqId`, or without a reqId the oldest unclaimed one
   * whose keys are all among `keys`) is claimed and freed by release() too. When some leading
   * chunk is still arriving, waits up to `waitMs` for it.
   */
  async take(keys: readonly string[], reqId?: string, waitMs = 0): Promise<Taken> {
    const deadline = Date.now() + waitMs;
    const local = this.opts.heldLocally;
    for (const k of keys) {
      const e = this.entries.get(k);
      if (!e || e.state === 'ready') {
        if (!e && !local?.(k)) break;
        continue;
      }
      const left = deadline - Date.now();
      if (left <= 0) break;
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        e.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
      if (this.entries.get(k)?.state !== 'ready') break;
    }
    let res: Reservation | undefined;
    if (reqId !== undefined) res = this.reservations.get(reqId);
    if (!res && reqId === undefined) {
      // No request id: claim the reservation made for this prompt. With an id that has no
      // reservation, claim nothing (another request's reservation is not ours to free); the
      // chunks themselves are content-addressed and usable either way.
      const set = new Set(keys);
      for (const r of this.reservations.values()) {
        if (!r.claimed && r.keys.every((k) => set.has(k))) {
          res = r;
          break;
        }
      }
    }
    if (res) res.claimed = true;
    const held: Entry[] = [];
    let numTokens = 0;
    for (const k of keys) {
      const e = this.entries.get(k);
      if (!e && local?.(k)) continue; // read from the engine's cache instead
      if (!e || e.state !== 'ready') break;
      e.refs++;
      held.push(e);
      numTokens += new DataView(e.buf!.buffer, e.buf!.byteOffset + 24, 4).getUint32(0, true);
    }
    let released = false;
    const claimed = res;
    return {
      keys: held.map((e) => e.key),
      chunks: held.map((e) => e.buf!.subarray(0, e.bytes)),
      numTokens,
      release: () => {
        if (released) return;
        released = true;
        for (const e of held) this.unref(e);
        if (claimed && this.reservations.get(claimed.reqId) === claimed) {
          this.counters.reservationsTaken++;
          this.dropReservation(claimed);
        }
        this.pumpAllocQueue();
      },
    };
  }

  /**
   * Milliseconds until request `reqId`'s transfer must have ended (its deadline; at that point
   * the chunks not here are discarded and their waiters wake), or null when it has no transfer in
   * flight. A consumer that waits this long waits exactly until the transfer ends.
   */
  msUntilEnded(reqId: string): number | null {
    const r = this.reservations.get(reqId);
    return r && r.outcome === null ? Math.max(0, r.deadline - this.now()) : null;
  }

  /** Frees a request's reservation (e.g. the consumer decided not to use it). */
  release(reqId: string): boolean {
    const r = this.reservations.get(reqId);
    if (!r) return false;
    this.counters.reservationsReleased++;
    this.dropReservation(r);
    this.pumpAllocQueue();
    return true;
  }

  /**
   * Request `reqId` reached the engine: its reservation (if any) is now freed by that request
   * (take's release, or endRequest with `own`), not by the claim window or the TTL.
   */
  claim(reqId: string): boolean {
    const r = this.reservations.get(reqId);
    if (r) r.claimed = true;
    return r !== undefined;
  }

  /**
   * Request `reqId` ended without using its transfer (its client left, it failed, or it went to
   * another decoder): its reservation is freed now unless a consumer took it (that one frees it
   * when done), a queued ALLOC for it is refused, and so is any ALLOC for it arriving within the
   * TTL (`own`: the request that claimed it ends it itself). `released`: a reservation or queued
   * ALLOC was freed; `taken`: its request holds it;
   * `none`: nothing here (yet: a later ALLOC is refused).
   */
  endRequest(reqId: string, own = false): 'released' | 'taken' | 'none' {
    this.remember(reqId);
    const r = this.reservations.get(reqId);
    if (r?.claimed && !own) return 'taken';
    const queued = this.dropQueued((w) => w.meta.req_id === reqId, `request ${reqId} ended before its reservation was granted`);
    if (!r) return queued ? 'released' : 'none';
    // Chunks it reserved and that have not started arriving: its sender's DATA is refused from now on.
    if (r.outcome === null) this.abandon(r.session, reqId, `request ${reqId} ended before its transfer`, 'abandoned');
    this.counters.reservationsReleased++;
    this.dropReservation(r);
    this.pumpAllocQueue();
    return 'released';
  }

  private remember(reqId: string): void {
    const now = this.now();
    this.ended.delete(reqId);
    this.ended.set(reqId, now + this.opts.ttlMs);
    // Bounded: expired ids go first (the oldest come first), then the oldest even if not expired.
    for (const [id, until] of this.ended) {
      if (until > now && this.ended.size <= ENDED_CAPACITY) break;
      this.ended.delete(id);
    }
  }

  stats(): ReceiverStats {
    let ready = 0;
    for (const e of this.entries.values()) if (e.state === 'ready') ready++;
    return {
      capacityBytes: this.opts.bufferBytes,
      reservedBytes: this.reserved,
      poolBytes: this.pool.heldBytes,
      reservations: this.reservations.size,
      entries: this.entries.size,
      readyEntries: ready,
      ...this.counters,
      sessions: this.sessions.size,
      transfers: { ...this.outcomes, inFlight: [...this.reservations.values()].filter((r) => r.outcome === null).length },
    };
  }

  /** Answers every queued ALLOC with a refusal (the receiver is closing). */
  close(): void {
    for (const r of this.reservations.values()) if (r.timer) clearTimeout(r.timer);
    for (const w of this.allocQueue.splice(0)) {
      clearTimeout(w.timer);
      w.reply({ ok: false, error: 'receiver is shutting down' });
    }
  }

  // ---- sender sessions -------------------------------------------------------------------

  /** A sender passed the handshake: its session id, which its ALLOCs and chunks are tied to. */
  openSession(): string {
    const session = randomBytes(8).toString('hex');
    this.sessions.add(session);
    return session;
  }

  hasSession(session: string): boolean {
    return this.sessions.has(session);
  }

  /**
   * The sender's connection closed; `cut` is the entry it was in the middle of writing, if any.
   * A transfer cut mid-chunk is never used: the half-written entry leaves the index. Chunks this
   * sender reserved and never started will not come: they are settled now, so a consumer waiting
   * for them (its own request's, or another's that got them in `have`) wakes at once with what is
   * usable instead of waiting out its timeout. Its queued ALLOCs are refused.
   */
  closeSession(session: string, cut: Entry | null): void {
    this.sessions.delete(session);
    // Its queued ALLOCs go first: the space freed below must not be granted to a closed session.
    this.dropQueued((w) => w.meta.session === session, `sender session ${session} closed`);
    if (cut && cut.writer === session) this.failEntry(cut, 'connection closed in the middle of the chunk');
    this.abandon(session, null, `sender session ${session} closed before sending them`, 'failed');
  }

  // ---- reservations ----------------------------------------------------------------------

  /**
   * An ALLOC (any shape: it is checked here): granted at once when there is room and nobody
   * waits before it, else queued (FIFO) up to min(its wait_ms, maxAllocWaitMs), then refused.
   * `reply` is called exactly once.
   */
  alloc(meta: unknown, reply: (r: AllocReply) => void): void {
    this.activity++;
    const checked = this.validateAlloc(meta);
    if (typeof checked === 'string') return reply({ ok: false, error: checked });
    const m = checked;
    if ((this.ended.get(m.req_id) ?? 0) > this.now()) {
      this.counters.allocRefused++;
      return reply({ ok: false, error: `request ${m.req_id} has ended: its decoder will not take a transfer for it` });
    }
    if (this.reservations.has(m.req_id) || this.allocQueue.some((w) => w.meta.req_id === m.req_id)) {
      return reply({ ok: false, error: `req_id "${m.req_id}" already has a reservation` });
    }
    const need = this.needFor(m);
    if (need > this.opts.bufferBytes) {
      this.counters.allocRefused++;
      return reply({ ok: false, error: `request needs ${need} bytes, more than the whole receiver buffer (${this.opts.bufferBytes})` });
    }
    if (need > this.perSenderLimit) {
      this.counters.allocRefused++;
      return reply({ ok: false, error: `request needs ${need} bytes, more than one sender may hold reserved (${this.perSenderLimit})` });
    }
    if (this.allocQueue.every((x) => this.overSenderLimit(x.meta))) {
      const r = this.tryReserve(m);
      if (r) return reply(r);
    }
    const waitMs = Math.min(m.wait_ms, this.opts.maxAllocWaitMs);
    const w: AllocWaiter = {
      meta: m,
      need,
      deadline: Date.now() + waitMs,
      reply,
      timer: setTimeout(() => {
        const i = this.allocQueue.indexOf(w);
        if (i >= 0) this.allocQueue.splice(i, 1);
        this.counters.allocRefused++;
        const msg = `receiver buffer full: request ${m.req_id} needs ${need} bytes, ${this.reserved} of ${this.opts.bufferBytes} reserved, waited ${waitMs} ms`;
        log.warn(msg);
        reply({ ok: false, error: msg });
        this.pumpAllocQueue();
      }, waitMs),
    };
    this.allocQueue.push(w);
  }

  /** CANCEL on the init port from `session` for `reqId`: its never-sent chunks are discarded. */
  discardUnsent(session: string, reqId: string): number {
    return this.abandon(session, reqId, `sender cancelled request ${reqId}`, 'abandoned');
  }

  /**
   * CANCEL on the alloc port (the sender gave up waiting for the ALLOC's answer): the never-sent
   * chunks are discarded, and the queued ALLOC or the granted reservation goes too.
   */
  withdrawAlloc(session: string, reqId: string): void {
    const res = this.reservations.get(reqId);
    const n = this.discardUnsent(session, reqId);
    this.dropQueued((w) => w.meta.session === session && w.meta.req_id === reqId, `request ${reqId} cancelled by the sender`);
    if (res && res.session === session && !res.claimed) {
      this.counters.reservationsReleased++;
      this.dropReservation(res);
      this.pumpAllocQueue();
    }
    log.info(`request ${reqId}: ALLOC withdrawn by the sender (no answer in time)${n ? `; ${n} chunk(s) discarded` : ''}`);
  }

  /**
   * Frees the reservations not claimed within ttlMs, and — when nothing happened since the last
   * sweep (no ALLOC, no DATA) — gives the recycled buffers back, so a burst does not keep its
   * peak memory for the life of the process. Live buffers are untouched.
   */
  sweep(): void {
    const now = this.now();
    let n = 0;
    for (const r of [...this.reservations.values()]) {
      // Never claimed: its request did not reach this engine within the TTL, or has not come
      // within the claim window after the transfer ended (the proxy calls the decoder as soon as
      // the prefiller answers, which it does when the transfer ends: a proxy that died then).
      if (!r.claimed && (now - r.createdAt > this.opts.ttlMs || (r.endedAt !== null && now - r.endedAt > this.opts.claimWindowMs))) {
        this.dropReservation(r);
        n++;
      }
    }
    for (const [id, until] of this.ended) {
      if (until > now) break;
      this.ended.delete(id);
    }
    if (n) {
      this.counters.reservationsExpired += n;
      log.warn(`${n} reservation(s) expired unused (no request claimed them ${this.opts.claimWindowMs} ms after their transfer ended, or ${this.opts.ttlMs} ms after they were made)`);
      this.pumpAllocQueue();
    }
    if (this.activity === this.activityAtSweep && this.pool.heldBytes > this.pool.inUseBytes) {
      const before = this.pool.heldBytes;
      this.pool.trim();
      log.debug(`idle: buffer pool trimmed from ${before} to ${this.pool.heldBytes} bytes`);
    }
    this.activityAtSweep = this.activity;
  }

  // ---- chunk arrival ---------------------------------------------------------------------

  /**
   * Where the body of a DATA frame from `session` goes: the slot of the pending entry it was
   * reserved for, or null (the body is dropped, and chunkArrived refuses it). Only the session
   * that reserved the chunk, for that request, with the announced length, may write it.
   */
  chunkTarget(session: string, meta: DataMeta, bodyLen: number): Entry | null {
    this.activity++;
    const res = typeof meta.req_id === 'string' ? this.reservations.get(meta.req_id) : undefined;
    const e = typeof meta.key === 'string' ? this.entries.get(meta.key) : undefined;
    if (!e || e.state !== 'pending' || e.writer !== null || bodyLen !== e.bytes) return null;
    // (The reservation itself may be gone already, released by its consumer, while another
    // reservation that got the key in `have` still waits for these bytes.)
    if (e.owner !== session || e.ownerReq !== meta.req_id) return null;
    if (res && (res.session !== session || !res.entries.includes(e))) return null;
    const buf = this.pool.acquire(e.bytes);
    if (!buf) return null; // cannot happen while accounting holds; treated as a rejected chunk
    e.buf = buf;
    e.writer = session;
    return e;
  }

  /**
   * A DATA body has arrived in full: verified against its key and checksum, it becomes ready
   * (waiters wake; `onComplete` when it completes its reservation). The answer is the ACK's.
   */
  chunkArrived(c: ArrivedChunk): { ok: boolean; error?: string } {
    const { meta, entry: e } = c;
    if (!e || !c.body) {
      this.counters.chunksRejected++;
      const cur = typeof meta.key === 'string' ? this.entries.get(meta.key) : undefined;
      return { ok: false, error: cur?.state === 'ready' ? 'already held' : `no reservation expects chunk ${meta.key} of ${c.bodyLen} bytes for request ${meta.req_id}` };
    }
    e.writer = null;
    if (this.entries.get(e.key) !== e) {
      // reservation dropped (expired / released) while the bytes were arriving
      if (e.buf) this.pool.release(e.buf);
      e.buf = null;
      this.counters.chunksRejected++;
      return { ok: false, error: 'reservation expired while receiving' };
    }
    try {
      if (c.payloadSum === null) throw new Error('chunk arrived without its checksum computed');
      verifyStreamed(c.body, e.key, c.payloadSum);
    } catch (err) {
      this.counters.chunksRejected++;
      this.failEntry(e, (err as Error).message);
      return { ok: false, error: (err as Error).message };
    }
    e.state = 'ready';
    this.counters.chunksReceived++;
    this.counters.bytesReceived += c.bodyLen;
    for (const w of e.waiters.splice(0)) w();
    const res = this.reservations.get(meta.req_id);
    // Every transfer waiting for this chunk whose chunks are now all here is done.
    for (const r of this.reservations.values()) {
      if (r.outcome === null && r.entries.includes(e) && r.entries.every((x) => x.state === 'ready' && this.entries.get(x.key) === x)) this.settle(r, 'done');
    }
    if (res && res.entries.every((x) => x.state === 'ready' && this.entries.get(x.key) === x)) this.opts.onComplete?.(res.reqId, res.keys);
    return { ok: true };
  }

  // ---- accounting ------------------------------------------------------------------------

  private unref(e: Entry): void {
    e.refs--;
    if (e.refs > 0) return;
    if (this.entries.get(e.key) === e) this.entries.delete(e.key);
    this.reserved -= e.cost;
    e.cost = 0;
    // Bytes may still be streaming into the buffer: chunkArrived returns it when done.
    if (e.buf && e.writer === null) {
      this.pool.release(e.buf);
      e.buf = null;
    }
    for (const w of e.waiters.splice(0)) w();
  }

  private dropReservation(r: Reservation): void {
    // Released or expired before it ended: whatever had not arrived will not be used.
    this.settle(r, 'abandoned');
    this.reservations.delete(r.reqId);
    for (const e of r.entries) this.unref(e);
  }

  /** Records how transfer `r` ended (once; later calls keep the first outcome). */
  private settle(r: Reservation, outcome: TransferOutcome): void {
    if (r.outcome !== null) return;
    r.outcome = outcome;
    r.endedAt = this.now();
    this.outcomes[outcome]++;
    if (r.timer) clearTimeout(r.timer);
    r.timer = null;
  }

  /** Settles as `outcome` every reservation still in flight that holds entry `e`. */
  private settleHolders(e: Entry, outcome: TransferOutcome): void {
    for (const r of this.reservations.values()) if (r.outcome === null && r.entries.includes(e)) this.settle(r, outcome);
  }

  /**
   * The deadline of transfer `r` passed before it ended: a chunk its sender is writing means a
   * stalled connection (cut; closeSession discards the chunk), chunks not started are discarded.
   * Either way the waiting consumer wakes with what arrived, and the request's room is freed when
   * it is taken (or by the TTL sweep).
   */
  private expire(r: Reservation): void {
    r.timer = null;
    if (r.outcome !== null || this.reservations.get(r.reqId) !== r) return;
    const mine = (e: Entry) => e.owner === r.session && e.ownerReq === r.reqId && this.entries.get(e.key) === e;
    const arrived = r.entries.filter((e) => e.state === 'ready').length;
    const why = `transfer of request ${r.reqId} not complete by its deadline (${arrived}/${r.entries.length} chunks arrived)`;
    log.warn(`${why}: abandoned; the decoder computes the rest`);
    this.settle(r, 'abandoned');
    const writing = r.entries.some((e) => mine(e) && e.state === 'pending' && e.writer === r.session);
    this.abandon(r.session, r.reqId, why, 'abandoned');
    if (writing) this.opts.cutSession?.(r.session, why);
  }

  /** A chunk that failed (corrupt, cut, refused) leaves the index at once: never served. */
  private failEntry(e: Entry, why: string, logIt = true, outcome: TransferOutcome = 'failed'): void {
    this.settleHolders(e, outcome);
    if (this.entries.get(e.key) !== e) {
      // already out of the index (its reservation went away): just give the memory back
      if (e.buf) this.pool.release(e.buf);
      e.buf = null;
      e.writer = null;
      return;
    }
    if (logIt) log.warn(`chunk ${e.key} discarded: ${why}`);
    this.entries.delete(e.key);
    this.reserved -= e.cost;
    if (e.buf) this.pool.release(e.buf);
    e.buf = null;
    e.cost = 0; // refs from reservations still point at it; they find the key gone
    e.writer = null;
    for (const w of e.waiters.splice(0)) w();
    this.pumpAllocQueue();
  }

  /**
   * Discards the chunks `session` reserved (for `reqId`, or for every request) and has not
   * started to send: nobody else will send them, so waiters must not wait for them.
   */
  private abandon(session: string, reqId: string | null, why: string, outcome: TransferOutcome): number {
    const gone: Entry[] = [];
    for (const e of this.entries.values()) {
      if (e.state === 'pending' && e.writer === null && e.owner === session && (reqId === null || e.ownerReq === reqId)) gone.push(e);
    }
    for (const e of gone) this.failEntry(e, why, false, outcome);
    if (gone.length) log.warn(`${gone.length} chunk(s) discarded before arrival: ${why}`);
    return gone.length;
  }

  /** Removes queued ALLOCs matching `pred`, answering them with `error`. */
  private dropQueued(pred: (w: AllocWaiter) => boolean, error: string): number {
    let n = 0;
    for (let i = this.allocQueue.length - 1; i >= 0; i--) {
      const w = this.allocQueue[i]!;
      if (!pred(w)) continue;
      this.allocQueue.splice(i, 1);
      clearTimeout(w.timer);
      w.reply({ ok: false, error });
      n++;
    }
    this.pumpAllocQueue();
    return n;
  }

  /** Space a reservation for `meta` still needs (keys not already held). */
  private needFor(meta: AllocMeta): number {
    let need = 0;
    const seen = new Set<string>();
    for (const [k, b] of meta.chunks) {
      if (this.entries.has(k) || seen.has(k) || this.opts.heldLocally?.(k)) continue;
      seen.add(k);
      need += sizeClass(b);
    }
    return need;
  }

  /** Bytes the session's live reservations hold (chunks it reserved and that are still accounted). */
  private reservedBy(session: string): number {
    let n = 0;
    for (const r of this.reservations.values()) {
      if (r.session !== session) continue;
      for (const e of r.entries) if (e.owner === session && e.ownerReq === r.reqId && this.entries.get(e.key) === e) n += e.cost;
    }
    return n;
  }

  /** The per-sender share: as configured, else half the buffer while more than one sender is connected (a lone sender may use it all). */
  private get perSenderLimit(): number {
    if (this.opts.maxReservedPerSender !== undefined) return this.opts.maxReservedPerSender;
    return this.sessions.size > 1 ? Math.floor(this.opts.bufferBytes / 2) : this.opts.bufferBytes;
  }

  private overSenderLimit(meta: AllocMeta): boolean {
    return this.reservedBy(meta.session) + this.needFor(meta) > this.perSenderLimit;
  }

  private tryReserve(meta: AllocMeta): { ok: true; have: string[] } | null {
    if (this.reserved + this.needFor(meta) > this.opts.bufferBytes) return null;
    if (this.overSenderLimit(meta)) return null;
    const have: string[] = [];
    const keys: string[] = [];
    const held: Entry[] = [];
    for (const [k, b] of meta.chunks) {
      if (keys.includes(k)) continue;
      keys.push(k);
      let e = this.entries.get(k);
      if (!e && this.opts.heldLocally?.(k)) {
        have.push(k); // the engine's cache has it: nothing to send, nothing to reserve
        continue;
      }
      if (e) {
        have.push(k);
      } else {
        e = { key: k, cost: sizeClass(b), bytes: b, state: 'pending', buf: null, refs: 0, writer: null, owner: meta.session, ownerReq: meta.req_id, waiters: [] };
        this.entries.set(k, e);
        this.reserved += e.cost;
      }
      e.refs++;
      held.push(e);
    }
    const bytes = held.reduce((a, e) => a + (e.owner === meta.session && e.ownerReq === meta.req_id ? e.bytes : 0), 0);
    const r: Reservation = {
      reqId: meta.req_id,
      keys,
      entries: held,
      createdAt: this.now(),
      endedAt: null,
      session: meta.session,
      claimed: false,
      deadline: this.now() + transferDeadlineMs(this.opts.deadlineFloorMs, bytes),
      timer: null,
      outcome: null,
    };
    this.reservations.set(meta.req_id, r);
    if (held.every((e) => e.state === 'ready')) this.settle(r, 'done'); // nothing to send
    else {
      r.timer = setTimeout(() => this.expire(r), r.deadline - this.now());
      r.timer.unref();
    }
    return { ok: true, have };
  }

  private pumpAllocQueue(): void {
    while (this.allocQueue.length) {
      const w = this.allocQueue[0]!;
      if (this.reservations.has(w.meta.req_id)) {
        this.allocQueue.shift();
        clearTimeout(w.timer);
        w.reply({ ok: false, error: `req_id "${w.meta.req_id}" already has a reservation` });
        continue;
      }
      // A sender at its own limit waits for its own reservations to end; it does not hold up the
      // others (they may overtake it). Otherwise FIFO: later requests do not overtake a waiting one.
      const i = this.allocQueue.findIndex((x) => !this.overSenderLimit(x.meta));
      if (i < 0) return;
      const head = this.allocQueue[i]!;
      const r = this.tryReserve(head.meta);
      if (!r) return;
      this.allocQueue.splice(i, 1);
      clearTimeout(head.timer);
      head.reply(r);
    }
  }

  /** The ALLOC checked (one per request, so its schema costs nothing per chunk), or why it is refused. */
  private validateAlloc(meta: unknown): AllocMeta | string {
    const shape = allocMetaSchema.safeParse(meta);
    if (!shape.success) return `malformed ALLOC: ${describeMeta(shape.error)}`;
    const m = shape.data;
    if (!this.sessions.has(m.session)) return 'alloc: unknown "session" (handshake on the init port first)';
    for (const [key, bytes] of m.chunks) {
      if (bytes <= HEADER_BYTES || bytes > this.opts.maxChunkBytes) {
        return `alloc: chunk ${key} size ${bytes} is outside (${HEADER_BYTES}, ${this.opts.maxChunkBytes}] for this layout and chunk size`;
      }
    }
    return m;
  }
}

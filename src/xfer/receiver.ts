// xfer receiver (decoder side; design: docs/xfer.md).
//
// Two listeners:
//   init port  — a sender connects, says HELLO with its KV layout / chunk size / model, and is
//                refused with a clear message when that differs from ours. An accepted
//                connection gets a session id and then carries the sender's DATA frames
//                (chunk bytes) and our ACKs.
//   alloc port — ALLOC {session, req_id, chunks:[[key, bytes]]} reserves buffer space for a
//                request's chunks. Keys we already hold (or are already receiving) are
//                reported in `have` so they are not sent twice. When the buffer is full the
//                request waits (FIFO) up to the sender's wait_ms, then is refused.
//
// Memory: chunks are entries shared by reservations (refcounted). Space is accounted in
// bytes at reservation time, bounded by xfer_buffer_size; the memory itself comes from a
// SlotArenaPool (src/common/slot_arena.ts) that grows on demand and recycles slots, so an idle
// receiver costs nothing and a busy one writes into warm pages.
//
// Zero-copy receive: the init port's connections are read with the socket's `onread` option
// (src/common/direct_read.ts): a DATA body is read by the kernel straight into its reserved slot, and the
// slot lives in the WASM memory of the xxh64 kernel, which hashes each read where it landed. No
// per-read buffer, no staging copy, no copy into the hasher.
//
// Consumer API (the engine's kv_consumer): lookup(keys), take(keys, reqId?) → leading ready
// chunks + release(), release(reqId). Reservations never taken expire after ttlMs.
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { sizeClass } from '../common/buffer_pool.js';
import { SlotArenaPool } from '../common/slot_arena.js';
import { chunkBytes, describeLayout, HEADER_BYTES, verifyStreamed, type KvLayout } from '../common/chunk.js';
import { logger } from '../common/log.js';
import {
  allocMetaSchema,
  cancelMetaSchema,
  describeMeta,
  FrameParser,
  helloMetaSchema,
  FrameType,
  ProtocolError,
  PROTOCOL_VERSION,
  writeFrame,
  type AllocMeta,
  type DataMeta,
  type HelloMeta,
} from '../protocol/xfer_frames.js';
import { deploymentSecret, verifyTag } from '../common/auth.js';
import { readDirect } from '../common/direct_read.js';

const log = logger('xfer-recv');

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
  /** Reservations not taken within this time are freed (default 120 s). */
  ttlMs?: number;
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

type EntryState = 'pending' | 'ready';

/** One chunk held (or being received) by the receiver; shared by every reservation naming its key. */
interface Entry {
  key: string;
  /** Accounted bytes (size class of the chunk length). */
  cost: number;
  /** Exact chunk length announced at reservation time. */
  bytes: number;
  state: EntryState;
  buf: Uint8Array | null;
  refs: number;
  /** Session currently streaming into buf (so a cut connection can fail it). */
  writer: string | null;
  /**
   * The session and request whose reservation created the entry: the only sender expected to
   * write it. Reservations that got the key in `have` wait on this one; when that session
   * closes or cancels the request before sending it, the entry is discarded (waiters wake).
   */
  owner: string;
  ownerReq: string;
  waiters: (() => void)[];
}

interface Reservation {
  reqId: string;
  keys: string[];
  /** the entries this reservation holds a reference on (not looked up by key: a failed key may be re-reserved) */
  entries: Entry[];
  createdAt: number;
  session: string;
  claimed: boolean;
}

interface AllocWaiter {
  meta: AllocMeta;
  need: number;
  deadline: number;
  reply: (r: { ok: boolean; have?: string[]; error?: string }) => void;
  timer: NodeJS.Timeout;
}

export interface ReceiverStats {
  capacityBytes: number;
  reservedBytes: number;
  /** memory actually held by the buffer pool (grows on demand) */
  poolBytes: number;
  reservations: number;
  entries: number;
  readyEntries: number;
  chunksReceived: number;
  bytesReceived: number;
  chunksRejected: number;
  allocRefused: number;
  reservationsExpired: number;
  sessions: number;
}

/** What take() hands the consumer: leading ready chunks; views stay valid until release(). */
export interface Taken {
  keys: string[];
  chunks: Uint8Array[];
  numTokens: number;
  release(): void;
}

export class XferReceiver extends EventEmitter {
  readonly receiverId: string;
  private readonly pool: SlotArenaPool;
  private readonly entries = new Map<string, Entry>();
  private readonly reservations = new Map<string, Reservation>();
  private readonly sessions = new Map<string, net.Socket>();
  private readonly allocQueue: AllocWaiter[] = [];
  private reserved = 0;
  private readonly counters = { chunksReceived: 0, bytesReceived: 0, chunksRejected: 0, allocRefused: 0, reservationsExpired: 0 };
  private initServer: net.Server | null = null;
  private allocServer: net.Server | null = null;
  private sweepTimer: NodeJS.Timeout | null = null;
  /** ALLOC / DATA frames seen; the sweep gives idle pool memory back when this did not move. */
  private activity = 0;
  private activityAtSweep = 0;
  private readonly sockets = new Set<net.Socket>();
  private readonly ttlMs: number;
  private readonly maxAllocWaitMs: number;
  private readonly helloTimeoutMs: number;
  private readonly maxChunkBytes: number;

  private constructor(readonly opts: ReceiverOptions) {
    super();
    this.receiverId = opts.receiverId ?? `recv-${randomBytes(4).toString('hex')}`;
    this.ttlMs = opts.ttlMs ?? 120_000;
    this.maxAllocWaitMs = opts.maxAllocWaitMs ?? 30_000;
    this.helloTimeoutMs = opts.helloTimeoutMs ?? 10_000;
    // Pool budget = accounted capacity: reservations are accounted in size classes, so the
    // pool can always satisfy an entry that fits the reservation budget.
    const l = opts.layout;
    this.maxChunkBytes = chunkBytes(l, opts.chunkSize);
    // Slack of a few chunks: a buffer whose reservation expired mid-transfer is returned
    // only when its last byte has arrived, while its bytes are already free for others.
    this.pool = new SlotArenaPool(opts.bufferBytes + 4 * sizeClass(this.maxChunkBytes));
  }

  /** Starts both listeners; rejects (e.g. port in use) with a message naming the port. */
  static async start(opts: ReceiverOptions): Promise<XferReceiver> {
    const r = new XferReceiver(opts);
    try {
      // pauseOnConnect: nothing is read before readDirect takes the connection over
      r.initServer = await listen(opts.host, opts.initPort, 'xfer_peer_init_port', (s) => r.onInitConnection(s), true);
      r.allocServer = await listen(opts.host, opts.allocPort, 'xfer_peer_alloc_port', (s) => r.onAllocConnection(s));
    } catch (e) {
      await r.close();
      throw e;
    }
    // The arenas of every slot size up to a full chunk, created now: their WASM memory grows and
    // the garbage collections V8 answers them with would otherwise land between the decode steps
    // of the transfers that first need each size (src/common/slot_arena.ts).
    r.pool.prepare(r.maxChunkBytes);
    const every = Math.max(50, Math.min(5000, Math.floor(r.ttlMs / 4)));
    r.sweepTimer = setInterval(() => r.expire(), every);
    r.sweepTimer.unref();
    log.info(
      `receiver ${r.receiverId} listening on ${opts.host} init ${opts.initPort} alloc ${opts.allocPort}; ` +
        `buffer ${opts.bufferBytes} bytes (grown on demand); ${describeLayout(opts.layout)} chunk_size=${opts.chunkSize} model=${opts.modelId}`,
    );
    return r;
  }

  // ---- consumer API ----------------------------------------------------------------------

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
        if (claimed && this.reservations.get(claimed.reqId) === claimed) this.dropReservation(claimed);
        this.pumpAllocQueue();
      },
    };
  }

  /** Frees a request's reservation (e.g. the consumer decided not to use it). */
  release(reqId: string): boolean {
    const r = this.reservations.get(reqId);
    if (!r) return false;
    this.dropReservation(r);
    this.pumpAllocQueue();
    return true;
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
    };
  }

  async close(): Promise<void> {
    if (this.sweepTimer) clearInterval(this.sweepTimer);
    for (const w of this.allocQueue.splice(0)) {
      clearTimeout(w.timer);
      w.reply({ ok: false, error: 'receiver is shutting down' });
    }
    for (const s of this.sockets) s.destroy();
    await Promise.all([closeServer(this.initServer), closeServer(this.allocServer)]);
  }

  // ---- accounting ------------------------------------------------------------------------

  private unref(e: Entry): void {
    e.refs--;
    if (e.refs > 0) return;
    if (this.entries.get(e.key) === e) this.entries.delete(e.key);
    this.reserved -= e.cost;
    e.cost = 0;
    // Bytes may still be streaming into the buffer: the DATA handler returns it when done.
    if (e.buf && e.writer === null) {
      this.pool.release(e.buf);
      e.buf = null;
    }
    for (const w of e.waiters.splice(0)) w();
  }

  private dropReservation(r: Reservation): void {
    this.reservations.delete(r.reqId);
    for (const e of r.entries) this.unref(e);
  }

  /** A chunk that failed (corrupt, cut, refused) leaves the index at once: never served. */
  private failEntry(e: Entry, why: string, logIt = true): void {
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

  private expire(): void {
    const now = Date.now();
    let n = 0;
    for (const r of [...this.reservations.values()]) {
      if (!r.claimed && now - r.createdAt > this.ttlMs) {
        this.dropReservation(r);
        n++;
      }
    }
    if (n) {
      this.counters.reservationsExpired += n;
      log.warn(`${n} reservation(s) expired unused after ${this.ttlMs} ms`);
      this.pumpAllocQueue();
    }
    // Idle since the last sweep (no ALLOC, no DATA): give the recycled buffers back, so a burst
    // does not keep its peak memory for the life of the process. Live buffers are untouched.
    if (this.activity === this.activityAtSweep && this.pool.heldBytes > this.pool.inUseBytes) {
      const before = this.pool.heldBytes;
      this.pool.trim();
      log.debug(`idle: buffer pool trimmed from ${before} to ${this.pool.heldBytes} bytes`);
    }
    this.activityAtSweep = this.activity;
  }

  /**
   * Discards the chunks `session` reserved (for `reqId`, or for every request) and has not
   * started to send: nobody else will send them, so waiters must not wait for them.
   */
  private abandon(session: string, reqId: string | null, why: string): number {
    const gone: Entry[] = [];
    for (const e of this.entries.values()) {
      if (e.state === 'pending' && e.writer === null && e.owner === session && (reqId === null || e.ownerReq === reqId)) gone.push(e);
    }
    for (const e of gone) this.failEntry(e, why, false);
    if (gone.length) log.warn(`${gone.length} chunk(s) discarded before arrival: ${why}`);
    return gone.length;
  }

  /** Removes queued ALLOCs matching `pred`, answering them with `error`. */
  private dropQueued(pred: (w: AllocWaiter) => boolean, error: string): void {
    for (let i = this.allocQueue.length - 1; i >= 0; i--) {
      const w = this.allocQueue[i]!;
      if (!pred(w)) continue;
      this.allocQueue.splice(i, 1);
      clearTimeout(w.timer);
      w.reply({ ok: false, error });
    }
    this.pumpAllocQueue();
  }

  /** CANCEL on the init port from `session` for `reqId`: its never-sent chunks are discarded. */
  private discardUnsent(session: string, reqId: string): number {
    return this.abandon(session, reqId, `sender cancelled request ${reqId}`);
  }

  /**
   * CANCEL on the alloc port (the sender gave up waiting for the ALLOC's answer): the never-sent
   * chunks are discarded, and the queued ALLOC or the granted reservation goes too.
   */
  private withdrawAlloc(session: string, reqId: string): void {
    const res = this.reservations.get(reqId);
    const n = this.discardUnsent(session, reqId);
    this.dropQueued((w) => w.meta.session === session && w.meta.req_id === reqId, `request ${reqId} cancelled by the sender`);
    if (res && res.session === session && !res.claimed) {
      this.dropReservation(res);
      this.pumpAllocQueue();
    }
    log.info(`request ${reqId}: ALLOC withdrawn by the sender (no answer in time)${n ? `; ${n} chunk(s) discarded` : ''}`);
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
    this.reservations.set(meta.req_id, { reqId: meta.req_id, keys, entries: held, createdAt: Date.now(), session: meta.session, claimed: false });
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

  // One ALLOC per request, so checking it with its schema costs nothing per chunk.
  private validateAlloc(meta: unknown): string | null {
    const shape = allocMetaSchema.safeParse(meta);
    if (!shape.success) return `malformed ALLOC: ${describeMeta(shape.error)}`;
    const m = shape.data;
    if (!this.sessions.has(m.session)) return 'alloc: unknown "session" (handshake on the init port first)';
    for (const [key, bytes] of m.chunks) {
      if (bytes <= HEADER_BYTES || bytes > this.maxChunkBytes) {
        return `alloc: chunk ${key} size ${bytes} is outside (${HEADER_BYTES}, ${this.maxChunkBytes}] for this layout and chunk size`;
      }
    }
    return null;
  }

  private handleAlloc(meta: AllocMeta, reply: (r: { ok: boolean; have?: string[]; error?: string }) => void): void {
    this.activity++;
    const bad = this.validateAlloc(meta);
    if (bad) return reply({ ok: false, error: bad });
    if (this.reservations.has(meta.req_id) || this.allocQueue.some((w) => w.meta.req_id === meta.req_id)) {
      return reply({ ok: false, error: `req_id "${meta.req_id}" already has a reservation` });
    }
    const need = this.needFor(meta);
    if (need > this.opts.bufferBytes) {
      this.counters.allocRefused++;
      return reply({ ok: false, error: `request needs ${need} bytes, more than the whole receiver buffer (${this.opts.bufferBytes})` });
    }
    if (need > this.perSenderLimit) {
      this.counters.allocRefused++;
      return reply({ ok: false, error: `request needs ${need} bytes, more than one sender may hold reserved (${this.perSenderLimit})` });
    }
    if (this.allocQueue.every((x) => this.overSenderLimit(x.meta))) {
      const r = this.tryReserve(meta);
      if (r) return reply(r);
    }
    const waitMs = Math.min(meta.wait_ms, this.maxAllocWaitMs);
    const w: AllocWaiter = {
      meta,
      need,
      deadline: Date.now() + waitMs,
      reply,
      timer: setTimeout(() => {
        const i = this.allocQueue.indexOf(w);
        if (i >= 0) this.allocQueue.splice(i, 1);
        this.counters.allocRefused++;
        const msg = `receiver buffer full: request ${meta.req_id} needs ${need} bytes, ${this.reserved} of ${this.opts.bufferBytes} reserved, waited ${waitMs} ms`;
        log.warn(msg);
        reply({ ok: false, error: msg });
        this.pumpAllocQueue();
      }, waitMs),
    };
    this.allocQueue.push(w);
  }

  // ---- connections -----------------------------------------------------------------------

  private track(sock: net.Socket): void {
    this.sockets.add(sock);
    sock.setNoDelay(true);
    sock.on('error', (e) => log.debug(`connection from ${sock.remoteAddress}:${sock.remotePort}: ${e.message}`));
    sock.on('close', () => this.sockets.delete(sock));
  }

  private onAllocConnection(sock: net.Socket): void {
    this.track(sock);
    // An alloc connection serves one live session: one that names none within the handshake
    // timeout is closed (it would otherwise sit open forever), and it closes with its session.
    let bound: string | null = null;
    const unbound = setTimeout(() => {
      log.warn(`alloc connection from ${sock.remoteAddress}: no frame of a live session within ${this.helloTimeoutMs} ms; closing it`);
      sock.destroy();
    }, this.helloTimeoutMs);
    sock.once('close', () => clearTimeout(unbound));
    const bind = (meta: unknown) => {
      const session = (meta as { session?: unknown } | null)?.session;
      if (bound !== null || typeof session !== 'string') return;
      const init = this.sessions.get(session);
      if (!init) return;
      bound = session;
      clearTimeout(unbound);
      init.once('close', () => sock.destroy());
    };
    const parser = new FrameParser(0, () => null, (type, meta) => {
      bind(meta);
      if (type === FrameType.Cancel) {
        const m = cancelMetaSchema.safeParse(meta);
        // only a live session may withdraw, and only its own requests (checked in cancel())
        if (m.success && this.sessions.has(m.data.session)) this.withdrawAlloc(m.data.session, m.data.req_id);
        return;
      }
      if (type !== FrameType.Alloc) throw new ProtocolError(`unexpected frame type ${type} on the alloc port`);
      this.handleAlloc(meta as AllocMeta, (r) => {
        if (!sock.destroyed) writeFrame(sock, FrameType.AllocReply, { id: (meta as AllocMeta).id, ...r });
      });
    });
    sock.on('data', (d) => {
      try {
        parser.push(d);
      } catch (e) {
        log.warn(`alloc connection from ${sock.remoteAddress}: ${(e as Error).message}; closing it`);
        sock.destroy();
      }
    });
  }

  private checkHello(m: HelloMeta): string | null {
    if (!verifyTag(deploymentSecret(), 'xfer-hello', `${m.sender_id}:${m.nonce ?? ''}`, m.auth)) {
      return `sender ${m.sender_id} refused: ${m.auth === undefined ? 'no' : 'a wrong'} deployment secret`;
    }
    if (m.version !== PROTOCOL_VERSION) return `incompatible sender: protocol version ${m.version}, receiver speaks ${PROTOCOL_VERSION}`;
    const l = this.opts.layout;
    const theirs: KvLayout = { dtype: m.dtype, numLayers: m.num_layers, numKvHeads: m.num_kv_heads, headDim: m.head_dim };
    const problems: string[] = [];
    if (m.model_id !== this.opts.modelId) problems.push(`model "${m.model_id}" (receiver serves "${this.opts.modelId}")`);
    if (m.chunk_size !== this.opts.chunkSize) problems.push(`chunk_size ${m.chunk_size} (receiver uses ${this.opts.chunkSize})`);
    if (theirs.dtype !== l.dtype || theirs.numLayers !== l.numLayers || theirs.numKvHeads !== l.numKvHeads || theirs.headDim !== l.headDim) {
      problems.push(`KV layout ${describeLayout(theirs)} (receiver has ${describeLayout(l)})`);
    }
    return problems.length ? `incompatible sender ${m.sender_id ?? '?'}: ${problems.join('; ')}` : null;
  }

  private onInitConnection(accepted: net.Socket): void {
    // assigned below, once the parser exists (readDirect asks it for a buffer at once)
    let sock!: net.Socket;
    let session: string | null = null;
    const helloTimer = setTimeout(() => {
      log.warn(`init connection from ${sock.remoteAddress}: no handshake within ${this.helloTimeoutMs} ms; closing it`);
      sock.destroy();
    }, this.helloTimeoutMs);
    const remote = accepted.remoteAddress;
    /** Where the DATA body goes: the pending entry's pooled buffer, or nowhere (dropped). */
    let target: Entry | null = null;
    const sink = (type: FrameType, meta: any, bodyLen: number): Uint8Array | null => {
      target = null;
      if (type !== FrameType.Data || !session) return null;
      this.activity++;
      const m = meta as DataMeta;
      const res = typeof m.req_id === 'string' ? this.reservations.get(m.req_id) : undefined;
      const e = typeof m.key === 'string' ? this.entries.get(m.key) : undefined;
      if (!e || e.state !== 'pending' || e.writer !== null || bodyLen !== e.bytes) return null;
      // Only the session that reserved the chunk, for that request, may write it. (The
      // reservation itself may be gone already, released by its consumer, while another
      // reservation that got the key in `have` still waits for these bytes.)
      if (e.owner !== session || e.ownerReq !== m.req_id) return null;
      if (res && (res.session !== session || !res.entries.includes(e))) return null;
      const buf = this.pool.acquire(e.bytes);
      if (!buf) return null; // cannot happen while accounting holds; treated as a rejected chunk
      e.buf = buf;
      e.writer = session;
      target = e;
      return buf;
    };
    const parser = new FrameParser(this.maxChunkBytes, sink, (type, meta, body, bodyLen, payloadSum) => {
      if (type === FrameType.Hello) {
        if (session) throw new ProtocolError('second HELLO on one connection');
        clearTimeout(helloTimer);
        const shape = helloMetaSchema.safeParse(meta);
        const bad = shape.success ? this.checkHello(shape.data) : `malformed HELLO: ${describeMeta(shape.error)}`;
        if (bad) {
          log.warn(`refused: ${bad}`);
          writeFrame(sock, FrameType.HelloReply, { ok: false, error: bad });
          sock.end();
          return;
        }
        session = randomBytes(8).toString('hex');
        this.sessions.set(session, sock);
        log.info(`sender ${(meta as HelloMeta).sender_id} connected from ${sock.remoteAddress}:${sock.remotePort} (session ${session})`);
        writeFrame(sock, FrameType.HelloReply, { ok: true, session, receiver_id: this.receiverId });
        return;
      }
      if (!session) throw new ProtocolError('expected HELLO first');
      if (type === FrameType.Cancel) {
        // the init port's CANCEL comes from the connection's own session, whatever its meta says
        const c = cancelMetaSchema.safeParse(meta);
        if (c.success) this.discardUnsent(session, c.data.req_id);
        return;
      }
      if (type !== FrameType.Data) throw new ProtocolError(`unexpected frame type ${type} on the init port`);
      const m = meta as DataMeta;
      const ack = (ok: boolean, error?: string) => {
        if (!sock.destroyed) writeFrame(sock, FrameType.Ack, { req_id: m.req_id, key: m.key, ok, ...(error ? { error } : {}) });
      };
      const e = target;
      target = null;
      if (!e || !body) {
        this.counters.chunksRejected++;
        const cur = typeof m.key === 'string' ? this.entries.get(m.key) : undefined;
        return ack(false, cur?.state === 'ready' ? 'already held' : `no reservation expects chunk ${m.key} of ${bodyLen} bytes for request ${m.req_id}`);
      }
      e.writer = null;
      if (this.entries.get(e.key) !== e) {
        // reservation dropped (expired / released) while the bytes were arriving
        if (e.buf) this.pool.release(e.buf);
        e.buf = null;
        this.counters.chunksRejected++;
        return ack(false, 'reservation expired while receiving');
      }
      try {
        if (payloadSum === null) throw new Error('chunk arrived without its checksum computed');
        verifyStreamed(body, e.key, payloadSum);
      } catch (err) {
        this.counters.chunksRejected++;
        this.failEntry(e, (err as Error).message);
        return ack(false, (err as Error).message);
      }
      e.state = 'ready';
      this.counters.chunksReceived++;
      this.counters.bytesReceived += bodyLen;
      for (const w of e.waiters.splice(0)) w();
      const res = this.reservations.get(m.req_id);
      // 'complete' (reqId, keys): every chunk of the reservation is here and verified.
      if (res && res.entries.every((x) => x.state === 'ready' && this.entries.get(x.key) === x)) this.emit('complete', res.reqId, res.keys);
      ack(true);
    },
      (type) => (type === FrameType.Data ? HEADER_BYTES : null), // hash the payload while it arrives (see src/protocol/frame_reader.ts)
      (body) => this.pool.hasher(body), // in place, in the slot's WASM memory
    );
    sock = readDirect(accepted, parser, (err) => {
      log.warn(`init connection from ${remote}: ${err.message}; closing it`);
      sock.destroy();
    });
    this.track(sock);
    sock.on('close', () => {
      clearTimeout(helloTimer);
      if (session === null) return;
      const sess: string = session;
      this.sessions.delete(sess);
      // A transfer cut mid-chunk is never used: the half-written entry leaves the index.
      const t = target as Entry | null;
      if (t && t.writer === sess) this.failEntry(t, 'connection closed in the middle of the chunk');
      // Chunks this sender reserved and never started will not come: settle them now, so a
      // consumer waiting for them (its own request's, or another's that got them in `have`)
      // wakes at once with what is usable instead of waiting out its timeout.
      this.abandon(sess, null, `sender session ${sess} closed before sending them`);
      this.dropQueued((w) => w.meta.session === sess, `sender session ${sess} closed`);
    });
  }
}

function listen(host: string, port: number, what: string, onConn: (s: net.Socket) => void, pauseOnConnect = false): Promise<net.Server> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer({ pauseOnConnect }, onConn);
    srv.once('error', (e: NodeJS.ErrnoException) =>
      reject(new Error(`xfer receiver cannot listen on ${host}:${port} (${what}): ${e.code === 'EADDRINUSE' ? 'port already in use' : e.message}`)),
    );
    srv.listen(port, host, () => resolve(srv));
  });
}

function closeServer(s: net.Server | null): Promise<void> {
  return new Promise((r) => (s ? s.close(() => r()) : r()));
}

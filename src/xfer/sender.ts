// xfer sender (prefiller side; design: docs/xfer.md).
//
// send(spec, chunks) for one request:
//   1. link to the receiver named by spec (connected on demand, kept and shared by every
//      request to that receiver): HELLO on its init port, refused when layouts differ;
//   2. ALLOC on its alloc port: reserve space; the reply names keys the receiver already holds;
//   3. stream the other chunks as DATA frames on the init connection (header + chunk buffer
//      handed to the socket as is), bounded by xfer_buffer_size bytes in flight;
//   4. wait for every ACK (the receiver verified the checksum);
//   5. push the notice to the proxy.
// send() never throws: any failure (receiver down, refused, buffer full past the deadline, a
// chunk rejected) yields {ok:false, error} and a notice with ok:false. The decoder then simply
// recomputes what it did not receive.
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { chunkBytes, type KvLayout } from '../common/chunk.js';
import { XFER_DEADLINE_FLOOR_DEFAULT_MS } from '../common/config.js';
import { transferDeadlineMs } from '../common/transfer_seam.js';
import { logger } from '../common/log.js';
import {
  allocReplyMetaSchema,
  describeMeta,
  FrameParser,
  FrameType,
  helloReplyMetaSchema,
  ProtocolError,
  PROTOCOL_VERSION,
  writeFrame,
  type AckMeta,
  type AllocReplyMeta,
  type CancelMeta,
  type HelloMeta,
  type HelloReplyMeta,
} from '../protocol/xfer_frames.js';
import { ProxyNotifier, type XferNotice } from './notify.js';
import { parseDisaggSpec, type DisaggSpec } from '../protocol/disagg_spec.js';
import { deploymentSecret } from '../common/auth.js';
import { seal } from '../common/replay.js';

export type { DisaggSpec } from '../protocol/disagg_spec.js';

const log = logger('xfer-send');

/** One chunk to send. `data` may be lazy so chunks the receiver already holds are never built. */
export interface OutChunk {
  key: string;
  numTokens: number;
  data: Uint8Array | (() => Uint8Array | Promise<Uint8Array>);
}

export interface SenderOptions {
  layout: KvLayout;
  chunkSize: number;
  modelId: string;
  senderId?: string;
  /** xfer_proxy_host / xfer_proxy_port; no notices when unset. */
  proxyHost?: string | null;
  proxyPort?: number | null;
  /** xfer_buffer_size: bytes written and not yet acked, across requests. */
  bufferBytes: number;
  connectTimeoutMs?: number;
  /** How long a full receiver buffer may hold a request back before it goes on without transfer. */
  allocWaitMs?: number;
  /**
   * How much longer than allocWaitMs the answer to an ALLOC may take (default 10 s). Past it the
   * request goes on without transfer and the ALLOC is withdrawn (CANCEL on the alloc port), so a
   * late grant does not sit in the receiver's buffer until its TTL.
   */
  allocReplyGraceMs?: number;
  /**
   * xfer_deadline_floor_ms: a request's chunks must be written and acked within this + their
   * bytes / TRANSFER_MIN_RATE of the reservation's grant (the deadline the receiver enforces too;
   * default XFER_DEADLINE_FLOOR_DEFAULT_MS).
   */
  deadlineFloorMs?: number;
}

export interface SendResult {
  ok: boolean;
  reqId: string;
  /** chunks written by this request */
  sent: number;
  /** chunks the receiver already held */
  skipped: number;
  bytes: number;
  numTokens: number;
  ms: number;
  error?: string;
  notified: boolean;
}

export class XferError extends Error {
  override name = 'XferError';
}

type Pending<T> = { resolve: (v: T) => void; reject: (e: Error) => void };

/** Both connections to one receiver, shared by all requests going there. */
class PeerLink {
  session = '';
  receiverId = '';
  closed = false;
  readonly acks = new Map<string, Pending<AckMeta>>();
  private readonly allocs = new Map<number, Pending<AllocReplyMeta>>();
  private nextId = 1;
  private helloWaiter: Pending<HelloReplyMeta> | null = null;

  private constructor(
    readonly name: string,
    readonly init: net.Socket,
    readonly alloc: net.Socket,
    private readonly onClose: () => void,
  ) {}

  static async open(spec: DisaggSpec, hello: HelloMeta, timeoutMs: number, onClose: () => void): Promise<PeerLink> {
    const name = `${spec.receiver_host}:${spec.receiver_init_port}/${spec.receiver_alloc_port}`;
    const both = await Promise.allSettled([
      connect(spec.receiver_host, spec.receiver_init_port, timeoutMs, 'receiver_init_port'),
      connect(spec.receiver_host, spec.receiver_alloc_port, timeoutMs, 'receiver_alloc_port'),
    ]);
    const failed = both.find((r) => r.status === 'rejected');
    if (failed) {
      for (const r of both) if (r.status === 'fulfilled') r.value.destroy();
      throw failed.reason;
    }
    const [init, alloc] = both.map((r) => (r as PromiseFulfilledResult<net.Socket>).value) as [net.Socket, net.Socket];
    const link = new PeerLink(name, init, alloc, onClose);
    link.wire();
    const reply = await link.request<HelloReplyMeta>(timeoutMs, `handshake with receiver ${name}`, (p) => {
      link.helloWaiter = p;
      writeFrame(init, FrameType.Hello, hello);
    });
    if (!reply.ok || !reply.session) {
      link.close();
      throw new XferError(`receiver ${name} refused the handshake: ${reply.error ?? 'no reason given'}`);
    }
    link.session = reply.session;
    link.receiverId = reply.receiver_id ?? name;
    return link;
  }

  private wire(): void {
    const fail = (why: string) => {
      if (this.closed) return;
      this.closed = true;
      this.init.destroy();
      this.alloc.destroy();
      const err = new XferError(`connection to receiver ${this.name} lost: ${why}`);
      this.helloWaiter?.reject(err);
      for (const p of this.acks.values()) p.reject(err);
      for (const p of this.allocs.values()) p.reject(err);
      this.acks.clear();
      this.allocs.clear();
      this.onClose();
    };
    const initParser = new FrameParser(0, () => null, (type, meta) => {
      if (type === FrameType.HelloReply) {
        const r = helloReplyMetaSchema.safeParse(meta);
        if (!r.success) throw new ProtocolError(`malformed HELLO_REPLY: ${describeMeta(r.error)}`);
        const w = this.helloWaiter;
        this.helloWaiter = null;
        w?.resolve(r.data);
      } else if (type === FrameType.Ack) {
        const m = meta as AckMeta;
        const id = `${m.req_id}\u0000${m.key}`;
        const p = this.acks.get(id);
        this.acks.delete(id);
        p?.resolve(m);
      }
    });
    const allocParser = new FrameParser(0, () => null, (type, meta) => {
      if (type !== FrameType.AllocReply) return;
      const r = allocReplyMetaSchema.safeParse(meta);
      if (!r.success) throw new ProtocolError(`malformed ALLOC_REPLY: ${describeMeta(r.error)}`);
      const m = r.data;
      const p = this.allocs.get(m.id);
      this.allocs.delete(m.id);
      p?.resolve(m);
    });
    for (const [sock, parser] of [
      [this.init, initParser],
      [this.alloc, allocParser],
    ] as const) {
      sock.on('data', (d) => {
        try {
          parser.push(d);
        } catch (e) {
          fail((e as Error).message);
        }
      });
      sock.on('error', (e) => fail(e.message));
      sock.on('close', () => fail('closed by the receiver'));
    }
  }

  /** Runs `start` with a pending slot, rejecting after timeoutMs. */
  request<T>(timeoutMs: number, what: string, start: (p: Pending<T>) => void): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const t = setTimeout(() => reject(new XferError(`${what}: no answer within ${timeoutMs} ms`)), timeoutMs);
      start({
        resolve: (v) => {
          clearTimeout(t);
          resolve(v);
        },
        reject: (e) => {
          clearTimeout(t);
          reject(e);
        },
      });
    });
  }

  allocate(reqId: string, chunks: [string, number][], waitMs: number, graceMs: number): Promise<AllocReplyMeta> {
    if (this.closed) return Promise.reject(new XferError(`connection to receiver ${this.name} is closed`));
    const id = this.nextId++;
    return this.request<AllocReplyMeta>(waitMs + graceMs, `reservation for ${reqId} on ${this.name}`, (p) => {
      this.allocs.set(id, p);
      writeFrame(this.alloc, FrameType.Alloc, { id, session: this.session, req_id: reqId, chunks, wait_ms: waitMs });
    })
      .catch((e: Error) => {
        // No answer in time: the ALLOC may still be queued, or granted with the answer late.
        // Withdraw it (same connection, so after the ALLOC): the receiver frees either.
        if (this.allocs.has(id)) this.withdrawAlloc(reqId);
        throw e;
      })
      .finally(() => this.allocs.delete(id));
  }

  /**
   * Tells the receiver this sender is done with `reqId`, on the init connection (so after the
   * request's DATA frames): the chunks it reserved and will not send are discarded there, so
   * nobody waits for them.
   */
  discardUnsent(reqId: string): void {
    this.sendCancel(this.init, reqId);
  }

  /** Withdraws the ALLOC for `reqId` (on the alloc connection, so after the ALLOC): queued or granted, it goes. */
  withdrawAlloc(reqId: string): void {
    this.sendCancel(this.alloc, reqId);
  }

  private sendCancel(sock: net.Socket, reqId: string): void {
    if (this.closed) return; // the receiver settles a closed session's chunks itself
    const meta: CancelMeta = { session: this.session, req_id: reqId };
    writeFrame(sock, FrameType.Cancel, meta);
  }

  close(): void {
    this.init.destroy();
    this.alloc.destroy();
  }
}

/**
 * How long past the deadline an ACK may still arrive: the receiver's clock for the deadline started
 * at the grant, before the sender's, so it settles first; this covers the trip of its answer.
 */
const ACK_GRACE_MS = 1000;

export class XferSender {
  readonly senderId: string;
  private readonly links = new Map<string, Promise<PeerLink>>();
  private readonly notifier: ProxyNotifier | null;
  private inflight = 0;
  private readonly inflightWaiters: (() => void)[] = [];
  private readonly connectTimeoutMs: number;
  private readonly allocWaitMs: number;
  private readonly allocReplyGraceMs: number;
  private readonly deadlineFloorMs: number;
  private readonly hello: HelloMeta;

  constructor(readonly opts: SenderOptions) {
    this.senderId = opts.senderId ?? `send-${randomBytes(4).toString('hex')}`;
    this.connectTimeoutMs = opts.connectTimeoutMs ?? 5000;
    this.allocWaitMs = opts.allocWaitMs ?? 10_000;
    this.allocReplyGraceMs = opts.allocReplyGraceMs ?? 10_000;
    this.deadlineFloorMs = opts.deadlineFloorMs ?? XFER_DEADLINE_FLOOR_DEFAULT_MS;
    this.notifier = opts.proxyHost && opts.proxyPort ? new ProxyNotifier(opts.proxyHost, opts.proxyPort) : null;
    const l = opts.layout;
    this.hello = {
      version: PROTOCOL_VERSION,
      sender_id: this.senderId,
      model_id: opts.modelId,
      chunk_size: opts.chunkSize,
      dtype: l.dtype,
      num_layers: l.numLayers,
      num_kv_heads: l.numKvHeads,
      head_dim: l.headDim,
    };
  }

  /** The HELLO of one connection: with a deployment secret, sealed afresh (docs/security.md, replay). */
  private sealedHello(): HelloMeta {
    return seal(deploymentSecret(), 'xfer-hello', this.hello);
  }

  private link(spec: DisaggSpec): Promise<PeerLink> {
    const name = `${spec.receiver_host}:${spec.receiver_init_port}/${spec.receiver_alloc_port}`;
    let p = this.links.get(name);
    if (!p) {
      p = PeerLink.open(spec, this.sealedHello(), this.connectTimeoutMs, () => {
        if (this.links.get(name) === p) this.links.delete(name);
      });
      this.links.set(name, p);
      p.catch(() => {
        if (this.links.get(name) === p) this.links.delete(name);
      });
    }
    return p;
  }

  private async acquireInflight(bytes: number, deadline: number): Promise<void> {
    // A single chunk larger than the whole budget still goes (alone), or nothing would move.
    while (this.inflight > 0 && this.inflight + bytes > this.opts.bufferBytes) {
      const left = deadline - Date.now();
      if (left <= 0) throw new XferError(`sender buffer (${this.opts.bufferBytes} bytes) stayed full`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.inflightWaiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
    this.inflight += bytes;
  }

  private releaseInflight(bytes: number): void {
    this.inflight -= bytes;
    for (const w of this.inflightWaiters.splice(0)) w();
  }

  /**
   * Transfers a request's chunks to the receiver in `spec` (validated here: a bad field fails the
   * transfer, named), then notifies the proxy. Never throws.
   */
  send(spec: unknown, chunks: readonly OutChunk[]): Promise<SendResult> {
    const parsed = parseDisaggSpec(spec);
    return this.sendTo(parsed.ok ? parsed.spec : null, parsed.ok ? null : parsed.error, spec, chunks);
  }

  /** send() for a spec already validated with parseDisaggSpec (the engine plugin's path). */
  sendParsed(spec: DisaggSpec, chunks: readonly OutChunk[]): Promise<SendResult> {
    return this.sendTo(spec, null, spec, chunks);
  }

  private async sendTo(spec: DisaggSpec | null, invalid: string | null, raw: unknown, chunks: readonly OutChunk[]): Promise<SendResult> {
    const t0 = Date.now();
    const numTokens = chunks.reduce((s, c) => s + c.numTokens, 0);
    const named = raw as Partial<Record<keyof DisaggSpec, unknown>> | null | undefined;
    const reqId = String(named?.req_id ?? '');
    const res: SendResult = { ok: false, reqId, sent: 0, skipped: 0, bytes: 0, numTokens, ms: 0, notified: false };
    try {
      if (!spec) throw new XferError(invalid ?? 'kv_transfer_params.disagg_spec: expected an object');
      if (chunks.length > 0) await this.transfer(spec, chunks, res);
      res.ok = true;
    } catch (e) {
      res.error = (e as Error).message;
      log.warn(`transfer of ${String(named?.req_id)} to ${String(named?.receiver_host)}:${String(named?.receiver_init_port)} failed, the decoder will recompute: ${res.error}`);
    }
    res.ms = Date.now() - t0;
    if (this.notifier) {
      const n: XferNotice = {
        req_id: reqId,
        prefiller: this.senderId,
        num_chunks: res.ok ? chunks.length : res.sent + res.skipped,
        num_tokens: res.ok ? numTokens : 0,
        ok: res.ok,
        ...(res.error ? { error: res.error } : {}),
      };
      res.notified = await this.notifier.push(n);
    }
    return res;
  }

  private async transfer(spec: DisaggSpec, chunks: readonly OutChunk[], res: SendResult): Promise<void> {
    const link = await this.link(spec);
    const sizes = chunks.map((c) => chunkBytes(this.opts.layout, c.numTokens));
    const reply = await link.allocate(
      spec.req_id,
      chunks.map((c, i) => [c.key, sizes[i]!]),
      this.allocWaitMs,
      this.allocReplyGraceMs,
    );
    if (!reply.ok) throw new XferError(`receiver ${link.name} refused the reservation: ${reply.error ?? 'no reason given'}`);
    const have = new Set(reply.have ?? []);
    const acks: Promise<AckMeta>[] = [];
    // The transfer contract (docs/xfer.md "Every transfer ends"): the receiver abandons the
    // reservation at this deadline, counted from its grant; the sender stops waiting then too.
    const toSend = sizes.reduce((a, b, i) => a + (have.has(chunks[i]!.key) ? 0 : b), 0);
    const deadline = Date.now() + transferDeadlineMs(this.deadlineFloorMs, toSend);
    try {
      await this.stream(link, spec, chunks, sizes, have, acks, deadline, res);
    } catch (e) {
      // Stopped before every chunk was in (or one was rejected): chunks this request reserved
      // and did not send must not keep a consumer waiting. A closed link needs nothing: the
      // receiver settles a closed session's chunks itself.
      link.discardUnsent(spec.req_id);
      throw e;
    }
  }

  private async stream(
    link: PeerLink,
    spec: DisaggSpec,
    chunks: readonly OutChunk[],
    sizes: number[],
    have: Set<string>,
    acks: Promise<AckMeta>[],
    deadline: number,
    res: SendResult,
  ): Promise<void> {
    try {
      for (let i = 0; i < chunks.length; i++) {
        const c = chunks[i]!;
        if (have.has(c.key)) {
          res.skipped++;
          continue;
        }
        const data = typeof c.data === 'function' ? await c.data() : c.data;
        if (data.byteLength !== sizes[i]) {
          throw new XferError(`chunk ${c.key}: ${data.byteLength} bytes, but ${c.numTokens} tokens of this layout make ${sizes[i]}`);
        }
        await this.acquireInflight(data.byteLength, deadline);
        if (link.closed) {
          this.releaseInflight(data.byteLength);
          throw new XferError(`connection to receiver ${link.name} lost`);
        }
        const id = `${spec.req_id}\u0000${c.key}`;
        const size = data.byteLength;
        const ack = link
          .request<AckMeta>(Math.max(1, deadline - Date.now()) + ACK_GRACE_MS, `ack of chunk ${c.key}`, (p) => link.acks.set(id, p))
          .finally(() => {
            link.acks.delete(id);
            this.releaseInflight(size);
          });
        ack.catch(() => undefined); // observed below; avoid unhandled rejections meanwhile
        acks.push(ack);
        // Queued at once, not after the socket drains: the in-flight budget above already bounds
        // what is written and not acked (the queue holds the chunk's own buffer, no copy). Waiting
        // for a drain put every request in flight on this connection in step — all of them wrote
        // their last chunk at the same drain, then waited for ACKs and for the next ALLOC while
        // the connection stood empty (~2 ms a request under prio, 5–8 % of a 16 MiB-chunk run).
        writeFrame(link.init, FrameType.Data, { req_id: spec.req_id, key: c.key }, data);
        res.sent++;
        res.bytes += size;
      }
    } finally {
      // Whatever happened, wait for what was written so in-flight accounting stays exact.
      const settled = await Promise.allSettled(acks);
      for (const s of settled) {
        if (s.status === 'rejected') throw s.reason;
        if (!s.value.ok) throw new XferError(`receiver rejected chunk ${s.value.key}: ${s.value.error ?? 'no reason given'}`);
      }
    }
  }

  /** Closes every link and the notifier. */
  async close(): Promise<void> {
    const links = [...this.links.values()];
    this.links.clear();
    for (const p of links) {
      try {
        (await p).close();
      } catch {
        /* never connected */
      }
    }
    this.notifier?.close();
  }
}

function connect(host: string, port: number, timeoutMs: number, what: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host, port, noDelay: true });
    const t = setTimeout(() => {
      s.destroy();
      reject(new XferError(`cannot connect to ${what} ${host}:${port}: no answer within ${timeoutMs} ms`));
    }, timeoutMs);
    s.once('connect', () => {
      clearTimeout(t);
      s.removeAllListeners('error');
      // Until PeerLink wires its handlers, an error must not become an uncaught exception;
      // the 'close' that follows it is what PeerLink reacts to.
      s.on('error', () => undefined);
      resolve(s);
    });
    s.once('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(t);
      reject(new XferError(`cannot connect to ${what} ${host}:${port}: ${e.code ?? e.message}`));
    });
  });
}

// The client side of a streamed answer: the decoder's SSE bytes, as undici delivers them
// (callStream's sink), written to the client's socket unchanged.
//
// Why pieces are gathered: Node writes every `res.write()` of a chunked response as four socket
// writes (length, CRLF, data, CRLF), each one buffered entry of the socket's writable state.
// A decoder answer arrives as one piece per SSE event, often many in one socket read; writing
// them one by one cost more CPU in the proxy than its own request logic. So the pieces that
// arrive in one event-loop turn are kept in a list and leave together at setImmediate as ONE
// chunk (one write, one syscall), without delaying any of them past the turn they arrived in;
// the SSE bytes themselves are not re-framed or parsed (the first-content check looks at the
// first event or two only).
//
// Backpressure: `data()` answers false, which pauses the decoder (undici), once a write found
// the client's socket full (until it drains) or once the gathered pieces reach the socket's
// high-water mark (until the next flush took them): the proxy holds at most about that much
// per client beyond what the socket holds (libuv may read many times from the decoder before a
// turn ends). A client that stays full for the idle timeout is given up on (its decode is
// cancelled and its connection closed).
import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';
import type { StreamSink } from './upstream.js';

/** Tells, piece by piece, when the first SSE event carrying generated text went by. */
export interface ContentDetector {
  feed(piece: Buffer): boolean;
}

export interface RelayHooks {
  /** The first piece carrying generated text was handed to the relay (the TTFT point). */
  firstToken(): void;
  /** The client is gone, or stopped reading for `idleMs`: cancel the upstream call. */
  cancel(): void;
  /** The client stopped reading for `idleMs` (called before cancel; for the log and the counter). */
  stalled(): void;
  /** Continue the decoder's paused body (the call's resume()). */
  resume(): void;
}

export class ClientRelay implements StreamSink {
  /** The decoder's 2xx status once its headers arrived; 0 until then (nothing sent to the client). */
  status = 0;
  private readonly raw: ServerResponse;
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  /** data() answered false: the decoder's body is paused until resume(). */
  private paused = false;
  /** The flush of the gathered pieces, due at setImmediate; null when none is due. */
  private scheduled: NodeJS.Immediate | null = null;
  private ended = false;
  /** The client's socket was full at the last write: the decoder is paused until 'drain'. */
  private full = false;
  private stall: NodeJS.Timeout | null = null;
  private first: ContentDetector | null;
  private readonly flushNow = () => this.flush();
  private readonly onDrain = () => {
    this.full = false;
    this.unstall();
    this.resume();
  };
  private readonly onStall = () => {
    this.stall = null;
    this.hooks.stalled();
    this.hooks.cancel();
    this.raw.destroy();
  };

  constructor(
    private readonly reply: FastifyReply,
    detector: ContentDetector,
    private readonly idleMs: number,
    private readonly hooks: RelayHooks,
  ) {
    this.raw = reply.raw;
    this.first = detector;
  }

  start(statusCode: number, contentType: string | null): void {
    this.status = statusCode;
    this.reply.hijack();
    // Sent with the first chunk (Node writes the head with the first write).
    this.raw.writeHead(statusCode, { 'content-type': contentType ?? 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
  }

  data(piece: Buffer): boolean {
    if (this.first && this.first.feed(piece)) {
      this.first = null;
      this.hooks.firstToken();
    }
    if (this.raw.destroyed) {
      this.hooks.cancel(); // the client is gone: no 'drain' will ever come
      return false;
    }
    this.pending.push(piece);
    this.pendingBytes += piece.length;
    if (!this.scheduled) this.scheduled = setImmediate(this.flushNow);
    if (this.full || this.pendingBytes >= this.raw.writableHighWaterMark) {
      this.paused = true;
      return false;
    }
    return true;
  }

  private resume(): void {
    if (!this.paused) return;
    this.paused = false;
    this.hooks.resume();
  }

  /** True until a piece with generated text went by (a stream without any: its end is the first "token"). */
  get waitingForContent(): boolean {
    return this.first !== null;
  }

  private take(): Buffer | null {
    const p = this.pending;
    if (p.length === 0) return null;
    this.pending = [];
    this.pendingBytes = 0;
    return p.length === 1 ? p[0]! : Buffer.concat(p);
  }

  private flush(): void {
    this.scheduled = null;
    if (this.ended || this.raw.destroyed) return;
    const buf = this.take();
    if (buf && !this.raw.write(buf)) {
      // Listened for only once the socket is full: most answers never fill it, and an on()/off()
      // pair per answer is per-request work.
      if (!this.full) this.raw.once('drain', this.onDrain);
      this.full = true;
      if (!this.stall) this.stall = setTimeout(this.onStall, this.idleMs);
    } else if (!this.full) this.resume(); // paused on the gathered bytes alone: they are gone now
  }

  /** Ends the answer: what is still gathered, then `tail` (an error event), in one last write. */
  end(tail?: string): void {
    if (this.ended) return;
    this.ended = true;
    // The last write takes what is gathered: a flush still due would only cost the event loop
    // a turn that polls without waiting (the common case: the whole answer came in one read).
    if (this.scheduled) clearImmediate(this.scheduled);
    this.scheduled = null;
    if (this.raw.destroyed) return;
    const buf = this.take();
    if (tail !== undefined) this.raw.end(buf ? Buffer.concat([buf, Buffer.from(tail)]) : tail);
    else if (buf) this.raw.end(buf);
    else this.raw.end();
  }

  private unstall(): void {
    if (this.stall) clearTimeout(this.stall);
    this.stall = null;
  }

  /** Stops the stall timer and detaches from the client's socket (the call is over). */
  close(): void {
    this.unstall();
    if (this.full) this.raw.off('drain', this.onDrain);
  }
}

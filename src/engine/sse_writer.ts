// The socket side of one SSE answer. Events go out as finished HTTP chunks
// (`<hex length>\r\n<events>\r\n`, the framing Node's ServerResponse would produce) written
// straight to the response's socket. ServerResponse.write would instead queue four pieces
// (length, CRLF, data, CRLF) on a socket it corks until the next tick and flush them with a
// writev: the same bytes on the wire and the same one system call, but several times the
// JavaScript per event, and a decode step at batch 8 writes eight events.
//
// With an output queue (the scheduler's, output_queue.ts), events are held and written when the
// queue flushes this writer: during the next forward, while the kernel's helper thread computes.
// Events held together leave in one socket write, each still its own HTTP chunk (the bytes
// ServerResponse would send). A writer that ends its answer writes what it holds first, so the
// order of the bytes never changes.
//
// The direct write is used only when it is certainly equivalent: the headers went out (with the
// first event, through ServerResponse.write, as before), the response is chunked (HTTP/1.1),
// and the socket belongs to this response now (an HTTP/1.1 pipelined response waits for the
// socket, its output buffered in the ServerResponse) with nothing of it still buffered there.
// Otherwise the events go through ServerResponse.write, which frames and orders them itself. The
// end of the answer (the terminating chunk, keep-alive) is always ServerResponse.end.
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Deferred, OutputQueue } from './output_queue.js';

/**
 * Node's own fields that tell whether the socket is this response's and nothing is queued. A
 * Node version without one of them makes every event take ServerResponse.write (never a wrong
 * byte, only the slower path).
 */
interface ResponseState {
  /** The header bytes were handed to the socket (`headersSent` is true already after writeHead). */
  _headerSent?: boolean;
  chunkedEncoding?: boolean;
  outputData?: unknown[];
  outputSize?: number;
}

export class SseWriter implements Deferred {
  /** Events held for the queue, in order. */
  private readonly held: string[] = [];
  /** An entry of this writer is in the queue (at most one at a time). */
  private queued = false;

  constructor(
    private readonly res: ServerResponse,
    private readonly queue: OutputQueue | null = null,
  ) {}

  /**
   * Sets the status line and headers; they leave with the first event (through
   * ServerResponse.write, as the headers are not sent yet), later events go to the socket.
   */
  start(headers: Record<string, string>): void {
    this.res.writeHead(200, headers);
  }

  /** Writes one event (`data: …\n\n`), or holds it for the queue; nothing once the client is gone. */
  write(event: string): void {
    if (this.res.destroyed) {
      this.held.length = 0;
      return;
    }
    // Held events keep their place ahead of this one; the first event (with the headers) is not held.
    if (this.queue && (this.held.length !== 0 || this.directSocket())) {
      this.held.push(event);
      if (!this.queued) {
        this.queued = true;
        this.queue.add(this);
      }
      return;
    }
    const sock = this.directSocket();
    if (sock) sock.write(frame(event));
    else this.res.write(event);
  }

  /** The queue's call: writes what is held. */
  flushDeferred(): void {
    this.queued = false;
    this.flush();
  }

  /** Writes what is held, then ends the answer. */
  end(): void {
    this.flush();
    this.res.end();
  }

  private flush(): void {
    const held = this.held;
    if (held.length === 0) return;
    if (!this.res.destroyed) {
      const sock = this.directSocket();
      if (sock) sock.write(held.length === 1 ? frame(held[0]!) : held.map(frame).join(''));
      else for (const e of held) this.res.write(e);
    }
    held.length = 0;
  }

  private directSocket(): Socket | null {
    const res = this.res;
    const st = res as unknown as ResponseState;
    const sock = res.socket;
    if (!sock || sock.destroyed || !sock.writable || st._headerSent !== true || res.writableEnded) return null;
    if (st.chunkedEncoding !== true) return null;
    // Anything still in the response's own buffer must go first (and through it).
    if (st.outputData === undefined || st.outputData.length !== 0 || st.outputSize !== 0) return null;
    if ((sock as Socket & { _httpMessage?: unknown })._httpMessage !== res) return null;
    return sock;
  }
}

/** One event as the HTTP chunk ServerResponse.write would make of it. */
function frame(event: string): string {
  return `${Buffer.byteLength(event).toString(16)}\r\n${event}\r\n`;
}

// The socket side of one SSE answer. An event goes out as ONE write of its finished HTTP chunk
// (`<hex length>\r\n<event>\r\n`, the framing Node's ServerResponse would produce) straight to
// the response's socket. ServerResponse.write would instead queue four pieces (length, CRLF,
// data, CRLF) on a socket it corks until the next tick and flush them with a writev: the same
// bytes on the wire and the same one system call per event, but several times the JavaScript
// per event, and a decode step at batch 8 writes eight events.
//
// The direct write is used only when it is certainly equivalent: the headers went out (with the
// first event, through ServerResponse.write, as before), the response is chunked (HTTP/1.1),
// and the socket belongs to this response now (an HTTP/1.1 pipelined response waits for the
// socket, its output buffered in the ServerResponse) with nothing of it still buffered there.
// Otherwise the event goes through ServerResponse.write, which frames and orders it itself. The
// end of the answer (the terminating chunk, keep-alive) is always ServerResponse.end.
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

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

export class SseWriter {
  constructor(private readonly res: ServerResponse) {}

  /**
   * Sets the status line and headers; they leave with the first event (through
   * ServerResponse.write, as the headers are not sent yet), later events go to the socket.
   */
  start(headers: Record<string, string>): void {
    this.res.writeHead(200, headers);
  }

  /** Writes one event (`data: …\n\n`); nothing once the client is gone. */
  write(event: string): void {
    const res = this.res;
    if (res.destroyed) return;
    const sock = this.directSocket();
    if (sock) sock.write(`${Buffer.byteLength(event).toString(16)}\r\n${event}\r\n`);
    else res.write(event);
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

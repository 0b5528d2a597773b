// The "request done" notice a sender pushes to the proxy after the receiver acked every chunk
// (DESIGN §1/§6). Transport: ZeroMQ PUSH → the proxy's PULL bound at
// xfer_proxy_host:xfer_proxy_port. Body: one msgpack map
//   {req_id: string, prefiller: string, num_chunks: number, num_tokens: number, ok: boolean, error?: string}
// The push is best effort with a deadline: the prefiller's HTTP reply (spec §4.3 rule 3) is the
// authoritative "transfer complete" signal, so a proxy that is down must not block it.
import { Push } from 'zeromq';
import { encode, decode } from '@msgpack/msgpack';
import { logger } from '../common/log.js';

const log = logger('xfer-notify');

export interface XferNotice {
  req_id: string;
  prefiller: string;
  num_chunks: number;
  num_tokens: number;
  ok: boolean;
  error?: string;
}

export function encodeNotice(n: XferNotice): Uint8Array {
  return encode(n);
}

/** Decodes and checks a notice (for the proxy's PULL side). Throws naming the bad field. */
export function decodeNotice(bytes: Uint8Array): XferNotice {
  const o = decode(bytes) as Record<string, unknown>;
  if (!o || typeof o !== 'object' || Array.isArray(o)) throw new Error('xfer notice: expected a msgpack map');
  if (typeof o.req_id !== 'string') throw new Error('xfer notice: "req_id" must be a string');
  if (typeof o.prefiller !== 'string') throw new Error('xfer notice: "prefiller" must be a string');
  if (typeof o.num_chunks !== 'number') throw new Error('xfer notice: "num_chunks" must be a number');
  if (typeof o.num_tokens !== 'number') throw new Error('xfer notice: "num_tokens" must be a number');
  if (typeof o.ok !== 'boolean') throw new Error('xfer notice: "ok" must be a boolean');
  if (o.error !== undefined && typeof o.error !== 'string') throw new Error('xfer notice: "error" must be a string');
  return o as unknown as XferNotice;
}

export class ProxyNotifier {
  private readonly sock: Push;
  private queue: Promise<void> = Promise.resolve();

  constructor(
    readonly host: string,
    readonly port: number,
    sendTimeoutMs = 2000,
  ) {
    // linger 0: a notice nobody will ever pull must not keep the process alive at exit.
    this.sock = new Push({ sendTimeout: sendTimeoutMs, linger: 0, sendHighWaterMark: 10_000 });
    this.sock.connect(`tcp://${host}:${port}`);
  }

  /** Pushes one notice; resolves true when queued for the proxy, false (logged) when not. */
  push(n: XferNotice): Promise<boolean> {
    // zeromq sockets allow one send at a time: serialise.
    const p = this.queue.then(() => this.sock.send(encodeNotice(n)));
    this.queue = p.catch(() => undefined);
    return p.then(
      () => true,
      (e: Error) => {
        log.warn(`notice for ${n.req_id} not delivered to proxy ${this.host}:${this.port}: ${e.message}`);
        return false;
      },
    );
  }

  close(): void {
    this.sock.close();
  }
}

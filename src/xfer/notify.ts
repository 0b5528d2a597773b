// The sender's side of the transfer notice (src/protocol/xfer_notice.ts): ZeroMQ PUSH to the
// proxy's PULL at xfer_proxy_host:xfer_proxy_port. The push is best effort with a deadline: the
// prefiller's HTTP reply is the authoritative "transfer complete" signal, so a proxy that is down
// must not block it.
import { Push } from 'zeromq';
import { logger } from '../common/log.js';
import { encodeNotice, type XferNotice } from '../protocol/xfer_notice.js';
import { deploymentSecret } from '../common/auth.js';
import { seal } from '../common/replay.js';

export { decodeNotice, encodeNotice, type XferNotice } from '../protocol/xfer_notice.js';

const log = logger('xfer-notify');

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
    const secret = deploymentSecret();
    const signed = seal(secret, 'notice', n);
    const p = this.queue.then(() => this.sock.send(encodeNotice(signed)));
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

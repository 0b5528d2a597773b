// The proxy's side of the transfer notice (src/protocol/xfer_notice.ts): every prefiller's
// xfer sender pushes one notice over ZeroMQ PUSH after the decoder acknowledged the KV; the
// proxy binds the PULL side. The prefiller's HTTP reply is what the request flow waits on; the
// notices feed metrics and the log (a failed transfer is logged with its reason, since the
// decoder then silently recomputes). A message that does not decode as a notice is logged and
// ignored: it never stops the loop.
import { Pull } from 'zeromq';
import { logger } from '../common/log.js';
import { decodeNotice, type XferNotice } from '../protocol/xfer_notice.js';
import { DEFAULT_ZMQ_MAX_MESSAGE_BYTES } from '../common/limits.js';
import { deploymentSecret } from '../common/auth.js';
import { NonceMemory, unseal } from '../common/replay.js';

export type { XferNotice } from '../protocol/xfer_notice.js';

const log = logger('proxy');

export class NotifyReceiver {
  // A message larger than the limit drops the sender's connection (nothing is buffered for it).
  private sock = new Pull({ maxMessageSize: DEFAULT_ZMQ_MAX_MESSAGE_BYTES });
  private closed = false;
  /** Messages dropped (undecodable, or not signed with the deployment secret). */
  droppedCount = 0;
  /** Nonces of the notices taken within the replay window (a replayed notice is dropped). */
  private readonly nonces = new NonceMemory('notice');
  private lastDropLog = 0;

  /** Counts a dropped message; logs at most one line per 10 s so a flood does not flood the log. */
  private dropped(why: string): void {
    this.droppedCount++;
    const now = Date.now();
    if (now - this.lastDropLog >= 10_000) {
      this.lastDropLog = now;
      log.warn(`xfer notify: dropped ${why} (${this.droppedCount} dropped so far)`);
    }
  }

  constructor(private onNotice: (n: XferNotice) => void) {}

  /** Binds tcp://host:port; throws a clear error when the port is taken. */
  async bind(host: string, port: number): Promise<void> {
    this.sock.receiveHighWaterMark = 100_000;
    try {
      await this.sock.bind(`tcp://${host}:${port}`);
    } catch (e) {
      throw new Error(`cannot bind the xfer notify port ${host}:${port} (--proxy-host/--proxy-port): ${(e as Error).message}`);
    }
    void this.loop();
  }

  private async loop(): Promise<void> {
    try {
      for await (const frames of this.sock) {
        const last = frames[frames.length - 1];
        if (!last) continue;
        let notice: XferNotice;
        try {
          notice = decodeNotice(last);
        } catch (e) {
          this.dropped(`undecodable message (${(e as Error).message})`);
          continue;
        }
        const refused = unseal(deploymentSecret(), this.nonces, notice);
        if (refused) {
          this.dropped(`notice for ${notice.req_id.slice(0, 64)}: ${refused.reason}: ${refused.message}`);
          continue;
        }
        try {
          this.onNotice(notice);
        } catch (e) {
          log.error(`xfer notify handler failed: ${(e as Error).message}`);
        }
      }
    } catch (e) {
      if (!this.closed) log.error(`xfer notify socket stopped: ${(e as Error).message}`);
    }
  }

  close(): void {
    this.closed = true;
    this.sock.close();
  }
}

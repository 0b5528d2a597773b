// The xfer notify port (DESIGN §1, §6): every prefiller's xfer sender pushes a msgpack notice
// {req_id, prefiller, num_chunks, num_tokens, ok, error?} over ZeroMQ PUSH after the decoder
// acknowledged the KV. The proxy binds the PULL side. The prefiller's HTTP reply is what the
// request flow waits on; the notices feed metrics and the log (a failed transfer is logged with
// its reason, since the decoder then silently recomputes).
import { Pull } from 'zeromq';
import { decode } from '@msgpack/msgpack';
import { logger } from '../common/log.js';

const log = logger('proxy');

export interface XferNotice {
  req_id: string;
  prefiller?: string;
  num_chunks?: number;
  num_tokens?: number;
  ok: boolean;
  error?: string;
}

export function parseNotice(raw: unknown): XferNotice | null {
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) return null;
  const o = raw as Record<string, unknown>;
  if (typeof o.req_id !== 'string') return null;
  return {
    req_id: o.req_id,
    prefiller: typeof o.prefiller === 'string' ? o.prefiller : undefined,
    num_chunks: typeof o.num_chunks === 'number' ? o.num_chunks : undefined,
    num_tokens: typeof o.num_tokens === 'number' ? o.num_tokens : undefined,
    ok: o.ok !== false,
    error: typeof o.error === 'string' ? o.error : undefined,
  };
}

export class NotifyReceiver {
  private sock = new Pull();
  private closed = false;

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
        let notice: XferNotice | null = null;
        try {
          notice = parseNotice(decode(last));
        } catch (e) {
          log.warn(`xfer notify: undecodable message (${(e as Error).message}) ignored`);
          continue;
        }
        if (!notice) {
          log.warn('xfer notify: message without a string req_id ignored');
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

// The controller side of the monitor port: a ZeroMQ ROUTER that feeds the Registry and
// answers registrations and heartbeats. One receive loop; replies go through a SendQueue
// (zeromq v6 allows one send in flight). A malformed frame is logged and dropped.
import { Router } from 'zeromq';
import { logger } from '../common/log.js';
import { SendQueue } from '../common/send_queue.js';
import { decodeMsg, encodeMsg } from '../protocol/monitor.js';
import type { Registry } from './registry.js';
import { answerP2pLookup } from './p2p_holders.js';
import { answerMissLookup } from './miss_reasons.js';
import type { ReplicaHintMsg } from '../protocol/replica_hint.js';
import { DEFAULT_ZMQ_MAX_MESSAGE_BYTES } from '../common/limits.js';

const log = logger('controller.monitor');

export class MonitorServer {
  private readonly sock = new Router({ linger: 0, maxMessageSize: DEFAULT_ZMQ_MAX_MESSAGE_BYTES, receiveHighWaterMark: 100_000, sendHighWaterMark: 10_000, sendTimeout: 1000 });
  private readonly out = new SendQueue(
    (f) => this.sock.send(f),
    (e) => log.debug(`reply dropped: ${(e as Error).message}`),
  );
  private loop: Promise<void> | null = null;
  private closed = false;

  constructor(private readonly registry: Registry) {}

  async bind(host: string, port: number): Promise<void> {
    await this.sock.bind(`tcp://${host}:${port}`);
    this.loop = this.run();
  }

  private async run(): Promise<void> {
    try {
      for await (const frames of this.sock) {
        const [id, body] = frames;
        if (!id || !body || frames.length !== 2) {
          log.warn(`dropped a monitor message of ${frames.length} frames (expected routing id + body)`);
          continue;
        }
        const msg = decodeMsg(body);
        if (!msg) {
          log.warn(`dropped an undecodable monitor message from ${id.toString()}`);
          this.registry.stats.badMessages++;
          continue;
        }
        let reply;
        try {
          // A P2P holder query is answered from the index (p2p_holders.ts); the rest feed it.
          reply =
            msg.t === 'p2p_lookup' ? answerP2pLookup(this.registry, id.toString(), msg)
            : msg.t === 'miss_lookup' ? answerMissLookup(this.registry, id.toString(), msg)
            : this.registry.handle(id.toString(), msg);
        } catch (e) {
          // A bug here must not stop the monitor: log and keep serving other instances.
          log.error(`monitor message ${String(msg.t)} from ${id.toString()} failed: ${(e as Error).stack}`);
          continue;
        }
        if (reply) void this.out.send([id, encodeMsg(reply)]);
      }
    } catch (e) {
      if (!this.closed) log.error(`monitor loop stopped: ${(e as Error).message}`);
    }
  }

  /** Sends a message to one instance (by its session's routing id); a failure is logged at debug. */
  sendTo(routingId: string, msg: ReplicaHintMsg): void {
    if (!this.closed) void this.out.send([Buffer.from(routingId), encodeMsg(msg)]);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.sock.close();
    await this.loop;
  }
}

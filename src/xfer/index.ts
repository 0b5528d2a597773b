// Entry point of the xfer library: builds the sender or receiver a cache configuration asks
// for (its xfer_* keys, docs/configuration.md). Start-up rules: an unknown xfer_backends entry
// stops start-up; an xfer_buffer_device other than cpu is a warning (host memory is used).
import type { CacheConfig } from '../common/config.js';
import { ConfigError, XFER_BACKENDS } from '../common/config.js';
import type { KvLayout } from '../common/chunk.js';
import { logger } from '../common/log.js';
import { XferReceiver } from './receiver.js';
import { XferSender } from './sender.js';

export { XferReceiver, type Taken, type ReceiverStats, type ReceiverOptions } from './receiver.js';
export { XferSender, XferError, type DisaggSpec, type OutChunk, type SendResult, type SenderOptions } from './sender.js';
export { ProxyNotifier, decodeNotice, encodeNotice, type XferNotice } from './notify.js';

const log = logger('xfer');

export interface XferModel {
  layout: KvLayout;
  chunkSize: number;
  modelId: string;
  /** names this engine in notices and logs (e.g. kvc_rpc_port or kvc_instance_id) */
  id?: string;
}

export type Xfer = { role: 'sender'; sender: XferSender } | { role: 'receiver'; receiver: XferReceiver };

/**
 * Checks the xfer keys that depend on what this build supports. Throws ConfigError for an
 * unknown backend (start-up must stop); warns once when the buffer device is not host memory.
 */
export function checkXferConfig(cfg: CacheConfig): void {
  const bad = cfg.xfer_backends.find((b) => !(XFER_BACKENDS as readonly string[]).includes(b));
  if (bad !== undefined) {
    throw new ConfigError(`key "xfer_backends": unknown backend "${bad}"; supported: ${XFER_BACKENDS.join(', ')}`);
  }
  if (cfg.xfer_buffer_device !== 'cpu') {
    log.warn(`xfer_buffer_device "${cfg.xfer_buffer_device}" is not available on this CPU engine; the transfer buffer uses host memory`);
  }
}

/** Starts the sender or receiver for `cfg`, or returns null when enable_xfer is false. */
export async function createXfer(
  cfg: CacheConfig,
  model: XferModel,
  opts: { receiverTtlMs?: number; allocWaitMs?: number; heldLocally?: (key: string) => boolean } = {},
): Promise<Xfer | null> {
  if (!cfg.enable_xfer) return null;
  checkXferConfig(cfg);
  if (cfg.xfer_role === 'receiver') {
    const receiver = await XferReceiver.start({
      host: cfg.xfer_peer_host!,
      initPort: cfg.xfer_peer_init_port!,
      allocPort: cfg.xfer_peer_alloc_port!,
      bufferBytes: cfg.xfer_buffer_size,
      deadlineFloorMs: cfg.xfer_deadline_floor_ms,
      layout: model.layout,
      chunkSize: model.chunkSize,
      modelId: model.modelId,
      ...(model.id ? { receiverId: model.id } : {}),
      ...(opts.receiverTtlMs ? { ttlMs: opts.receiverTtlMs } : {}),
      ...(opts.heldLocally ? { heldLocally: opts.heldLocally } : {}),
    });
    return { role: 'receiver', receiver };
  }
  const sender = new XferSender({
    layout: model.layout,
    chunkSize: model.chunkSize,
    modelId: model.modelId,
    ...(model.id ? { senderId: model.id } : {}),
    proxyHost: cfg.xfer_proxy_host,
    proxyPort: cfg.xfer_proxy_port,
    bufferBytes: cfg.xfer_buffer_size,
    deadlineFloorMs: cfg.xfer_deadline_floor_ms,
    ...(opts.allocWaitMs ? { allocWaitMs: opts.allocWaitMs } : {}),
  });
  return { role: 'sender', sender };
}

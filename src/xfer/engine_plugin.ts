// The xfer plugin the engine uses for kv_producer / kv_consumer: `createKvTransfer` implements
// the TransferFactory of src/common/transfer_seam.ts.
//
// kv_producer (xfer_role sender): after prefill the connector hands over the prompt's sealed
//   chunks; they go to the receiver named by kv_transfer_params.disagg_spec, the proxy is
//   notified, and only then does the engine answer the HTTP request.
// kv_consumer (xfer_role receiver): before prefill the connector asks for the chunks received
//   for this request (by disagg_spec.req_id, else by the prompt's keys); the engine imports the
//   leading ones, recomputes the tail and releases the reservation.
import { ConfigError } from '../common/config.js';
import type { KvTransferPlugin, ReceivedKv, SealedChunk, TransferFactory, TransferRequest } from '../common/transfer_seam.js';
import { parseDisaggSpec, transferReqId } from '../protocol/disagg_spec.js';
import { createXfer, XferError } from './index.js';

/**
 * How long a consumer waits for a chunk still arriving under another request's reservation (the
 * proxy normally calls after the ack); a request's own transfer is waited for until it ends, by its
 * deadline at the latest (xfer_deadline_floor_ms, docs/xfer.md).
 */
const TAKE_WAIT_MS = 5000;

export const createKvTransfer: TransferFactory = async (ctx) => {
  const want = ctx.role === 'kv_producer' ? 'sender' : ctx.role === 'kv_consumer' ? 'receiver' : null;
  if (!want) throw new ConfigError(`kv_role ${ctx.role} does not transfer KV`);
  if (ctx.cacheConfig.xfer_role !== want) {
    throw new ConfigError(`key "xfer_role": kv_role ${ctx.role} needs xfer_role "${want}" in the cache config; found ${JSON.stringify(ctx.cacheConfig.xfer_role)}`);
  }
  const id = ctx.connectorConfig.kv_connector_extra_config.kvc_rpc_port ?? ctx.cacheConfig.kvc_instance_id;
  const x = await createXfer(ctx.cacheConfig, { layout: ctx.layout, chunkSize: ctx.chunkSize, modelId: ctx.modelId, id }, ctx.heldLocally ? { heldLocally: ctx.heldLocally } : {});
  if (!x) throw new ConfigError('key "enable_xfer": must be true for kv_producer / kv_consumer');

  if (x.role === 'sender') {
    const sender = x.sender;
    const plugin: KvTransferPlugin = {
      async send(req: TransferRequest, chunks: SealedChunk[]) {
        const spec = parseDisaggSpec(req.kvTransferParams?.disagg_spec);
        if (!spec.ok) throw new XferError(spec.error);
        const res = await sender.sendParsed(
          spec.spec,
          chunks.map((c) => ({ key: c.key, numTokens: c.end - c.start, data: c.chunk })),
        );
        // Reported back in the response's kv_transfer_params (the proxy forwards them to the decoder).
        return { xfer: { ok: res.ok, chunks: res.sent + res.skipped, tokens: res.ok ? res.numTokens : 0, ms: res.ms, ...(res.error ? { error: res.error } : {}) } };
      },
      close: () => sender.close(),
    };
    return plugin;
  }

  const receiver = x.receiver;
  const plugin: KvTransferPlugin = {
    stats() {
      const s = receiver.stats();
      return {
        reservations: s.reservations,
        reservedBytes: s.reservedBytes,
        heldBytes: s.poolBytes,
        transfers: s.transfers,
        reservationsEnded: { taken: s.reservationsTaken, released: s.reservationsReleased, expired: s.reservationsExpired },
      };
    },
    ended: (reqId, own) => receiver.endRequest(reqId, own),
    claim: (reqId) => void receiver.claim(reqId),
    async received(req: TransferRequest): Promise<ReceivedKv | null> {
      const reqId = transferReqId(req.kvTransferParams);
      // The request's own transfer, still in flight, is waited for until it ends (by its deadline
      // at the latest, when what did not arrive is discarded): then the engine computes the rest.
      const own = reqId !== undefined ? receiver.msUntilEnded(reqId) : null;
      const taken = await receiver.take(
        req.spans.map((s) => s.key),
        reqId,
        Math.max(TAKE_WAIT_MS, own === null ? 0 : own + 1),
      );
      if (taken.keys.length === 0) {
        taken.release(); // frees this request's reservation too: nothing usable arrived
        return null;
      }
      const byKey = new Map(taken.keys.map((k, i) => [k, taken.chunks[i]!]));
      return { get: (key) => byKey.get(key) ?? null, release: () => taken.release() };
    },
    close: () => receiver.close(),
  };
  return plugin;
};

// POST /xfer/release (src/protocol/xfer_release.ts): a disaggregated request ended without using
// the KV transferred to this decoder for it; its reservation is freed now. Internal: signed with
// the deployment secret when the deployment has one (the proxy is its caller).
import type { FastifyInstance } from 'fastify';
import { requireSecret } from '../../common/auth.js';
import { ERRORS, kvcError } from '../../common/errors.js';
import { requireObject } from '../../common/http.js';
import { parseBody } from '../../common/validate.js';
import type { KvTransferPlugin } from '../../common/transfer_seam.js';
import { XFER_RELEASE_PATH, xferReleaseRequestSchema, type XferReleaseReply } from '../../protocol/xfer_release.js';

export function xferReleaseRoute(app: FastifyInstance, transfer: KvTransferPlugin | null): void {
  requireSecret(app, { applies: (m, p) => m === 'POST' && p === XFER_RELEASE_PATH, name: 'engine', channel: 'engine-http', bearer: false });
  app.post(XFER_RELEASE_PATH, async (req): Promise<XferReleaseReply> => {
    const b = parseBody(xferReleaseRequestSchema, requireObject(req.body));
    if (!transfer?.ended) throw kvcError(ERRORS.conflict, 'this engine receives no KV transfers (it is not a kv_consumer with xfer_role receiver)');
    return { req_id: b.req_id, reservation: transfer.ended(b.req_id) };
  });
}

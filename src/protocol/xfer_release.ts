// POST /xfer/release on a decoder (an engine with kv_role kv_consumer): the proxy tells it that a
// disaggregated request ended without using the KV transferred for it (the client left, the
// request failed, or it was sent to another decoder), so the decoder frees that request's
// reservation at once instead of at its TTL, and refuses a transfer for it that arrives later
// (docs/disaggregation.md "Every transfer ends"). Signed with the deployment secret like every
// internal HTTP call (docs/security.md).
import { z } from 'zod';

export const XFER_RELEASE_PATH = '/xfer/release';

export const xferReleaseRequestSchema = z.strictObject(
  {
    req_id: z.string('expected the transfer id (disagg_spec.req_id) as a string').min(1, 'expected a non-empty string').max(256, 'expected at most 256 characters'),
  },
  'expected an object',
);
export type XferReleaseRequest = z.infer<typeof xferReleaseRequestSchema>;

/**
 * `released`: its reservation (or queued reservation request) was freed; `taken`: the request's
 * decode holds it and frees it when done; `none`: nothing was held for it (a transfer for it
 * arriving later is refused).
 */
export interface XferReleaseReply {
  req_id: string;
  reservation: 'released' | 'taken' | 'none';
}

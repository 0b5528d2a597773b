// The transfer notice: after the receiver acknowledged every chunk of a request, the
// prefiller's xfer sender (src/xfer/notify.ts, ProxyNotifier) pushes one notice to the proxy
// (src/proxy/notify.ts, NotifyReceiver). Transport: ZeroMQ PUSH → the proxy's PULL bound at
// xfer_proxy_host:xfer_proxy_port; body: one msgpack map. The notice is informational (metrics
// and logs): the prefiller's HTTP reply is the authoritative "transfer complete" signal.
import { decode, encode } from '@msgpack/msgpack';
import { z } from 'zod';

export const xferNoticeSchema = z.object({
  req_id: z.string(),
  prefiller: z.string(),
  num_chunks: z.number(),
  num_tokens: z.number(),
  ok: z.boolean(),
  error: z.string().optional(),
  /** With a deployment secret: the sender's clock (ms), a nonce and the seal's tag over the whole notice (src/common/replay.ts, channel "notice"; docs/security.md). */
  ts: z.number().optional(),
  nonce: z.string().optional(),
  auth: z.string().optional(),
});
export type XferNotice = z.infer<typeof xferNoticeSchema>;

export function encodeNotice(n: XferNotice): Uint8Array {
  return encode(n);
}

/** Decodes and checks a notice. Throws naming the bad field (`xfer notice: "num_chunks" must be a number`). */
export function decodeNotice(bytes: Uint8Array): XferNotice {
  const o = decode(bytes);
  if (!o || typeof o !== 'object' || Array.isArray(o)) throw new Error('xfer notice: expected a msgpack map');
  const r = xferNoticeSchema.safeParse(o);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  throw new Error(`xfer notice: "${issue.path.join('.')}" ${issue.message}`);
}

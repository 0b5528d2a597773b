// The proxy's side of the routing lookup (src/protocol/prefix_lookup.ts): one POST per request to
// the controller's /prefix_lookup with the prompt's token ids, answered from the controller's
// in-memory index. Bounded by a short timeout: routing must never wait long on it, and a lookup
// that fails or is late counts as "nothing cached anywhere" (the request is served, routed on
// load alone, and kvc_proxy_prefix_lookups_total{outcome="failed"} says so).
import { Pool } from 'undici';
import { CACHE_SALT_HEADER, prefixLookupReplySchema, PREFIX_LOOKUP_PATH, type PrefixLookupReply } from '../protocol/prefix_lookup.js';
import { encodeTokenBody, TOKEN_BODY_CONTENT_TYPE } from '../protocol/token_body.js';

export class PrefixLookupError extends Error {
  override name = 'PrefixLookupError';
}

export class PrefixClient {
  private readonly pool: Pool;
  // The binary token body (src/protocol/token_body.ts): the controller reads it into reused
  // memory instead of parsing a JSON array, which is most of what a lookup costs it.
  private static readonly HEADERS = { 'content-type': TOKEN_BODY_CONTENT_TYPE };

  constructor(
    readonly url: string,
    readonly timeoutMs: number,
  ) {
    this.pool = new Pool(url, { connections: 16, connect: { timeout: Math.max(100, timeoutMs) }, keepAliveTimeout: 30_000 });
  }

  /** Every instance's cached prefix of `tokens`; rejects with PrefixLookupError (never hangs past timeoutMs). */
  async lookup(tokens: readonly number[], cacheSalt?: string): Promise<PrefixLookupReply> {
    // An empty prompt holds no prefix anywhere (and an empty binary body is refused).
    if (tokens.length === 0) return { num_tokens: 0, instances: {} };
    let res;
    try {
      res = await this.pool.request({
        method: 'POST',
        path: PREFIX_LOOKUP_PATH,
        headers: cacheSalt === undefined ? PrefixClient.HEADERS : { ...PrefixClient.HEADERS, [CACHE_SALT_HEADER]: cacheSalt },
        body: encodeTokenBody(tokens),
        headersTimeout: this.timeoutMs,
        bodyTimeout: this.timeoutMs,
      });
    } catch (e) {
      throw new PrefixLookupError(`controller ${this.url}${PREFIX_LOOKUP_PATH}: ${(e as Error).message}`);
    }
    let body: unknown;
    try {
      body = await res.body.json();
    } catch (e) {
      throw new PrefixLookupError(`controller ${this.url}${PREFIX_LOOKUP_PATH}: unreadable answer (${(e as Error).message})`);
    }
    if (res.statusCode !== 200) {
      const msg = (body as { error?: { message?: unknown } } | null)?.error?.message;
      throw new PrefixLookupError(`controller ${this.url}${PREFIX_LOOKUP_PATH} answered ${res.statusCode}${typeof msg === 'string' ? `: ${msg}` : ''}`);
    }
    const r = prefixLookupReplySchema.safeParse(body);
    if (!r.success) {
      const i = r.error.issues[0]!;
      throw new PrefixLookupError(`controller ${this.url}${PREFIX_LOOKUP_PATH}: malformed answer: ${i.path.join('.') || '(body)'}: ${i.message}`);
    }
    return r.data;
  }

  close(): Promise<void> {
    return this.pool.close();
  }
}

// Reads binary token bodies (src/protocol/token_body.ts) into reused, preallocated buffers.
//
// Why: the request-path lookups carry thousands of token ids, and anything a request allocates
// in proportion to them (a JSON string and array, or a Buffer.concat and a typed array per
// request) is garbage that V8 must collect; when it lives outside the JS heap (ArrayBuffers),
// V8 answers with full mark-compact collections once the heap is large, and those land in the
// latency tail. Here the socket's chunks are copied straight into a buffer taken from a small
// pool and returned after the (synchronous) handler ran, so a steady stream of lookups
// allocates nothing per token.
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ERRORS, kvcError } from '../common/errors.js';
import { TOKEN_BODY_CONTENT_TYPE, TOKEN_BYTES, tokenBodyLengthSchema } from '../protocol/token_body.js';

/** Buffers above this size are not kept after use (one huge body must not pin its memory). */
const KEEP_MAX_BYTES = 1 << 20;
/** Buffers kept for reuse: more than the requests whose bodies arrive at the same time. */
const KEEP_MAX_COUNT = 32;
const FIRST_BYTES = 64 * 1024;

/** A received binary token body: `tokens` views pooled memory until `release()`. */
export class TokenBody {
  tokens: Uint32Array;
  private released = false;

  constructor(
    private readonly pool: TokenBufferPool,
    private readonly buf: ArrayBuffer,
    length: number,
  ) {
    this.tokens = new Uint32Array(buf, 0, length / TOKEN_BYTES);
  }

  /** Gives the memory back to the pool; `tokens` must not be used afterwards. */
  release(): void {
    if (this.released) return;
    this.released = true;
    this.tokens = EMPTY;
    this.pool.put(this.buf);
  }
}
const EMPTY = new Uint32Array(0);

export class TokenBufferPool {
  private readonly free: ArrayBuffer[] = [];
  /** Buffers handed out since start (reuse is visible in tests: it stays small under steady load). */
  allocated = 0;

  /** A buffer of at least `bytes` (a multiple of 4, so every buffer can hold whole token ids). */
  take(bytes: number): ArrayBuffer {
    const b = this.free.pop();
    if (b && b.byteLength >= bytes) return b;
    if (b) this.put(b);
    this.allocated++;
    let size = FIRST_BYTES;
    while (size < bytes) size *= 2;
    return new ArrayBuffer(size);
  }

  put(b: ArrayBuffer): void {
    if (b.byteLength <= KEEP_MAX_BYTES && this.free.length < KEEP_MAX_COUNT) this.free.push(b);
  }
}

/**
 * Registers the application/octet-stream parser on `app`: accepted on `routes` only (elsewhere a
 * 400 naming the routes), at most `maxBytes` (413), a length that is a positive multiple of 4
 * (400 naming the body). The handler receives a TokenBody and must release it.
 */
export function installTokenBodyParser(app: FastifyInstance, routes: readonly string[], maxBytes: number): TokenBufferPool {
  const pool = new TokenBufferPool();
  const accepted = new Set(routes);
  const tooLarge = () => kvcError(ERRORS.body_too_large, `request body exceeds ${maxBytes} bytes (${Math.floor(maxBytes / TOKEN_BYTES)} token ids)`);
  app.addContentTypeParser(TOKEN_BODY_CONTENT_TYPE, (req: FastifyRequest, payload, done) => {
    const route = req.routeOptions.url ?? req.url;
    if (!accepted.has(route)) {
      done(kvcError(ERRORS.invalid_content_type, `content-type: ${TOKEN_BODY_CONTENT_TYPE} (binary token ids) is accepted by ${routes.join(' and ')} only; send ${route} a JSON body (application/json)`), undefined);
      return;
    }
    const declared = Number(req.headers['content-length']);
    if (declared > maxBytes) {
      done(tooLarge(), undefined);
      return;
    }
    // Sized from Content-Length up to KEEP_MAX_BYTES only: a larger body grows its buffer as its
    // bytes arrive, so a client that declares 16 MiB and sends nothing reserves little.
    let buf = pool.take(Number.isFinite(declared) && declared > 0 ? Math.min(declared, KEEP_MAX_BYTES) : FIRST_BYTES);
    let bytes = new Uint8Array(buf);
    let received = 0;
    let finished = false;
    const finish = (err: Error | null, body?: TokenBody) => {
      if (finished) return;
      finished = true;
      payload.removeListener('data', onData);
      payload.removeListener('end', onEnd);
      payload.removeListener('error', onError);
      if (!body) pool.put(buf);
      done(err, body);
    };
    const onData = (chunk: Buffer) => {
      const end = received + chunk.length;
      if (end > maxBytes) {
        finish(tooLarge());
        return;
      }
      if (end > buf.byteLength) {
        // Chunked transfer or a Content-Length that lied low: move to a larger buffer.
        const bigger = pool.take(end);
        new Uint8Array(bigger).set(bytes.subarray(0, received));
        pool.put(buf);
        [buf, bytes] = [bigger, new Uint8Array(bigger)];
      }
      bytes.set(chunk, received);
      received = end;
    };
    const onEnd = () => {
      if (Number.isFinite(declared) && received !== declared) {
        finish(kvcError(ERRORS.invalid_field, `body: received ${received} bytes, Content-Length said ${declared}`));
        return;
      }
      const r = tokenBodyLengthSchema.safeParse(received);
      if (!r.success) {
        finish(kvcError(ERRORS.invalid_field, r.error.issues[0]!.message));
        return;
      }
      // The wire layout is little-endian; a big-endian host swaps in place (no copy).
      if (!LITTLE_ENDIAN) for (let i = 0; i < received; i += 4) bytes.subarray(i, i + 4).reverse();
      finish(null, new TokenBody(pool, buf, received));
    };
    const onError = (e: Error) => finish(kvcError(ERRORS.invalid_field, `body: could not be read (${e.message})`));
    payload.on('data', onData);
    payload.on('end', onEnd);
    payload.on('error', onError);
    payload.resume();
  });
  return pool;
}
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

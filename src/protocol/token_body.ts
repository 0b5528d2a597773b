// The binary token body: a prompt's token ids as raw bytes instead of a JSON array, for the
// controller's request-path lookups (POST /lookup and POST /prefix_lookup). Sender: the proxy's
// kv-aware router (src/proxy/prefix_client.ts), and any client that wants the cheap path;
// receiver: the controller's HTTP API (src/controller/token_body_parser.ts). JSON `{"tokens": [...]}`
// stays accepted on the same routes; both give the same answer.
//
// Layout: `Content-Type: application/octet-stream`, the body is the token ids in order, each an
// unsigned 32-bit integer, little-endian, 4 bytes, nothing before or after (no header, no count:
// the count is the body length / 4). Every uint32 is a valid token id (the JSON path accepts
// the same range, 0 … 4294967295). The body must hold at least one token id, and at most the
// server's body limit in bytes (413 above it).
//
// Why it exists: the controller answers a lookup in ~10 µs from its index, while parsing an
// 8,192-token JSON body (a ~40 KB string, an 8,192-element array) cost ~0.4 ms of CPU and most of
// the request's garbage. Read as bytes into a reused buffer, a request allocates nothing
// proportional to its tokens.
import { z } from 'zod';

export const TOKEN_BODY_CONTENT_TYPE = 'application/octet-stream';
/** Bytes per token id. */
export const TOKEN_BYTES = 4;

/**
 * The byte length of a binary token body, checked once the whole body arrived (the 413 for a
 * body above the limit comes earlier, from its Content-Length or as the bytes arrive).
 */
export const tokenBodyLengthSchema = z
  .number()
  .int()
  .refine((n) => n > 0, 'body: empty; expected at least one token id (application/octet-stream: uint32 little-endian, 4 bytes each)')
  .refine((n) => n % TOKEN_BYTES === 0, {
    error: (iss) => `body: ${String(iss.input)} bytes is not a multiple of 4; expected token ids as uint32 little-endian, 4 bytes each`,
  });

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** Encodes token ids (each checked to be a uint32) as a binary token body. */
export function encodeTokenBody(tokens: ArrayLike<number>): Uint8Array {
  const out = new Uint32Array(tokens.length);
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i]!;
    if (t >>> 0 !== t) throw new RangeError(`tokens[${i}]: expected a token id from 0 to 4294967295, found ${t}`);
    out[i] = t;
  }
  const bytes = new Uint8Array(out.buffer);
  if (!LITTLE_ENDIAN) swap32(bytes);
  return bytes;
}

/**
 * The token ids of a binary token body as a Uint32Array view over `bytes` (no copy). `bytes`
 * must start at a 4-byte aligned offset of its buffer; on a big-endian host they are swapped
 * in place first.
 */
export function decodeTokenBody(bytes: Uint8Array): Uint32Array {
  const r = tokenBodyLengthSchema.safeParse(bytes.byteLength);
  if (!r.success) throw new RangeError(r.error.issues[0]!.message);
  if (!LITTLE_ENDIAN) swap32(bytes);
  return new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / TOKEN_BYTES);
}

function swap32(b: Uint8Array): void {
  for (let i = 0; i + 3 < b.length; i += 4) {
    const [x0, x1] = [b[i]!, b[i + 1]!];
    b[i] = b[i + 3]!;
    b[i + 1] = b[i + 2]!;
    b[i + 2] = x1;
    b[i + 3] = x0;
  }
}

// The bodies of POST /lookup and POST /prefix_lookup, read straight from the request's bytes.
// Both are `{"tokens": [ids…]}` with thousands of ids, sent once per request by the proxy's
// kv-aware router (and by engines and tools for /lookup); through the generic path each one
// becomes a ~40 KB string, a nesting scan, JSON.parse's array of numbers and a validation pass,
// all garbage the collector must then sweep while other requests wait. This scanner reads that
// one shape in a single pass into a Uint32Array (its storage is outside the JS heap) and claims
// nothing else: any other key, a sign, a fraction, an exponent, a leading zero, an id above
// 2^32 − 1 or malformed JSON returns undefined, and the body takes the generic path (JSON
// parse, then the zod schema), which gives the same answer or the same 400 naming the field.

const SPACE = 0x20;
const TAB = 0x09;
const LF = 0x0a;
const CR = 0x0d;
const ZERO = 0x30;
const NINE = 0x39;
const KEY = Buffer.from('"tokens"');

/** Ids are written here while scanning (sync, so one per process is enough), then copied out at their count. */
let scratch = new Uint32Array(16_384);

/** The index of the first non-whitespace byte at or after `i` (a plain function: a closure over `i` would make every access to it a context load). */
function skipWs(b: Uint8Array, i: number): number {
  for (let c = b[i]; c === SPACE || c === LF || c === CR || c === TAB; c = b[++i]);
  return i;
}

/** The token ids of a body that is exactly `{"tokens": [non-negative 32-bit integers]}` (JSON whitespace allowed); undefined otherwise. */
export function scanTokenBody(b: Uint8Array): Uint32Array | undefined {
  const n = b.length;
  let i = 0;
  i = skipWs(b, i);
  if (b[i++] !== 0x7b /* { */) return undefined;
  i = skipWs(b, i);
  for (let k = 0; k < KEY.length; k++) if (b[i++] !== KEY[k]) return undefined;
  i = skipWs(b, i);
  if (b[i++] !== 0x3a /* : */) return undefined;
  i = skipWs(b, i);
  if (b[i++] !== 0x5b /* [ */) return undefined;
  i = skipWs(b, i);
  let count = 0;
  let out = scratch; // a local: the module variable is a context slot
  if (b[i] === 0x5d /* ] */) i++;
  else {
    for (;;) {
      let c = b[i]!;
      if (!(c >= ZERO && c <= NINE)) return undefined;
      let v = c - ZERO;
      i++;
      c = b[i]!;
      if (v === 0 && c >= ZERO && c <= NINE) return undefined; // leading zero: not JSON
      while (c >= ZERO && c <= NINE) {
        v = v * 10 + (c - ZERO);
        if (v > 0xffffffff) return undefined;
        c = b[++i]!;
      }
      if (count === out.length) {
        const bigger = new Uint32Array(out.length * 2);
        bigger.set(out);
        scratch = out = bigger;
      }
      out[count++] = v;
      i = skipWs(b, i);
      c = b[i++]!;
      if (c === 0x2c /* , */) {
        i = skipWs(b, i);
        continue;
      }
      if (c === 0x5d /* ] */) break;
      return undefined;
    }
  }
  i = skipWs(b, i);
  if (b[i++] !== 0x7d /* } */) return undefined;
  i = skipWs(b, i);
  return i === n ? out.slice(0, count) : undefined;
}

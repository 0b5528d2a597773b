// Symmetric int8 quantisation of KV rows (one head's head_dim elements of one token), for the
// engine's int8 paged KV (--kv-cache-dtype int8, its scales held as f16) and the tiers' int8 chunk
// codec (scales as f32): scale = round(max|x| / 127) to the scale's type, q = round(x / scale)
// clamped to [-127, 127]; the value read back is fround(q · scale).

/**
 * Quantises x[xo .. xo+n) into q[qo .. qo+n) and returns the row's scale (max|x| / 127 through
 * `roundScale`, f32 by default); NaN when the row holds
 * a non-finite value (q is then written as zeros: the caller decides, the codec refuses the chunk,
 * the engine keeps the NaN scale so the row reads back as NaN, as an f32 cache would hold it).
 */
export function quantizeInt8Row(x: Float32Array, xo: number, n: number, q: Int8Array, qo: number, roundScale: (s: number) => number = Math.fround): number {
  let m = 0;
  for (let e = 0; e < n; e++) {
    const a = Math.abs(x[xo + e]!);
    if (!(a <= 3.4028234663852886e38)) {
      q.fill(0, qo, qo + n);
      return NaN;
    }
    if (a > m) m = a;
  }
  const scale = roundScale(m / 127);
  if (scale === 0) {
    q.fill(0, qo, qo + n);
    return 0;
  }
  for (let e = 0; e < n; e++) {
    const v = Math.round(x[xo + e]! / scale);
    q[qo + e] = v > 127 ? 127 : v < -127 ? -127 : v;
  }
  return scale;
}

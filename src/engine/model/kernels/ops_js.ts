// The forward pass's element-wise operations in plain JS: the definition of their bits (the WASM
// SIMD twins in wat/ops.ts compute the same values bit for bit), used by the JS kernel and by the
// WASM kernel for operands outside its memory.
//
// Every operation is per row or per element in a fixed order, so a row's result never depends
// on the batch (batch invariance). JS evaluates in f64: a sum, difference or product of two f32
// values computed in f64 and rounded to f32 is the f32 operation's result (f64 has more than
// 2*24+2 bits), so storing into a Float32Array gives exactly the f32 arithmetic the SIMD code does.

/**
 * RMSNorm: out[r] = f32(f32(x[r] * s) * w) with s = f32(1 / sqrt(ss / dim + eps)), where ss is
 * the sum of x[r][i]² accumulated in f64 for i ascending (each square exact in f64) and eps
 * the config's value as an f64.
 */
export function rmsNormJs(x: Float32Array, w: Float32Array, out: Float32Array, rows: number, dim: number, eps: number): void {
  for (let r = 0; r < rows; r++) {
    const b = r * dim;
    let ss = 0;
    for (let i = 0; i < dim; i++) ss += x[b + i]! * x[b + i]!;
    const s = Math.fround(1 / Math.sqrt(ss / dim + eps));
    for (let i = 0; i < dim; i++) out[b + i] = Math.fround(x[b + i]! * s) * w[i]!;
  }
}

/**
 * RoPE (Hugging Face rotate_half), in place on the first `heads` heads of `hd` floats of each of
 * `rows` rows `stride` floats apart: for i < hd/2, with c = cos[pos*hd/2 + i], s = sin[…],
 * x1' = f32(x1*c) - f32(x2*s), x2' = f32(x2*c) + f32(x1*s) (x1 = head[i], x2 = head[i + hd/2]).
 */
export function ropeJs(qkv: Float32Array, rows: number, stride: number, heads: number, hd: number, pos: Int32Array, cos: Float32Array, sin: Float32Array): void {
  const half = hd >> 1;
  const fr = Math.fround;
  for (let r = 0; r < rows; r++) {
    const base = r * stride;
    const cb = pos[r]! * half;
    for (let hh = 0; hh < heads; hh++) {
      const o = base + hh * hd;
      for (let i = 0; i < half; i++) {
        const x1 = qkv[o + i]!;
        const x2 = qkv[o + i + half]!;
        const c = cos[cb + i]!;
        const s = sin[cb + i]!;
        qkv[o + i] = fr(x1 * c) - fr(x2 * s);
        qkv[o + i + half] = fr(x2 * c) + fr(x1 * s);
      }
    }
  }
}

/** x[i] = f32(x[i] + y[i]) for i < n (the residual adds). */
export function addIntoJs(x: Float32Array, y: Float32Array, n: number): void {
  for (let i = 0; i < n; i++) x[i] = x[i]! + y[i]!;
}

/**
 * `rows` rows of n floats from src[so + r*ss …] to dst[do + r*ds …] (attention's query gather
 * and output scatter). Plain copies: no arithmetic.
 */
export function copyRowsJs(src: Float32Array, so: number, ss: number, dst: Float32Array, d0: number, ds: number, rows: number, n: number): void {
  for (let r = 0; r < rows; r++) {
    const a = so + r * ss;
    const b = d0 + r * ds;
    for (let i = 0; i < n; i++) dst[b + i] = src[a + i]!;
  }
}

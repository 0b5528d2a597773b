// WAT of exp, shared by softmax, SwiGLU and the fused SwiGLU epilogue of the GEMM. exp is the
// Cephes expf polynomial evaluated in f32 with separate mul/add, so attention_js.ts (expf32) can
// reproduce it bit for bit in JS. Constants are emitted as exact f32 bit patterns.

export const EXP_CONSTS = {
  lo: -87,
  log2e: 1.44269504088896341,
  half: 0.5,
  c1: 0.693359375,
  c2: -2.12194440e-4,
  p: [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1],
  one: 1,
};

const bitsOf = (v: number) => '0x' + (new Uint32Array(new Float32Array([v]).buffer)[0]!).toString(16);
const vc = (v: number) => `(v128.const i32x4 ${bitsOf(v)} ${bitsOf(v)} ${bitsOf(v)} ${bitsOf(v)})`;
const sc = (v: number) => `(f32.reinterpret_i32 (i32.const ${bitsOf(v)}))`;

/**
 * Where expV takes its constants. Written inline, each v128.const costs the loop that uses it
 * (V8 materialises it there rather than keeping a register): softmax, in isolation over the
 * groups of a 512-token causal prefill, took 3.1 ns per score with them inline and 2.46 with them
 * in locals set once before the loop (2.25 with its exp pass also two vectors per turn). So
 * loops that evaluate expV many times declare EXP_LOCALS, run EXP_INIT once, and pass `hoisted`;
 * the bits are the same either way. (Not the fused SwiGLU epilogue nor the swiglu export: no
 * gain measured there, where divisions and the product's K steps dominate.)
 */
const EXP_VCONSTS: Record<string, number> = {
  lo: EXP_CONSTS.lo,
  log2e: EXP_CONSTS.log2e,
  half: EXP_CONSTS.half,
  c1: EXP_CONSTS.c1,
  c2: EXP_CONSTS.c2,
  p0: EXP_CONSTS.p[0]!,
  p1: EXP_CONSTS.p[1]!,
  p2: EXP_CONSTS.p[2]!,
  p3: EXP_CONSTS.p[3]!,
  p4: EXP_CONSTS.p[4]!,
  p5: EXP_CONSTS.p[5]!,
  one: EXP_CONSTS.one,
  magic: 12582912,
};
export const EXP_LOCALS = Object.keys(EXP_VCONSTS).map((k) => `(local $xk_${k} v128)`).join(' ') + ' (local $xk_127 v128)';
export const EXP_INIT = Object.entries(EXP_VCONSTS).map(([k, v]) => `(local.set $xk_${k} ${vc(v)})`).join('\n') + '\n(local.set $xk_127 (v128.const i32x4 127 127 127 127))';

/**
 * exp of the v128 expression `x` (f32x4); uses locals $ex $efx $ey $ez with suffix `sfx` (so two
 * evaluations can be interleaved), and EXP_LOCALS when `hoisted`.
 */
export function expV(x: string, opts: { hoisted?: boolean; sfx?: string } = {}): string {
  const C = EXP_CONSTS;
  const k = (name: string, v: number) => (opts.hoisted ? `(local.get $xk_${name})` : vc(v));
  const s = opts.sfx ?? '';
  const [ex, efx, ey, ez] = [`$ex${s}`, `$efx${s}`, `$ey${s}`, `$ez${s}`];
  const lines = [
    // pmax(x, lo) = x < lo ? lo : x: max(x, lo) for every x, NaN included (x is kept), in one
    // instruction where f32x4.max's NaN and signed-zero rules cost several on x86.
    `(local.set ${ex} (f32x4.pmax ${x} ${k('lo', C.lo)}))`,
    `(local.set ${efx} (f32x4.floor (f32x4.add (f32x4.mul (local.get ${ex}) ${k('log2e', C.log2e)}) ${k('half', C.half)})))`,
    `(local.set ${ex} (f32x4.sub (local.get ${ex}) (f32x4.mul (local.get ${efx}) ${k('c1', C.c1)})))`,
    `(local.set ${ex} (f32x4.sub (local.get ${ex}) (f32x4.mul (local.get ${efx}) ${k('c2', C.c2)})))`,
    `(local.set ${ez} (f32x4.mul (local.get ${ex}) (local.get ${ex})))`,
    `(local.set ${ey} ${k('p0', C.p[0]!)})`,
  ];
  for (let i = 1; i < C.p.length; i++) lines.push(`(local.set ${ey} (f32x4.add (f32x4.mul (local.get ${ey}) (local.get ${ex})) ${k(`p${i}`, C.p[i]!)}))`);
  lines.push(`(local.set ${ey} (f32x4.add (f32x4.add (f32x4.mul (local.get ${ey}) (local.get ${ez})) (local.get ${ex})) ${k('one', C.one)}))`);
  // 2^fx from the integral fx without a float→int conversion: fx + 1.5·2^23 holds fx in its low
  // mantissa bits (|fx| < 2^22), and the exponent bits above them vanish in the shift by 23 — the
  // same bits as (trunc(fx) + 127) << 23 for every finite fx the clamp above lets through.
  const i127 = opts.hoisted ? '(local.get $xk_127)' : '(v128.const i32x4 127 127 127 127)';
  lines.push(`(f32x4.mul (local.get ${ey}) (i32x4.shl (i32x4.add (f32x4.add (local.get ${efx}) ${k('magic', 12582912)}) ${i127}) (i32.const 23)))`);
  return lines.join('\n');
}

/** Scalar twin of expV; uses locals $sx $sfx $sy $sz. */
export function expS(x: string): string {
  const C = EXP_CONSTS;
  const lines = [
    `(local.set $sx (f32.max ${x} ${sc(C.lo)}))`,
    `(local.set $sfx (f32.floor (f32.add (f32.mul (local.get $sx) ${sc(C.log2e)}) ${sc(C.half)})))`,
    `(local.set $sx (f32.sub (local.get $sx) (f32.mul (local.get $sfx) ${sc(C.c1)})))`,
    `(local.set $sx (f32.sub (local.get $sx) (f32.mul (local.get $sfx) ${sc(C.c2)})))`,
    `(local.set $sz (f32.mul (local.get $sx) (local.get $sx)))`,
    `(local.set $sy ${sc(C.p[0]!)})`,
  ];
  for (let i = 1; i < C.p.length; i++) lines.push(`(local.set $sy (f32.add (f32.mul (local.get $sy) (local.get $sx)) ${sc(C.p[i]!)}))`);
  lines.push(`(local.set $sy (f32.add (f32.add (f32.mul (local.get $sy) (local.get $sz)) (local.get $sx)) ${sc(C.one)}))`);
  // 2^fx as in expV (the magic-number add, no float→int conversion): i32.trunc_f32_s would trap
  // on a NaN or ±Inf fx — an Inf/NaN score, e.g. from a K value past f16's range — where this
  // gives y·(some power of two) = NaN, as expV and expf32 do, so the kernels are total.
  lines.push(`(f32.mul (local.get $sy) (f32.reinterpret_i32 (i32.shl (i32.add (i32.reinterpret_f32 (f32.add (local.get $sfx) ${sc(12582912)})) (i32.const 127)) (i32.const 23))))`);
  return lines.join('\n');
}

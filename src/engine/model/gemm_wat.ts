// WAT source of the WASM SIMD GEMM kernel, generated from TypeScript so the unrolled register
// blocks stay readable. C[m][n] = sum_k A[m][k] * Wt[k][n], with
//   A  row-major [M][K] f32,  Wt row-major [K][N] f32 (the weight pre-transposed, N padded to a
//   multiple of STRIP), C row-major [M][N] f32.
// Vectorised over n: every output element is ONE f32 accumulator updated as acc = acc + a*w for
// k = 0, 1, ..., K-1: separate mul and add, or, when the module is built with `fma` (fma.ts:
// only where relaxed SIMD's f32x4.relaxed_madd is fused), one fused multiply-add. That order does
// not depend on M, on which rows share a register block, or on the column strip, so results are
// batch invariant and equal bit for bit to the plain-JS reference (kernel_js.ts, with the same
// fma setting).
//
// Blocking: rows in blocks of MB (A block stays in L1/L2), columns in strips of STRIP=32 (a strip
// of Wt is K*128 bytes, cache resident across the row block; the model's weights hold each strip
// as four panels of PANEL=8 columns, one per register tile); inside, 4 rows x 8 columns (8 vector
// accumulators) per micro-kernel, and 1 row x 32 columns for the leftover rows (8 independent
// accumulators keep the add pipeline busy during single-sequence decode).

import { BLOCK_SHIFT, BLOCK_TOKENS } from './kv_cache.js';

export const STRIP = 32;
export const MB = 64;

/**
 * The register tile: 4 rows x 8 columns (8 v128 accumulators), four per strip. Why not larger
 * (measured, see docs/engine-model.md): V8's scheduler issues every load of a k step (2 weight
 * vectors, one splat per row) before its multiply-adds, so a tile needs accumulators + weights
 * + splats (+ the zero constant) xmm registers, 15 at most; 5 or 6 rows spill accumulators to
 * the stack (store-forwarding in the dependency chain: 26-34 against 44 GFLOP/s), and 3 x 12
 * (9 sums, exactly 15 registers) runs no faster than 4 x 8.
 */
const TILE_ROWS = 4;
const TILE_COLS = [0, 8, 16, 24];


/**
 * Columns per panel: a strip of packed weights is STRIP / PANEL panels, each [K][PANEL] — the
 * columns of one register tile, contiguous over k (see gemmFunc).
 */
export const PANEL = 8;

/**
 * Where packed column `c` of a weight with `k` rows starts, in values, in the WASM kernel's weight
 * layout (gemm_wat.ts gemmFunc): strips of STRIP columns, each STRIP / PANEL panels of [k][PANEL];
 * its value at row kk is at panelIndex(c, k) + kk * PANEL.
 */
export function panelIndex(c: number, k: number): number {
  const inStrip = c % STRIP;
  return (c - inStrip) * k + (inStrip - (inStrip % PANEL)) * k + (inStrip % PANEL);
}

/**
 * Weight formats of packed weights (see gemmFunc). Each is turned into the f32 value the
 * plain-JS decoder (gguf_format.ts dequantize, safetensors.ts) gives, then used exactly like an
 * f32 weight: a model computes the same bits as with those values widened to f32 at load.
 *   f32   [4][K][8] f32 per strip (panels), 32 bytes a panel row;
 *   bf16  [4][K][8] u16 per strip: the f32 bits are the u16 << 16;
 *   f16   [4][K][8] u16 per strip: |h| << 13 reinterpreted as f32, times 2^112 (exact for normal and
 *         subnormal halves; Inf/NaN weights are refused at upload), then the sign;
 *   q8    per strip, two runs of k-blocks, one per half of 16 columns (two streams from memory);
 *         per half and block of 32 k: 16 f32 column scales (64 bytes), then 16 k-pairs of
 *         [16 columns][2] i8 (512 bytes) — the layout i32x4.dot_i16x8_s takes (before round 11,
 *         one run of 32-column blocks); computed as an int8 dot product
 *         against quantized activations (q8_dot.ts defines the bits; gemmpq8 below), not widened;
 *   q4    4-bit weights with a scale and an offset per column and block of 32 (x = s·q − o, q in
 *         0..15: Q4_0, Q4_1 and Q4_K as their files hold them), in modules built with relaxed
 *         SIMD only (gemmpq4 multiplies with its i8 × i7 dot): q8's runs of k-blocks per half,
 *         each half-block 16 f32 scales, 16 f32 offsets, then 8 k-quad rows of 32 bytes — 4-column
 *         group g's 16 values (column c mod 4, then k mod 4: [c][k]) in bytes 16·(g >> 1) …,
 *         low nibbles for even g, high for odd (0.75 bytes a weight against q8's 1.125).
 */
export type WFmt = 'f32' | 'bf16' | 'f16' | 'q8' | 'q4';
/** The formats the widening GEMMs take (gemmFunc): every one but q8 and q4 (gemmpq8, gemmpq4). */
type WideFmt = Exclude<WFmt, 'q8' | 'q4'>;
/** Bytes of one weight value of a widened format. */
const ELEM_BYTES: Record<WideFmt, number> = { f32: 4, bf16: 2, f16: 2 };
/** q8: bytes of one k-block of a strip (scales + 32 rows of 32 i8). */
export const Q8_BLOCK_BYTES = STRIP * 4 + 32 * STRIP;
/** q8: columns of one half of a strip (gemmpq8 takes a strip in two passes, one per half). */
export const Q8_HALF_COLS = STRIP / 2;
/** q8: bytes of one k-pair row of a half: its columns × 2 i8. */
export const Q8_HALF_PAIR_BYTES = Q8_HALF_COLS * 2;
/** q8: bytes of one k-block of one half of a strip: its column scales (f32), then 16 k-pair rows. */
export const Q8_HALF_BLOCK_BYTES = Q8_BLOCK_BYTES / 2;
/** q4: bytes of one k-quad row of a half (4 k of 16 columns as nibbles). */
export const Q4_HALF_QUAD_BYTES = 32;
/** q4: bytes of one k-block of one half: 16 f32 column scales, 16 f32 column offsets, 8 k-quad rows. */
export const Q4_HALF_BLOCK_BYTES = Q8_HALF_COLS * 8 + 8 * Q4_HALF_QUAD_BYTES;
/** q4: bytes of one k-block of a strip (both halves). */
export const Q4_BLOCK_BYTES = 2 * Q4_HALF_BLOCK_BYTES;

/**
 * v128 (f32x4) of the 4 columns `half` (0 or 1) of the 8 whose k-row starts `off` bytes past the
 * address expression `at` (f32 and 16-bit formats; 16-bit values come from $wq, see loadGroup).
 */
function loadW(fmt: WideFmt, at: string, off: number, half: number): string {
  const ext = half ? 'high' : 'low';
  switch (fmt) {
    case 'f32':
      return `(v128.load offset=${off + 16 * half} ${at})`;
    case 'bf16':
      return `(i32x4.shl (i32x4.extend_${ext}_i16x8_u (local.get $wq)) (i32.const 16))`;
    case 'f16': {
      const h = `(i32x4.extend_${ext}_i16x8_u (local.get $wq))`;
      return `(v128.or (f32x4.mul (i32x4.shl (v128.and ${h} (v128.const i32x4 0x7fff 0x7fff 0x7fff 0x7fff)) (i32.const 13)) (v128.const i32x4 0x77800000 0x77800000 0x77800000 0x77800000))
        (i32x4.shl (v128.and ${h} (v128.const i32x4 0x8000 0x8000 0x8000 0x8000)) (i32.const 16)))`;
    }
  }
}

/**
 * For the 16-bit formats, the statement loading the 8 columns whose k-row starts `off` bytes past
 * `at` into $wq (as i16x8), which loadW then widens; one load serves both halves. Nothing for f32.
 */
function loadGroup(fmt: WideFmt, at: string, off: number): string {
  if (fmt === 'f32') return '';
  return `(local.set $wq (v128.load offset=${off} ${at}))`;
}

/**
 * The k loop around `body` (which reads the weight row at $wp): K rows, $wp advancing one row of
 * $ws bytes (set by gemmFunc: a panel row, a strip row, or N*4 for the dense layout).
 */
function kLoop(label: string, body: string[]): string {
  const step = `(local.set $wp (i32.add (local.get $wp) (local.get $ws)))`;
  return `(local.set $k (local.get $K))
      (loop $${label} ${body.join('\n')} ${step}
        (local.set $k (i32.sub (local.get $k) (i32.const 1)))
        (br_if $${label} (local.get $k)))`;
}

/**
 * SwiGLU of the gate vector in local `g` and the up vector `u` (a v128 expression): exactly the
 * operations of the swiglu export (swigluFunc), so a fused epilogue gives its bits. Uses the
 * locals $e $d $sg and expV's. (Its constants stay inline: with them hoisted into locals the
 * fused product measured no faster, 0.96–0.99 × in paired runs; the epilogue runs once per tile,
 * after K steps.)
 */
function gluV(g: string, u: string): string {
  return `(block (result v128)
          (local.set $e ${expV(`(f32x4.neg (f32x4.abs (local.get ${g})))`)})
          (local.set $d (f32x4.add (local.get $e) (v128.const f32x4 1 1 1 1)))
          (local.set $sg (v128.bitselect (f32x4.div (v128.const f32x4 1 1 1 1) (local.get $d)) (f32x4.div (local.get $e) (local.get $d))
            (f32x4.ge (local.get ${g}) (v128.const f32x4 0 0 0 0))))
          (f32x4.mul (f32x4.mul (local.get ${g}) (local.get $sg)) ${u}))`;
}

/** acc + x*w as a v128 expression: fused (relaxed_madd) in an FMA module, else mul then add. */
function madd(fma: boolean, acc: string, x: string, w: string): string {
  return fma ? `(f32x4.relaxed_madd ${x} ${w} ${acc})` : `(f32x4.add ${acc} (f32x4.mul ${x} ${w}))`;
}

/**
 * One register tile: `rows` rows x 8 columns (col..col+7 of the strip), 2*rows v128 accumulators
 * over the whole k range, stored once. Every accumulator lane is one output element updated for
 * k ascending, so the tile shape changes no bits.
 */
function kernelTile(rows: number, col: number, fmt: WideFmt, fma: boolean, glu: boolean, panels: boolean): string {
  const lines: string[] = [];
  for (let r = 0; r < rows; r++) for (let j = 0; j < 2; j++) lines.push(`(local.set $a${r}${j} (v128.const i32x4 0 0 0 0))`);
  lines.push(`(local.set $p0 (local.get $arow))`);
  for (let r = 1; r < rows; r++) lines.push(`(local.set $p${r} (i32.add (local.get $p${r - 1}) (local.get $kb)))`);
  // Panels: this tile's 8 columns are the strip's panel col/8, its k-rows adjacent; strips: the
  // columns are at offset col within each k-row of the strip.
  lines.push(panels ? `(local.set $wp (i32.add (local.get $wstrip) (i32.mul (i32.const ${col / PANEL}) (local.get $pb))))` : `(local.set $wp (local.get $wstrip))`);
  const off = panels ? 0 : col * ELEM_BYTES[fmt];
  const body: string[] = [];
  body.push(loadGroup(fmt, '(local.get $wp)', off));
  for (let j = 0; j < 2; j++) body.push(`(local.set $w${j} ${loadW(fmt, '(local.get $wp)', off, j)})`);
  for (let r = 0; r < rows; r++) {
    body.push(`(local.set $x (v128.load32_splat (local.get $p${r})))`);
    for (let j = 0; j < 2; j++) body.push(`(local.set $a${r}${j} ${madd(fma, `(local.get $a${r}${j})`, '(local.get $x)', `(local.get $w${j})`)})`);
    body.push(`(local.set $p${r} (i32.add (local.get $p${r}) (i32.const 4)))`);
  }
  lines.push(kLoop(`kl${rows}`, body));
  if (glu) {
    // Gate|up interleaved (packGluStrips): a tile's first 4 columns are gate columns, its last 4
    // the matching up columns; C gets SwiGLU of the pair at output column (n + col) / 2.
    for (let r = 0; r < rows; r++) {
      lines.push(`(local.set $cp (i32.add (local.get $crow) (i32.add (i32.mul (i32.const ${r}) (local.get $nb)) (i32.const ${col * 2}))))`);
      lines.push(`(v128.store (local.get $cp) ${gluV(`$a${r}0`, `(local.get $a${r}1)`)})`);
    }
    return lines.join('\n');
  }
  // store: C + ((m+r)*N + n0 + col)*4
  for (let r = 0; r < rows; r++) {
    lines.push(`(local.set $cp (i32.add (local.get $crow) (i32.add (i32.mul (i32.const ${r}) (local.get $nb)) (i32.const ${col * 4}))))`);
    for (let j = 0; j < 2; j++) lines.push(`(v128.store offset=${j * 16} (local.get $cp) (local.get $a${r}${j}))`);
  }
  return lines.join('\n');
}

function kernel1x32(fmt: WideFmt, fma: boolean, glu: boolean, panels: boolean): string {
  const lines: string[] = [];
  for (let j = 0; j < 8; j++) lines.push(`(local.set $b${j} (v128.const i32x4 0 0 0 0))`);
  lines.push(`(local.set $p0 (local.get $arow))`);
  lines.push(`(local.set $wp (local.get $wstrip))`);
  // The k-row of columns 8q..8q+7: panel q ($pb bytes apart, $pb2 = 2·$pb, $pb3 = 3·$pb), or
  // offset 8q in the strip's row.
  const eb = ELEM_BYTES[fmt];
  const at = (q: number) => (!panels || q === 0 ? '(local.get $wp)' : `(i32.add (local.get $wp) (local.get ${['', '$pb', '$pb2', '$pb3'][q]}))`);
  const off = (q: number) => (panels ? 0 : q * PANEL * eb);
  const body: string[] = [];
  body.push(`(local.set $x (v128.load32_splat (local.get $p0)))`);
  for (let j = 0; j < 8; j++) {
    const q = j >> 1;
    if (j % 2 === 0) body.push(loadGroup(fmt, at(q), off(q)));
    body.push(`(local.set $b${j} ${madd(fma, `(local.get $b${j})`, '(local.get $x)', loadW(fmt, at(q), off(q), j & 1))})`);
  }
  body.push(`(local.set $p0 (i32.add (local.get $p0) (i32.const 4)))`);
  lines.push(kLoop('kl1', body));
  if (glu) {
    for (let j = 0; j < 4; j++) lines.push(`(v128.store offset=${j * 16} (local.get $crow) ${gluV(`$b${2 * j}`, `(local.get $b${2 * j + 1})`)})`);
    return lines.join('\n');
  }
  for (let j = 0; j < 8; j++) lines.push(`(v128.store offset=${j * 16} (local.get $crow) (local.get $b${j}))`);
  return lines.join('\n');
}


// ---- softmax -------------------------------------------------------------------------------
// exp is the Cephes expf polynomial evaluated in f32 with separate mul/add, so gemm.ts can
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
const EXP_LOCALS = Object.keys(EXP_VCONSTS).map((k) => `(local $xk_${k} v128)`).join(' ') + ' (local $xk_127 v128)';
const EXP_INIT = Object.entries(EXP_VCONSTS).map(([k, v]) => `(local.set $xk_${k} ${vc(v)})`).join('\n') + '\n(local.set $xk_127 (v128.const i32x4 127 127 127 127))';

/**
 * exp of the v128 expression `x` (f32x4); uses locals $ex $efx $ey $ez with suffix `sfx` (so two
 * evaluations can be interleaved), and EXP_LOCALS when `hoisted`.
 */
function expV(x: string, opts: { hoisted?: boolean; sfx?: string } = {}): string {
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
function expS(x: string): string {
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
  lines.push(`(f32.mul (local.get $sy) (f32.reinterpret_i32 (i32.shl (i32.add (i32.trunc_f32_s (local.get $sfx)) (i32.const 127)) (i32.const 23))))`);
  return lines.join('\n');
}

/**
 * softmax(S, rows, stride, L, scale): for each row r, with len = L[r] (i32), in place:
 *   x_j = f32(S[r][j] * scale); m = max_j x_j; e_j = exp(x_j - m) for j < len;
 *   sum = ((l0 + l1) + (l2 + l3)) + e_{len4} + ... (lane l sums j = l mod 4 below len4 = len & ~3);
 *   S[r][j] = e_j * f32(1 / sum) for j < len, 0 for len <= j < stride.
 */
function softmaxFunc(): string {
  const sAt = (off: number) => `(v128.load offset=${off} (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))))`;
  return `
  (func $softmax (export "softmax") (param $S i32) (param $rows i32) (param $stride i32) (param $L i32) (param $scale f32)
    (local $r i32) (local $p i32) (local $len i32) (local $len4 i32) (local $j i32) (local $m f32) (local $sum f32) (local $inv f32)
    (local $sv v128) (local $mv v128) (local $acc v128) (local $e v128) (local $nan v128)
    (local $ex v128) (local $efx v128) (local $ey v128) (local $ez v128)
    (local $e2 v128) (local $ex2 v128) (local $efx2 v128) (local $ey2 v128) (local $ez2 v128) ${EXP_LOCALS}
    (local $sx f32) (local $sfx f32) (local $sy f32) (local $sz f32) (local $se f32)
    ${EXP_INIT}
    (local.set $sv (f32x4.splat (local.get $scale)))
    (local.set $r (i32.const 0))
    (block $rdone (loop $rloop
      (br_if $rdone (i32.ge_u (local.get $r) (local.get $rows)))
      (local.set $p (i32.add (local.get $S) (i32.shl (i32.mul (local.get $r) (local.get $stride)) (i32.const 2))))
      (local.set $len (i32.load (i32.add (local.get $L) (i32.shl (local.get $r) (i32.const 2)))))
      (local.set $len4 (i32.and (local.get $len) (i32.const -4)))
      ;; max
      (local.set $mv (f32x4.splat (f32.const -inf)))
      (local.set $nan (v128.const i32x4 0 0 0 0))
      (local.set $j (i32.const 0))
      (block $d1 (loop $l1
        (br_if $d1 (i32.ge_u (local.get $j) (local.get $len4)))
        ;; pmax (one instruction) plus a NaN flag: the same maximum as f32x4.max — NaN if any
        ;; score is NaN — up to the sign of a zero maximum, which no exp below can see (x - ±0
        ;; differs only for x = -0, and both give exp = 1).
        (local.set $e (f32x4.mul (v128.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))) (local.get $sv)))
        (local.set $mv (f32x4.pmax (local.get $mv) (local.get $e)))
        (local.set $nan (v128.or (local.get $nan) (f32x4.ne (local.get $e) (local.get $e))))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $l1)))
      (local.set $m (f32.max (f32.max (f32x4.extract_lane 0 (local.get $mv)) (f32x4.extract_lane 1 (local.get $mv)))
                             (f32.max (f32x4.extract_lane 2 (local.get $mv)) (f32x4.extract_lane 3 (local.get $mv)))))
      (if (v128.any_true (local.get $nan)) (then (local.set $m (f32.const nan))))
      (block $d2 (loop $l2
        (br_if $d2 (i32.ge_u (local.get $j) (local.get $len)))
        (local.set $m (f32.max (local.get $m) (f32.mul (f32.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))) (local.get $scale))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $l2)))
      ;; exp and sum
      (local.set $mv (f32x4.splat (local.get $m)))
      (local.set $acc (v128.const i32x4 0 0 0 0))
      (local.set $j (i32.const 0))
      ;; two vectors per turn, their exp chains interleaved (each is ~25 dependent operations), the
      ;; sum still taken vector by vector in order; then at most one vector alone
      (block $d3b (loop $l3b
        (br_if $d3b (i32.gt_u (i32.add (local.get $j) (i32.const 8)) (local.get $len4)))
        (local.set $e ${expV(`(f32x4.sub (f32x4.mul ${sAt(0)} (local.get $sv)) (local.get $mv))`, { hoisted: true })})
        (local.set $e2 ${expV(`(f32x4.sub (f32x4.mul ${sAt(16)} (local.get $sv)) (local.get $mv))`, { hoisted: true, sfx: '2' })})
        (v128.store (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))) (local.get $e))
        (v128.store offset=16 (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))) (local.get $e2))
        (local.set $acc (f32x4.add (f32x4.add (local.get $acc) (local.get $e)) (local.get $e2)))
        (local.set $j (i32.add (local.get $j) (i32.const 8)))
        (br $l3b)))
      (block $d3 (loop $l3
        (br_if $d3 (i32.ge_u (local.get $j) (local.get $len4)))
        (local.set $e ${expV(`(f32x4.sub (f32x4.mul ${sAt(0)} (local.get $sv)) (local.get $mv))`, { hoisted: true })})
        (v128.store (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))) (local.get $e))
        (local.set $acc (f32x4.add (local.get $acc) (local.get $e)))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $l3)))
      (local.set $sum (f32.add (f32.add (f32x4.extract_lane 0 (local.get $acc)) (f32x4.extract_lane 1 (local.get $acc)))
                               (f32.add (f32x4.extract_lane 2 (local.get $acc)) (f32x4.extract_lane 3 (local.get $acc)))))
      (block $d4 (loop $l4
        (br_if $d4 (i32.ge_u (local.get $j) (local.get $len)))
        (local.set $se ${expS('(f32.sub (f32.mul (f32.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))) (local.get $scale)) (local.get $m))')})
        (f32.store (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))) (local.get $se))
        (local.set $sum (f32.add (local.get $sum) (local.get $se)))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $l4)))
      ;; normalise, zero the rest of the row
      (local.set $inv (f32.div (f32.const 1) (local.get $sum)))
      (local.set $mv (f32x4.splat (local.get $inv)))
      (local.set $j (i32.const 0))
      (block $d5 (loop $l5
        (br_if $d5 (i32.ge_u (local.get $j) (local.get $len4)))
        (v128.store (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))
          (f32x4.mul (v128.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))) (local.get $mv)))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $l5)))
      (block $d6 (loop $l6
        (br_if $d6 (i32.ge_u (local.get $j) (local.get $len)))
        (f32.store (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))
          (f32.mul (f32.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))) (local.get $inv)))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $l6)))
      ;; zeros: one by one up to a multiple of 4, then 4 at a time (causal prefill rows end
      ;; tens of columns short of their block's key count), then the rest one by one
      (block $d7 (loop $l7
        (br_if $d7 (i32.or (i32.ge_u (local.get $j) (local.get $stride)) (i32.eqz (i32.and (local.get $j) (i32.const 3)))))
        (f32.store (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))) (f32.const 0))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $l7)))
      (block $d8 (loop $l8
        (br_if $d8 (i32.gt_u (i32.add (local.get $j) (i32.const 4)) (local.get $stride)))
        (v128.store (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))) (v128.const i32x4 0 0 0 0))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $l8)))
      (block $d9 (loop $l9
        (br_if $d9 (i32.ge_u (local.get $j) (local.get $stride)))
        (f32.store (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2))) (f32.const 0))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $l9)))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br $rloop)))
  )`;
}


/**
 * swiglu(GU, O, rows, hidden): per row r, with g = GU[r][i] and u = GU[r][hidden + i]:
 *   e = exp(-|g|) (the f32 polynomial above), d = 1 + e, s = g >= 0 ? 1/d : e/d (the logistic
 *   function without overflow), O[r][i] = (g * s) * u, every operation in f32 (attention.ts
 *   swigluJs is its bit-exact twin). Per element, so batch invariant.
 */
function swigluFunc(): string {
  const body = (v: boolean) => {
    if (v) {
      return `
        (local.set $g (v128.load (local.get $gp)))
        (local.set $e ${expV('(f32x4.neg (f32x4.abs (local.get $g)))')})
        (local.set $d (f32x4.add (local.get $e) (v128.const f32x4 1 1 1 1)))
        (local.set $sg (v128.bitselect (f32x4.div (v128.const f32x4 1 1 1 1) (local.get $d)) (f32x4.div (local.get $e) (local.get $d))
          (f32x4.ge (local.get $g) (v128.const f32x4 0 0 0 0))))
        (v128.store (local.get $op) (f32x4.mul (f32x4.mul (local.get $g) (local.get $sg)) (v128.load (i32.add (local.get $gp) (local.get $hb)))))`;
    }
    return `
        (local.set $sg1 (f32.load (local.get $gp)))
        (local.set $se ${expS('(f32.neg (f32.abs (local.get $sg1)))')})
        (local.set $sd (f32.add (local.get $se) (f32.const 1)))
        (local.set $ss (select (f32.div (f32.const 1) (local.get $sd)) (f32.div (local.get $se) (local.get $sd)) (f32.ge (local.get $sg1) (f32.const 0))))
        (f32.store (local.get $op) (f32.mul (f32.mul (local.get $sg1) (local.get $ss)) (f32.load (i32.add (local.get $gp) (local.get $hb)))))`;
  };
  return `
  (func $swiglu (export "swiglu") (param $GU i32) (param $O i32) (param $rows i32) (param $hidden i32)
    (local $r i32) (local $i i32) (local $h4 i32) (local $hb i32) (local $gp i32) (local $op i32)
    (local $g v128) (local $e v128) (local $d v128) (local $sg v128)
    (local $ex v128) (local $efx v128) (local $ey v128) (local $ez v128)
    (local $sx f32) (local $sfx f32) (local $sy f32) (local $sz f32)
    (local $sg1 f32) (local $se f32) (local $sd f32) (local $ss f32)
    (local.set $h4 (i32.and (local.get $hidden) (i32.const -4)))
    (local.set $hb (i32.shl (local.get $hidden) (i32.const 2)))
    (local.set $r (i32.const 0))
    (block $rd (loop $rl
      (br_if $rd (i32.ge_u (local.get $r) (local.get $rows)))
      (local.set $gp (i32.add (local.get $GU) (i32.shl (i32.mul (local.get $r) (local.get $hidden)) (i32.const 3))))
      (local.set $op (i32.add (local.get $O) (i32.shl (i32.mul (local.get $r) (local.get $hidden)) (i32.const 2))))
      (local.set $i (i32.const 0))
      (block $vd (loop $vl
        (br_if $vd (i32.ge_u (local.get $i) (local.get $h4)))
        ${body(true)}
        (local.set $gp (i32.add (local.get $gp) (i32.const 16)))
        (local.set $op (i32.add (local.get $op) (i32.const 16)))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $vl)))
      (block $sd (loop $sl
        (br_if $sd (i32.ge_u (local.get $i) (local.get $hidden)))
        ${body(false)}
        (local.set $gp (i32.add (local.get $gp) (i32.const 4)))
        (local.set $op (i32.add (local.get $op) (i32.const 4)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $sl)))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br $rl)))
  )`;
}

/**
 * swiglurows(GU, O, hidden, _, _, _, _, _, r0, r1): swiglu of rows [r0, r1), with the gemm entry
 * points' argument shape so the worker thread can share the rows (gemm_worker.ts).
 */
function swigluRowsFunc(): string {
  return `
  (func (export "swiglurows") (param $GU i32) (param $O i32) (param $hidden i32) (param $u3 i32) (param $u4 i32) (param $u5 i32)
      (param $u6 i32) (param $u7 i32) (param $r0 i32) (param $r1 i32)
    (if (i32.ge_u (local.get $r0) (local.get $r1)) (then (return)))
    (call $swiglu (i32.add (local.get $GU) (i32.shl (i32.mul (local.get $r0) (local.get $hidden)) (i32.const 3)))
      (i32.add (local.get $O) (i32.shl (i32.mul (local.get $r0) (local.get $hidden)) (i32.const 2)))
      (i32.sub (local.get $r1) (local.get $r0)) (local.get $hidden))
  )`;
}

/**
 * One GEMM entry point. `packed` selects the weight layout:
 *   dense  Wt [K][N]: strip s starts at W + s*STRIP*4, rows STRIDE N*4 apart (attention's
 *          transient operands, written per call);
 *   packed, the model's weights (packed once at load; packStrips, packGluStrips, packEncoded):
 *          Wt [N/STRIP][STRIP/PANEL][K][PANEL]: strip s is one contiguous block of K*STRIP
 *          values made of four panels, panel q holding columns 8q..8q+7 of the strip with their
 *          k-rows adjacent (32 bytes of f32). A strip streams sequentially from memory instead of
 *          touching K pages N*4 bytes apart (decode, few rows, reads each weight once per step and
 *          is bound by exactly that stream), and a register tile reads its own panel front to
 *          back: every cache line it pulls in is all its own columns. With [K][STRIP] rows
 *          instead (before round 11), a tile used 32 of each 128-byte row, so half of every line
 *          it pulled from L2 was other tiles' columns; panels measured 7–16 % faster on the
 *          156M prefill's shapes (docs/engine-model.md, "Panels");
 *   packed, strided (attention's Kᵀ, gatherkv): Wt [P/STRIP][hd][STRIP], k-rows of 128 bytes.
 * The arithmetic, and so every result bit, is the same for every layout.
 * `glu` (export gemmpglu): the fused gate|up projection and SwiGLU. Wt is the gate|up weight
 * packed by packGluStrips (kernel.ts: each strip holds 16 gate columns and their 16 up columns,
 * in groups of 4), N is its padded width (2·hidden) and C is [M][N/2]: each tile's accumulators
 * (computed exactly as gemmp computes them) go through the swiglu export's operations in
 * registers and only silu(gate)·up is stored — the same bits as gemmp then swiglu, without
 * writing and re-reading the [M][2·hidden] gate|up product.
 */
function gemmFunc(name: string, packed: boolean, fmt: WideFmt, fma: boolean, strided = false, glu = false): string {
  const v128Locals: string[] = [];
  if (glu) v128Locals.push('$e', '$d', '$sg', '$ex', '$efx', '$ey', '$ez');
  for (let r = 0; r < TILE_ROWS; r++) for (let j = 0; j < 2; j++) v128Locals.push(`$a${r}${j}`);
  for (let j = 0; j < 8; j++) v128Locals.push(`$b${j}`);
  v128Locals.push('$w0', '$w1', '$x', '$wq');
  // The model's weights are in panels; attention's strided Kᵀ is in [hd][STRIP] strips.
  const panels = packed && !strided;
  const stripBase = packed
    ? `(i32.add (local.get $W) (i32.mul (local.get $n) (i32.mul (local.get $K) (i32.const ${ELEM_BYTES[fmt]}))))`
    : `(i32.add (local.get $W) (i32.shl (local.get $n) (i32.const 2)))`;
  // The strided variant (internal, attention's per-group products): A, Wt and C each have their
  // own row stride (lda, ldw, ldc floats; ldw unused when Wt is strip-packed), so a product can
  // use a prefix of Wt's columns and of A's k range. Same tiles, same arithmetic.
  const head = strided
    ? `(func $${name} (param $A i32) (param $W i32) (param $C i32) (param $lda i32) (param $ldw i32) (param $ldc i32) (param $K i32)
      (param $m0 i32) (param $m1 i32) (param $n0 i32) (param $n1 i32)`
    : `(func $${name} (export "${name}") (param $A i32) (param $W i32) (param $C i32) (param $M i32) (param $K i32) (param $N i32)
      (param $m0 i32) (param $m1 i32) (param $n0 i32) (param $n1 i32)`;
  const strides = strided
    ? `(local.set $kb (i32.shl (local.get $lda) (i32.const 2)))
    (local.set $nb (i32.shl (local.get $ldc) (i32.const 2)))
    (local.set $ws ${packed ? `(i32.const ${STRIP * 4})` : '(i32.shl (local.get $ldw) (i32.const 2))'})`
    : `(local.set $kb (i32.shl (local.get $K) (i32.const 2)))
    (local.set $nb (i32.shl (local.get $N) (i32.const ${glu ? 1 : 2})))
    (local.set $ws ${panels ? `(i32.const ${PANEL * ELEM_BYTES[fmt]})` : '(local.get $nb)'})${
      panels
        ? `
    (local.set $pb (i32.mul (local.get $K) (i32.const ${PANEL * ELEM_BYTES[fmt]})))
    (local.set $pb2 (i32.shl (local.get $pb) (i32.const 1)))
    (local.set $pb3 (i32.add (local.get $pb2) (local.get $pb)))`
        : ''
    }`;
  return `
  ;; ${name}(A, Wt, C, ${strided ? 'lda, ldw, ldc, K' : 'M, K, N'}, m0, m1, n0, n1): rows [m0,m1) x columns [n0,n1) of C (n0, n1 multiples of ${STRIP})
  ${head}
    (local $kb i32) (local $nb i32) (local $ws i32) (local $mb i32) (local $mEnd i32) (local $n i32) (local $m i32) (local $k i32)
    (local $arow i32) (local $crow i32) (local $wstrip i32) (local $wp i32) (local $cp i32) (local $pb i32) (local $pb2 i32) (local $pb3 i32)
    ${Array.from({ length: TILE_ROWS }, (_, r) => `(local $p${r} i32)`).join(' ')}
    ${v128Locals.map((l) => `(local ${l} v128)`).join(' ')}
    ${strides}
    ${blockedLoops(`
        (local.set $wstrip ${stripBase})
        (local.set $m (local.get $mb))
        ;; ${TILE_ROWS}-row register tiles
        (block $rtdone (loop $rtloop
          (br_if $rtdone (i32.gt_u (i32.add (local.get $m) (i32.const ${TILE_ROWS})) (local.get $mEnd)))
          (local.set $arow (i32.add (local.get $A) (i32.mul (local.get $m) (local.get $kb))))
          (local.set $crow (i32.add (local.get $C) (i32.add (i32.mul (local.get $m) (local.get $nb)) (i32.shl (local.get $n) (i32.const ${glu ? 1 : 2})))))
          ${TILE_COLS.map((c) => kernelTile(TILE_ROWS, c, fmt, fma, glu, panels)).join('\n')}
          (local.set $m (i32.add (local.get $m) (i32.const ${TILE_ROWS})))
          (br $rtloop)))
        ;; leftover rows, one at a time
        (block $r1done (loop $r1loop
          (br_if $r1done (i32.ge_u (local.get $m) (local.get $mEnd)))
          (local.set $arow (i32.add (local.get $A) (i32.mul (local.get $m) (local.get $kb))))
          (local.set $crow (i32.add (local.get $C) (i32.add (i32.mul (local.get $m) (local.get $nb)) (i32.shl (local.get $n) (i32.const ${glu ? 1 : 2})))))
          ${kernel1x32(fmt, fma, glu, panels)}
          (local.set $m (i32.add (local.get $m) (i32.const 1)))
          (br $r1loop)))`)}
  )`;
}

/**
 * The blocked M/N loops every GEMM export shares: row blocks [$mb, $mEnd) of MB rows over
 * [$m0, $m1), and inside each, the column strips $n = $n0, $n0 + STRIP, … < $n1; `body` computes
 * rows [$mb, $mEnd) of strip $n.
 */
function blockedLoops(body: string): string {
  return `(local.set $mb (local.get $m0))
    (block $mdone (loop $mloop
      (br_if $mdone (i32.ge_u (local.get $mb) (local.get $m1)))
      (local.set $mEnd (select (i32.add (local.get $mb) (i32.const ${MB})) (local.get $m1)
        (i32.lt_u (i32.add (local.get $mb) (i32.const ${MB})) (local.get $m1))))
      (local.set $n (local.get $n0))
      (block $ndone (loop $nloop
        (br_if $ndone (i32.ge_u (local.get $n) (local.get $n1)))
        ${body}
        (local.set $n (i32.add (local.get $n) (i32.const ${STRIP})))
        (br $nloop)))
      (local.set $mb (local.get $mEnd))
      (br $mloop)))`;
}


// ---- Q8: int8 dot products (q8_dot.ts defines the bits) -----------------------------------------

/**
 * quantq8(X, M, K, Q): rows X [M][K] f32 (K a multiple of 32) quantized per block of 32 into
 * int16 values Q [M][K] and f32 scales at Q + M*K*2 ([M][K/32]); quantq8i8 (for gemmpq4): the
 * same values as int8 [M][K], scales at Q + M*K, then each block's Σ q as f32 ([M][K/32]):
 * amax = max |x|,
 * d = f32(amax / 127), id = d ≠ 0 ? f32(1/d) : 0, q = nearest-even(f32(x·id)) (trunc_sat: NaN → 0).
 * Rows are contiguous, so the blocks of all rows are one run.
 */
function quantQ8Func(i8 = false): string {
  const lines: string[] = [];
  lines.push(`(local.set $mx (f32x4.abs (v128.load (local.get $xp))))`);
  for (let j = 1; j < 8; j++) lines.push(`(local.set $mx (f32x4.max (local.get $mx) (f32x4.abs (v128.load offset=${j * 16} (local.get $xp)))))`);
  const q = (off: number) => `(i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul (v128.load offset=${off} (local.get $xp)) (local.get $idv))))`;
  const stores: string[] = [];
  if (!i8) for (let j = 0; j < 4; j++) stores.push(`(v128.store offset=${j * 16} (local.get $qp) (i16x8.narrow_i32x4_s ${q(j * 32)} ${q(j * 32 + 16)}))`);
  else {
    // int8 values (|q| ≤ 127: the narrowing is exact), and the block's Σ q (exact) for the
    // q4 weights' offsets, summed from the 32-bit lanes before they are narrowed.
    for (let j = 0; j < 8; j++) {
      stores.push(`(local.set $r${j} ${q(j * 16)})`, `(local.set $sum (i32x4.add (local.get $sum) (local.get $r${j})))`);
    }
    for (let h = 0; h < 2; h++) {
      const r = (j: number) => `(local.get $r${4 * h + j})`;
      stores.push(`(v128.store offset=${h * 16} (local.get $qp) (i8x16.narrow_i16x8_s (i16x8.narrow_i32x4_s ${r(0)} ${r(1)}) (i16x8.narrow_i32x4_s ${r(2)} ${r(3)})))`);
    }
  }
  const vb = i8 ? 1 : 2; // bytes per value
  return `
  (func (export "${i8 ? 'quantq8i8' : 'quantq8'}") (param $X i32) (param $M i32) (param $K i32) (param $Q i32)
    (local $blocks i32) (local $xp i32) (local $qp i32) (local $sp i32)
    (local $mx v128) (local $idv v128) (local $amax f32) (local $d f32)
    ${i8 ? `(local $sums i32) (local $sum v128) ${Array.from({ length: 8 }, (_, j) => `(local $r${j} v128)`).join(' ')}` : ''}
    (local.set $blocks (i32.shr_u (i32.mul (local.get $M) (local.get $K)) (i32.const 5)))
    (local.set $xp (local.get $X))
    (local.set $qp (local.get $Q))
    (local.set $sp (i32.add (local.get $Q) ${i8 ? '(i32.mul (local.get $M) (local.get $K))' : '(i32.shl (i32.mul (local.get $M) (local.get $K)) (i32.const 1))'}))
    ${i8 ? '(local.set $sums (i32.add (local.get $sp) (i32.shl (local.get $blocks) (i32.const 2))))' : ''}
    (block $done (loop $each
      (br_if $done (i32.eqz (local.get $blocks)))
      ${lines.join('\n      ')}
      (local.set $amax (f32.max (f32.max (f32x4.extract_lane 0 (local.get $mx)) (f32x4.extract_lane 1 (local.get $mx)))
                                (f32.max (f32x4.extract_lane 2 (local.get $mx)) (f32x4.extract_lane 3 (local.get $mx)))))
      (local.set $d (f32.div (local.get $amax) (f32.const 127)))
      (f32.store (local.get $sp) (local.get $d))
      (local.set $idv (f32x4.splat (select (f32.div (f32.const 1) (local.get $d)) (f32.const 0) (f32.ne (local.get $d) (f32.const 0)))))
      ${i8 ? '(local.set $sum (v128.const i32x4 0 0 0 0))' : ''}
      ${stores.join('\n      ')}
      ${
        i8
          ? `(f32.store (local.get $sums) (f32.convert_i32_s (i32.add
        (i32.add (i32x4.extract_lane 0 (local.get $sum)) (i32x4.extract_lane 1 (local.get $sum)))
        (i32.add (i32x4.extract_lane 2 (local.get $sum)) (i32x4.extract_lane 3 (local.get $sum))))))
      (local.set $sums (i32.add (local.get $sums) (i32.const 4)))`
          : ''
      }
      (local.set $xp (i32.add (local.get $xp) (i32.const 128)))
      (local.set $qp (i32.add (local.get $qp) (i32.const ${32 * vb})))
      (local.set $sp (i32.add (local.get $sp) (i32.const 4)))
      (local.set $blocks (i32.sub (local.get $blocks) (i32.const 1)))
      (br $each)))
  )`;
}

/**
 * The quantized products' row setup for rows m (and m + 1 when R = 2): $ap at row m's activations
 * (`stride` bytes a row), $sp at its block scales, $crow / $crow1 at the strip's 32 columns of C,
 * zeroed.
 */
function quantRows(R: number, stride: string): string {
  return `
          (local.set $ap (i32.add (local.get $A) (i32.mul (local.get $m) ${stride})))
          (local.set $sp (i32.add (local.get $sbase) (i32.shl (i32.mul (local.get $m) (local.get $nblk)) (i32.const 2))))
          (local.set $crow (i32.add (local.get $C) (i32.add (i32.mul (local.get $m) (local.get $nb)) (i32.shl (local.get $n) (i32.const 2)))))
          (local.set $crow1 (i32.add (local.get $crow) (local.get $nb)))
          ${Array.from({ length: 8 * R }, (_, g) => `(v128.store offset=${(g % 8) * 16} (local.get ${g < 8 ? '$crow' : '$crow1'}) (v128.const i32x4 0 0 0 0))`).join('\n          ')}`;
}

/** The row block's rows in pairs from $mb, then the last one alone when the count is odd. */
function byRowPairs(rows: (R: number) => string): string {
  return `(local.set $m (local.get $mb))
        (block $r2done (loop $r2loop
          (br_if $r2done (i32.gt_u (i32.add (local.get $m) (i32.const 2)) (local.get $mEnd)))
          ${rows(2)}
          (br $r2loop)))
        (if (i32.lt_u (local.get $m) (local.get $mEnd)) (then
          ${rows(1)}))`;
}

/**
 * gemmpq8(Q, W, C, M, K, N, m0, m1, n0, n1): the gemm entry point's arguments, with Q the
 * activations as quantq8 left them (int16 [M][K], scales after) and W strip-packed q8. Per row
 * and 32-column strip, per k-block: eight i32x4 accumulators of i32x4.dot_i16x8_s over the 16
 * k-pairs (the pair (x_k, x_k+1) splatted as one i32), then C += f32(isum) · f32(dw · dx), C
 * starting at 0 — q8_dot.ts's order. Rows two at a time (one alone when a row block has an odd
 * count): each weight group is loaded and widened once for both rows' dot products, which took
 * a 512-token prefill of the 156M model's Q8_0 file from ~330 to ~390 tok/s and decode at batch
 * 8 up ~13 % (paired runs, docs/engine-model.md); three rows would need 19 xmm registers. The
 * strip stays cache-resident over the row block; every row's sums are those of the one-row path.
 * A k-block is taken in two passes of 16 columns (four accumulators each), not one of 32: V8
 * loads all of a step's weight groups before its dot products, so eight accumulators, eight
 * loaded groups and the splat needed 17 xmm registers; one accumulator then lived on the stack
 * and its load-add-store ran through store forwarding every step. Each column's sums, and so
 * every bit, are the same. (Measured in docs/engine-model.md, "Q8 in two passes".)
 */
function q8GemmFunc(): string {
  const HALF = Q8_HALF_COLS / 4; // accumulators (groups of 4 columns) per half
  // Rows in pairs where two remain (R = 2), then one: a pair shares each weight group's load and
  // widening between its two rows' dot products. Accumulators: $c* of the first row, $e* of the
  // second; each row's integer sums and flushes are exactly the single-row path's.
  const acc = (r: number) => Array.from({ length: HALF }, (_, g) => `$${r === 0 ? 'c' : 'e'}${g}`);
  // A half's k-pair row is 32 bytes: its four groups of 4 columns × 2 k.
  const pair = (R: number) => {
    const out: string[] = [`(local.set $x (v128.load32_splat (local.get $ap)))`];
    if (R === 1) {
      for (let g = 0; g < HALF; g++) out.push(`(local.set $c${g} (i32x4.add (local.get $c${g}) (i32x4.dot_i16x8_s (v128.load8x8_s offset=${g * 8} (local.get $wp)) (local.get $x))))`);
      return out;
    }
    out.push(`(local.set $x1 (v128.load32_splat (i32.add (local.get $ap) (local.get $kb2))))`);
    for (let g = 0; g < HALF; g++) {
      out.push(`(local.set $q${g} (v128.load8x8_s offset=${g * 8} (local.get $wp)))`);
      out.push(`(local.set $c${g} (i32x4.add (local.get $c${g}) (i32x4.dot_i16x8_s (local.get $q${g}) (local.get $x))))`);
      out.push(`(local.set $e${g} (i32x4.add (local.get $e${g}) (i32x4.dot_i16x8_s (local.get $q${g}) (local.get $x1))))`);
    }
    return out;
  };
  const flush = (h: number, R: number) => {
    const out: string[] = [];
    for (let r = 0; r < R; r++) {
      const [crow, dx, a] = r === 0 ? ['$crow', '$dx', 'c'] : ['$crow1', '$dx1', 'e'];
      for (let g = 0; g < HALF; g++) {
        const o = (h * HALF + g) * 16;
        out.push(`(v128.store offset=${o} (local.get ${crow}) (f32x4.add (v128.load offset=${o} (local.get ${crow}))
        (f32x4.mul (f32x4.convert_i32x4_s (local.get $${a}${g})) (f32x4.mul (v128.load offset=${g * 16} (local.get $wh${h})) (local.get ${dx})))))`);
      }
    }
    return out;
  };
  const half = (h: number, R: number) => `
            ${[0, 1].slice(0, R).flatMap(acc).map((a) => `(local.set ${a} (v128.const i32x4 0 0 0 0))`).join(' ')}
            (local.set $wp (i32.add (local.get $wh${h}) (i32.const ${Q8_HALF_COLS * 4})))
            (local.set $ap (local.get $ak))
            ;; 16 k-pairs, counted by the activation pointer (a separate counter was one
            ;; register too many: V8 kept it on the stack)
            (loop $kpl${h}r${R}
              ${pair(R).join('\n              ')}
              (local.set $ap (i32.add (local.get $ap) (i32.const 4)))
              (local.set $wp (i32.add (local.get $wp) (i32.const ${Q8_HALF_PAIR_BYTES})))
              (br_if $kpl${h}r${R} (i32.ne (local.get $ap) (local.get $aend))))
            ${flush(h, R).join('\n            ')}
            (local.set $wh${h} (i32.add (local.get $wh${h}) (i32.const ${Q8_HALF_BLOCK_BYTES})))`;
  // Rows m (and m + 1 when R = 2) of the strip: C zeroed, then every k-block.
  const rows = (R: number) => `${quantRows(R, '(local.get $kb2)')}
          ;; the strip's two halves, each its own run of k-blocks (two streams from memory)
          (local.set $wh0 (local.get $wstrip))
          (local.set $wh1 (i32.add (local.get $wstrip) (i32.mul (local.get $nblk) (i32.const ${Q8_HALF_BLOCK_BYTES}))))
          (local.set $kq (local.get $nblk))
          (if (local.get $kq) (then (loop $kblr${R}
            ;; per half: the block's 16 column scales ($wh0 / $wh1), then its 16 k-pair rows of
            ;; 32 bytes; the activations' 16 pairs from $ak (the next row's $kb2 bytes further)
            (local.set $ak (local.get $ap))
            (local.set $aend (i32.add (local.get $ap) (i32.const 64)))
            (local.set $dx (f32x4.splat (f32.load (local.get $sp))))
            ${R === 2 ? '(local.set $dx1 (f32x4.splat (f32.load (i32.add (local.get $sp) (i32.shl (local.get $nblk) (i32.const 2))))))' : ''}
            ${half(0, R)}
            ${half(1, R)}
            (local.set $sp (i32.add (local.get $sp) (i32.const 4)))
            (local.set $kq (i32.sub (local.get $kq) (i32.const 1)))
            (br_if $kblr${R} (local.get $kq)))))
          (local.set $m (i32.add (local.get $m) (i32.const ${R})))`;
  return `
  (func $gemmpq8 (export "gemmpq8") (param $A i32) (param $W i32) (param $C i32) (param $M i32) (param $K i32) (param $N i32)
      (param $m0 i32) (param $m1 i32) (param $n0 i32) (param $n1 i32)
    (local $kb2 i32) (local $nblk i32) (local $sbase i32) (local $nb i32) (local $mb i32) (local $mEnd i32) (local $n i32) (local $m i32)
    (local $wstrip i32) (local $wp i32) (local $ap i32) (local $sp i32) (local $crow i32) (local $crow1 i32) (local $kq i32)
    (local $wh0 i32) (local $wh1 i32) (local $ak i32) (local $aend i32)
    (local $x v128) (local $x1 v128) (local $dx v128) (local $dx1 v128)
    ${[0, 1].flatMap(acc).map((a) => `(local ${a} v128)`).join(' ')} ${Array.from({ length: HALF }, (_, g) => `(local $q${g} v128)`).join(' ')}
    (local.set $kb2 (i32.shl (local.get $K) (i32.const 1)))
    (local.set $nblk (i32.shr_u (local.get $K) (i32.const 5)))
    (local.set $sbase (i32.add (local.get $A) (i32.mul (local.get $M) (local.get $kb2))))
    (local.set $nb (i32.shl (local.get $N) (i32.const 2)))
    ${blockedLoops(`
        (local.set $wstrip (i32.add (local.get $W) (i32.mul (i32.shr_u (local.get $n) (i32.const 5)) (i32.mul (local.get $nblk) (i32.const ${Q8_BLOCK_BYTES})))))
        ${byRowPairs(rows)}`)}
  )`;
}

/**
 * gemmpq4(Q, W, C, M, K, N, m0, m1, n0, n1): gemmpq8's arguments with Q as quantq8i8 left it
 * (int8 [M][K], then scales and block sums) and W strip-packed q4. Per row, 32-column strip and
 * k-block: eight i32x4 accumulators of relaxed SIMD's i32x4.relaxed_dot_i8x16_i7x16_add_s over
 * the block's 8 k-quads — each lane adds four products of an int8 activation and a 4-bit weight,
 * 16 multiply-adds an instruction against i32x4.dot_i16x8_s's 8, and exact: the weight is the
 * operand that must lie in 0..127, and 15·127·4 fits every intermediate — then
 * C += f32(isum)·(s·dx) − Σqx·(o·dx), C starting at 0: q8_dot.ts's Q4 order. Unpacking costs an
 * `and` or a shift per 16 weights. Rows two at a time, as gemmpq8 (each unpacked group serves
 * both rows' dots); a k-block is taken in two passes of 16 columns.
 */
function q4GemmFunc(): string {
  const HALF = Q8_HALF_COLS / 4; // accumulators (groups of 4 columns) per half
  const acc = (r: number) => Array.from({ length: HALF }, (_, g) => `$${r === 0 ? 'c' : 'e'}${g}`);
  const mask = `(v128.const i8x16 ${Array(16).fill(15).join(' ')})`;
  // One k-quad row of a half: groups 0, 1 the low and high nibbles of its first 16 bytes, 2, 3
  // of its second.
  const quad = (R: number) => {
    const out = [`(local.set $x (v128.load32_splat (local.get $ap)))`];
    if (R === 2) out.push(`(local.set $x1 (v128.load32_splat (i32.add (local.get $ap) (local.get $K))))`);
    for (let g = 0; g < HALF; g++) {
      if (g % 2 === 0) out.push(`(local.set $v (v128.load offset=${(g >> 1) * 16} (local.get $wp)))`);
      out.push(`(local.set $g ${g % 2 === 0 ? `(v128.and (local.get $v) ${mask})` : `(i8x16.shr_u (local.get $v) (i32.const 4))`})`);
      out.push(`(local.set $c${g} (i32x4.relaxed_dot_i8x16_i7x16_add_s (local.get $x) (local.get $g) (local.get $c${g})))`);
      if (R === 2) out.push(`(local.set $e${g} (i32x4.relaxed_dot_i8x16_i7x16_add_s (local.get $x1) (local.get $g) (local.get $e${g})))`);
    }
    return out;
  };
  const flush = (h: number, R: number) => {
    const out: string[] = [];
    for (let r = 0; r < R; r++) {
      const [crow, dx, xs, a] = r === 0 ? ['$crow', '$dx', '$xs', 'c'] : ['$crow1', '$dx1', '$xs1', 'e'];
      for (let g = 0; g < HALF; g++) {
        const o = (h * HALF + g) * 16;
        const scaled = `(f32x4.mul (f32x4.convert_i32x4_s (local.get $${a}${g})) (f32x4.mul (v128.load offset=${g * 16} (local.get $wh${h})) (local.get ${dx})))`;
        const offset = `(f32x4.mul (local.get ${xs}) (f32x4.mul (v128.load offset=${Q8_HALF_COLS * 4 + g * 16} (local.get $wh${h})) (local.get ${dx})))`;
        out.push(`(v128.store offset=${o} (local.get ${crow}) (f32x4.add (v128.load offset=${o} (local.get ${crow})) (f32x4.sub ${scaled} ${offset})))`);
      }
    }
    return out;
  };
  const half = (h: number, R: number) => `
            ${[0, 1].slice(0, R).flatMap(acc).map((a) => `(local.set ${a} (v128.const i32x4 0 0 0 0))`).join(' ')}
            (local.set $wp (i32.add (local.get $wh${h}) (i32.const ${Q8_HALF_COLS * 8})))
            (local.set $ap (local.get $ak))
            (loop $kq${h}r${R}
              ${quad(R).join('\n              ')}
              (local.set $ap (i32.add (local.get $ap) (i32.const 4)))
              (local.set $wp (i32.add (local.get $wp) (i32.const ${Q4_HALF_QUAD_BYTES})))
              (br_if $kq${h}r${R} (i32.ne (local.get $ap) (local.get $aend))))
            ${flush(h, R).join('\n            ')}
            (local.set $wh${h} (i32.add (local.get $wh${h}) (i32.const ${Q4_HALF_BLOCK_BYTES})))`;
  const rows = (R: number) => `${quantRows(R, '(local.get $K)')}
          (local.set $wh0 (local.get $wstrip))
          (local.set $wh1 (i32.add (local.get $wstrip) (i32.mul (local.get $nblk) (i32.const ${Q4_HALF_BLOCK_BYTES}))))
          (local.set $kq (local.get $nblk))
          (if (local.get $kq) (then (loop $kbl${R}
            ;; per block: row scales and sums, then each half's 8 k-quads and its flush
            (local.set $ak (local.get $ap))
            (local.set $aend (i32.add (local.get $ap) (i32.const 32)))
            (local.set $dx (f32x4.splat (f32.load (local.get $sp))))
            (local.set $xs (f32x4.splat (f32.load (i32.add (local.get $sp) (local.get $sumoff)))))
            ${
              R === 2
                ? `(local.set $dx1 (f32x4.splat (f32.load (i32.add (local.get $sp) (i32.shl (local.get $nblk) (i32.const 2))))))
            (local.set $xs1 (f32x4.splat (f32.load (i32.add (i32.add (local.get $sp) (local.get $sumoff)) (i32.shl (local.get $nblk) (i32.const 2))))))`
                : ''
            }
            ${half(0, R)}
            ${half(1, R)}
            (local.set $sp (i32.add (local.get $sp) (i32.const 4)))
            (local.set $kq (i32.sub (local.get $kq) (i32.const 1)))
            (br_if $kbl${R} (local.get $kq)))))
          (local.set $m (i32.add (local.get $m) (i32.const ${R})))`;
  return `
  (func $gemmpq4 (export "gemmpq4") (param $A i32) (param $W i32) (param $C i32) (param $M i32) (param $K i32) (param $N i32)
      (param $m0 i32) (param $m1 i32) (param $n0 i32) (param $n1 i32)
    (local $nblk i32) (local $sbase i32) (local $sumoff i32) (local $nb i32) (local $mb i32) (local $mEnd i32) (local $n i32) (local $m i32)
    (local $wstrip i32) (local $wp i32) (local $ap i32) (local $sp i32) (local $crow i32) (local $crow1 i32) (local $kq i32)
    (local $wh0 i32) (local $wh1 i32) (local $ak i32) (local $aend i32)
    (local $x v128) (local $x1 v128) (local $v v128) (local $g v128) (local $dx v128) (local $dx1 v128) (local $xs v128) (local $xs1 v128)
    ${[0, 1].flatMap(acc).map((a) => `(local ${a} v128)`).join(' ')}
    (local.set $nblk (i32.shr_u (local.get $K) (i32.const 5)))
    ;; int8 activations [M][K], then their scales [M][nblk], then their block sums [M][nblk]
    (local.set $sbase (i32.add (local.get $A) (i32.mul (local.get $M) (local.get $K))))
    (local.set $sumoff (i32.shl (i32.mul (local.get $M) (local.get $nblk)) (i32.const 2)))
    (local.set $nb (i32.shl (local.get $N) (i32.const 2)))
    ${blockedLoops(`
        (local.set $wstrip (i32.add (local.get $W) (i32.mul (i32.shr_u (local.get $n) (i32.const 5)) (i32.mul (local.get $nblk) (i32.const ${Q4_BLOCK_BYTES})))))
        ${byRowPairs(rows)}`)}
  )`;
}

/**
 * gatherkv(src, P, Pb, kvDim, off, hd, kt, v, hdPad): one KV head's keys and values out of staged
 * paged-cache slabs into attention's operands. src holds, per cache block, the layer's K slab
 * then its V slab, each [16 positions][kvDim] f32 (the cache's own block layout, copied in bulk).
 * For j < P: kt[e][j] = K[j][off + e] (transposed and strip-packed like the model's weights,
 * [Pb/32][hd][32]: a strip of 32 keys is one contiguous hd·128-byte block, where the dense
 * [hd][Pb] layout put its rows Pb·4 bytes apart — 2 KB at 512 keys, a power of two that mapped
 * every row of a strip onto the same few L1 sets) and v[j][e] = V[j][off + e] ([Pb][hdPad]);
 * positions P..Pb-1 and columns hd..hdPad-1 are zero. Plain copies: no arithmetic.
 */
function gatherFunc(): string {
  return `
  (func $gatherkv (export "gatherkv") (param $src i32) (param $P i32) (param $Pb i32) (param $kvDim i32) (param $off i32)
      (param $hd i32) (param $kt i32) (param $v i32) (param $hdPad i32)
    (local $j i32) (local $e i32) (local $kp i32) (local $vp i32) (local $vrow i32) (local $ktcol i32)
    (local $slab i32)
    (local.set $slab (i32.shl (i32.mul (local.get $kvDim) (i32.const ${BLOCK_TOKENS})) (i32.const 2)))
    (local.set $j (i32.const 0))
    (block $jdone (loop $jloop
      (br_if $jdone (i32.ge_u (local.get $j) (local.get $Pb)))
      (local.set $vrow (i32.add (local.get $v) (i32.shl (i32.mul (local.get $j) (local.get $hdPad)) (i32.const 2))))
      (local.set $ktcol (i32.add (local.get $kt) (i32.add (i32.mul (i32.shr_u (local.get $j) (i32.const 5)) (i32.shl (local.get $hd) (i32.const 7)))
        (i32.shl (i32.and (local.get $j) (i32.const 31)) (i32.const 2)))))
      (local.set $e (i32.const 0))
      (if (i32.lt_u (local.get $j) (local.get $P))
        (then
          ;; block j / BLOCK_TOKENS holds 2 slabs; slot j % BLOCK_TOKENS is a row of kvDim floats
          (local.set $kp (i32.add (local.get $src)
            (i32.add (i32.mul (i32.shr_u (local.get $j) (i32.const ${BLOCK_SHIFT})) (i32.shl (local.get $slab) (i32.const 1)))
              (i32.shl (i32.add (i32.mul (i32.and (local.get $j) (i32.const ${BLOCK_TOKENS - 1})) (local.get $kvDim)) (local.get $off)) (i32.const 2)))))
          (local.set $vp (i32.add (local.get $kp) (local.get $slab)))
          (block $edone (loop $eloop
            (br_if $edone (i32.ge_u (local.get $e) (local.get $hd)))
            (f32.store (i32.add (local.get $ktcol) (i32.shl (local.get $e) (i32.const 7))) (f32.load (local.get $kp)))
            (f32.store (i32.add (local.get $vrow) (i32.shl (local.get $e) (i32.const 2))) (f32.load (local.get $vp)))
            (local.set $kp (i32.add (local.get $kp) (i32.const 4)))
            (local.set $vp (i32.add (local.get $vp) (i32.const 4)))
            (local.set $e (i32.add (local.get $e) (i32.const 1)))
            (br $eloop))))
        (else
          (block $zdone (loop $zloop
            (br_if $zdone (i32.ge_u (local.get $e) (local.get $hd)))
            (f32.store (i32.add (local.get $ktcol) (i32.shl (local.get $e) (i32.const 7))) (f32.const 0))
            (f32.store (i32.add (local.get $vrow) (i32.shl (local.get $e) (i32.const 2))) (f32.const 0))
            (local.set $e (i32.add (local.get $e) (i32.const 1)))
            (br $zloop)))))
      (block $pdone (loop $ploop
        (br_if $pdone (i32.ge_u (local.get $e) (local.get $hdPad)))
        (f32.store (i32.add (local.get $vrow) (i32.shl (local.get $e) (i32.const 2))) (f32.const 0))
        (local.set $e (i32.add (local.get $e) (i32.const 1)))
        (br $ploop)))
      (local.set $j (i32.add (local.get $j) (i32.const 1)))
      (br $jloop)))
  )`;
}

/**
 * argmax(p, n) -> i32: the scalar loop's answer (sampler.ts / gemm.ts argmaxJs), NaN included: start
 * from element 0, take a later element only when strictly larger. So index 0 when element 0 is NaN
 * (nothing compares larger), other NaNs are never taken, and ties go to the lowest index. Sixteen
 * lanes (four vectors over consecutive groups of four in each block of sixteen) each keep their
 * first strict maximum over the elements they see (from -Inf, index -1 = none yet); the lanes are
 * then merged preferring the larger value and, on equal values, the lower index; the tail is
 * scanned like the scalar loop. No lane candidate (everything -Inf or NaN after element 0) means
 * element 0, as in the scalar loop. Four independent vectors because one is a dependency chain
 * (compare, then select, every iteration): with four the loop is bound by loads instead.
 * argmaxany(p, n) is the same scan without the element-0 rule, for one chunk of a row (argmaxcols):
 * a NaN anywhere is never taken, and it answers -1 when no element beats -Inf.
 */
function argmaxFunc(name = 'argmax', nanFirst = true): string {
  const V = [0, 1, 2, 3];
  const lane = (v: number, l: number) => `(local.set $x (f32x4.extract_lane ${l} (local.get $bv${v})))
    (local.set $xi (i32x4.extract_lane ${l} (local.get $bi${v})))
    (if (i32.and (i32.ge_s (local.get $xi) (i32.const 0))
          (i32.or (i32.lt_s (local.get $bix) (i32.const 0))
            (i32.or (f32.gt (local.get $x) (local.get $best))
                    (i32.and (f32.eq (local.get $x) (local.get $best)) (i32.lt_s (local.get $xi) (local.get $bix))))))
      (then (local.set $best (local.get $x)) (local.set $bix (local.get $xi))))`;
  const step = (v: number) => `(local.set $v${v} (v128.load offset=${16 * v} (local.get $a)))
      (local.set $m${v} (f32x4.gt (local.get $v${v}) (local.get $bv${v})))
      (local.set $bv${v} (v128.bitselect (local.get $v${v}) (local.get $bv${v}) (local.get $m${v})))
      (local.set $bi${v} (v128.bitselect (i32x4.add (local.get $idx) (v128.const i32x4 ${4 * v} ${4 * v} ${4 * v} ${4 * v})) (local.get $bi${v}) (local.get $m${v})))`;
  return `
  (func $${name} (export "${name}") (param $p i32) (param $n i32) (result i32)
    (local $i i32) (local $n16 i32) (local $a i32) (local $idx v128)
    ${V.map((v) => `(local $v${v} v128) (local $m${v} v128) (local $bv${v} v128) (local $bi${v} v128)`).join(' ')}
    (local $best f32) (local $bix i32) (local $x f32) (local $xi i32)
    (if (i32.eqz (local.get $n)) (then (return (i32.const ${nanFirst ? 0 : -1}))))
    ${nanFirst ? `(local.set $x (f32.load (local.get $p)))
    (if (f32.ne (local.get $x) (local.get $x)) (then (return (i32.const 0))))` : ''}
    (local.set $n16 (i32.and (local.get $n) (i32.const -16)))
    ${V.map((v) => `(local.set $bv${v} (v128.const f32x4 -inf -inf -inf -inf)) (local.set $bi${v} (v128.const i32x4 -1 -1 -1 -1))`).join('\n    ')}
    (local.set $idx (v128.const i32x4 -16 -15 -14 -13))
    (local.set $i (i32.const 0))
    (block $vd (loop $vl
      (br_if $vd (i32.ge_u (local.get $i) (local.get $n16)))
      (local.set $a (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2))))
      (local.set $idx (i32x4.add (local.get $idx) (v128.const i32x4 16 16 16 16)))
      ${V.map(step).join('\n      ')}
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br $vl)))
    (local.set $best (f32.const -inf))
    (local.set $bix (i32.const -1))
    ${V.flatMap((v) => [0, 1, 2, 3].map((l) => lane(v, l))).join('\n    ')}
    (local.set $i (local.get $n16))
    (block $td (loop $tl
      (br_if $td (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $x (f32.load (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 2)))))
      (if (f32.gt (local.get $x) (local.get $best)) (then (local.set $best (local.get $x)) (local.set $bix (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $tl)))
    ${nanFirst ? '(select (local.get $bix) (i32.const 0) (i32.ge_s (local.get $bix) (i32.const 0)))' : '(local.get $bix)'}
  )`;
}

/**
 * argmaxrows(X, OUT, n, _, _, _, _, _, r0, r1): OUT[r] = argmax of row r of X ([rows][n] floats)
 * for r in [r0, r1), with the gemm entry points' argument shape so the worker thread can share
 * the rows (gemm_worker.ts): greedy sampling of a batch right after its LM head, while the
 * worker is still awake.
 */
function argmaxRowsFunc(): string {
  return `
  (func (export "argmaxrows") (param $X i32) (param $OUT i32) (param $n i32) (param $u3 i32) (param $u4 i32) (param $u5 i32)
      (param $u6 i32) (param $u7 i32) (param $r0 i32) (param $r1 i32)
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $r0) (local.get $r1)))
      (i32.store (i32.add (local.get $OUT) (i32.shl (local.get $r0) (i32.const 2)))
        (call $argmax (i32.add (local.get $X) (i32.shl (i32.mul (local.get $r0) (local.get $n)) (i32.const 2))) (local.get $n)))
      (local.set $r0 (i32.add (local.get $r0) (i32.const 1)))
      (br $each)))
  )`;
}

/**
 * argmaxcols(C, nPad, N, M, SLOT, _, _, _, n0, n1): the part of greedy sampling that one chunk
 * [n0, n1) of an LM-head product can do while its columns are still in the cache of the thread
 * that computed them (kernel_wasm.ts, matmul with argmaxOut). For each row r of C ([M][nPad] floats), the
 * first strict maximum of its columns [n0, min(n1, N)) with NaN never taken ($argmaxany: -1 when
 * there is none), as an index into the row and its value. Stored at SLOT + s·(8 + 8M) bytes, s =
 * n0 / STRIP: the chunk's end n1, 4 bytes unused, then M pairs (index i32, value f32). The chunks
 * are then merged in column order by argmaxRows's rules (the caller, after the product).
 */
function argmaxColsFunc(): string {
  return `
  (func (export "argmaxcols") (param $C i32) (param $nPad i32) (param $N i32) (param $M i32) (param $SLOT i32) (param $u5 i32)
      (param $u6 i32) (param $u7 i32) (param $n0 i32) (param $n1 i32)
    (local $len i32) (local $base i32) (local $r i32) (local $j i32) (local $at i32)
    (local.set $len (i32.sub (select (local.get $n1) (local.get $N) (i32.lt_u (local.get $n1) (local.get $N))) (local.get $n0)))
    (local.set $base (i32.add (local.get $SLOT) (i32.mul (i32.div_u (local.get $n0) (i32.const ${STRIP})) (i32.add (i32.const 8) (i32.shl (local.get $M) (i32.const 3))))))
    (i32.store (local.get $base) (local.get $n1))
    (local.set $r (i32.const 0))
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $r) (local.get $M)))
      (local.set $at (i32.add (local.get $base) (i32.add (i32.const 8) (i32.shl (local.get $r) (i32.const 3)))))
      (local.set $j (i32.const -1))
      (if (i32.gt_s (local.get $len) (i32.const 0))
        (then (local.set $j (call $argmaxany
          (i32.add (local.get $C) (i32.shl (i32.add (i32.mul (local.get $r) (local.get $nPad)) (local.get $n0)) (i32.const 2)))
          (local.get $len)))))
      (if (i32.ge_s (local.get $j) (i32.const 0))
        (then
          (i32.store (local.get $at) (i32.add (local.get $n0) (local.get $j)))
          (f32.store offset=4 (local.get $at) (f32.load
            (i32.add (local.get $C) (i32.shl (i32.add (i32.mul (local.get $r) (local.get $nPad)) (i32.add (local.get $n0) (local.get $j))) (i32.const 2))))))
        (else (i32.store (local.get $at) (i32.const -1))))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br $each)))
  )`;
}

/**
 * attendheads(stage, Q, KT, S, V, O, L, M, hd, hdPad, kvDim, heads, keys, P, scale): for each KV head
 * g of the staged KV, gatherkv into KT/V, then attgroups over all M rows, with Q_g = Q + g*M*hd
 * floats and O_g = O + g*M*hdPad floats. Exactly the calls the per-head path makes (same
 * functions, same arguments), in one call from JS: decode attention is small enough that the
 * JS→WASM crossings and per-call set-up were most of its cost.
 */
function attendHeadsFunc(): string {
  return `
  (func (export "attendheads") (param $stage i32) (param $Q i32) (param $KT i32) (param $S i32) (param $V i32) (param $O i32)
      (param $L i32) (param $M i32) (param $hd i32) (param $hdPad i32) (param $kvDim i32) (param $heads i32) (param $keys i32)
      (param $P i32) (param $scale f32)
    (local $g i32) (local $q i32) (local $o i32)
    (local.set $q (local.get $Q))
    (local.set $o (local.get $O))
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $g) (local.get $heads)))
      (call $gatherkv (local.get $stage) (local.get $keys) (local.get $P) (local.get $kvDim)
        (i32.mul (local.get $g) (local.get $hd)) (local.get $hd) (local.get $KT) (local.get $V) (local.get $hdPad))
      (call $attgroups (local.get $q) (local.get $KT) (local.get $S) (local.get $V) (local.get $o) (local.get $L)
        (local.get $M) (local.get $hd) (local.get $P) (local.get $hdPad) (local.get $scale) (i32.const 0) (local.get $M))
      (local.set $q (i32.add (local.get $q) (i32.shl (i32.mul (local.get $M) (local.get $hd)) (i32.const 2))))
      (local.set $o (i32.add (local.get $o) (i32.shl (i32.mul (local.get $M) (local.get $hdPad)) (i32.const 2))))
      (local.set $g (i32.add (local.get $g) (i32.const 1)))
      (br $each)))
  )`;
}

/**
 * Query rows per attention group (a power of two, a multiple of the 4-row tile): the rows that
 * share one key count. 16 rows (four tiles) reuse each 32-key strip of Kᵀ and V from L1 four
 * times; 4-row groups walked all keys per tile (one thread: 8 % slower than the 64-token blocks
 * before them, where 16-row groups are within 4 %).
 */
export const ATT_GROUP = 16;
const ATT_GROUP_SHIFT = 4;

/**
 * attgroups(Q, KT, S, V, O, L, M, hd, P, hdPad, scale, r0, r1): attention of query rows [r0, r1)
 * (r0 a multiple of ATT_GROUP) of one head, in groups of ATT_GROUP rows, the groups taken last first. A group
 * whose longest row has len keys computes only the first Pg = len rounded up to the 32-column
 * strip (at most P) of everything: S_g = Q_g·KT[:, 0..Pg) (KT strip-packed, [P/32][hd][32], K = hd), softmax over
 * each row's length with the row zeroed up to Pg, O_g = S_g·V[0..Pg) (K = Pg). Causal prefill
 * rows thus skip the keys after their block's group instead of computing a whole block's key
 * range. S_g is [rows][Pg] at S + ATT_GROUP·g·P floats (inside the group's own rows of an [M][P] S).
 * The keys skipped would each add p·v = 0·v = ±0 to O, so the results equal those over all P
 * keys up to the sign of an exactly-zero sum. Every element depends only on its own row and
 * its group's Pg, so splitting groups between threads changes no bit; the last groups are the
 * heaviest (longest rows), and going last-first leaves the light ones for the end of a shared
 * job, where the threads wait for each other.
 */
function attGroupsFunc(): string {
  if (1 << ATT_GROUP_SHIFT !== ATT_GROUP) throw new Error('ATT_GROUP must be a power of two');
  return `
  (func $attgroups (param $Q i32) (param $KT i32) (param $S i32) (param $V i32) (param $O i32) (param $L i32)
      (param $M i32) (param $hd i32) (param $P i32) (param $hdPad i32) (param $scale f32) (param $r0 i32) (param $r1 i32)
    (local $G i32) (local $gi i32) (local $gEnd i32) (local $rs i32) (local $rows i32) (local $len i32) (local $i i32)
    (local $Pg i32) (local $sp i32)
    (local.set $G (i32.shr_u (i32.add (local.get $M) (i32.const ${ATT_GROUP - 1})) (i32.const ${ATT_GROUP_SHIFT})))
    (local.set $gi (i32.shr_u (local.get $r0) (i32.const ${ATT_GROUP_SHIFT})))
    (local.set $gEnd (i32.shr_u (i32.add (local.get $r1) (i32.const ${ATT_GROUP - 1})) (i32.const ${ATT_GROUP_SHIFT})))
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $gi) (local.get $gEnd)))
      (local.set $rs (i32.shl (i32.sub (i32.sub (local.get $G) (i32.const 1)) (local.get $gi)) (i32.const ${ATT_GROUP_SHIFT})))
      (local.set $rows (i32.sub (local.get $M) (local.get $rs)))
      (if (i32.gt_u (local.get $rows) (i32.const ${ATT_GROUP})) (then (local.set $rows (i32.const ${ATT_GROUP}))))
      ;; the group's longest row, rounded up to the strip, at most P
      (local.set $len (i32.const 0))
      (local.set $i (i32.const 0))
      (block $ld (loop $ll
        (br_if $ld (i32.ge_u (local.get $i) (local.get $rows)))
        (local.set $len (select (local.get $len)
          (i32.load (i32.add (local.get $L) (i32.shl (i32.add (local.get $rs) (local.get $i)) (i32.const 2))))
          (i32.gt_s (local.get $len) (i32.load (i32.add (local.get $L) (i32.shl (i32.add (local.get $rs) (local.get $i)) (i32.const 2)))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $ll)))
      (local.set $Pg (i32.and (i32.add (local.get $len) (i32.const ${STRIP - 1})) (i32.const ${-STRIP})))
      (if (i32.or (i32.gt_s (local.get $Pg) (local.get $P)) (i32.le_s (local.get $Pg) (i32.const 0))) (then (local.set $Pg (local.get $P))))
      (local.set $sp (i32.add (local.get $S) (i32.shl (i32.mul (local.get $rs) (local.get $P)) (i32.const 2))))
      (call $gemmsp (i32.add (local.get $Q) (i32.shl (i32.mul (local.get $rs) (local.get $hd)) (i32.const 2))) (local.get $KT) (local.get $sp)
        (local.get $hd) (local.get $P) (local.get $Pg) (local.get $hd) (i32.const 0) (local.get $rows) (i32.const 0) (local.get $Pg))
      (call $softmax (local.get $sp) (local.get $rows) (local.get $Pg)
        (i32.add (local.get $L) (i32.shl (local.get $rs) (i32.const 2))) (local.get $scale))
      (call $gemms (local.get $sp) (local.get $V) (i32.add (local.get $O) (i32.shl (i32.mul (local.get $rs) (local.get $hdPad)) (i32.const 2)))
        (local.get $Pg) (local.get $hdPad) (local.get $hdPad) (local.get $Pg) (i32.const 0) (local.get $rows) (i32.const 0) (local.get $hdPad))
      (local.set $gi (i32.add (local.get $gi) (i32.const 1)))
      (br $each)))
  )`;
}

/**
 * attendrows(prm, _, _, _, _, _, _, _, r0, r1): one head's attention (attgroups) for query rows
 * [r0, r1), with the gemm entry points' argument shape so the worker thread can share the rows
 * (gemm_worker.ts; chunks are whole groups of ATT_GROUP rows). prm points at 11 i32 words: Q, KT, S, V, O,
 * L, M, hd, P, hdPad, scale (f32 bits). Rows, not columns, are split: the softmax and O = S·V
 * (one 32-column strip) of a block could not be shared by columns, and one hand-off per head
 * replaces three.
 */
function attendRowsFunc(): string {
  const ld = (i: number) => `(i32.load offset=${i * 4} (local.get $prm))`;
  return `
  (func (export "attendrows") (param $prm i32) (param $u1 i32) (param $u2 i32) (param $u3 i32) (param $u4 i32) (param $u5 i32)
      (param $u6 i32) (param $u7 i32) (param $r0 i32) (param $r1 i32)
    (if (i32.ge_u (local.get $r0) (local.get $r1)) (then (return)))
    (call $attgroups ${ld(0)} ${ld(1)} ${ld(2)} ${ld(3)} ${ld(4)} ${ld(5)} ${ld(6)} ${ld(7)} ${ld(8)} ${ld(9)}
      (f32.reinterpret_i32 ${ld(10)}) (local.get $r0) (local.get $r1))
  )`;
}

/**
 * The module: shared memory is imported so a worker thread can run the same kernel on it.
 * `fma`: the f32 and 16-bit GEMMs (model weights and attention's dense products) accumulate with
 * relaxed_madd (needs relaxed SIMD; fma.ts decides). Q8 (integer dots), softmax, SwiGLU and the
 * rest are the same in both.
 */
export function gemmWat(opts: { fma: boolean; q4?: boolean } = { fma: false }): string {
  const fma = opts.fma;
  // gemmpq4 (and its int8 activations) only in the module that holds 4-bit weights as q4: it
  // needs relaxed SIMD, and that module is compiled without V8's baseline tier (kernel_wasm.ts).
  const q4 = opts.q4 === true;
  return `(module
  (import "env" "mem" (memory 1 65536 shared))
${gemmFunc('gemm', false, 'f32', fma)}
${gemmFunc('gemms', false, 'f32', fma, true)}
${gemmFunc('gemmsp', true, 'f32', fma, true)}
${gemmFunc('gemmp', true, 'f32', fma)}
${gemmFunc('gemmpbf16', true, 'bf16', fma)}
${gemmFunc('gemmpf16', true, 'f16', fma)}
${gemmFunc('gemmpglu', true, 'f32', fma, false, true)}
${q8GemmFunc()}
${q4 ? q4GemmFunc() : ''}
${quantQ8Func()}
${q4 ? quantQ8Func(true) : ''}
${softmaxFunc()}
${swigluFunc()}
${swigluRowsFunc()}
${gatherFunc()}
${argmaxFunc()}
${argmaxFunc('argmaxany', false)}
${argmaxRowsFunc()}
${argmaxColsFunc()}
${attGroupsFunc()}
${attendHeadsFunc()}
${attendRowsFunc()}
)`;
}

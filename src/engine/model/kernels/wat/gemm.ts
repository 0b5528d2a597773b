// WAT source of the WASM SIMD GEMM kernel, generated from TypeScript so the unrolled register
// blocks stay readable. C[m][n] = sum_k A[m][k] * Wt[k][n], with
//   A  row-major [M][K] f32,  Wt row-major [K][N] f32 (the weight pre-transposed, N padded to a
//   multiple of STRIP), C row-major [M][N] f32.
// Vectorised over n: every output element is ONE f32 accumulator updated as acc = acc + a*w for
// k = 0, 1, ..., K-1: separate mul and add, or, when the module is built with `fma` (fma.ts:
// only where relaxed SIMD's f32x4.relaxed_madd is fused), one fused multiply-add. That order does
// not depend on M, on which rows share a register block, or on the column strip, so results are
// batch invariant and equal bit for bit to the plain-JS reference (js_kernel.ts, with the same
// fma setting).
//
// Blocking: rows in blocks of MB (A block stays in L1/L2), columns in strips of STRIP=32 (a strip
// of Wt is K*128 bytes, cache resident across the row block; the model's weights hold each strip
// as four panels of PANEL=8 columns, one per register tile); inside, 4 rows x 8 columns (8 vector
// accumulators) per micro-kernel, and 1 row x 32 columns for the leftover rows (8 independent
// accumulators keep the add pipeline busy during single-sequence decode).

import { MB, PANEL, STRIP, type WFmt } from '../layout.js';
import { gluV } from './swiglu.js';

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


/** The formats the widening GEMMs take (gemmFunc): every one but q8 and q4 (gemmpq8, gemmpq4). */
type WideFmt = Exclude<WFmt, 'q8' | 'q4'>;
/** Bytes of one weight value of a widened format. */
const ELEM_BYTES: Record<WideFmt, number> = { f32: 4, bf16: 2, f16: 2 };


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



/** acc + x*w as a v128 expression: fused (relaxed_madd) in an FMA module, else mul then add. */
export function madd(fma: boolean, acc: string, x: string, w: string): string {
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
 *          instead, a tile would use 32 of each 128-byte row, so half of every line
 *          it pulls from L2 would be other tiles' columns; panels measured 7–16 % faster on the
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
export function gemmFunc(name: string, packed: boolean, fmt: WideFmt, fma: boolean, strided = false, glu = false): string {
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
export function blockedLoops(body: string): string {
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


// WAT of the integer GEMMs: q8 and q4 weights multiplied as int8 dot products against activations
// quantized per row and block of 32 (q8_dot.ts defines the bits), and that quantizer.
import { Q4_BLOCK_BYTES, Q4_HALF_BLOCK_BYTES, Q4_HALF_QUAD_BYTES, Q8_BLOCK_BYTES, Q8_HALF_BLOCK_BYTES, Q8_HALF_COLS, Q8_HALF_PAIR_BYTES } from '../layout.js';
import { blockedLoops } from './gemm.js';

/**
 * quantq8(X, M, K, Q): rows X [M][K] f32 (K a multiple of 32) quantized per block of 32 into
 * int16 values Q [M][K] and f32 scales at Q + M*K*2 ([M][K/32]); quantq8i8 (for gemmpq4): the
 * same values as int8 [M][K], scales at Q + M*K, then each block's Σ q as f32 ([M][K/32]):
 * amax = max |x|,
 * d = f32(amax / 127), id = d ≠ 0 ? f32(1/d) : 0, q = nearest-even(f32(x·id)) (trunc_sat: NaN → 0).
 * Rows are contiguous, so the blocks of all rows are one run.
 */
export function quantQ8Func(i8 = false): string {
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
export function q8GemmFunc(): string {
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
export function q4GemmFunc(): string {
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

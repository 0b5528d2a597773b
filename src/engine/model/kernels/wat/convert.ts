// WAT source of the load-time conversions: decoding GGUF block formats (Q4_K, Q6_K, ...) and
// quantizing the values to Q8_0 blocks (a re-quantized tensor), and packing Q8_0, 4-bit (Q4_0,
// Q4_1, Q4_K) and 16-bit weights into the kernel's layouts (../layout.ts). In JavaScript both ran at 6–10 ns a value on this project's reference
// machine, most of a quantized model's load (a 7B Q4_K_M file: minutes); here they are a small
// fraction of a nanosecond. The JS functions stay the definition (quantizeQ8_0 in gguf_format.ts,
// decodeBlocks in gguf_blocks.ts, packEncoded in weight_pack.ts): these produce the same bytes,
// which the tests check bit for bit.
// A module of its own with its own memory (no threads), used only while a model loads.

import { PANEL, Q4_BLOCK_BYTES, Q4_HALF_BLOCK_BYTES, Q8_BLOCK_BYTES, Q8_HALF_BLOCK_BYTES, Q8_HALF_COLS, Q8_HALF_PAIR_BYTES, STRIP } from '../layout.js';

/**
 * $f32_to_f16(x): round-to-nearest-even f16 bits of a non-negative f32 or NaN (a block's scale:
 * amax / 127). The same steps as safetensors.ts f32ToF16; NaN gives 0x7e00, as there.
 */
function f32ToF16Func(): string {
  return `
  (func $f32_to_f16 (param $x f32) (result i32)
    (local $b i32) (local $e i32) (local $m i32) (local $hm i32) (local $rem i32) (local $sh i32) (local $half i32)
    (if (f32.ne (local.get $x) (local.get $x)) (then (return (i32.const 0x7e00))))
    (local.set $b (i32.reinterpret_f32 (local.get $x)))
    (local.set $m (i32.and (local.get $b) (i32.const 0x7fffff)))
    (local.set $e (i32.sub (i32.and (i32.shr_u (local.get $b) (i32.const 23)) (i32.const 0xff)) (i32.const 112)))
    (if (i32.ge_s (local.get $e) (i32.const 31)) (then (return (i32.const 0x7c00))))
    (if (i32.le_s (local.get $e) (i32.const 0)) (then
      (if (i32.lt_s (local.get $e) (i32.const -10)) (then (return (i32.const 0))))
      (local.set $m (i32.or (local.get $m) (i32.const 0x800000)))
      (local.set $sh (i32.sub (i32.const 14) (local.get $e)))
      (local.set $hm (i32.shr_u (local.get $m) (local.get $sh)))
      (local.set $rem (i32.and (local.get $m) (i32.sub (i32.shl (i32.const 1) (local.get $sh)) (i32.const 1))))
      (local.set $half (i32.shl (i32.const 1) (i32.sub (local.get $sh) (i32.const 1))))
      (if (i32.or (i32.gt_u (local.get $rem) (local.get $half))
                  (i32.and (i32.eq (local.get $rem) (local.get $half)) (i32.and (local.get $hm) (i32.const 1))))
        (then (local.set $hm (i32.add (local.get $hm) (i32.const 1)))))
      (return (local.get $hm))))
    (local.set $hm (i32.shr_u (local.get $m) (i32.const 13)))
    (local.set $rem (i32.and (local.get $m) (i32.const 0x1fff)))
    (if (i32.or (i32.gt_u (local.get $rem) (i32.const 0x1000))
                (i32.and (i32.eq (local.get $rem) (i32.const 0x1000)) (i32.and (local.get $hm) (i32.const 1))))
      (then
        (local.set $hm (i32.add (local.get $hm) (i32.const 1)))
        (if (i32.eq (local.get $hm) (i32.const 0x400)) (then
          (local.set $hm (i32.const 0))
          (local.set $e (i32.add (local.get $e) (i32.const 1)))
          (if (i32.ge_s (local.get $e) (i32.const 31)) (then (return (i32.const 0x7c00))))))))
    (i32.or (i32.shl (local.get $e) (i32.const 10)) (local.get $hm))
  )`;
}

/**
 * $f16_to_f32(h): the f32 of f16 bits, exactly (normal and subnormal halves: |h| << 13 read as
 * f32, times 2^112; Inf as Inf; NaN as the canonical NaN JavaScript stores, 0x7fc00000).
 */
function f16ToF32Func(): string {
  return `
  (func $f16_to_f32 (param $h i32) (result f32)
    (local $a i32)
    (local.set $a (i32.and (local.get $h) (i32.const 0x7fff)))
    (if (i32.gt_u (local.get $a) (i32.const 0x7c00)) (then (return (f32.reinterpret_i32 (i32.const 0x7fc00000)))))
    (f32.reinterpret_i32 (i32.or
      (i32.shl (i32.and (local.get $h) (i32.const 0x8000)) (i32.const 16))
      (if (result i32) (i32.eq (local.get $a) (i32.const 0x7c00))
        (then (i32.const 0x7f800000))
        (else (i32.reinterpret_f32 (f32.mul (f32.reinterpret_i32 (i32.shl (local.get $a) (i32.const 13))) (f32.const 0x1p112)))))))
  )`;
}

/**
 * q8quant(X, O, blocks): Q8_0 of `blocks` × 32 f32 at X into 34-byte blocks at O, as ggml's
 * reference quantizer computes it in f32: d = amax / 127 (NaN if any value is NaN), stored as
 * f16; id = 1 / d (0 when d is 0); q = roundf(x · id), halves away from zero; NaN and ±Inf
 * products (1 / d overflows f32 when amax < ≈ 4e-37) give 0.
 */
function q8QuantFunc(): string {
  // |x| maximum as a tree (depth 3, not a chain of 7 dependent maxes); f32x4.max keeps NaN.
  const ab = (j: number) => `(f32x4.abs (v128.load offset=${j * 16} (local.get $xp)))`;
  const mx2 = (a: number, b: number) => `(f32x4.max ${ab(a)} ${ab(b)})`;
  const amax = [`(local.set $mx (f32x4.max (f32x4.max ${mx2(0, 1)} ${mx2(2, 3)}) (f32x4.max ${mx2(4, 5)} ${mx2(6, 7)})))`];
  // Lanes 4j..4j+3 of the block times id, rounded as roundf, into $r<j> (i32x4): truncating
  // v + copysign(0.49999997, v) in f32 (trunc_sat truncates; NaN gives 0). For |v| < 2^23 (here
  // |v| ≤ 127) that is roundf: below a half the sum stays under the next integer, since the
  // gap left (the largest f32 under ½) is at least half an ulp there; from a half up it reaches
  // it (an exact ½ too: 0.5 + 0.49999997 rounds to even, 1). Checked against quantizeQ8_0 bit for
  // bit in the tests, ties included. A lane that is not finite gives 0 (the mask), as in the JS:
  // NaN, and ±Inf where 1 / d overflowed (amax below ≈ 4e-37, whose f16 scale is 0 anyway).
  // (ggml's C leaves that conversion undefined; the block's f16 scale makes its values 0.)
  const round = [0, 1, 2, 3, 4, 5, 6, 7].map(
    (j) => `(local.set $v (f32x4.mul (v128.load offset=${16 * j} (local.get $xp)) (local.get $idv)))
      (local.set $r${j} (v128.and (f32x4.le (f32x4.abs (local.get $v)) (v128.const f32x4 128.0 128.0 128.0 128.0))
        (i32x4.trunc_sat_f32x4_s (f32x4.add (local.get $v)
          (v128.or (v128.and (local.get $v) (v128.const i32x4 0x80000000 0x80000000 0x80000000 0x80000000)) (v128.const i32x4 0x3effffff 0x3effffff 0x3effffff 0x3effffff))))))`,
  );
  const halves = [0, 1].map(
    (h) =>
      `(v128.store offset=${2 + 16 * h} (local.get $op) (i8x16.narrow_i16x8_s
        (i16x8.narrow_i32x4_s (local.get $r${4 * h}) (local.get $r${4 * h + 1}))
        (i16x8.narrow_i32x4_s (local.get $r${4 * h + 2}) (local.get $r${4 * h + 3}))))`,
  );
  return `
  (func (export "q8quant") (param $X i32) (param $O i32) (param $blocks i32)
    (local $xp i32) (local $op i32) (local $mx v128) (local $idv v128) (local $amax f32) (local $d f32) (local $v v128)
    ${[0, 1, 2, 3, 4, 5, 6, 7].map((j) => `(local $r${j} v128)`).join(' ')}
    (local.set $xp (local.get $X))
    (local.set $op (local.get $O))
    (block $done (loop $each
      (br_if $done (i32.eqz (local.get $blocks)))
      ${amax.join('\n      ')}
      (local.set $amax (f32.max (f32.max (f32x4.extract_lane 0 (local.get $mx)) (f32x4.extract_lane 1 (local.get $mx)))
                                (f32.max (f32x4.extract_lane 2 (local.get $mx)) (f32x4.extract_lane 3 (local.get $mx)))))
      (local.set $d (f32.div (local.get $amax) (f32.const 127)))
      (i32.store16 (local.get $op) (call $f32_to_f16 (local.get $d)))
      (local.set $idv (f32x4.splat (select (f32.div (f32.const 1) (local.get $d)) (f32.const 0) (f32.ne (local.get $d) (f32.const 0)))))
      ${round.join('\n      ')}
      ${halves.join('\n      ')}
      (local.set $xp (i32.add (local.get $xp) (i32.const 128)))
      (local.set $op (i32.add (local.get $op) (i32.const 34)))
      (local.set $blocks (i32.sub (local.get $blocks) (i32.const 1)))
      (br $each)))
  )`;
}

/**
 * q8pack(S, D, n, k): n rows of Q8_0 blocks at S (row-major, k / 32 blocks of 34 bytes a row) into
 * the q8 layout at D (ceil(n / 32) strips, zeroed by the caller): per strip, per half of 16
 * columns, per k-block, the half's 16 f32 column scales, then 16 k-pair rows of [16 columns][2]
 * int8 — weight_pack.ts packEncoded's placement, two bytes at a time.
 */
function q8PackFunc(): string {
  return `
  (func (export "q8pack") (param $S i32) (param $D i32) (param $n i32) (param $k i32)
    (local $kb i32) (local $i i32) (local $b i32) (local $p i32) (local $src i32) (local $blk i32) (local $q0 i32)
    (local.set $kb (i32.shr_u (local.get $k) (i32.const 5)))
    (local.set $src (local.get $S))
    (block $rowsd (loop $rowsl
      (br_if $rowsd (i32.ge_u (local.get $i) (local.get $n)))
      ;; The first block of column i: its strip, then its half's run of k-blocks.
      (local.set $blk (i32.add (local.get $D) (i32.add
        (i32.mul (i32.shr_u (local.get $i) (i32.const 5)) (i32.mul (local.get $kb) (i32.const ${Q8_BLOCK_BYTES})))
        (i32.mul (i32.mul (i32.and (i32.shr_u (local.get $i) (i32.const 4)) (i32.const 1)) (local.get $kb)) (i32.const ${Q8_HALF_BLOCK_BYTES})))))
      (local.set $b (i32.const 0))
      (block $blocksd (loop $blocksl
        (br_if $blocksd (i32.ge_u (local.get $b) (local.get $kb)))
        (f32.store (i32.add (local.get $blk) (i32.shl (i32.and (local.get $i) (i32.const ${Q8_HALF_COLS - 1})) (i32.const 2)))
          (call $f16_to_f32 (i32.load16_u (local.get $src))))
        (local.set $q0 (i32.add (local.get $blk) (i32.add (i32.const ${Q8_HALF_COLS * 4}) (i32.shl (i32.and (local.get $i) (i32.const ${Q8_HALF_COLS - 1})) (i32.const 1)))))
        (local.set $p (i32.const 0))
        (block $pairsd (loop $pairsl
          (br_if $pairsd (i32.ge_u (local.get $p) (i32.const 16)))
          (i32.store16 (i32.add (local.get $q0) (i32.mul (local.get $p) (i32.const ${Q8_HALF_PAIR_BYTES})))
            (i32.load16_u offset=2 (i32.add (local.get $src) (i32.shl (local.get $p) (i32.const 1)))))
          (local.set $p (i32.add (local.get $p) (i32.const 1)))
          (br $pairsl)))
        (local.set $src (i32.add (local.get $src) (i32.const 34)))
        (local.set $blk (i32.add (local.get $blk) (i32.const ${Q8_HALF_BLOCK_BYTES})))
        (local.set $b (i32.add (local.get $b) (i32.const 1)))
        (br $blocksl)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $rowsl)))
  )`;
}

/**
 * q4pack(S, D, n, k, type): n rows of Q4_0 (type 0), Q4_1 (1) or Q4_K (2) blocks at S into the q4
 * layout at D (../layout.ts; zeroed by the caller), as weight_pack.ts packQ4 places them: per
 * column and block of 32 its scale s and offset o (weight_pack.ts q4Block: Q4_0 d and 8d, Q4_1 d
 * and −m, Q4_K d·sc_j and dmin·m_j), and its 32 nibbles — value r of k-quad t = r >> 2 is byte
 * r mod 4 of the 32-bit word 4·(c mod 4) + 16·(g >> 1) of quad row t, low nibble for even
 * groups g, high for odd: each quad's 4 values are one lane of the block's values in k order,
 * OR-ed into its word.
 */
function q4PackFunc(): string {
  // The block's 32 values in k order: $lo (0..15), $hi (16..31), as bytes (nibble values).
  const words = Array.from({ length: 8 }, (_, t) => {
    const v = t < 4 ? '$lo' : '$hi';
    const at = `(i32.add (local.get $rows) (i32.const ${t * 32}))`;
    return `(i32.store ${at} (i32.or (i32.load ${at}) (i32x4.extract_lane ${t % 4} (local.get ${v}))))`;
  }).join('\n        ');
  // Q4_K's 6-bit scale (min: `min`) of sub-block $j from the 12 bytes at $sb + 4 (gguf_blocks.ts scaleOf / minOf).
  const b = (off: string) => `(i32.load8_u (i32.add (local.get $sb) ${off}))`;
  const jp = (d: number) => `(i32.add (local.get $j) (i32.const ${4 + d}))`;
  const scale = `(if (result i32) (i32.lt_u (local.get $j) (i32.const 4))
          (then (i32.and ${b(jp(0))} (i32.const 63)))
          (else (i32.or (i32.and ${b(jp(4))} (i32.const 15)) (i32.shl (i32.shr_u ${b(jp(-4))} (i32.const 6)) (i32.const 4)))))`;
  const min = `(if (result i32) (i32.lt_u (local.get $j) (i32.const 4))
          (then (i32.and ${b(jp(4))} (i32.const 63)))
          (else (i32.or (i32.shr_u ${b(jp(4))} (i32.const 4)) (i32.shl (i32.shr_u ${b(jp(0))} (i32.const 6)) (i32.const 4)))))`;
  return `
  (func (export "q4pack") (param $S i32) (param $D i32) (param $n i32) (param $k i32) (param $type i32)
    (local $kb i32) (local $rb i32) (local $i i32) (local $blk i32) (local $src i32) (local $sb i32) (local $j i32)
    (local $half i32) (local $col i32) (local $g i32) (local $hb i32) (local $rows i32) (local $v v128) (local $lo v128) (local $hi v128)
    (local $s f32) (local $o f32) (local $sh i32) (local $nib i32)
    (local.set $kb (i32.shr_u (local.get $k) (i32.const 5)))
    ;; bytes per row: Q4_0 18, Q4_1 20 per 32 values; Q4_K 144 per 256
    (local.set $rb (if (result i32) (i32.eq (local.get $type) (i32.const 2))
      (then (i32.mul (i32.shr_u (local.get $k) (i32.const 8)) (i32.const 144)))
      (else (i32.mul (local.get $kb) (select (i32.const 18) (i32.const 20) (i32.eqz (local.get $type)))))))
    (block $rowsd (loop $rowsl
      (br_if $rowsd (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $half (i32.and (i32.shr_u (local.get $i) (i32.const 4)) (i32.const 1)))
      (local.set $col (i32.and (local.get $i) (i32.const ${Q8_HALF_COLS - 1})))
      (local.set $g (i32.shr_u (local.get $col) (i32.const 2)))
      ;; the column's first half-block: its strip, then its half's run of k-blocks
      (local.set $hb (i32.add (local.get $D) (i32.add
        (i32.mul (i32.shr_u (local.get $i) (i32.const 5)) (i32.mul (local.get $kb) (i32.const ${Q4_BLOCK_BYTES})))
        (i32.mul (i32.mul (local.get $half) (local.get $kb)) (i32.const ${Q4_HALF_BLOCK_BYTES})))))
      (local.set $blk (i32.const 0))
      (block $blocksd (loop $blocksl
        (br_if $blocksd (i32.ge_u (local.get $blk) (local.get $kb)))
        (local.set $src (i32.add (local.get $S) (i32.mul (local.get $i) (local.get $rb))))
        (if (i32.eq (local.get $type) (i32.const 2))
          (then
            ;; Q4_K: super-block blk >> 3, sub-block j; sub-blocks 2c, 2c + 1 are the low and high
            ;; nibbles of the 32 bytes at 16 + 32c
            (local.set $sb (i32.add (local.get $src) (i32.mul (i32.shr_u (local.get $blk) (i32.const 3)) (i32.const 144))))
            (local.set $j (i32.and (local.get $blk) (i32.const 7)))
            (local.set $s (f32.mul (call $f16_to_f32 (i32.load16_u (local.get $sb))) (f32.convert_i32_u ${scale})))
            (local.set $o (f32.mul (call $f16_to_f32 (i32.load16_u offset=2 (local.get $sb))) (f32.convert_i32_u ${min})))
            (local.set $sh (i32.shl (i32.and (local.get $j) (i32.const 1)) (i32.const 2)))
            (local.set $nib (i32.add (local.get $sb) (i32.add (i32.const 16) (i32.shl (i32.shr_u (local.get $j) (i32.const 1)) (i32.const 5)))))
            (local.set $lo (v128.and (i8x16.shr_u (v128.load (local.get $nib)) (local.get $sh)) ${splat8(15)}))
            (local.set $hi (v128.and (i8x16.shr_u (v128.load offset=16 (local.get $nib)) (local.get $sh)) ${splat8(15)})))
          (else
            ;; Q4_0 (d, 16 bytes) or Q4_1 (d, m, 16 bytes): value l < 16 the low nibble of byte l,
            ;; l + 16 its high nibble
            (local.set $sb (i32.add (local.get $src) (i32.mul (local.get $blk) (select (i32.const 18) (i32.const 20) (i32.eqz (local.get $type))))))
            (local.set $s (call $f16_to_f32 (i32.load16_u (local.get $sb))))
            (local.set $o (if (result f32) (i32.eqz (local.get $type))
              (then (f32.mul (local.get $s) (f32.const 8)))
              (else (f32.neg (call $f16_to_f32 (i32.load16_u offset=2 (local.get $sb)))))))
            (local.set $v (v128.load (i32.add (local.get $sb) (select (i32.const 2) (i32.const 4) (i32.eqz (local.get $type))))))
            (local.set $lo (v128.and (local.get $v) ${splat8(15)}))
            (local.set $hi (i8x16.shr_u (local.get $v) (i32.const 4)))))
        ;; odd groups take the high nibble of their bytes
        (if (i32.and (local.get $g) (i32.const 1)) (then
          (local.set $lo (i8x16.shl (local.get $lo) (i32.const 4)))
          (local.set $hi (i8x16.shl (local.get $hi) (i32.const 4)))))
        (f32.store (i32.add (local.get $hb) (i32.shl (local.get $col) (i32.const 2))) (local.get $s))
        (f32.store (i32.add (local.get $hb) (i32.add (i32.const ${Q8_HALF_COLS * 4}) (i32.shl (local.get $col) (i32.const 2)))) (local.get $o))
        (local.set $rows (i32.add (local.get $hb) (i32.add (i32.const ${Q8_HALF_COLS * 8})
          (i32.add (i32.shl (i32.shr_u (local.get $g) (i32.const 1)) (i32.const 4)) (i32.shl (i32.and (local.get $col) (i32.const 3)) (i32.const 2))))))
        ${words}
        (local.set $hb (i32.add (local.get $hb) (i32.const ${Q4_HALF_BLOCK_BYTES})))
        (local.set $blk (i32.add (local.get $blk) (i32.const 1)))
        (br $blocksl)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $rowsl)))
  )`;
}

/**
 * p16pack(S, D, n, k, f16) → 0, or 1 + the index of the first Inf/NaN value when `f16`: n rows of
 * k 16-bit values at S (F16 or BF16 bits, row-major) into the 16-bit panel layout at D (column c's
 * value at row kk goes to value ((c & ~7)·k + (c & 7)) + kk·8: ../layout.ts panelIndex), which
 * the caller has zeroed. The f16 kernel widens finite halves only, so F16 Inf/NaN is refused.
 */
function p16PackFunc(): string {
  return `
  (func (export "p16pack") (param $S i32) (param $D i32) (param $n i32) (param $k i32) (param $f16 i32) (result i32)
    (local $i i32) (local $j i32) (local $src i32) (local $dst i32) (local $h i32)
    (local.set $src (local.get $S))
    (block $rowsd (loop $rowsl
      (br_if $rowsd (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $dst (i32.add (local.get $D) (i32.shl (i32.add
        (i32.mul (i32.and (local.get $i) (i32.const ${~(PANEL - 1)})) (local.get $k))
        (i32.and (local.get $i) (i32.const ${PANEL - 1}))) (i32.const 1))))
      (local.set $j (i32.const 0))
      (block $colsd (loop $colsl
        (br_if $colsd (i32.ge_u (local.get $j) (local.get $k)))
        (local.set $h (i32.load16_u (local.get $src)))
        (if (i32.and (local.get $f16) (i32.eq (i32.and (local.get $h) (i32.const 0x7c00)) (i32.const 0x7c00)))
          (then (return (i32.add (i32.add (i32.mul (local.get $i) (local.get $k)) (local.get $j)) (i32.const 1)))))
        (i32.store16 (local.get $dst) (local.get $h))
        (local.set $src (i32.add (local.get $src) (i32.const 2)))
        (local.set $dst (i32.add (local.get $dst) (i32.const ${PANEL * 2})))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br $colsl)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $rowsl)))
    (i32.const 0)
  )`;
}

// ---- decoders: gguf_blocks.ts decodeBlocks, value for value ---------------------------------

/**
 * Writes the 16 lanes of $q (int8 when `signed`, else uint8) as f32 d·q, then − or + m, to
 * $fp + off: each lane the one f32 multiply (and add) the JS decoder rounds with fround.
 */
function put16(signed: boolean, d: string, m: { op: 'sub' | 'add'; v: string } | null, off: number): string {
  const sx = signed ? 's' : 'u';
  const out: string[] = [];
  for (let p = 0; p < 4; p++) {
    const w32 = `(i32x4.extend_${p % 2 ? 'high' : 'low'}_i16x8_${sx} (i16x8.extend_${p < 2 ? 'low' : 'high'}_i8x16_${sx} (local.get $q)))`;
    let f = `(f32x4.mul ${d} (f32x4.convert_i32x4_s ${w32}))`;
    if (m) f = `(f32x4.${m.op} ${f} ${m.v})`;
    out.push(`(v128.store offset=${off + 16 * p} (local.get $fp) ${f})`);
  }
  return out.join('\n      ');
}

const splat8 = (v: number) => `(i8x16.splat (i32.const ${v}))`;
const halfAt = (off: number) => `(call $f16_to_f32 (i32.load16_u offset=${off} (local.get $sp)))`;

/** One exported decoder: `blocks` blocks of `inBytes` at S into `values` f32 each at F. */
function decoder(name: string, inBytes: number, values: number, body: string): string {
  return `
  (func (export "${name}") (param $S i32) (param $F i32) (param $blocks i32)
    (local $sp i32) (local $fp i32) (local $q v128) (local $v v128) (local $w v128) (local $h v128)
    (local $dv v128) (local $mv v128) (local $d2 v128) (local $m2 v128) (local $d f32) (local $dmin f32) (local $qh v128)
    (local.set $sp (local.get $S))
    (local.set $fp (local.get $F))
    (block $done (loop $each
      (br_if $done (i32.eqz (local.get $blocks)))
      ${body}
      (local.set $sp (i32.add (local.get $sp) (i32.const ${inBytes})))
      (local.set $fp (i32.add (local.get $fp) (i32.const ${values * 4})))
      (local.set $blocks (i32.sub (local.get $blocks) (i32.const 1)))
      (br $each)))
  )`;
}

/**
 * Bit 4 of value j (j < 16: bits 0..15 of the u32 qh; `high`: bits 16..31) as 16 or 0 in byte
 * lane j: qh's byte (j / 8) in lane j, tested against 1 << (j % 8).
 */
function qhBits(high: boolean): string {
  const b0 = high ? 2 : 0;
  const idx = [...Array(8).fill(b0), ...Array(8).fill(b0 + 1)].join(' ');
  const mask = `(v128.const i8x16 ${[0, 1].flatMap(() => [1, 2, 4, 8, 16, 32, 64, 128]).join(' ')})`;
  return `(v128.and (i8x16.eq (v128.and (i8x16.shuffle ${idx} (local.get $qh) (local.get $qh)) ${mask}) ${mask}) ${splat8(16)})`;
}

/**
 * q4toq8(S, O, blocks): Q4_0 blocks (f16 d, 16 bytes of nibbles) as the Q8_0 blocks of the same
 * values (weight_pack.ts q4_0AsQ8_0): d as it is, value j < 16 the low nibble of byte j minus 8,
 * value j + 16 its high nibble minus 8.
 */
function q4ToQ8Func(): string {
  return `
  (func (export "q4toq8") (param $S i32) (param $O i32) (param $blocks i32)
    (local $v v128)
    (block $done (loop $each
      (br_if $done (i32.eqz (local.get $blocks)))
      (i32.store16 (local.get $O) (i32.load16_u (local.get $S)))
      (local.set $v (v128.load offset=2 (local.get $S)))
      (v128.store offset=2 (local.get $O) (i8x16.sub (v128.and (local.get $v) ${splat8(15)}) ${splat8(8)}))
      (v128.store offset=18 (local.get $O) (i8x16.sub (i8x16.shr_u (local.get $v) (i32.const 4)) ${splat8(8)}))
      (local.set $S (i32.add (local.get $S) (i32.const 18)))
      (local.set $O (i32.add (local.get $O) (i32.const 34)))
      (local.set $blocks (i32.sub (local.get $blocks) (i32.const 1)))
      (br $each)))
  )`;
}

/** Q4_1, Q5_0, Q5_1: blocks of 32; value j < 16 the low nibble of byte j, j + 16 its high nibble. */
function legacyDecoders(): string {
  const kinds: { name: string; bytes: number; m: number | null; qh: number | null; qs: number }[] = [
    { name: 'dq4_1', bytes: 20, m: 2, qh: null, qs: 4 },
    { name: 'dq5_0', bytes: 22, m: null, qh: 2, qs: 6 },
    { name: 'dq5_1', bytes: 24, m: 2, qh: 4, qs: 8 },
  ];
  return kinds
    .map(({ name, bytes, m, qh, qs }) => {
      const add = m === null ? null : { op: 'add' as const, v: '(local.get $mv)' };
      const nib = (hi: boolean) => (hi ? `(i8x16.shr_u (local.get $v) (i32.const 4))` : `(v128.and (local.get $v) ${splat8(15)})`);
      // Q5_0 is d·(q − 16): the subtraction exact in int8, then signed.
      const q = (hi: boolean) => {
        const five = qh === null ? nib(hi) : `(v128.or ${nib(hi)} ${qhBits(hi)})`;
        return m === null ? `(i8x16.sub ${five} ${splat8(16)})` : five;
      };
      return decoder(
        name,
        bytes,
        32,
        `(local.set $dv (f32x4.splat ${halfAt(0)}))
      ${m === null ? '' : `(local.set $mv (f32x4.splat ${halfAt(m)}))`}
      ${qh === null ? '' : `(local.set $qh (i32x4.splat (i32.load offset=${qh} (local.get $sp))))`}
      (local.set $v (v128.load offset=${qs} (local.get $sp)))
      (local.set $q ${q(false)})
      ${put16(m === null, '(local.get $dv)', add, 0)}
      (local.set $q ${q(true)})
      ${put16(m === null, '(local.get $dv)', add, 64)}`,
      );
    })
    .join('\n');
}

/**
 * Q4_K and Q5_K: sub-block j's 6-bit scale and min from the 12 bytes at offset 4
 * (gguf_blocks.ts scaleOf / minOf; j is a constant here, so the j < 4 choice is made now).
 */
function scaleMin(j: number, min: boolean): string {
  const b = (i: number) => `(i32.load8_u offset=${4 + i} (local.get $sp))`;
  if (j < 4) return `(i32.and ${b(min ? j + 4 : j)} (i32.const 63))`;
  return min
    ? `(i32.or (i32.shr_u ${b(j + 4)} (i32.const 4)) (i32.shl (i32.shr_u ${b(j)} (i32.const 6)) (i32.const 4)))`
    : `(i32.or (i32.and ${b(j + 4)} (i32.const 15)) (i32.shl (i32.shr_u ${b(j - 4)} (i32.const 6)) (i32.const 4)))`;
}

/** Q4_K, Q5_K: x = (d·sc)·q − (dmin·m) per sub-block of 32; sub-blocks 2c, 2c + 1 share 32 bytes. */
function kDecoder(five: boolean): string {
  const qs = five ? 48 : 16;
  const lines = [`(local.set $d ${halfAt(0)})`, `(local.set $dmin ${halfAt(2)})`];
  const f32of = (x: string, i: string) => `(f32x4.splat (f32.mul (local.get ${x}) (f32.convert_i32_u ${i})))`;
  // Bit `b` of each qh byte moved to bit 4.
  const bit = (b: number) => `(i8x16.shl (v128.and (i8x16.shr_u (local.get $h) (i32.const ${b})) ${splat8(1)}) (i32.const 4))`;
  for (let c = 0; c < 4; c++) {
    lines.push(
      `(local.set $dv ${f32of('$d', scaleMin(2 * c, false))})`,
      `(local.set $mv ${f32of('$dmin', scaleMin(2 * c, true))})`,
      `(local.set $d2 ${f32of('$d', scaleMin(2 * c + 1, false))})`,
      `(local.set $m2 ${f32of('$dmin', scaleMin(2 * c + 1, true))})`,
    );
    for (let g = 0; g < 2; g++) {
      lines.push(`(local.set $v (v128.load offset=${qs + 32 * c + 16 * g} (local.get $sp)))`);
      if (five) lines.push(`(local.set $h (v128.load offset=${16 + 16 * g} (local.get $sp)))`);
      const lo = `(v128.and (local.get $v) ${splat8(15)})`;
      const hi = `(i8x16.shr_u (local.get $v) (i32.const 4))`;
      lines.push(
        `(local.set $q ${five ? `(v128.or ${lo} ${bit(2 * c)})` : lo})`,
        put16(false, '(local.get $dv)', { op: 'sub', v: '(local.get $mv)' }, (64 * c + 16 * g) * 4),
        `(local.set $q ${five ? `(v128.or ${hi} ${bit(2 * c + 1)})` : hi})`,
        put16(false, '(local.get $d2)', { op: 'sub', v: '(local.get $m2)' }, (64 * c + 32 + 16 * g) * 4),
      );
    }
  }
  return decoder(five ? 'dq5_k' : 'dq4_k', five ? 176 : 144, 256, lines.join('\n      '));
}

/**
 * Q6_K: in half n, value l + 32i (l < 32, i < 4): low nibble of ql[64n + l + 32(i & 1)] (the high
 * one for i ≥ 2), top bits 2i of qh[32n + l], scale scales[8n + 2i + l / 16]; x = (d·sc)·(q − 32).
 */
function q6kDecoder(): string {
  const lines = [`(local.set $d ${halfAt(208)})`];
  for (let n = 0; n < 2; n++) {
    for (let g = 0; g < 2; g++) {
      lines.push(
        `(local.set $v (v128.load offset=${64 * n + 16 * g} (local.get $sp)))`,
        `(local.set $w (v128.load offset=${64 * n + 32 + 16 * g} (local.get $sp)))`,
        `(local.set $h (v128.load offset=${128 + 32 * n + 16 * g} (local.get $sp)))`,
      );
      const low = (x: string) => `(v128.and (local.get ${x}) ${splat8(15)})`;
      const high = (x: string) => `(i8x16.shr_u (local.get ${x}) (i32.const 4))`;
      const top = (i: number) => `(i8x16.shl (v128.and (i8x16.shr_u (local.get $h) (i32.const ${2 * i})) ${splat8(3)}) (i32.const 4))`;
      const nib = [low('$v'), low('$w'), high('$v'), high('$w')];
      for (let i = 0; i < 4; i++) {
        const sc = `(f32x4.splat (f32.mul (local.get $d) (f32.convert_i32_s (i32.load8_s offset=${192 + 8 * n + 2 * i + g} (local.get $sp)))))`;
        lines.push(
          `(local.set $dv ${sc})`,
          `(local.set $q (i8x16.sub (v128.or ${nib[i]} ${top(i)}) ${splat8(32)}))`,
          put16(true, '(local.get $dv)', null, (128 * n + 32 * i + 16 * g) * 4),
        );
      }
    }
  }
  return decoder('dq6_k', 210, 256, lines.join('\n      '));
}

/** The module: its memory imported as env.mem (one page table per converter, not shared). */
export function convertWat(): string {
  if (STRIP !== 2 * Q8_HALF_COLS) throw new Error('wat/convert.ts: the q8 layout changed (two halves per strip)');
  return `(module
  (import "env" "mem" (memory 1))
  ${f32ToF16Func()}
  ${f16ToF32Func()}
  ${q8QuantFunc()}
  ${q8PackFunc()}
  ${p16PackFunc()}
  ${q4PackFunc()}
  ${q4ToQ8Func()}
  ${legacyDecoders()}
  ${kDecoder(false)}
  ${kDecoder(true)}
  ${q6kDecoder()}
)`;
}

// WAT of attention over a narrow staged KV (f16, bf16, int8, fp8): the score and value products
// read the staged 16- and 8-bit K and V rows themselves and widen them in registers, with no f32
// copy of K or V (the f32 path, attention.ts attendheads, gathers Kᵀ and V into f32 operands for
// the dense GEMMs). Every result is bit for bit what gatherkv + attgroups compute: the same
// widening (gather.ts's exact conversions), the same accumulation order (each score a sum over
// the head's elements ascending, each output element a sum over keys 0..Pg ascending, acc + x·w
// per step, fused or not as the module's GEMMs), the same softmax and the same zero padding.
import { ATT_GROUP, STRIP } from '../layout.js';
import { BLOCK_SHIFT, BLOCK_TOKENS } from '../../kv_cache.js';
import { madd } from './gemm.js';

/** The narrow KV dtype codes (common/dtype.ts DType): 1 f16, 2 bf16, 3 int8, 4 fp8_e4m3, 5 fp8_e5m2. */
type NarrowDt = 1 | 2 | 3 | 4 | 5;
const NARROW: NarrowDt[] = [1, 2, 3, 4, 5];
const elemShift = (dt: NarrowDt) => (dt <= 2 ? 1 : 0);
const splat = (v: string) => `(v128.const i32x4 ${v} ${v} ${v} ${v})`;

/** f32x4 of the f16 bits in the i32x4 expression `h` (gather.ts's exact conversion, Inf/NaN kept); `m` a v128 scratch local. */
function f16Vec(h: string, m: string, hv: string): string {
  return `(local.set ${hv} ${h})
        (local.set ${m} (i32x4.shl (v128.and (local.get ${hv}) ${splat('0x7fff')}) (i32.const 13)))
        (v128.or
          (i32x4.shl (v128.and (local.get ${hv}) ${splat('0x8000')}) (i32.const 16))
          (v128.bitselect
            (v128.or (local.get ${m}) ${splat('0x7f800000')})
            (f32x4.mul (local.get ${m}) (v128.const f32x4 0x1p112 0x1p112 0x1p112 0x1p112))
            (i32x4.eq (v128.and (local.get ${hv}) ${splat('0x7c00')}) ${splat('0x7c00')})))`;
}

/**
 * The exact widening is exact for every value; a fast one (f16, E5M2, E4M3) skips the Inf/NaN case and
 * the multiply by a power of two: it yields the element times 2^−FAST_EXP (the magnitude bits
 * moved into f32's fields, the sign kept by a sign-extending load), the factor going onto the other
 * operand instead (q, or the softmax's p). A product of two f32s scaled by 2^k and 2^−k is the same
 * real number, so every rounded product and sum is the same: the same bits, as long as the scaled
 * operand stays finite (|q| < 2^(128 − FAST_EXP)) and no element is Inf/NaN — each checked per head
 * (the elements' magnitudes by a running max); where either fails, the head is computed again exactly.
 */
const FAST_EXP: Partial<Record<NarrowDt, number>> = { 1: 112, 5: 112, 4: 120 };

/**
 * Statements widening the elements in the low lanes of $raw (16-bit: 8 lanes of i16x8; 8-bit:
 * the low 8 bytes) into $w0 (elements 0..3) and $w1 (4..7) — only $w0 when `half` (4 elements).
 * int8: the integers as f32 (their row's scale is folded into p). `fast`:
 * the fast widening (FAST_EXP), and $chk keeps the running max of the magnitude bits (shifted left
 * past the sign).
 */
function widen8(dt: NarrowDt, half: boolean, fast = false): string {
  const parts = half ? [0] : [0, 1];
  const ext = (i: number) => (i === 0 ? 'low' : 'high');
  if (fast) {
    const wide = dt === 1;
    const chk = wide ? `(local.set $chk (i16x8.max_u (local.get $chk) (i16x8.shl (local.get $raw) (i32.const 1))))` : `(local.set $chk (i8x16.max_u (local.get $chk) (i8x16.shl (local.get $raw) (i32.const 1))))`;
    // f16 h sign-extended: bits 31..28 the sign, 27..13 |h| after << 13; E5M2 b is the f16 b << 8,
    // so << 21; E4M3 b << 20 puts |b| in 26..20. The mask keeps the sign bit and |x|'s bits.
    const [sh, mask] = dt === 1 ? [13, '0x8fffffff'] : dt === 5 ? [21, '0x8fffffff'] : [20, '0x87ffffff'];
    const src = wide ? '(local.get $raw)' : '(local.get $hv)';
    return `${chk}
        ${wide ? '' : '(local.set $hv (i16x8.extend_low_i8x16_s (local.get $raw)))'}
        ${parts.map((i) => `(local.set $w${i} (v128.and (i32x4.shl (i32x4.extend_${ext(i)}_i16x8_s ${src}) (i32.const ${sh})) ${splat(mask)}))`).join('\n        ')}`;
  }
  return parts
    .map((i) => {
      if (dt === 1) return `(local.set $w${i} (block (result v128) ${f16Vec(`(i32x4.extend_${ext(i)}_i16x8_u (local.get $raw))`, '$m', '$hv')}))`;
      if (dt === 2) return `(local.set $w${i} (i32x4.shl (i32x4.extend_${ext(i)}_i16x8_u (local.get $raw)) (i32.const 16)))`;
      const bytes = (signed: boolean) => {
        const x = signed ? 's' : 'u';
        return `(i32x4.extend_${ext(i)}_i16x8_${x} (i16x8.extend_low_i8x16_${x} (local.get $raw)))`;
      };
      // int8: the value itself; its row's scale is folded into p (groupsLoop)
      if (dt === 3) return `(local.set $w${i} (f32x4.convert_i32x4_s ${bytes(true)}))`;
      if (dt === 5) return `(local.set $w${i} (block (result v128) ${f16Vec(`(i32x4.shl ${bytes(false)} (i32.const 8))`, '$m', '$hv')}))`;
      // E4M3: magnitude bits << 20 read as f32, times 2^120; 0x7f (NaN) kept; the sign put back.
      return `(local.set $hv ${bytes(false)})
        (local.set $m (i32x4.shl (v128.and (local.get $hv) ${splat('0x7f')}) (i32.const 20)))
        (local.set $w${i} (v128.or
          (i32x4.shl (v128.and (local.get $hv) ${splat('0x80')}) (i32.const 24))
          (v128.bitselect
            (v128.or (local.get $m) ${splat('0x7f800000')})
            (f32x4.mul (local.get $m) (v128.const f32x4 0x1p120 0x1p120 0x1p120 0x1p120))
            (i32x4.eq (v128.and (local.get $hv) ${splat('0x7f')}) ${splat('0x7f')}))))`;
    })
    .join('\n');
}

const V128_LOCALS = '(local $u0 v128) (local $u1 v128) (local $ta v128) (local $tb v128) (local $tc v128) (local $td v128) (local $raw v128) (local $hv v128) (local $m v128) (local $w0 v128) (local $w1 v128) (local $x v128) (local $z v128) (local $s0 v128) (local $s1 v128) (local $chk v128)';
const accLocals = (rows: number) => Array.from({ length: rows }, (_, r) => `(local $a${r}0 v128) (local $a${r}1 v128)`).join(' ');
/** A fast variant's last statement: the running max of its elements' magnitude bits into the head's (at $chkp). */
const keepChk = (dt: NarrowDt) => `(v128.store (local.get $chkp) (${dt === 1 ? 'i16x8' : 'i8x16'}.max_u (v128.load (local.get $chkp)) (local.get $chk)))`;
const variant = (fast: boolean) => (fast ? 'f' : 'x');

/** i8x16.shuffle lanes interleaving the low 16-bit (then 32-bit) halves of two vectors: x86's punpcklwd / punpckldq / punpckhdq. */
const LO16 = '0 1 16 17 2 3 18 19 4 5 20 21 6 7 22 23';
const LO32 = '0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23';
const HI32 = '8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31';

/**
 * A 16-bit dtype's score step of four elements for eight keys, the tile transposed in registers:
 * each key's four elements in one 8-byte load, two rounds of interleaving, so $ta holds
 * element e of keys 0..3 and e+1 in its halves ($tb: e+2, e+3; $tc, $td: keys 4..7). Two loads
 * and two interleaves per key a step, where loading lane by lane took four loads (the same
 * elements, products and order: each lane's score still adds q[e]·k[e] for e ascending). The
 * caller advances the row and query pointers.
 */
function transposedBody(dt: NarrowDt, R: number, fma: boolean, fast: boolean): string[] {
  const body: string[] = [];
  const pair = (a: number) => `(i8x16.shuffle ${LO16} (v128.load64_zero (local.get $p${a})) (v128.load64_zero (local.get $p${a + 1})))`;
  for (const [lo, hi, a] of [['$ta', '$tb', 0], ['$tc', '$td', 4]] as const) {
    body.push(`(local.set $u0 ${pair(a)})`, `(local.set $u1 ${pair(a + 2)})`);
    body.push(`(local.set ${lo} (i8x16.shuffle ${LO32} (local.get $u0) (local.get $u1)))`, `(local.set ${hi} (i8x16.shuffle ${HI32} (local.get $u0) (local.get $u1)))`);
  }
  if (fast) {
    // the running max of the magnitude bits, as widen8 keeps it for the lane-loaded tile
    for (const t of ['$ta', '$tb', '$tc', '$td']) body.push(`(local.set $chk (i16x8.max_u (local.get $chk) (i16x8.shl (local.get ${t}) (i32.const 1))))`);
  }
  for (let u = 0; u < 4; u++) {
    const half = u & 1 ? 'high' : 'low';
    const [k0, k1] = u < 2 ? ['$ta', '$tc'] : ['$tb', '$td'];
    body.push(`(local.set $w0 ${widen16(dt, fast, `(i32x4.extend_${half}_i16x8_${fast ? 's' : 'u'} (local.get ${k0}))`)})`);
    body.push(`(local.set $w1 ${widen16(dt, fast, `(i32x4.extend_${half}_i16x8_${fast ? 's' : 'u'} (local.get ${k1}))`)})`);
    for (let r = 0; r < R; r++) {
      body.push(`(local.set $x (v128.load32_splat offset=${u * 4} (local.get $q${r})))`);
      for (let k = 0; k < 2; k++) body.push(`(local.set $a${r}${k} ${madd(fma, `(local.get $a${r}${k})`, '(local.get $x)', `(local.get $w${k})`)})`);
    }
  }
  return body;
}

/**
 * f32x4 of four 16-bit elements already extended to i32 lanes (`x`: zero-extended, or
 * sign-extended for the fast f16 widening), widen8's conversions for f16 and bf16.
 */
function widen16(dt: NarrowDt, fast: boolean, x: string): string {
  if (dt === 2) return `(i32x4.shl ${x} (i32.const 16))`;
  if (fast) return `(v128.and (i32x4.shl ${x} (i32.const 13)) ${splat('0x8fffffff')})`;
  return `(block (result v128) ${f16Vec(x, '$m', '$hv')})`;
}

/**
 * $ns<dt><x|f>_<R>(q, s, stride, len, hd, kbase, region, rowB, ksc, chkp): scores of R query rows
 * (q: the first row, rows hd floats apart) against keys [0, len) rounded up to 8, into s (rows
 * `stride` floats apart). Keys in lanes, eight at a time (a block of 16 holds whole tiles):
 * element e of the tile's eight K rows (kbase + block·region + slot·rowB, the dtype's bytes) is
 * loaded lane by lane, widened, and each row's score accumulates q[e]·k[e] for e ascending —
 * gemmsp's order on gatherkv's Kᵀ (not int8: scoresInt8Func). hd is a multiple of 4.
 * The fast variant (f) reads q scaled by 2^FAST_EXP and keeps the elements' max at chkp.
 */
function scoresFunc(dt: NarrowDt, R: number, fma: boolean, fast: boolean): string {
  const es = elemShift(dt);
  const eb = 1 << es;
  const lane = dt <= 2 ? 'v128.load16_lane' : 'v128.load8_lane';
  const body: string[] = [];
  if (eb === 2) body.push(...transposedBody(dt, R, fma, fast));
  else for (let u = 0; u < 4; u++) {
    const loads = Array.from({ length: 8 }, (_, i) => `(local.set $raw (${lane} offset=${u * eb} ${i} (local.get $p${i}) (local.get $raw)))`);
    body.push(...loads);
    body.push(widen8(dt, false, fast));
    for (let r = 0; r < R; r++) {
      body.push(`(local.set $x (v128.load32_splat offset=${u * 4} (local.get $q${r})))`);
      for (let k = 0; k < 2; k++) body.push(`(local.set $a${r}${k} ${madd(fma, `(local.get $a${r}${k})`, '(local.get $x)', `(local.get $w${k})`)})`);
    }
  }
  for (let i = 0; i < 8; i++) body.push(`(local.set $p${i} (i32.add (local.get $p${i}) (i32.const ${4 * eb})))`);
  for (let r = 0; r < R; r++) body.push(`(local.set $q${r} (i32.add (local.get $q${r}) (i32.const 16)))`);
  const zero = Array.from({ length: R }, (_, r) => `(local.set $a${r}0 (local.get $z)) (local.set $a${r}1 (local.get $z))`).join(' ');
  const store = Array.from(
    { length: R },
    (_, r) => `(local.set $sp (i32.add (local.get $s) (i32.shl (i32.add (i32.mul (i32.const ${r}) (local.get $stride)) (local.get $j)) (i32.const 2))))
        (v128.store (local.get $sp) (local.get $a${r}0)) (v128.store offset=16 (local.get $sp) (local.get $a${r}1))`,
  ).join('\n');
  return `
  (func $ns${dt}${variant(fast)}_${R} (param $q i32) (param $s i32) (param $stride i32) (param $len i32) (param $hd i32) (param $kbase i32)
      (param $region i32) (param $rowB i32) (param $ksc i32) (param $chkp i32)
    (local $j i32) (local $e i32) (local $sp i32) (local $rb i32)
    ${Array.from({ length: 8 }, (_, i) => `(local $p${i} i32)`).join(' ')} ${Array.from({ length: R }, (_, r) => `(local $q${r} i32)`).join(' ')}
    ${V128_LOCALS} ${accLocals(R)}
    (block $jdone (loop $jloop
      (br_if $jdone (i32.ge_u (local.get $j) (local.get $len)))
      (local.set $p0 (i32.add (local.get $kbase) (i32.add (i32.mul (i32.shr_u (local.get $j) (i32.const ${BLOCK_SHIFT})) (local.get $region))
        (i32.mul (i32.and (local.get $j) (i32.const ${BLOCK_TOKENS - 1})) (local.get $rowB)))))
      ${Array.from({ length: 7 }, (_, i) => `(local.set $p${i + 1} (i32.add (local.get $p${i}) (local.get $rowB)))`).join(' ')}
      ${Array.from({ length: R }, (_, r) => `(local.set $q${r} (i32.add (local.get $q) (i32.shl (i32.mul (i32.const ${r}) (local.get $hd)) (i32.const 2))))`).join(' ')}
      ${zero}
      (local.set $e (i32.const 0))
      (block $edone (loop $eloop
        (br_if $edone (i32.ge_u (local.get $e) (local.get $hd)))
        ${body.join('\n        ')}
        (local.set $e (i32.add (local.get $e) (i32.const 4)))
        (br $eloop)))
      ${store}
      (local.set $j (i32.add (local.get $j) (i32.const 8)))
      (br $jloop)))
    ${fast ? keepChk(dt) : ''}
  )`;
}

/**
 * $nv<dt><x|f>_<R>(s, stride, Pg, keys, o, hdPad, hd, vbase, region, rowB, chkp): O rows of R
 * query rows (o: the first, rows hdPad floats apart) = Σ_j p[j]·V[j] for j = 0..Pg−1 ascending
 * (gemms' order on gatherkv's V: keys ≥ keys count as zero rows), eight (then four) columns at a
 * time, reading each V row (vbase + block·region + slot·rowB) and widening it in registers, four
 * keys a step (int8: p already times the row's scale). The fast variant (f) reads p scaled by
 * 2^FAST_EXP and keeps the elements' max at chkp.
 */
function valuesFunc(dt: NarrowDt, R: number, fma: boolean, fast: boolean): string {
  const es = elemShift(dt);
  const eb = 1 << es;
  const pass = (half: boolean) => {
    const load = half ? (eb === 2 ? 'v128.load64_zero' : 'v128.load32_zero') : eb === 2 ? 'v128.load' : 'v128.load64_zero';
    const ks = half ? [0] : [0, 1];
    const h = half ? 'h' : '';
    /** One key: its p at offset u·4 of each row pointer, its V row at $vp (`w`: the widened elements, or zero). */
    const key = (u: number, real: boolean) => {
      const lines: string[] = [];
      if (real) {
        lines.push(`(local.set $raw (${load} (local.get $vp)))`);
        lines.push(widen8(dt, half, fast));
        lines.push(`(local.set $vp (i32.add (local.get $vp) (local.get $rowB)))`);
      }
      for (let r = 0; r < R; r++) {
        lines.push(`(local.set $x (v128.load32_splat offset=${u * 4} (local.get $r${r})))`);
        for (const k of ks) lines.push(`(local.set $a${r}${k} ${madd(fma, `(local.get $a${r}${k})`, '(local.get $x)', real ? `(local.get $w${k})` : '(local.get $z)')})`);
      }
      return lines.join('\n          ');
    };
    const advance = (n: number) =>
      [...Array.from({ length: R }, (_, r) => `(local.set $r${r} (i32.add (local.get $r${r}) (i32.const ${4 * n})))`), `(local.set $j (i32.add (local.get $j) (i32.const ${n})))`].join(' ');
    const zero = Array.from({ length: R }, (_, r) => ks.map((k) => `(local.set $a${r}${k} (local.get $z))`).join(' ')).join(' ');
    const store = Array.from({ length: R }, (_, r) => {
      const at = `(i32.add (local.get $o) (i32.shl (i32.add (i32.mul (i32.const ${r}) (local.get $hdPad)) (local.get $c)) (i32.const 2)))`;
      return ks.map((k) => `(v128.store offset=${16 * k} ${at} (local.get $a${r}${k}))`).join(' ');
    }).join('\n      ');
    return `${zero}
      (local.set $j (i32.const 0))
      ${Array.from({ length: R }, (_, r) => `(local.set $r${r} (i32.add (local.get $s) (i32.shl (i32.mul (i32.const ${r}) (local.get $stride)) (i32.const 2))))`).join(' ')}
      (block $kdone${h} (loop $kloop${h}
        (br_if $kdone${h} (i32.ge_u (local.get $j) (local.get $jEnd)))
        (local.set $vp (i32.add (i32.add (local.get $vbase) (i32.shl (local.get $c) (i32.const ${es})))
          (i32.add (i32.mul (i32.shr_u (local.get $j) (i32.const ${BLOCK_SHIFT})) (local.get $region)) (i32.mul (i32.and (local.get $j) (i32.const ${BLOCK_TOKENS - 1})) (local.get $rowB)))))
        ;; the rest of this block's rows: four keys a step, then one
        (local.set $bEnd (i32.and (i32.add (local.get $j) (i32.const ${BLOCK_TOKENS})) (i32.const ${-BLOCK_TOKENS})))
        (if (i32.gt_u (local.get $bEnd) (local.get $jEnd)) (then (local.set $bEnd (local.get $jEnd))))
        (block $qdone${h} (loop $qloop${h}
          (br_if $qdone${h} (i32.gt_u (i32.add (local.get $j) (i32.const 4)) (local.get $bEnd)))
          ${[0, 1, 2, 3].map((u) => key(u, true)).join('\n          ')}
          ${advance(4)}
          (br $qloop${h})))
        (block $rdone${h} (loop $rloop${h}
          (br_if $rdone${h} (i32.ge_u (local.get $j) (local.get $bEnd)))
          ${key(0, true)}
          ${advance(1)}
          (br $rloop${h})))
        (br $kloop${h})))
      ;; keys past the staged ones, up to Pg: zero rows, as gatherkv pads V
      (block $zdone${h} (loop $zloop${h}
        (br_if $zdone${h} (i32.ge_u (local.get $j) (local.get $Pg)))
        ${key(0, false)}
        ${advance(1)}
        (br $zloop${h})))
      ${store}`;
  };
  return `
  (func $nv${dt}${variant(fast)}_${R} (param $s i32) (param $stride i32) (param $Pg i32) (param $keys i32) (param $o i32) (param $hdPad i32) (param $hd i32)
      (param $vbase i32) (param $region i32) (param $rowB i32) (param $chkp i32)
    (local $c i32) (local $j i32) (local $jEnd i32) (local $vp i32) (local $bEnd i32)
    ${Array.from({ length: R }, (_, r) => `(local $r${r} i32)`).join(' ')}
    ${V128_LOCALS} ${accLocals(R)}
    (local.set $jEnd (select (local.get $keys) (local.get $Pg) (i32.lt_u (local.get $keys) (local.get $Pg))))
    (block $cdone (loop $cloop
      (br_if $cdone (i32.gt_u (i32.add (local.get $c) (i32.const 8)) (local.get $hd)))
      ${pass(false)}
      (local.set $c (i32.add (local.get $c) (i32.const 8)))
      (br $cloop)))
    (if (i32.lt_u (local.get $c) (local.get $hd)) (then
      ${pass(true)}))
    ${fast ? keepChk(dt) : ''}
  )`;
}

/**
 * $ns3_<R>(q16, sq, s, stride, len, hd, kbase, region, rowB, ksc): int8 scores of R query rows
 * (the kernel's int8 KV semantics, attention_js.ts attendInt8Js): each row's queries quantized
 * to int16 (q16 rows hd values apart, sq their f32 scales, nquant), each key row read as it is
 * held, the dot products exact in i32 (i32x4.dot_i16x8_s, eight elements a step: |q16·k| ≤ 2^22
 * per pair, so no sum of a head of fewer than 512 elements can overflow), then
 * score = f32(sum) · f32(sq_r · ks_j), ks_j the key's scale. One key at a time (its row
 * contiguous); the R sums reduced into the lanes of one vector.
 */
function scoresInt8Func(R: number): string {
  /** The dot products of n keys (rows at $p and $p + rowB) with the R rows, eight elements from `load`. */
  const step = (n: number, load: string) => {
    const lines = Array.from({ length: n }, (_, k) => `(local.set $w${k} (i16x8.extend_low_i8x16_s (${load} ${k ? '(i32.add (local.get $p) (local.get $rowB))' : '(local.get $p)'})))`);
    for (let r = 0; r < R; r++) {
      lines.push(`(local.set $x (v128.load (local.get $q${r})))`);
      for (let k = 0; k < n; k++) lines.push(`(local.set $a${r}${k} (i32x4.add (local.get $a${r}${k}) (i32x4.dot_i16x8_s (local.get $w${k}) (local.get $x))))`);
      lines.push(`(local.set $q${r} (i32.add (local.get $q${r}) (i32.const 16)))`);
    }
    return lines.join('\n          ');
  };
  const acc = (r: number, k: number) => (r < R ? `(local.get $a${r}${k})` : '(local.get $z)');
  // [Σa0, Σa1, Σa2, Σa3] of key k: pairs interleaved and added, twice; then times sq_r · ks_j
  const reduce = (k: number) => `(local.set $w0 (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 ${acc(0, k)} ${acc(1, k)})
            (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 ${acc(0, k)} ${acc(1, k)})))
        (local.set $w1 (i32x4.add (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 ${acc(2, k)} ${acc(3, k)})
            (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 ${acc(2, k)} ${acc(3, k)})))
        (local.set $x (i32x4.add (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $w0) (local.get $w1))
            (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $w0) (local.get $w1))))
        (local.set $x (f32x4.mul (f32x4.convert_i32x4_s (local.get $x))
          (f32x4.mul (local.get $s1) (v128.load32_splat offset=${4 * k} (i32.add (local.get $ksc) (i32.shl (local.get $j) (i32.const 2)))))))
        ${Array.from({ length: R }, (_, r) => `(f32.store offset=${4 * k} (i32.add (local.get $s) (i32.shl (i32.add (i32.mul (i32.const ${r}) (local.get $stride)) (local.get $j)) (i32.const 2)))
          (f32x4.extract_lane ${r} (local.get $x)))`).join('\n        ')}`;
  /** n keys from $j: all their products, then their scores stored. */
  const keys = (n: number) => `(local.set $p (i32.add (local.get $kbase) (i32.add (i32.mul (i32.shr_u (local.get $j) (i32.const ${BLOCK_SHIFT})) (local.get $region))
        (i32.mul (i32.and (local.get $j) (i32.const ${BLOCK_TOKENS - 1})) (local.get $rowB)))))
      ${Array.from({ length: R }, (_, r) => `(local.set $q${r} (i32.add (local.get $q16) (i32.mul (i32.const ${r}) (local.get $rowQ))))`).join(' ')}
      ${Array.from({ length: R }, (_, r) => Array.from({ length: n }, (_, k) => `(local.set $a${r}${k} (local.get $z))`).join(' ')).join(' ')}
      (local.set $e (i32.const 0))
      ;; eight elements a step; a last four come with four zeros (the q16 rows are padded to 8)
      (block $edone${n} (loop $eloop${n}
        (br_if $edone${n} (i32.gt_u (i32.add (local.get $e) (i32.const 8)) (local.get $hd)))
          ${step(n, 'v128.load64_zero')}
        (local.set $p (i32.add (local.get $p) (i32.const 8)))
        (local.set $e (i32.add (local.get $e) (i32.const 8)))
        (br $eloop${n})))
      (if (i32.lt_u (local.get $e) (local.get $hd)) (then
          ${step(n, 'v128.load32_zero')}))
      ${Array.from({ length: n }, (_, k) => reduce(k)).join('\n      ')}`;
  return `
  (func $ns3_${R} (param $q16 i32) (param $sq i32) (param $s i32) (param $stride i32) (param $len i32) (param $hd i32) (param $kbase i32)
      (param $region i32) (param $rowB i32) (param $ksc i32)
    (local $j i32) (local $e i32) (local $p i32) (local $rowQ i32)
    ${Array.from({ length: R }, (_, r) => `(local $q${r} i32)`).join(' ')}
    ${V128_LOCALS} ${accLocals(R)}
    (local.set $rowQ (i32.shl (i32.and (i32.add (local.get $hd) (i32.const 7)) (i32.const -8)) (i32.const 1)))
    (local.set $s1 (v128.load (local.get $sq)))
    ;; two keys a step (even j: both in one block), then a last one
    (block $jdone (loop $jloop
      (br_if $jdone (i32.gt_u (i32.add (local.get $j) (i32.const 2)) (local.get $len)))
      ${keys(2)}
      (local.set $j (i32.add (local.get $j) (i32.const 2)))
      (br $jloop)))
    (if (i32.lt_u (local.get $j) (local.get $len)) (then
      ${keys(1)}))
  )`;
}

/**
 * $nquant(q, M, hd, q16, sq): each of the M query rows (hd floats) as int16, attendInt8Js's rule:
 * m = max |q|, sq = f32(m / 32767), q16 = q · f32(32767 / m) rounded to nearest even and
 * saturated (a row of zeros: sq = 0 and zeros; NaN: 0). q16 rows are hd8 = hd rounded up to 8
 * values apart (zero-padded); sq has M rounded up to 4 entries (zeros past M).
 */
function quantFunc(): string {
  return `
  (func $nquant (param $q i32) (param $M i32) (param $hd i32) (param $q16 i32) (param $sq i32)
    (local $r i32) (local $e i32) (local $hd8 i32) (local $m v128) (local $x v128) (local $inv f32) (local $mx f32) (local $qp i32) (local $op i32)
    (local.set $hd8 (i32.and (i32.add (local.get $hd) (i32.const 7)) (i32.const -8)))
    (block $rdone (loop $rloop
      (br_if $rdone (i32.ge_u (local.get $r) (local.get $M)))
      (local.set $qp (i32.add (local.get $q) (i32.shl (i32.mul (local.get $r) (local.get $hd)) (i32.const 2))))
      (local.set $op (i32.add (local.get $q16) (i32.shl (i32.mul (local.get $r) (local.get $hd8)) (i32.const 1))))
      (local.set $m (v128.const i32x4 0 0 0 0))
      (local.set $e (i32.const 0))
      (block $mdone (loop $mloop
        (br_if $mdone (i32.ge_u (local.get $e) (local.get $hd)))
        (local.set $m (f32x4.max (local.get $m) (f32x4.abs (v128.load (i32.add (local.get $qp) (i32.shl (local.get $e) (i32.const 2)))))))
        (local.set $e (i32.add (local.get $e) (i32.const 4)))
        (br $mloop)))
      (local.set $mx (f32.max (f32.max (f32x4.extract_lane 0 (local.get $m)) (f32x4.extract_lane 1 (local.get $m)))
        (f32.max (f32x4.extract_lane 2 (local.get $m)) (f32x4.extract_lane 3 (local.get $m)))))
      (local.set $inv (select (f32.div (f32.const 32767) (local.get $mx)) (f32.const 0) (f32.gt (local.get $mx) (f32.const 0))))
      (f32.store (i32.add (local.get $sq) (i32.shl (local.get $r) (i32.const 2))) (f32.div (local.get $mx) (f32.const 32767)))
      (v128.store (i32.add (local.get $op) (i32.shl (i32.sub (local.get $hd8) (i32.const 8)) (i32.const 1))) (v128.const i32x4 0 0 0 0))
      (local.set $e (i32.const 0))
      (block $qdone (loop $qloop
        (br_if $qdone (i32.ge_u (local.get $e) (local.get $hd)))
        (local.set $x (i32x4.trunc_sat_f32x4_s (f32x4.nearest (f32x4.mul (v128.load (i32.add (local.get $qp) (i32.shl (local.get $e) (i32.const 2)))) (f32x4.splat (local.get $inv))))))
        (v128.store64_lane 0 (i32.add (local.get $op) (i32.shl (local.get $e) (i32.const 1))) (i16x8.narrow_i32x4_s (local.get $x) (local.get $x)))
        (local.set $e (i32.add (local.get $e) (i32.const 4)))
        (br $qloop)))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br $rloop)))
    (v128.store (i32.add (local.get $sq) (i32.shl (local.get $M) (i32.const 2))) (v128.const i32x4 0 0 0 0))
  )`;
}

/** $nscalecols(s, rows, Pg, f): each of `rows` rows of Pg floats (Pg a multiple of 4) times f[j] in place (int8: p_j · vs_j). */
function scaleColsFunc(): string {
  return `
  (func $nscalecols (param $s i32) (param $rows i32) (param $Pg i32) (param $f i32)
    (local $r i32) (local $j i32) (local $p i32)
    (block $rdone (loop $rloop
      (br_if $rdone (i32.ge_u (local.get $r) (local.get $rows)))
      (local.set $p (i32.add (local.get $s) (i32.shl (i32.mul (local.get $r) (local.get $Pg)) (i32.const 2))))
      (local.set $j (i32.const 0))
      (block $jdone (loop $jloop
        (br_if $jdone (i32.ge_u (local.get $j) (local.get $Pg)))
        (v128.store (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))
          (f32x4.mul (v128.load (i32.add (local.get $p) (i32.shl (local.get $j) (i32.const 2)))) (v128.load (i32.add (local.get $f) (i32.shl (local.get $j) (i32.const 2))))))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br $jloop)))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br $rloop)))
  )`;
}

/** A call of the R-row variant of `fn` (R = 1..4) chosen by $R at run time. */
function byRows(fn: (R: number) => string): string {
  return `(if (i32.eq (local.get $R) (i32.const 4)) (then ${fn(4)})
        (else (if (i32.eq (local.get $R) (i32.const 3)) (then ${fn(3)})
        (else (if (i32.eq (local.get $R) (i32.const 2)) (then ${fn(2)}) (else ${fn(1)}))))))`;
}

/**
 * The head's groups of ATT_GROUP rows (attgroups' groups and Pg): the scores (4-row tiles), the
 * softmax, the values; `fast`: the fast variants, q read from $qs (scaled) and p scaled after the softmax.
 */
function groupsLoop(dt: NarrowDt, fast: boolean): string {
  const v = variant(fast);
  const x = fast ? 'f' : 'x';
  return `(local.set $gi (i32.const 0))
    (block $done${x} (loop $each${x}
      (br_if $done${x} (i32.ge_u (local.get $gi) (local.get $G)))
      (local.set $rs (i32.shl (local.get $gi) (i32.const ${Math.log2(ATT_GROUP)})))
      (local.set $rows (i32.sub (local.get $M) (local.get $rs)))
      (if (i32.gt_u (local.get $rows) (i32.const ${ATT_GROUP})) (then (local.set $rows (i32.const ${ATT_GROUP}))))
      ;; the group's longest row and its key count Pg, as attgroups takes them
      (local.set $len (i32.const 0))
      (local.set $i (i32.const 0))
      (block $ld${x} (loop $ll${x}
        (br_if $ld${x} (i32.ge_u (local.get $i) (local.get $rows)))
        (local.set $t (i32.load (i32.add (local.get $L) (i32.shl (i32.add (local.get $rs) (local.get $i)) (i32.const 2)))))
        (if (i32.gt_s (local.get $t) (local.get $len)) (then (local.set $len (local.get $t))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $ll${x})))
      (local.set $Pg (i32.and (i32.add (local.get $len) (i32.const ${STRIP - 1})) (i32.const ${-STRIP})))
      (if (i32.or (i32.gt_s (local.get $Pg) (local.get $P)) (i32.le_s (local.get $Pg) (i32.const 0))) (then (local.set $Pg (local.get $P))))
      (local.set $sp (i32.add (local.get $S) (i32.shl (i32.mul (local.get $rs) (local.get $P)) (i32.const 2))))
      ;; scores (keys past a row's length are overwritten by the softmax's zeros)
      (local.set $i (i32.const 0))
      (block $sd${x} (loop $sl${x}
        (br_if $sd${x} (i32.ge_u (local.get $i) (local.get $rows)))
        (local.set $R (i32.sub (local.get $rows) (local.get $i)))
        (if (i32.gt_u (local.get $R) (i32.const 4)) (then (local.set $R (i32.const 4))))
        ${byRows((R) =>
          dt === 3
            ? `(call $ns3_${R} (i32.add (local.get $qs) (i32.shl (i32.mul (i32.add (local.get $rs) (local.get $i)) (local.get $hd8)) (i32.const 1)))
          (i32.add (local.get $sqp) (i32.shl (i32.add (local.get $rs) (local.get $i)) (i32.const 2)))
          (i32.add (local.get $sp) (i32.shl (i32.mul (local.get $i) (local.get $Pg)) (i32.const 2))) (local.get $Pg) (local.get $len) (local.get $hd)
          (local.get $kbase) (local.get $region) (local.get $rowB) (local.get $scr))`
            : `(call $ns${dt}${v}_${R} (i32.add (local.get ${fast ? '$qs' : '$q'}) (i32.shl (i32.mul (i32.add (local.get $rs) (local.get $i)) (local.get $hd)) (i32.const 2)))
          (i32.add (local.get $sp) (i32.shl (i32.mul (local.get $i) (local.get $Pg)) (i32.const 2))) (local.get $Pg) (local.get $len) (local.get $hd)
          (local.get $kbase) (local.get $region) (local.get $rowB) (local.get $scr) (local.get $scr))`,
        )}
        (local.set $i (i32.add (local.get $i) (local.get $R)))
        (br $sl${x})))
      (call $softmax (local.get $sp) (local.get $rows) (local.get $Pg) (i32.add (local.get $L) (i32.shl (local.get $rs) (i32.const 2))) (local.get $scale))
      ${fast ? `(drop (call $nscale (local.get $sp) (i32.mul (local.get $rows) (local.get $Pg)) (f32.const 0x1p${FAST_EXP[dt]})))` : ''}
      ${dt === 3 ? '(call $nscalecols (local.get $sp) (local.get $rows) (local.get $Pg) (local.get $vsc))' : ''}
      (local.set $i (i32.const 0))
      (block $vd${x} (loop $vl${x}
        (br_if $vd${x} (i32.ge_u (local.get $i) (local.get $rows)))
        (local.set $R (i32.sub (local.get $rows) (local.get $i)))
        (if (i32.gt_u (local.get $R) (i32.const 4)) (then (local.set $R (i32.const 4))))
        ${byRows((R) => `(call $nv${dt}${v}_${R} (i32.add (local.get $sp) (i32.shl (i32.mul (local.get $i) (local.get $Pg)) (i32.const 2))) (local.get $Pg) (local.get $Pg) (local.get $keys)
          (i32.add (local.get $o) (i32.shl (i32.mul (i32.add (local.get $rs) (local.get $i)) (local.get $hdPad)) (i32.const 2))) (local.get $hdPad) (local.get $hd)
          (local.get $vbase) (local.get $region) (local.get $rowB) (local.get $scr))`)}
        (local.set $i (i32.add (local.get $i) (local.get $R)))
        (br $vl${x})))
      (local.set $gi (i32.add (local.get $gi) (i32.const 1)))
      (br $each${x})))`;
}

/**
 * $nscale(p, n, f): the n floats at p (n a multiple of 4) times f in place; 1 when every result
 * is finite (or NaN), 0 when one overflowed to ±Inf.
 */
function scaleFunc(): string {
  return `
  (func $nscale (param $p i32) (param $n i32) (param $f f32) (result i32)
    (local $end i32) (local $x v128) (local $fv v128) (local $inf v128)
    (local.set $fv (f32x4.splat (local.get $f)))
    (local.set $end (i32.add (local.get $p) (i32.shl (local.get $n) (i32.const 2))))
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $p) (local.get $end)))
      (local.set $x (f32x4.mul (v128.load (local.get $p)) (local.get $fv)))
      (v128.store (local.get $p) (local.get $x))
      (local.set $inf (v128.or (local.get $inf) (f32x4.eq (f32x4.abs (local.get $x)) (v128.const f32x4 inf inf inf inf))))
      (local.set $p (i32.add (local.get $p) (i32.const 16)))
      (br $each)))
    (i32.eqz (v128.any_true (local.get $inf)))
  )`;
}

/** The magnitude-bits max ($chk, shifted past the sign) at or above which an element is Inf/NaN. */
const SPECIAL_AT: Partial<Record<NarrowDt, string>> = { 1: '(i16x8.ge_u (v128.load (local.get $scr)) (v128.const i16x8 0xf800 0xf800 0xf800 0xf800 0xf800 0xf800 0xf800 0xf800))', 5: `(i8x16.ge_u (v128.load (local.get $scr)) (v128.const i8x16 ${'0xf8 '.repeat(16)}))`, 4: `(i8x16.ge_u (v128.load (local.get $scr)) (v128.const i8x16 ${'0xfe '.repeat(16)}))` };

/**
 * $nhead<dt>(stage, q, S, o, L, M, hd, hdPad, kvDim, heads, keys, P, scale, g, scr, qs): one KV
 * head g's attention over the staged narrow KV (groupsLoop). scr: scratch for int8's f32 scales
 * (2·keys + 8 floats), else the fast variants' max; qs: M·hd floats for the scaled queries. For
 * f16 and fp8 the fast variants run first, and the exact ones after them only when q was too
 * large to scale or an element was Inf/NaN.
 */
function headFunc(dt: NarrowDt): string {
  const es = elemShift(dt);
  const scales =
    dt === 3
      ? `;; the head's K and V scales as f32, [keys] each (after both slabs: [16][heads] f16 for K, then for V),
    ;; eight keys a step (eight is within one block): lane by lane, then widened as f16Vec does
    (local.set $hs (i32.shl (local.get $heads) (i32.const 1)))
    (local.set $vo (i32.shl (local.get $heads) (i32.const ${BLOCK_SHIFT + 1})))
    (block $sdone (loop $sloop
      (br_if $sdone (i32.ge_u (local.get $j) (local.get $keys)))
      (local.set $sp (i32.add (local.get $stage) (i32.add (i32.add (i32.mul (i32.shr_u (local.get $j) (i32.const ${BLOCK_SHIFT})) (local.get $region)) (i32.shl (local.get $slab) (i32.const 1)))
        (i32.shl (i32.add (i32.mul (i32.and (local.get $j) (i32.const ${BLOCK_TOKENS - 1})) (local.get $heads)) (local.get $g)) (i32.const 1)))))
      ${Array.from({ length: 8 }, (_, i) => `${i ? '(local.set $sp (i32.add (local.get $sp) (local.get $hs)))' : ''}
      (local.set $kh (v128.load16_lane ${i} (local.get $sp) (local.get $kh)))
      (local.set $vh (v128.load16_lane ${i} (i32.add (local.get $sp) (local.get $vo)) (local.get $vh)))`).join('')}
      ${[
        ['$scr', '$kh'],
        ['$vsc', '$vh'],
      ]
        .map(([to, from]) =>
          ['low', 'high']
            .map(
              (half, k) => `(v128.store offset=${16 * k} (i32.add (local.get ${to}) (i32.shl (local.get $j) (i32.const 2)))
        (block (result v128) ${f16Vec(`(i32x4.extend_${half}_i16x8_u (local.get ${from}))`, '$sm', '$sx')}))`,
            )
            .join('\n      '),
        )
        .join('\n      ')}
      (local.set $j (i32.add (local.get $j) (i32.const 8)))
      (br $sloop)))
    (local.set $j (local.get $keys))
    ;; p times the V scale for every column of S up to P: zero past the staged keys
    (block $zdone (loop $zloop
      (br_if $zdone (i32.ge_u (local.get $j) (local.get $P)))
      (f32.store (i32.add (local.get $vsc) (i32.shl (local.get $j) (i32.const 2))) (f32.const 0))
      (local.set $j (i32.add (local.get $j) (i32.const 1)))
      (br $zloop)))
    (local.set $hd8 (i32.and (i32.add (local.get $hd) (i32.const 7)) (i32.const -8)))
    (local.set $sqp (i32.add (local.get $qs) (i32.and (i32.add (i32.shl (i32.mul (local.get $M) (local.get $hd8)) (i32.const 1)) (i32.const 15)) (i32.const -16))))
    (call $nquant (local.get $q) (local.get $M) (local.get $hd) (local.get $qs) (local.get $sqp))`
      : '';
  const fastExp = FAST_EXP[dt];
  const run = fastExp
    ? `(if (call $nscale (local.get $qs) (i32.mul (local.get $M) (local.get $hd)) (f32.const 0x1p${fastExp}))
      (then
        (v128.store (local.get $scr) (v128.const i32x4 0 0 0 0))
        ${groupsLoop(dt, true)}
        (if (i32.eqz (v128.any_true ${SPECIAL_AT[dt]})) (then (return)))))
    ${groupsLoop(dt, false)}`
    : groupsLoop(dt, false);
  return `
  (func $nhead${dt} (param $stage i32) (param $q i32) (param $S i32) (param $o i32) (param $L i32) (param $M i32) (param $hd i32)
      (param $hdPad i32) (param $kvDim i32) (param $heads i32) (param $keys i32) (param $P i32) (param $scale f32) (param $g i32) (param $scr i32) (param $qs i32)
    (local $slab i32) (local $region i32) (local $rowB i32) (local $kbase i32) (local $vbase i32) (local $vsc i32) (local $j i32) (local $sp i32)
    (local $gi i32) (local $G i32) (local $rs i32) (local $rows i32) (local $len i32) (local $i i32) (local $Pg i32) (local $t i32) (local $R i32)
    (local $hd8 i32) (local $sqp i32) (local $hs i32) (local $vo i32) (local $kh v128) (local $vh v128) (local $sm v128) (local $sx v128)
    (local.set $slab (i32.shl (i32.mul (local.get $kvDim) (i32.const ${BLOCK_TOKENS})) (i32.const ${es})))
    (local.set $region (i32.shl (local.get $slab) (i32.const 1)))
    ${dt === 3 ? `(local.set $region (i32.add (local.get $region) (i32.mul (local.get $heads) (i32.const ${BLOCK_TOKENS * 4}))))` : ''}
    (local.set $rowB (i32.shl (local.get $kvDim) (i32.const ${es})))
    (local.set $kbase (i32.add (local.get $stage) (i32.shl (i32.mul (local.get $g) (local.get $hd)) (i32.const ${es}))))
    (local.set $vbase (i32.add (local.get $kbase) (local.get $slab)))
    (local.set $vsc (i32.add (local.get $scr) (i32.shl (i32.add (local.get $P) (i32.const 8)) (i32.const 2))))
    ${scales}
    (local.set $G (i32.shr_u (i32.add (local.get $M) (i32.const ${ATT_GROUP - 1})) (i32.const ${Math.log2(ATT_GROUP)})))
    ${fastExp ? `(memory.copy (local.get $qs) (local.get $q) (i32.shl (i32.mul (local.get $M) (local.get $hd)) (i32.const 2)))` : ''}
    ${run}
  )`;
}

/**
 * attendnarrow(stage, Q, S, O, L, M, hd, hdPad, kvDim, heads, g0, g1, keys, P, scale, dt, scr, qs):
 * attendheads' arguments without the f32 operands KT and V (scr: scratch of 2·P + 8 floats; qs:
 * M·hd + 4 floats), for a narrow dtype dt (1..5) and hd a multiple of 4: the attention of KV heads
 * [g0, g1) (of `heads`) read from the staged narrow KV, Q_g = Q + (g − g0)·M·hd floats,
 * O_g = O + (g − g0)·M·hdPad floats. f16, bf16, fp8: the same bits as attendheads; int8: the
 * kernels' int8 semantics (attention_int8_js.ts).
 */
export function narrowAttentionFuncs(fma: boolean): string {
  const parts: string[] = [scaleFunc(), quantFunc(), scaleColsFunc()];
  for (const dt of NARROW) {
    for (const fast of FAST_EXP[dt] ? [false, true] : [false]) {
      for (let R = 1; R <= 4; R++) parts.push(dt === 3 ? scoresInt8Func(R) : scoresFunc(dt, R, fma, fast), valuesFunc(dt, R, fma, fast));
    }
    parts.push(headFunc(dt));
  }
  const dispatch = NARROW.reduceRight<string>(
    (rest, dt) => `(if (i32.eq (local.get $dt) (i32.const ${dt})) (then (call $nhead${dt} (local.get $stage) (local.get $q) (local.get $S) (local.get $o) (local.get $L)
          (local.get $M) (local.get $hd) (local.get $hdPad) (local.get $kvDim) (local.get $heads) (local.get $keys) (local.get $P) (local.get $scale) (local.get $g) (local.get $scr) (local.get $qs)))
        (else ${rest}))`,
    'unreachable',
  );
  parts.push(`
  (func (export "attendnarrow") (param $stage i32) (param $Q i32) (param $S i32) (param $O i32) (param $L i32) (param $M i32) (param $hd i32)
      (param $hdPad i32) (param $kvDim i32) (param $heads i32) (param $g0 i32) (param $g1 i32) (param $keys i32) (param $P i32) (param $scale f32) (param $dt i32)
      (param $scr i32) (param $qs i32)
    (local $g i32) (local $q i32) (local $o i32)
    (local.set $q (local.get $Q))
    (local.set $o (local.get $O))
    (local.set $g (local.get $g0))
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $g) (local.get $g1)))
      ${dispatch}
      (local.set $q (i32.add (local.get $q) (i32.shl (i32.mul (local.get $M) (local.get $hd)) (i32.const 2))))
      (local.set $o (i32.add (local.get $o) (i32.shl (i32.mul (local.get $M) (local.get $hdPad)) (i32.const 2))))
      (local.set $g (i32.add (local.get $g) (i32.const 1)))
      (br $each)))
  )`);
  return parts.join('\n');
}

// WAT of gatherkv: one KV head's keys and values out of the staged paged-cache blocks into
// attention's operands (attention_js.ts gatherStagedJs is the JavaScript twin).
import { BLOCK_SHIFT, BLOCK_TOKENS } from '../../kv_cache.js';

/**
 * KV dtype codes (common/dtype.ts DType) the gather widens: 0 f32, 1 f16, 2 bf16, 3 int8 (with
 * per-token-per-head f32 scales), 4 fp8_e4m3, 5 fp8_e5m2.
 */
type Dt = 0 | 1 | 2 | 3 | 4 | 5;

/** One KV element at address `p` as f32 ($sc: the row's int8 scale): the widening happens here, in the gather. */
function loadAs(dt: Dt, p: string, sc: string): string {
  if (dt === 0) return `(f32.load ${p})`;
  if (dt === 2) return `(f32.reinterpret_i32 (i32.shl (i32.load16_u ${p}) (i32.const 16)))`;
  if (dt === 3) return `(f32.mul (f32.convert_i32_s (i32.load8_s ${p})) (local.get ${sc}))`;
  if (dt === 4) return `(call $e4m3tof32 (i32.load8_u ${p}))`;
  // f16: magnitude bits << 13 read as f32, times 2^112, is exact for normals and subnormals;
  // exponent 31 (Inf/NaN) maps to f32's 255; the sign is put back last. E5M2 is an f16's high byte.
  if (dt === 5) return `(call $f16tof32 (i32.shl (i32.load8_u ${p}) (i32.const 8)))`;
  return `(call $f16tof32 (i32.load16_u ${p}))`;
}

/**
 * A scalar minifloat → f32 widening: the magnitude bits (`mag`) shifted into f32's exponent and
 * mantissa fields, read as f32 and times 2^(127 − bias) (exact for normals and subnormals); an
 * all-ones exponent (`special` bits equal to `special`) maps to f32's Inf/NaN; the sign bit put back last.
 */
function widenFunc(name: string, mag: number, sign: number, shift: number, pow: number, special: number): string {
  return `
  (func $${name} (param $h i32) (result f32)
    (local $m i32)
    (local.set $m (i32.shl (i32.and (local.get $h) (i32.const ${mag})) (i32.const ${shift})))
    (f32.reinterpret_i32 (i32.or
      (i32.shl (i32.and (local.get $h) (i32.const ${sign})) (i32.const ${31 - Math.log2(sign)}))
      (select
        (i32.or (local.get $m) (i32.const 0x7f800000))
        (i32.reinterpret_f32 (f32.mul (f32.reinterpret_i32 (local.get $m)) (f32.const 0x1p${pow})))
        (i32.eq (i32.and (local.get $h) (i32.const ${special})) (i32.const ${special})))))
  )`;
}

/** f16 bits → f32 and E4M3 bits → f32 (exact; E4M3's only special value is 0x7f, NaN), for gatherkv's 16- and 8-bit KV. */
export function f16Func(): string {
  return widenFunc('f16tof32', 0x7fff, 0x8000, 13, 112, 0x7c00) + widenFunc('e4m3tof32', 0x7f, 0x80, 20, 120, 0x7f);
}

const splat = (v: string) => `(v128.const i32x4 ${v} ${v} ${v} ${v})`;

/** $h (i32x4 of f16 bits) widened to f32x4 into $w; $m is scratch. */
const f16Lanes = `(local.set $m (i32x4.shl (v128.and (local.get $h) ${splat('0x7fff')}) (i32.const 13)))
            (local.set $w (v128.or
              (i32x4.shl (v128.and (local.get $h) ${splat('0x8000')}) (i32.const 16))
              (v128.bitselect
                (v128.or (local.get $m) ${splat('0x7f800000')})
                (f32x4.mul (local.get $m) (v128.const f32x4 0x1p112 0x1p112 0x1p112 0x1p112))
                (i32x4.eq (v128.and (local.get $h) ${splat('0x7c00')}) ${splat('0x7c00')}))))`;

/** Four bytes at `p` as i32x4 lanes, sign- or zero-extended. */
const bytes4 = (p: string, signed: boolean) => {
  const x = signed ? 's' : 'u';
  return `(i32x4.extend_low_i16x8_${x} (i16x8.extend_low_i8x16_${x} (v128.load32_zero ${p})))`;
};

/** Four elements at `p` widened to an f32x4 (into $w; $h and $m are scratch; $sc the int8 row's scale). */
function widen4(dt: Exclude<Dt, 0>, p: string, sc: string): string {
  if (dt === 2) return `(local.set $w (i32x4.shl (v128.load16x4_u ${p}) (i32.const 16)))`;
  if (dt === 3) return `(local.set $w (f32x4.mul (f32x4.convert_i32x4_s ${bytes4(p, true)}) (f32x4.splat (local.get ${sc}))))`;
  if (dt === 4) {
    return `(local.set $h ${bytes4(p, false)})
            (local.set $m (i32x4.shl (v128.and (local.get $h) ${splat('0x7f')}) (i32.const 20)))
            (local.set $w (v128.or
              (i32x4.shl (v128.and (local.get $h) ${splat('0x80')}) (i32.const 24))
              (v128.bitselect
                (v128.or (local.get $m) ${splat('0x7f800000')})
                (f32x4.mul (local.get $m) (v128.const f32x4 0x1p120 0x1p120 0x1p120 0x1p120))
                (i32x4.eq (v128.and (local.get $h) ${splat('0x7f')}) ${splat('0x7f')}))))`;
  }
  if (dt === 5) return `(local.set $h (i32x4.shl ${bytes4(p, false)} (i32.const 8)))
            ${f16Lanes}`;
  return `(local.set $h (v128.load16x4_u ${p}))
            ${f16Lanes}`;
}

/** Bytes of one element of dtype dt. */
const elemBytes = (dt: Dt) => (dt === 0 ? 4 : dt <= 2 ? 2 : 1);

/**
 * The copy of one row of hd elements (K transposed into kt, V into v), widening dtype dt. Narrow
 * rows go four elements at a time in SIMD (the same exact conversion as the scalar one), then the tail.
 */
function rowLoop(dt: Dt): string {
  const step = elemBytes(dt);
  const simd =
    dt === 0
      ? ''
      : `
          (block $vdone${dt} (loop $vloop${dt}
            (br_if $vdone${dt} (i32.gt_u (i32.add (local.get $e) (i32.const 4)) (local.get $hd)))
            ${widen4(dt, '(local.get $kp)', '$ks')}
            (local.set $ka (i32.add (local.get $ktcol) (i32.shl (local.get $e) (i32.const 7))))
            (f32.store offset=0 (local.get $ka) (f32x4.extract_lane 0 (local.get $w)))
            (f32.store offset=128 (local.get $ka) (f32x4.extract_lane 1 (local.get $w)))
            (f32.store offset=256 (local.get $ka) (f32x4.extract_lane 2 (local.get $w)))
            (f32.store offset=384 (local.get $ka) (f32x4.extract_lane 3 (local.get $w)))
            ${widen4(dt, '(local.get $vp)', '$vs')}
            (v128.store (i32.add (local.get $vrow) (i32.shl (local.get $e) (i32.const 2))) (local.get $w))
            (local.set $kp (i32.add (local.get $kp) (i32.const ${4 * step})))
            (local.set $vp (i32.add (local.get $vp) (i32.const ${4 * step})))
            (local.set $e (i32.add (local.get $e) (i32.const 4)))
            (br $vloop${dt})))`;
  return `${simd}
          (block $edone${dt} (loop $eloop${dt}
            (br_if $edone${dt} (i32.ge_u (local.get $e) (local.get $hd)))
            (f32.store (i32.add (local.get $ktcol) (i32.shl (local.get $e) (i32.const 7))) ${loadAs(dt, '(local.get $kp)', '$ks')})
            (f32.store (i32.add (local.get $vrow) (i32.shl (local.get $e) (i32.const 2))) ${loadAs(dt, '(local.get $vp)', '$vs')})
            (local.set $kp (i32.add (local.get $kp) (i32.const ${step})))
            (local.set $vp (i32.add (local.get $vp) (i32.const ${step})))
            (local.set $e (i32.add (local.get $e) (i32.const 1)))
            (br $eloop${dt})))`;
}

/** The row loops of dtypes `dts` as nested ifs on $dt (the first one when none other matches). */
function dispatch(dts: Dt[]): string {
  const [first, ...rest] = dts;
  if (rest.length === 0) return rowLoop(first!);
  return `(if (i32.eq (local.get $dt) (i32.const ${rest[0]}))
              (then ${rowLoop(rest[0]!)})
              (else ${dispatch([first!, ...rest.slice(1)])}))`;
}

/**
 * gatherkv(src, P, Pb, kvDim, off, hd, kt, v, hdPad, dt): one KV head's keys and values out of staged
 * paged-cache slabs into attention's operands. src holds, per cache block, the layer's region
 * (kv_cache.ts): its K slab then its V slab, each [16 positions][kvDim] elements of the KV dtype dt
 * (0 f32, 1 f16, 2 bf16, 3 int8, 4 fp8_e4m3, 5 fp8_e5m2; the cache's own block layout, copied in
 * bulk), and for int8 the K then V scales, [16 positions][kvDim / hd heads] f16 each; widened to
 * f32 here as they are gathered (int8: q · scale).
 * For j < P: kt[e][j] = K[j][off + e] (transposed and strip-packed like the model's weights,
 * [Pb/32][hd][32]: a strip of 32 keys is one contiguous hd·128-byte block, where the dense
 * [hd][Pb] layout put its rows Pb·4 bytes apart — 2 KB at 512 keys, a power of two that mapped
 * every row of a strip onto the same few L1 sets) and v[j][e] = V[j][off + e] ([Pb][hdPad]);
 * positions P..Pb-1 and columns hd..hdPad-1 are zero. Copies and widening only.
 */
export function gatherFunc(): string {
  return `
  (func $gatherkv (export "gatherkv") (param $src i32) (param $P i32) (param $Pb i32) (param $kvDim i32) (param $off i32)
      (param $hd i32) (param $kt i32) (param $v i32) (param $hdPad i32) (param $dt i32)
    (local $j i32) (local $e i32) (local $kp i32) (local $vp i32) (local $vrow i32) (local $ktcol i32)
    (local $slab i32) (local $es i32) (local $ka i32) (local $h v128) (local $m v128) (local $w v128)
    (local $region i32) (local $heads i32) (local $ks f32) (local $vs f32) (local $sp i32)
    ;; element size as a shift: f32 2, 16-bit 1, 8-bit 0
    (local.set $es (select (i32.const 2) (select (i32.const 1) (i32.const 0) (i32.le_u (local.get $dt) (i32.const 2))) (i32.eqz (local.get $dt))))
    (local.set $slab (i32.shl (i32.mul (local.get $kvDim) (i32.const ${BLOCK_TOKENS})) (local.get $es)))
    ;; a block's region: K and V slabs, and for int8 the K and V scales (16 positions x heads f16 each)
    (local.set $heads (i32.div_u (local.get $kvDim) (local.get $hd)))
    (local.set $region (i32.add (i32.shl (local.get $slab) (i32.const 1))
      (select (i32.mul (local.get $heads) (i32.const ${BLOCK_TOKENS * 4})) (i32.const 0) (i32.eq (local.get $dt) (i32.const 3)))))
    (local.set $j (i32.const 0))
    (block $jdone (loop $jloop
      (br_if $jdone (i32.ge_u (local.get $j) (local.get $Pb)))
      (local.set $vrow (i32.add (local.get $v) (i32.shl (i32.mul (local.get $j) (local.get $hdPad)) (i32.const 2))))
      (local.set $ktcol (i32.add (local.get $kt) (i32.add (i32.mul (i32.shr_u (local.get $j) (i32.const 5)) (i32.shl (local.get $hd) (i32.const 7)))
        (i32.shl (i32.and (local.get $j) (i32.const 31)) (i32.const 2)))))
      (local.set $e (i32.const 0))
      (if (i32.lt_u (local.get $j) (local.get $P))
        (then
          ;; block j / BLOCK_TOKENS holds one region; slot j % BLOCK_TOKENS is a row of kvDim elements
          (local.set $kp (i32.add (local.get $src)
            (i32.add (i32.mul (i32.shr_u (local.get $j) (i32.const ${BLOCK_SHIFT})) (local.get $region))
              (i32.shl (i32.add (i32.mul (i32.and (local.get $j) (i32.const ${BLOCK_TOKENS - 1})) (local.get $kvDim)) (local.get $off)) (local.get $es)))))
          (local.set $vp (i32.add (local.get $kp) (local.get $slab)))
          (if (i32.eq (local.get $dt) (i32.const 3))
            (then
              ;; the row's scales: after both slabs, [16][heads] f16 for K then for V
              (local.set $sp (i32.add (local.get $src)
                (i32.add (i32.add (i32.mul (i32.shr_u (local.get $j) (i32.const ${BLOCK_SHIFT})) (local.get $region)) (i32.shl (local.get $slab) (i32.const 1)))
                  (i32.shl (i32.add (i32.mul (i32.and (local.get $j) (i32.const ${BLOCK_TOKENS - 1})) (local.get $heads)) (i32.div_u (local.get $off) (local.get $hd))) (i32.const 1)))))
              (local.set $ks (call $f16tof32 (i32.load16_u (local.get $sp))))
              (local.set $vs (call $f16tof32 (i32.load16_u (i32.add (local.get $sp) (i32.shl (local.get $heads) (i32.const ${BLOCK_SHIFT + 1}))))))))
          (if (i32.eqz (local.get $dt))
            (then ${rowLoop(0)})
            (else ${dispatch([1, 2, 3, 4, 5])})))
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

// WAT of the attention softmax (the export `softmax`); attention_js.ts softmaxRowsJs is its
// bit-exact JavaScript twin.
import { EXP_INIT, EXP_LOCALS, expS, expV } from './exp.js';

/**
 * softmax(S, rows, stride, L, scale): for each row r, with len = L[r] (i32), in place:
 *   x_j = f32(S[r][j] * scale); m = max_j x_j; e_j = exp(x_j - m) for j < len;
 *   sum = ((l0 + l1) + (l2 + l3)) + e_{len4} + ... (lane l sums j = l mod 4 below len4 = len & ~3);
 *   S[r][j] = e_j * f32(1 / sum) for j < len, 0 for len <= j < stride.
 */
export function softmaxFunc(): string {
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

// WAT of SwiGLU: the exports `swiglu` and `swiglurows`, and the epilogue the fused gate|up GEMM
// (gemm.ts) applies to its tiles; attention_js.ts swigluJs is the bit-exact JavaScript twin.
import { expS, expV } from './exp.js';
/**
 * SwiGLU of the gate vector in local `g` and the up vector `u` (a v128 expression): exactly the
 * operations of the swiglu export (swigluFunc), so a fused epilogue gives its bits. Uses the
 * locals $e $d $sg and expV's. (Its constants stay inline: with them hoisted into locals the
 * fused product measured no faster, 0.96–0.99 × in paired runs; the epilogue runs once per tile,
 * after K steps.)
 */
export function gluV(g: string, u: string): string {
  return `(block (result v128)
          (local.set $e ${expV(`(f32x4.neg (f32x4.abs (local.get ${g})))`)})
          (local.set $d (f32x4.add (local.get $e) (v128.const f32x4 1 1 1 1)))
          (local.set $sg (v128.bitselect (f32x4.div (v128.const f32x4 1 1 1 1) (local.get $d)) (f32x4.div (local.get $e) (local.get $d))
            (f32x4.ge (local.get ${g}) (v128.const f32x4 0 0 0 0))))
          (f32x4.mul (f32x4.mul (local.get ${g}) (local.get $sg)) ${u}))`;
}

/**
 * swiglu(GU, O, rows, hidden): per row r, with g = GU[r][i] and u = GU[r][hidden + i]:
 *   e = exp(-|g|) (the f32 polynomial above), d = 1 + e, s = g >= 0 ? 1/d : e/d (the logistic
 *   function without overflow), O[r][i] = (g * s) * u, every operation in f32 (attention_js.ts
 *   swigluJs is its bit-exact twin). Per element, so batch invariant.
 */
export function swigluFunc(): string {
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
 * points' argument shape so the worker thread can share the rows (worker_main.ts).
 */
export function swigluRowsFunc(): string {
  return `
  (func (export "swiglurows") (param $GU i32) (param $O i32) (param $hidden i32) (param $u3 i32) (param $u4 i32) (param $u5 i32)
      (param $u6 i32) (param $u7 i32) (param $r0 i32) (param $r1 i32)
    (if (i32.ge_u (local.get $r0) (local.get $r1)) (then (return)))
    (call $swiglu (i32.add (local.get $GU) (i32.shl (i32.mul (local.get $r0) (local.get $hidden)) (i32.const 3)))
      (i32.add (local.get $O) (i32.shl (i32.mul (local.get $r0) (local.get $hidden)) (i32.const 2)))
      (i32.sub (local.get $r1) (local.get $r0)) (local.get $hidden))
  )`;
}

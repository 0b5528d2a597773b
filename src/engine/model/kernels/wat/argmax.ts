// WAT of greedy sampling's argmax: over one vector, per row, and per column chunk of a product
// (taken while the LM head's columns are still in cache).
import { STRIP } from '../layout.js';

/**
 * argmax(p, n) -> i32: the scalar loop's answer (sampler.ts / kernel.ts argmaxJs), NaN included: start
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
export function argmaxFunc(name = 'argmax', nanFirst = true): string {
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
 * the rows (worker_main.ts): greedy sampling of a batch right after its LM head, while the
 * worker is still awake.
 */
export function argmaxRowsFunc(): string {
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
 * that computed them (wasm_kernel.ts, matmul with argmaxOut). For each row r of C ([M][nPad] floats), the
 * first strict maximum of its columns [n0, min(n1, N)) with NaN never taken ($argmaxany: -1 when
 * there is none), as an index into the row and its value. Stored at SLOT + s·(8 + 8M) bytes, s =
 * n0 / STRIP: the chunk's end n1, 4 bytes unused, then M pairs (index i32, value f32). The chunks
 * are then merged in column order by argmaxRows's rules (the caller, after the product).
 */
export function argmaxColsFunc(): string {
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

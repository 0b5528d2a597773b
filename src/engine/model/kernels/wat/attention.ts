// WAT of attention: groups of query rows against one KV head (scores, softmax, weighted values
// through the dense GEMM), per head of the staged KV, and the row-range entry the worker shares.
import { ATT_GROUP, STRIP } from '../layout.js';

/**
 * attendheads(stage, Q, KT, S, V, O, L, M, hd, hdPad, kvDim, heads, keys, P, scale, dt): for each KV head
 * g of the staged KV, gatherkv into KT/V, then attgroups over all M rows, with Q_g = Q + g*M*hd
 * floats and O_g = O + g*M*hdPad floats. Exactly the calls the per-head path makes (same
 * functions, same arguments), in one call from JS: decode attention is small enough that the
 * JS→WASM crossings and per-call set-up were most of its cost.
 */
export function attendHeadsFunc(): string {
  return `
  (func (export "attendheads") (param $stage i32) (param $Q i32) (param $KT i32) (param $S i32) (param $V i32) (param $O i32)
      (param $L i32) (param $M i32) (param $hd i32) (param $hdPad i32) (param $kvDim i32) (param $heads i32) (param $keys i32)
      (param $P i32) (param $scale f32) (param $dt i32)
    (local $g i32) (local $q i32) (local $o i32)
    (local.set $q (local.get $Q))
    (local.set $o (local.get $O))
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $g) (local.get $heads)))
      (call $gatherkv (local.get $stage) (local.get $keys) (local.get $P) (local.get $kvDim)
        (i32.mul (local.get $g) (local.get $hd)) (local.get $hd) (local.get $KT) (local.get $V) (local.get $hdPad) (local.get $dt))
      (call $attgroups (local.get $q) (local.get $KT) (local.get $S) (local.get $V) (local.get $o) (local.get $L)
        (local.get $M) (local.get $hd) (local.get $P) (local.get $hdPad) (local.get $scale) (i32.const 0) (local.get $M))
      (local.set $q (i32.add (local.get $q) (i32.shl (i32.mul (local.get $M) (local.get $hd)) (i32.const 2))))
      (local.set $o (i32.add (local.get $o) (i32.shl (i32.mul (local.get $M) (local.get $hdPad)) (i32.const 2))))
      (local.set $g (i32.add (local.get $g) (i32.const 1)))
      (br $each)))
  )`;
}


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
export function attGroupsFunc(): string {
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
 * (worker_main.ts; chunks are whole groups of ATT_GROUP rows). prm points at 11 i32 words: Q, KT, S, V, O,
 * L, M, hd, P, hdPad, scale (f32 bits). Rows, not columns, are split: the softmax and O = S·V
 * (one 32-column strip) of a block could not be shared by columns, and one hand-off per head
 * replaces three.
 */
export function attendRowsFunc(): string {
  const ld = (i: number) => `(i32.load offset=${i * 4} (local.get $prm))`;
  return `
  (func (export "attendrows") (param $prm i32) (param $u1 i32) (param $u2 i32) (param $u3 i32) (param $u4 i32) (param $u5 i32)
      (param $u6 i32) (param $u7 i32) (param $r0 i32) (param $r1 i32)
    (if (i32.ge_u (local.get $r0) (local.get $r1)) (then (return)))
    (call $attgroups ${ld(0)} ${ld(1)} ${ld(2)} ${ld(3)} ${ld(4)} ${ld(5)} ${ld(6)} ${ld(7)} ${ld(8)} ${ld(9)}
      (f32.reinterpret_i32 ${ld(10)}) (local.get $r0) (local.get $r1))
  )`;
}

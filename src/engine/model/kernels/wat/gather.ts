// WAT of gatherkv: one KV head's keys and values out of the staged paged-cache blocks into
// attention's operands (attention_js.ts gatherStagedJs is the JavaScript twin).
import { BLOCK_SHIFT, BLOCK_TOKENS } from '../../kv_cache.js';

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
export function gatherFunc(): string {
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

// WAT source of the WASM SIMD GEMM kernel, generated from TypeScript so the unrolled register
// blocks stay readable. C[m][n] = sum_k A[m][k] * Wt[k][n], with
//   A  row-major [M][K] f32,  Wt row-major [K][N] f32 (the weight pre-transposed, N padded to a
//   multiple of STRIP), C row-major [M][N] f32.
// Vectorised over n: every output element is ONE f32 accumulator updated as acc = acc + a*w for
// k = 0, 1, ..., K-1 (separate mul and add, no FMA). That order does not depend on M, on which
// rows share a register block, or on the column strip, so results are batch invariant and equal
// bit for bit to the plain-JS reference in gemm.ts.
//
// Blocking: rows in blocks of MB (A block stays in L1/L2), columns in strips of STRIP=32 (a strip
// of Wt is K*128 bytes, cache resident across the row block); inside, 4 rows x 8 columns (8 vector
// accumulators) per micro-kernel, and 1 row x 32 columns for the leftover rows (8 independent
// accumulators keep the add pipeline busy during single-sequence decode).

export const STRIP = 32;
export const MB = 64;

function kernel4x8(col: number): string {
  // accumulators $a{r}{j}, r in 0..3, j in 0..1
  const lines: string[] = [];
  for (let r = 0; r < 4; r++) for (let j = 0; j < 2; j++) lines.push(`(local.set $a${r}${j} (v128.const i32x4 0 0 0 0))`);
  lines.push(`(local.set $p0 (local.get $arow))`);
  lines.push(`(local.set $p1 (i32.add (local.get $p0) (local.get $kb)))`);
  lines.push(`(local.set $p2 (i32.add (local.get $p1) (local.get $kb)))`);
  lines.push(`(local.set $p3 (i32.add (local.get $p2) (local.get $kb)))`);
  lines.push(`(local.set $wp (i32.add (local.get $wstrip) (i32.const ${col * 4})))`);
  lines.push(`(local.set $k (local.get $K))`);
  const body: string[] = [];
  body.push(`(local.set $w0 (v128.load (local.get $wp)))`);
  body.push(`(local.set $w1 (v128.load offset=16 (local.get $wp)))`);
  for (let r = 0; r < 4; r++) {
    body.push(`(local.set $x (f32x4.splat (f32.load (local.get $p${r}))))`);
    for (let j = 0; j < 2; j++) body.push(`(local.set $a${r}${j} (f32x4.add (local.get $a${r}${j}) (f32x4.mul (local.get $x) (local.get $w${j}))))`);
    body.push(`(local.set $p${r} (i32.add (local.get $p${r}) (i32.const 4)))`);
  }
  body.push(`(local.set $wp (i32.add (local.get $wp) (local.get $nb)))`);
  body.push(`(local.set $k (i32.sub (local.get $k) (i32.const 1)))`);
  body.push(`(br_if $kl (local.get $k))`);
  lines.push(`(loop $kl ${body.join('\n')})`);
  // store: C + ((m+r)*N + n0 + col)*4
  for (let r = 0; r < 4; r++) {
    lines.push(`(local.set $cp (i32.add (local.get $crow) (i32.add (i32.mul (i32.const ${r}) (local.get $nb)) (i32.const ${col * 4}))))`);
    for (let j = 0; j < 2; j++) lines.push(`(v128.store offset=${j * 16} (local.get $cp) (local.get $a${r}${j}))`);
  }
  return lines.join('\n');
}

function kernel1x32(): string {
  const lines: string[] = [];
  for (let j = 0; j < 8; j++) lines.push(`(local.set $b${j} (v128.const i32x4 0 0 0 0))`);
  lines.push(`(local.set $p0 (local.get $arow))`);
  lines.push(`(local.set $wp (local.get $wstrip))`);
  lines.push(`(local.set $k (local.get $K))`);
  const body: string[] = [];
  body.push(`(local.set $x (f32x4.splat (f32.load (local.get $p0))))`);
  for (let j = 0; j < 8; j++) {
    body.push(`(local.set $b${j} (f32x4.add (local.get $b${j}) (f32x4.mul (local.get $x) (v128.load offset=${j * 16} (local.get $wp)))))`);
  }
  body.push(`(local.set $p0 (i32.add (local.get $p0) (i32.const 4)))`);
  body.push(`(local.set $wp (i32.add (local.get $wp) (local.get $nb)))`);
  body.push(`(local.set $k (i32.sub (local.get $k) (i32.const 1)))`);
  body.push(`(br_if $kl1 (local.get $k))`);
  lines.push(`(loop $kl1 ${body.join('\n')})`);
  for (let j = 0; j < 8; j++) lines.push(`(v128.store offset=${j * 16} (local.get $crow) (local.get $b${j}))`);
  return lines.join('\n');
}

/** The module: shared memory is imported so a worker thread can run the same kernel on it. */
export function gemmWat(): string {
  const v128Locals: string[] = [];
  for (let r = 0; r < 4; r++) for (let j = 0; j < 2; j++) v128Locals.push(`$a${r}${j}`);
  for (let j = 0; j < 8; j++) v128Locals.push(`$b${j}`);
  v128Locals.push('$w0', '$w1', '$x');
  return `(module
  (import "env" "mem" (memory 1 65536 shared))
  ;; gemm(A, Wt, C, M, K, N, m0, m1, n0, n1): rows [m0,m1) x columns [n0,n1) of C (n0, n1 multiples of ${STRIP})
  (func (export "gemm") (param $A i32) (param $W i32) (param $C i32) (param $M i32) (param $K i32) (param $N i32)
      (param $m0 i32) (param $m1 i32) (param $n0 i32) (param $n1 i32)
    (local $kb i32) (local $nb i32) (local $mb i32) (local $mEnd i32) (local $n i32) (local $m i32) (local $k i32)
    (local $arow i32) (local $crow i32) (local $wstrip i32) (local $wp i32) (local $cp i32)
    (local $p0 i32) (local $p1 i32) (local $p2 i32) (local $p3 i32)
    ${v128Locals.map((l) => `(local ${l} v128)`).join(' ')}
    (local.set $kb (i32.shl (local.get $K) (i32.const 2)))
    (local.set $nb (i32.shl (local.get $N) (i32.const 2)))
    (local.set $mb (local.get $m0))
    (block $mdone (loop $mloop
      (br_if $mdone (i32.ge_u (local.get $mb) (local.get $m1)))
      (local.set $mEnd (select (i32.add (local.get $mb) (i32.const ${MB})) (local.get $m1)
        (i32.lt_u (i32.add (local.get $mb) (i32.const ${MB})) (local.get $m1))))
      (local.set $n (local.get $n0))
      (block $ndone (loop $nloop
        (br_if $ndone (i32.ge_u (local.get $n) (local.get $n1)))
        (local.set $wstrip (i32.add (local.get $W) (i32.shl (local.get $n) (i32.const 2))))
        (local.set $m (local.get $mb))
        ;; 4-row micro-kernels
        (block $r4done (loop $r4loop
          (br_if $r4done (i32.gt_u (i32.add (local.get $m) (i32.const 4)) (local.get $mEnd)))
          (local.set $arow (i32.add (local.get $A) (i32.mul (local.get $m) (local.get $kb))))
          (local.set $crow (i32.add (local.get $C) (i32.add (i32.mul (local.get $m) (local.get $nb)) (i32.shl (local.get $n) (i32.const 2)))))
          ${[0, 8, 16, 24].map((c) => kernel4x8(c)).join('\n')}
          (local.set $m (i32.add (local.get $m) (i32.const 4)))
          (br $r4loop)))
        ;; leftover rows, one at a time
        (block $r1done (loop $r1loop
          (br_if $r1done (i32.ge_u (local.get $m) (local.get $mEnd)))
          (local.set $arow (i32.add (local.get $A) (i32.mul (local.get $m) (local.get $kb))))
          (local.set $crow (i32.add (local.get $C) (i32.add (i32.mul (local.get $m) (local.get $nb)) (i32.shl (local.get $n) (i32.const 2)))))
          ${kernel1x32()}
          (local.set $m (i32.add (local.get $m) (i32.const 1)))
          (br $r1loop)))
        (local.set $n (i32.add (local.get $n) (i32.const ${STRIP})))
        (br $nloop)))
      (local.set $mb (local.get $mEnd))
      (br $mloop)))
  )
)`;
}

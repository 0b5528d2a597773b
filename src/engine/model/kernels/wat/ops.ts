// WAT source of the forward pass's element-wise operations in WASM SIMD (RMSNorm, RoPE, residual
// add), run in place on activations kept in the kernel's memory. ops_js.ts defines their bits;
// these compute the same values (per lane the same f32 operations, the RMSNorm sum of squares the
// same sequential f64 chain). A module of its own on the kernel's shared memory, beside the GEMM
// module (kernel.ts), so the two evolve independently.

/**
 * `while (v < end) { body; v += step }` as WAT: the inner loops below (the sum of squares, and
 * each vector loop with its scalar tail) have this one shape. Labels `$<name>d` / `$<name>l`.
 */
function whileBelow(v: string, name: string, end: string, step: number, body: string): string {
  return `(block $${name}d (loop $${name}l
        (br_if $${name}d (i32.ge_u (local.get ${v}) ${end}))
        ${body}
        (local.set ${v} (i32.add (local.get ${v}) (i32.const ${step})))
        (br $${name}l)))`;
}

/**
 * rmsnorm(X, W, O, rows, dim, eps): ops_js.ts rmsNormJs. Each row's sum of squares stays a
 * sequential f64 chain (the reference's order), so one row alone is bound by the latency of
 * f64.add. Rows therefore go four at a time: two f64x2 chains whose lanes are rows (r, r+1) and
 * (r+2, r+3), fed element by element in order (a row's 4 loaded floats interleaved with its
 * neighbour's, then widened pair by pair: the widening is exact, and each lane sees the same
 * multiply and add as the scalar chain), which changes no bit of any row. The scaling is
 * vectorised (per element, order-free).
 */
function rmsNormFunc(): string {
  const sq = (k: number) => `(local.set $v (f64.promote_f32 (f32.load (i32.add (local.get $xp${k}) (local.get $i)))))
        (local.set $ss${k} (f64.add (local.get $ss${k}) (f64.mul (local.get $v) (local.get $v))))`;
  // i8x16.shuffle byte indices of f32 lanes (0-3 the first operand's, 4-7 the second's).
  const lanes = (...l: number[]) => l.flatMap((q) => [0, 1, 2, 3].map((k) => 4 * q + k)).join(' ');
  // Adds elements 0..3 of rows (a, b) squared to chain c, in order: the rows interleaved
  // ([a0 b0 a1 b1], [a2 b2 a3 b3]: unpack patterns the compiler emits as one instruction each),
  // the upper pair of each moved down, each pair widened exactly to f64x2.
  const four = (c: string, a: string, b: string) => {
    const add = (pairs: string) => `(local.set $w (f64x2.promote_low_f32x4 ${pairs}))
        (local.set ${c} (f64x2.add (local.get ${c}) (f64x2.mul (local.get $w) (local.get $w))))`;
    return `(local.set $lo (i8x16.shuffle ${lanes(0, 4, 1, 5)} (local.get ${a}) (local.get ${b})))
        (local.set $hi (i8x16.shuffle ${lanes(2, 6, 3, 7)} (local.get ${a}) (local.get ${b})))
        ${add('(local.get $lo)')}
        ${add(`(i8x16.shuffle ${lanes(2, 3, 2, 3)} (local.get $lo) (local.get $lo))`)}
        ${add('(local.get $hi)')}
        ${add(`(i8x16.shuffle ${lanes(2, 3, 2, 3)} (local.get $hi) (local.get $hi))`)}`;
  };
  // 1 / sqrt(ss / dim + eps), rounded to f32 as the reference does.
  const inv = (k: number) => `(f32.demote_f64 (f64.div (f64.const 1)
        (f64.sqrt (f64.add (f64.div (local.get $ss${k}) (f64.convert_i32_u (local.get $dim))) (local.get $eps)))))`;
  const rowOut = (k: number) => `(i32.add (local.get $O) (i32.mul (i32.add (local.get $r) (i32.const ${k})) (local.get $rb)))`;
  return `
  (func $rmsscale (param $xp i32) (param $op i32) (param $W i32) (param $dim i32) (param $s f32)
    (local $i i32) (local $d4 i32) (local $sv v128)
    (local.set $d4 (i32.and (local.get $dim) (i32.const -4)))
    (local.set $sv (f32x4.splat (local.get $s)))
    ${whileBelow('$i', 'v', '(local.get $d4)', 4, `(v128.store (i32.add (local.get $op) (i32.shl (local.get $i) (i32.const 2)))
        (f32x4.mul (f32x4.mul (v128.load (i32.add (local.get $xp) (i32.shl (local.get $i) (i32.const 2)))) (local.get $sv))
          (v128.load (i32.add (local.get $W) (i32.shl (local.get $i) (i32.const 2))))))`)}
    ${whileBelow('$i', 't', '(local.get $dim)', 1, `(f32.store (i32.add (local.get $op) (i32.shl (local.get $i) (i32.const 2)))
        (f32.mul (f32.mul (f32.load (i32.add (local.get $xp) (i32.shl (local.get $i) (i32.const 2)))) (local.get $s))
          (f32.load (i32.add (local.get $W) (i32.shl (local.get $i) (i32.const 2))))))`)}
  )
  (func (export "rmsnorm") (param $X i32) (param $W i32) (param $O i32) (param $rows i32) (param $dim i32) (param $eps f64)
    (local $r i32) (local $i i32) (local $rb i32) (local $vb i32) (local $v f64) (local $w v128)
    (local $xp0 i32) (local $xp1 i32) (local $xp2 i32) (local $xp3 i32)
    (local $x0 v128) (local $x1 v128) (local $x2 v128) (local $x3 v128) (local $c01 v128) (local $c23 v128) (local $lo v128) (local $hi v128)
    (local $ss0 f64) (local $ss1 f64) (local $ss2 f64) (local $ss3 f64)
    (local.set $rb (i32.shl (local.get $dim) (i32.const 2)))
    (local.set $vb (i32.and (local.get $rb) (i32.const -16)))
    ;; Four rows at a time: their sums first (before any of them is written: O may be X), then their scaling.
    (block $gd (loop $gl
      (br_if $gd (i32.gt_u (i32.add (local.get $r) (i32.const 4)) (local.get $rows)))
      (local.set $xp0 (i32.add (local.get $X) (i32.mul (local.get $r) (local.get $rb))))
      (local.set $xp1 (i32.add (local.get $xp0) (local.get $rb)))
      (local.set $xp2 (i32.add (local.get $xp1) (local.get $rb)))
      (local.set $xp3 (i32.add (local.get $xp2) (local.get $rb)))
      (local.set $c01 (v128.const i64x2 0 0))
      (local.set $c23 (v128.const i64x2 0 0))
      (local.set $i (i32.const 0))
      ${whileBelow('$i', 'g4', '(local.get $vb)', 16, `(local.set $x0 (v128.load (i32.add (local.get $xp0) (local.get $i))))
        (local.set $x1 (v128.load (i32.add (local.get $xp1) (local.get $i))))
        (local.set $x2 (v128.load (i32.add (local.get $xp2) (local.get $i))))
        (local.set $x3 (v128.load (i32.add (local.get $xp3) (local.get $i))))
        ${four('$c01', '$x0', '$x1')}
        ${four('$c23', '$x2', '$x3')}`)}
      (local.set $ss0 (f64x2.extract_lane 0 (local.get $c01)))
      (local.set $ss1 (f64x2.extract_lane 1 (local.get $c01)))
      (local.set $ss2 (f64x2.extract_lane 0 (local.get $c23)))
      (local.set $ss3 (f64x2.extract_lane 1 (local.get $c23)))
      ${whileBelow('$i', 't4', '(local.get $rb)', 4, `${sq(0)}
        ${sq(1)}
        ${sq(2)}
        ${sq(3)}`)}
      ${[0, 1, 2, 3].map((k) => `(call $rmsscale (local.get $xp${k}) ${rowOut(k)} (local.get $W) (local.get $dim) ${inv(k)})`).join('\n      ')}
      (local.set $r (i32.add (local.get $r) (i32.const 4)))
      (br $gl)))
    ;; The last rows (fewer than four) one by one.
    (block $rd (loop $rl
      (br_if $rd (i32.ge_u (local.get $r) (local.get $rows)))
      (local.set $xp0 (i32.add (local.get $X) (i32.mul (local.get $r) (local.get $rb))))
      (local.set $ss0 (f64.const 0))
      (local.set $i (i32.const 0))
      ${whileBelow('$i', 's', '(local.get $rb)', 4, sq(0))}
      (call $rmsscale (local.get $xp0) ${rowOut(0)} (local.get $W) (local.get $dim) ${inv(0)})
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br $rl)))
  )`;
}

/**
 * rope(QKV, rows, stride, heads, hd, POS, COS, SIN): ops_js.ts ropeJs (POS: i32 positions per
 * row; COS/SIN: [position][hd/2] f32 tables). Four pairs at a time, the rest one by one.
 */
function ropeFunc(): string {
  const pair = (v: boolean) => {
    const T = v ? 'f32x4' : 'f32';
    const ld = (a: string) => (v ? `(v128.load ${a})` : `(f32.load ${a})`);
    const st = v ? 'v128.store' : 'f32.store';
    const at = (base: string, extra = '') => `(i32.add ${base} (i32.add (i32.shl (local.get $i) (i32.const 2)) ${extra || '(i32.const 0)'}))`;
    return `
          (local.set ${v ? '$x1' : '$y1'} ${ld(at('(local.get $hp)'))})
          (local.set ${v ? '$x2' : '$y2'} ${ld(at('(local.get $hp)', '(local.get $hb)'))})
          (local.set ${v ? '$c' : '$cs'} ${ld(at('(local.get $cp)'))})
          (local.set ${v ? '$s' : '$ss'} ${ld(at('(local.get $sp)'))})
          (${st} ${at('(local.get $hp)')} (${T}.sub (${T}.mul (local.get ${v ? '$x1' : '$y1'}) (local.get ${v ? '$c' : '$cs'})) (${T}.mul (local.get ${v ? '$x2' : '$y2'}) (local.get ${v ? '$s' : '$ss'}))))
          (${st} ${at('(local.get $hp)', '(local.get $hb)')} (${T}.add (${T}.mul (local.get ${v ? '$x2' : '$y2'}) (local.get ${v ? '$c' : '$cs'})) (${T}.mul (local.get ${v ? '$x1' : '$y1'}) (local.get ${v ? '$s' : '$ss'}))))`;
  };
  return `
  (func (export "rope") (param $QKV i32) (param $rows i32) (param $stride i32) (param $heads i32) (param $hd i32)
      (param $POS i32) (param $COS i32) (param $SIN i32)
    (local $r i32) (local $h i32) (local $i i32) (local $half i32) (local $h4 i32) (local $hb i32)
    (local $rp i32) (local $hp i32) (local $cp i32) (local $sp i32)
    (local $x1 v128) (local $x2 v128) (local $c v128) (local $s v128)
    (local $y1 f32) (local $y2 f32) (local $cs f32) (local $ss f32)
    (local.set $half (i32.shr_u (local.get $hd) (i32.const 1)))
    (local.set $h4 (i32.and (local.get $half) (i32.const -4)))
    (local.set $hb (i32.shl (local.get $half) (i32.const 2)))
    (block $rd (loop $rl
      (br_if $rd (i32.ge_u (local.get $r) (local.get $rows)))
      (local.set $rp (i32.add (local.get $QKV) (i32.shl (i32.mul (local.get $r) (local.get $stride)) (i32.const 2))))
      (local.set $cp (i32.shl (i32.mul (i32.load (i32.add (local.get $POS) (i32.shl (local.get $r) (i32.const 2)))) (local.get $half)) (i32.const 2)))
      (local.set $sp (i32.add (local.get $SIN) (local.get $cp)))
      (local.set $cp (i32.add (local.get $COS) (local.get $cp)))
      (local.set $h (i32.const 0))
      (block $hd_ (loop $hl
        (br_if $hd_ (i32.ge_u (local.get $h) (local.get $heads)))
        (local.set $hp (i32.add (local.get $rp) (i32.shl (i32.mul (local.get $h) (local.get $hd)) (i32.const 2))))
        (local.set $i (i32.const 0))
        ${whileBelow('$i', 'v', '(local.get $h4)', 4, pair(true))}
        ${whileBelow('$i', 't', '(local.get $half)', 1, pair(false))}
        (local.set $h (i32.add (local.get $h) (i32.const 1)))
        (br $hl)))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br $rl)))
  )`;
}

/** addinto(X, Y, n): X[i] = X[i] + Y[i] (ops_js.ts addIntoJs). */
function addIntoFunc(): string {
  return `
  (func (export "addinto") (param $X i32) (param $Y i32) (param $n i32)
    (local $i i32) (local $n4 i32)
    (local.set $n4 (i32.shl (i32.and (local.get $n) (i32.const -4)) (i32.const 2)))
    (local.set $n (i32.shl (local.get $n) (i32.const 2)))
    ${whileBelow('$i', 'v', '(local.get $n4)', 16, `(v128.store (i32.add (local.get $X) (local.get $i))
        (f32x4.add (v128.load (i32.add (local.get $X) (local.get $i))) (v128.load (i32.add (local.get $Y) (local.get $i)))))`)}
    ${whileBelow('$i', 't', '(local.get $n)', 4, `(f32.store (i32.add (local.get $X) (local.get $i))
        (f32.add (f32.load (i32.add (local.get $X) (local.get $i))) (f32.load (i32.add (local.get $Y) (local.get $i)))))`)}
  )`;
}

/** copyrows(S, ss, D, ds, rows, n): ops_js.ts copyRowsJs with byte addresses and float strides. */
function copyRowsFunc(): string {
  return `
  (func (export "copyrows") (param $S i32) (param $ss i32) (param $D i32) (param $ds i32) (param $rows i32) (param $n i32)
    (local $r i32) (local $i i32) (local $n4 i32)
    (local.set $n4 (i32.shl (i32.and (local.get $n) (i32.const -4)) (i32.const 2)))
    (local.set $n (i32.shl (local.get $n) (i32.const 2)))
    (local.set $ss (i32.shl (local.get $ss) (i32.const 2)))
    (local.set $ds (i32.shl (local.get $ds) (i32.const 2)))
    (block $rd (loop $rl
      (br_if $rd (i32.ge_u (local.get $r) (local.get $rows)))
      (local.set $i (i32.const 0))
      ${whileBelow('$i', 'v', '(local.get $n4)', 16, `(v128.store (i32.add (local.get $D) (local.get $i)) (v128.load (i32.add (local.get $S) (local.get $i))))`)}
      ${whileBelow('$i', 't', '(local.get $n)', 4, `(i32.store (i32.add (local.get $D) (local.get $i)) (i32.load (i32.add (local.get $S) (local.get $i))))`)}
      (local.set $S (i32.add (local.get $S) (local.get $ss)))
      (local.set $D (i32.add (local.get $D) (local.get $ds)))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br $rl)))
  )`;
}

/** The module, on the kernel's imported shared memory. */
export function opsWat(): string {
  return `(module
  (import "env" "mem" (memory 1 65536 shared))
${rmsNormFunc()}
${ropeFunc()}
${addIntoFunc()}
${copyRowsFunc()}
)`;
}

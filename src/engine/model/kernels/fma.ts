// Fused multiply-add for the GEMM: whether the WASM kernel uses it (relaxed SIMD's
// f32x4.relaxed_madd) and the exact JS twin the reference kernel uses when it does.
//
// relaxed_madd may be fused (one rounding) or unfused (two) depending on the CPU; V8 picks one
// lowering per machine, so one process always computes the same bits for every batch shape. The
// kernel uses it only when a probe shows it is FUSED here: then the JS kernel computes fmaf()
// (exact fused f32 multiply-add) and stays the kernel's bitwise twin. Unfused relaxed_madd is
// the same as the plain kernel, so there is nothing to gain from it.
//
// KVC_WASM_FMA: unset = use FMA when the platform has it; "0" = never (the mul+add kernel, the
// bits of earlier versions); "1" = required (start fails when the platform lacks it). Any other
// value is an error.
import v8 from 'node:v8';
import { environment } from '../../../common/environment.js';

/**
 * A module exporting f(a, b, c) = lane 0 of f32x4.relaxed_madd(splat a, splat b, splat c)
 * (binary form: relaxed_madd is 0xfd 0x85 0x02, i.e. opcode 0x105).
 */
const PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x01, 0x60, 0x03, 0x7d, 0x7d, 0x7d, 0x01, 0x7d, 0x03, 0x02, 0x01,
  0x00, 0x07, 0x05, 0x01, 0x01, 0x66, 0x00, 0x00, 0x0a, 0x16, 0x01, 0x14, 0x00, 0x20, 0x00, 0xfd, 0x13, 0x20, 0x01, 0xfd, 0x13,
  0x20, 0x02, 0xfd, 0x13, 0xfd, 0x85, 0x02, 0xfd, 0x1f, 0x00, 0x0b,
]);

export interface FmaSupport {
  /** The kernels use fused multiply-add. */
  readonly fma: boolean;
  /** Why (for logs and the benchmark). */
  readonly reason: string;
}

let cached: FmaSupport | null = null;

/** Whether this process's kernels use FMA (KVC_WASM_FMA, then a probe); decided once. */
export function fmaSupport(): FmaSupport {
  cached ??= detectFma(environment().get('wasmFma'));
  return cached;
}

/** The decision for a KVC_WASM_FMA value (exported for tests; fmaSupport() caches it for the process). */
export function detectFma(setting: '0' | '1' | undefined): FmaSupport {
  if (setting === '0') return { fma: false, reason: 'off (KVC_WASM_FMA=0)' };
  const probe = probeFused();
  if (setting === '1' && !probe.fma) throw new Error(`KVC_WASM_FMA=1 but fused multiply-add is unavailable: ${probe.reason}`);
  return probe;
}

/** Enables relaxed SIMD in V8 (process-wide, so worker threads see it) and probes it. */
function probeFused(): FmaSupport {
  // Node 20's V8 ships relaxed SIMD behind this flag; newer V8 has it on by default (and may
  // ignore the flag). It must be set before the kernel module is compiled.
  if (!WebAssembly.validate(PROBE)) v8.setFlagsFromString('--experimental-wasm-relaxed-simd');
  if (!WebAssembly.validate(PROBE)) return { fma: false, reason: 'this runtime has no WASM relaxed SIMD' };
  const f = (new WebAssembly.Instance(new WebAssembly.Module(PROBE)).exports as { f(a: number, b: number, c: number): number }).f;
  // (1 + 2^-23)(1 - 2^-23) - 1 = -2^-46 exactly; with the product rounded to f32 first it is 0.
  const a = 1 + 2 ** -23;
  const b = 1 - 2 ** -23;
  const r = f(a, b, -1);
  if (r === -(2 ** -46)) return { fma: true, reason: 'relaxed_madd is fused on this CPU' };
  return { fma: false, reason: 'relaxed_madd is not fused on this CPU (no FMA instructions)' };
}

const fr = Math.fround;

/**
 * f32(a*b + c) with ONE rounding, for f32 inputs: what a fused f32 multiply-add gives. a*b is
 * exact in f64 (2*24 bits); s = f64(p + c) and its rounding error e are exact (TwoSum). Rounding
 * s to f32 is the correctly rounded result unless s is exactly halfway between two f32 values
 * and e != 0 (double rounding): then the exact value lies on e's side of the midpoint.
 */
export function fmaf(a: number, b: number, c: number): number {
  const p = a * b;
  const s = p + c;
  const r = fr(s);
  const bb = s - p;
  const e = p - (s - bb) + (c - bb);
  if (e === 0 || r === s || !Number.isFinite(s)) return r;
  const d = s - r; // exact: s and r are within half an f32 ulp
  const other = r + 2 * d; // the f32 neighbour on s's side, when s is a midpoint
  if (fr(other) !== other) return r; // s is not a midpoint: r is right
  return e > 0 === d > 0 ? other : r;
}

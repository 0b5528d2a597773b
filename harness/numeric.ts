// Numeric comparisons shared by the model tests.
import assert from 'node:assert/strict';

/** ‖got − exact‖ / ‖exact‖ over all elements (the tolerances in docs/engine-model.md use it). */
export function relativeRms(got: ArrayLike<number>, exact: ArrayLike<number>): number {
  if (got.length !== exact.length) throw new Error(`relativeRms: ${got.length} values against ${exact.length}`);
  let err = 0;
  let ref = 0;
  for (let i = 0; i < got.length; i++) {
    err += (got[i]! - exact[i]!) ** 2;
    ref += exact[i]! ** 2;
  }
  return Math.sqrt(err / ref);
}

/** A deterministic generator of numbers in [0, 1) (xorshift32), so a failing input reproduces. */
export function seededRandom(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 4294967296;
  };
}

/** Fails naming `what` and the first element whose bit pattern differs (NaN payloads included). */
export function bitsEqual(a: Float32Array, b: Float32Array, what: string): void {
  assert.equal(a.length, b.length, `${what}: lengths differ`);
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < ua.length; i++) {
    if (ua[i] !== ub[i]) assert.fail(`${what}: element ${i} differs: ${a[i]} vs ${b[i]}`);
  }
}

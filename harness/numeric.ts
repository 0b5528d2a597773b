// Numeric comparisons shared by the model tests.

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

// Free ports for tests. scripts/run-tests.mjs runs several system test files at a time and gives
// each running file a slot of its own, KVC_TEST_PORT_SLOT="k/n": freePortRange then picks only in
// the k-th of n equal parts of the range asked for, so two files side by side never pick the same
// ports (a port found free by both would be bound by one first, and the other's server would fail
// with EADDRINUSE). Without the variable (a file run alone, a benchmark) the whole range.
import { ephemeralPortLow, freePortRange as pickIn } from '../src/common/ports.js';

export { isPortFree } from '../src/common/ports.js';

/** The variable scripts/run-tests.mjs sets for each system test file it runs beside others. */
export const PORT_SLOT_ENV = 'KVC_TEST_PORT_SLOT';

/**
 * `count` consecutive free ports from a random base in [lo, hi) (by default from 20000 up to the
 * kernel's ephemeral range: see src/common/ports.ts), within this file's slot of that range.
 */
export function freePortRange(count: number, lo = 20000, hi = ephemeralPortLow()): Promise<number> {
  const slot = process.env[PORT_SLOT_ENV];
  if (slot === undefined || slot === '') return pickIn(count, lo, hi);
  const m = /^(\d+)\/(\d+)$/.exec(slot);
  const k = Number(m?.[1]);
  const n = Number(m?.[2]);
  if (!m || n < 1 || k >= n) throw new Error(`${PORT_SLOT_ENV}: expected "k/n" with 0 <= k < n, found "${slot}"`);
  const size = Math.floor((hi - lo) / n);
  return pickIn(count, lo + k * size, lo + (k + 1) * size);
}

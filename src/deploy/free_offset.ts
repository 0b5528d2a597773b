// A `--port-offset` whose every port is free, for tests and benchmarks that start `kvc up` beside
// each other (and beside a live deployment on the reference ports).
import { ephemeralPortLow } from '../common/ports.js';
import { makePlan, type PlanOptions } from './plan.js';
import { takenPorts } from './up.js';

/** The lowest offset tried: every port of a plan then lies above the reference ports of docs/proxy.md. */
const FIRST_OFFSET = 10_000;
const STEP = 100;

/**
 * A random multiple of 100 (plus `shift`, to keep apart from callers that use plain multiples)
 * from 10,000 up, small enough that the plan's highest port stays below the kernel's ephemeral
 * range: a port there, found free, can still be taken by another process's outgoing connection
 * before the engine binds it, and `kvc up` then fails with EADDRINUSE.
 */
export async function freePortOffset(o: Omit<PlanOptions, 'portOffset'>, shift = 0): Promise<number> {
  const highest = Math.max(...makePlan({ ...o, portOffset: 0 }).ports.map((p) => p.port));
  const steps = Math.floor((ephemeralPortLow() - 1 - highest - shift - FIRST_OFFSET) / STEP);
  if (steps < 1) throw new Error(`no port offset keeps ports ${highest}+offset below the ephemeral range (${ephemeralPortLow()})`);
  for (let i = 0; i < 60; i++) {
    const off = FIRST_OFFSET + Math.floor(Math.random() * steps) * STEP + shift;
    if ((await takenPorts(makePlan({ ...o, portOffset: off }))).length === 0) return off;
  }
  throw new Error('no free port offset found');
}

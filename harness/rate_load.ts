// An open load at a fixed rate: requests arrive on their own clock (Poisson or evenly spaced),
// whatever the deployment's answers do, so two minutes of a soak carry the same load and their
// memory can be compared. At most `maxInFlight` requests are outstanding; an arrival finding that
// many is shed: not sent, and counted with its time (never dropped unseen), so a deployment that
// falls behind shows as shed arrivals instead of a generator piling up requests without bound.
import { performance } from 'node:perf_hooks';
import { loadRequest, type LoadOptions, type LoadResult } from './load.js';
import { seededRandom } from './numeric.js';

export type Arrivals = 'poisson' | 'even';

export interface RateLoadOptions extends LoadOptions {
  /** Arrivals a minute. */
  perMinute: number;
  /** Requests outstanding at most; arrivals beyond are shed. */
  maxInFlight: number;
  /** Exponential gaps (a Poisson process, seeded) or equal ones. */
  arrivals: Arrivals;
  seed?: number;
}

export function startRateLoad(o: RateLoadOptions) {
  const results: LoadResult[] = [];
  /** When each shed arrival came (Date.now()). */
  const shed: number[] = [];
  const inFlight = new Set<Promise<void>>();
  const request = loadRequest(o);
  const random = seededRandom(o.seed ?? 35);
  const meanGapMs = 60_000 / o.perMinute;
  const gap = () => (o.arrivals === 'even' ? meanGapMs : -Math.log(1 - random()) * meanGapMs);
  let n = 0;
  let offered = 0;
  /** The most requests outstanding at once, since the last call of peakInFlight(). */
  let peak = 0;
  /** How late the generator's own clock fired an arrival at most (ms): the generator's own lag. */
  let lateMs = 0;
  let running = true;
  let next = performance.now() + gap();
  let timer: NodeJS.Timeout | undefined;
  const arrive = () => {
    offered++;
    if (inFlight.size >= o.maxInFlight) {
      shed.push(Date.now());
      return;
    }
    const p = request(n++).then((r) => {
      results.push(r);
      inFlight.delete(p);
    });
    inFlight.add(p);
    peak = Math.max(peak, inFlight.size);
  };
  // Arrivals are due on the schedule's clock: a timer that fires late sends every arrival due by
  // then (their times are not moved), so the rate over a minute holds even when the loop lags.
  const tick = () => {
    if (!running) return;
    const now = performance.now();
    if (next <= now) lateMs = Math.max(lateMs, now - next);
    while (next <= now) {
      arrive();
      next += gap();
    }
    timer = setTimeout(tick, next - performance.now());
  };
  timer = setTimeout(tick, next - performance.now());
  return {
    results,
    shed,
    offered: () => offered,
    inFlight: () => inFlight.size,
    /** The most outstanding at once since the last call, then starts again from now. */
    peakInFlight(): number {
      const p = peak;
      peak = inFlight.size;
      return p;
    },
    /** The generator's largest lag since the last call (ms), then starts again. */
    lateMs(): number {
      const l = lateMs;
      lateMs = 0;
      return l;
    },
    /** Stops the arrivals and waits for every request outstanding (each bounded by its timeout). */
    async stop(): Promise<LoadResult[]> {
      running = false;
      clearTimeout(timer);
      while (inFlight.size) await Promise.all([...inFlight]);
      return results;
    },
  };
}

// The goodput search of the disaggregation bench: the highest long-prompt arrival rate at which a
// deployment still meets the SLO, found by a bounded doubling / halving / bisection over probe windows.
import { settle } from './_disagg_deployment.js';
import { ATTAINMENT, attainment, misses, r1, r4, schedule, window, type Config, type Done } from './_disagg_workload.js';

/**
 * Goodput probes: the short requests as above plus long prompts as a Poisson process at the
 * probed rate. A probe must not hinge on one request: its window lasts long enough for PROBE_LONGS
 * long prompts on average (PROBE_LONGS / rate seconds, at least PROBE_MIN_S), so one long miss
 * moves the long attainment by ~6 %, not 20–30 % as with the 3–11 long prompts of 15–30 s windows.
 * The schedule of a probe depends only on its rate and repeat number, so both configurations see
 * the same requests at the same rate.
 */
export const PROBE_LONGS = 16;
export const PROBE_MIN_S = 20;
/**
 * Bounded search over the long-prompt rate (per second). From `first`: doubling while the SLO holds
 * (up to `max`), halving while it fails (down to `min`), then bisection between the highest rate
 * that held and the lowest that failed until they are within `within` of the upper one. A probe
 * whose attainment lands in `near` (close to the 90 % line) gets a second window with the next seed,
 * its requests pooled with the first's. The probes of one configuration together last at most
 * `budgetS` seconds of windows: a probe that would pass it is not run (the search then reports the
 * bracket it reached). `first` = 0.4/s: one CPU prefills a 1,500–3,000-token prompt of the built-in
 * model in roughly 1–3 s (quiet machine), so one prefiller saturates near 0.5–0.8 long prompts/s,
 * and colocated engines, which stall their streams at every long prompt, held up to 0.25–0.3/s:
 * starting between them reaches both boundaries in the fewest windows.
 */
export const SEARCH = { first: 0.4, min: 0.05, max: 1.6, within: 0.2, budgetS: 240, near: [0.85, 0.95] } as const;
/** Length of one probe window at `rate` (s). */
export const probeSeconds = (rate: number) => Math.max(PROBE_MIN_S, PROBE_LONGS / rate);

/** One point of the attainment curve: the pooled windows of one configuration at one rate. */
export interface CurvePoint {
  config: Config;
  rate: number;
  /** Lower of the short and long attainment (%). */
  attainment: number;
  short: number;
  long: number;
  windows: number;
  /** Requests pooled at this point, and how many of them were short and long. */
  requests: number;
  short_requests?: number;
  long_requests?: number;
  /** Seconds of windows pooled. */
  seconds?: number;
}

/** The seed of probe `repeat` at `rate`: a function of the rate, so every configuration gets the same requests there. */
export const probeSeed = (rate: number, repeat: number) => 1000 + Math.round(rate * 10_000) * 10 + repeat;

/**
 * Bounded goodput search (SEARCH): doubling / halving from SEARCH.first until the SLO's outcome
 * flips, then bisection; probes near the 90 % line get a second window, pooled; at most
 * SEARCH.budgetS seconds of windows.
 */
export async function goodput(url: string, engines: string[], name: Config, curve: CurvePoint[]): Promise<{ rps: number; held: number; failed: number | null; seconds: number; stoppedBy: string }> {
  let good = 0;
  let bad = Infinity;
  let rate: number = SEARCH.first;
  let spent = 0;
  let stoppedBy = 'resolution';
  const pooled = new Map<number, Done[]>();
  const probe = async (repeat: number) => {
    const seconds = probeSeconds(rate);
    await settle(engines);
    const ds = await window(url, schedule(seconds, probeSeed(rate, repeat), { kind: 'poisson', rate }), seconds);
    spent += seconds;
    const all = [...(pooled.get(rate) ?? []), ...ds];
    pooled.set(rate, all);
    const a = attainment(all);
    const longs = all.filter((d) => d.kind === 'long').length;
    const point: CurvePoint = {
      config: name,
      rate: r4(rate),
      attainment: r1(a.both * 100),
      short: r1(a.short * 100),
      long: r1(a.long * 100),
      windows: repeat + 1,
      requests: all.length,
      short_requests: all.length - longs,
      long_requests: longs,
      seconds: r1(seconds * (repeat + 1)),
    };
    const i = curve.findIndex((c) => c.config === name && c.rate === point.rate);
    if (i >= 0) curve[i] = point;
    else curve.push(point);
    console.log(
      `  ${name} @ ${rate.toFixed(4)} long/s (${repeat + 1} window(s) of ${seconds.toFixed(0)} s): SLO attainment short ${(a.short * 100).toFixed(1)} %, long ${(a.long * 100).toFixed(1)} % (${all.length - longs} short, ${longs} long; ${misses(all, 'short')}; ${misses(all, 'long')})`,
    );
    return a.both;
  };
  for (;;) {
    if (spent + probeSeconds(rate) > SEARCH.budgetS) {
      stoppedBy = 'time budget';
      break;
    }
    let a = await probe(0);
    // Close to the line: a second window with the next seed, pooled (if the budget allows).
    if (a >= SEARCH.near[0] && a < SEARCH.near[1] && spent + probeSeconds(rate) <= SEARCH.budgetS) a = await probe(1);
    if (a >= ATTAINMENT) good = Math.max(good, rate);
    else bad = Math.min(bad, rate);
    let next: number;
    if (bad === Infinity) next = rate * 2; // everything so far held: go up
    else if (good === 0) next = rate / 2; // everything so far failed: go down
    else next = (good + bad) / 2;
    if (next > SEARCH.max || next < SEARCH.min) {
      stoppedBy = next > SEARCH.max ? 'search ceiling' : 'search floor';
      break;
    }
    if (good > 0 && bad !== Infinity && (bad - good) / bad <= SEARCH.within) break;
    rate = next;
  }
  console.log(
    `  ${name} goodput search: held at ${r4(good)}/s, failed at ${bad === Infinity ? 'none tried' : `${r4(bad)}/s`}; ${spent.toFixed(0)} s of probe windows; stopped by the ${stoppedBy}`,
  );
  return { rps: good, held: good, failed: bad === Infinity ? null : r4(bad), seconds: Math.round(spent), stoppedBy };
}

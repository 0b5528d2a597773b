// npm run bench -- disagg
// Does disaggregated prefill protect decoding? Three configurations on the built-in model, each a
// real deployment started with `kvc up` on the same machine (the same cores):
//   idle      the main window's short requests alone (on the 1P1D deployment): the ITL baseline;
//   coloc     `kvc up --prefillers 0 --decoders 2`: two kv_both engines (chunked prefill) behind
//             the proxy's round-robin, both on every CPU;
//   disagg    `kvc up --prefillers 1 --decoders 1 --routing kv-aware` (default placement:
//             prefiller on the first CPU, decoder on the rest; conditional disaggregation: prompts
//             of at most 256 uncached tokens are prefilled on the decoder itself, longer ones on the
//             prefiller), what a user who wants decoding protected from long prompts runs.
// Workload (the same seeded requests for every configuration): short requests (PROMPT_SHORT
// tokens in, SHORT_TOKENS streamed out) sent open-loop at SHORT_RATE per second (Poisson), plus
// long prompts (LONG_MIN..LONG_MAX tokens, LONG_TOKENS out): in the main window in bursts of
// BURST.size every BURST.everyS seconds, in the goodput probes as a Poisson process at the probed
// rate. Reported: ITL p50/p99/max over every stream, TTFT p50/p99 of short and long requests, and
// goodput: the highest long-prompt arrival rate at which at least 90 % of the short AND of the
// long requests meet the SLO (below), found by a bounded search. Per window, the first decoder's
// own step intervals, GC pauses, event-loop delay, CPU / run-queue shares and the backends the
// proxy marked down say where a stall came from.
// Plots (Vega-Lite rendered to SVG): ITL over time per configuration, SLO attainment vs rate.
// Output folder: bench-results/disagg/ (or --out DIR); `--replot DIR/results.json` redraws the plots
// of an earlier run without running anything; --keep-logs keeps the deployments' logs;
// `--probe CONFIG@RATE[xSECONDS]` runs one goodput probe window only (see probeOnly); `--burst [N@T]`
// runs the burst workload instead (bench/_disagg_burst.ts; `--configs 1P1D,2P2D,colocated` picks some of
// its deployments). Last line:
// {"bench":"disagg","idle_itl_p99_ms":…,"coloc_itl_p99_ms":…,"disagg_itl_p99_ms":…,
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { resultsDir } from './_plot.js';
import { burstBench, parseBurst, parseConfigs, type BurstParts } from './_disagg_burst.js';
import { markedDown, prefillsWhere, schedstat, scrape, settle, stepIntervals, up, value } from './_disagg_deployment.js';
import { goodput, probeSeconds, probeSeed, PROBE_LONGS, PROBE_MIN_S, SEARCH, type CurvePoint } from './_disagg_goodput.js';
import { plots, type Saved } from './_disagg_plot.js';
import {
  ATTAINMENT,
  attainment,
  BURST,
  LONG_MAX,
  LONG_MIN,
  LONG_TOKENS,
  longPrompts,
  MAIN_SEED,
  MAIN_WINDOW_S,
  misses,
  pct,
  PROMPT_SHORT,
  r1,
  r4,
  schedule,
  streamsWindow,
  SHORT_RATE,
  SHORT_TOKENS,
  SLO,
  summary,
  warm,
  window,
  type Arrival,
  type Config,
  type Done,
} from './_disagg_workload.js';

async function main(): Promise<void> {
  const argOut = process.argv.indexOf('--out');
  const outDir = resolve(argOut > 0 ? process.argv[argOut + 1]! : resultsDir('disagg'));
  mkdirSync(outDir, { recursive: true });
  const replot = process.argv.indexOf('--replot');
  if (replot > 0) {
    // Redraw the plots of an earlier run from its results.json, without running anything.
    await plots(outDir, JSON.parse(readFileSync(process.argv[replot + 1]!, 'utf8')) as Saved);
    console.log(`plots redrawn in ${outDir}`);
    return;
  }
  const logRoot = mkdtempSync(join(tmpdir(), 'kvc-bench-disagg-'));
  const burstAt = process.argv.indexOf('--burst');
  if (burstAt > 0) {
    try {
      const parts: BurstParts = {
        up,
        warm,
        settle,
        longPrompts,
        longTokens: LONG_TOKENS,
        streamsWindow,
        pct,
        scrape,
      };
      const configsAt = process.argv.indexOf('--configs');
      await burstBench(parts, parseBurst(process.argv[burstAt + 1]), outDir, logRoot, parseConfigs(configsAt > 0 ? (process.argv[configsAt + 1] ?? '') : undefined));
    } finally {
      if (process.argv.includes('--keep-logs')) console.log(`logs kept in ${logRoot}`);
      else rmSync(logRoot, { recursive: true, force: true });
    }
    return;
  }
  const probeAt = process.argv.indexOf('--probe');
  if (probeAt > 0) {
    try {
      await probeOnly(process.argv[probeAt + 1], logRoot);
    } finally {
      if (process.argv.includes('--keep-logs')) console.log(`logs kept in ${logRoot}`);
      else rmSync(logRoot, { recursive: true, force: true });
    }
    return;
  }
  const started = performance.now();
  const mainPlan = schedule(MAIN_WINDOW_S, MAIN_SEED, { kind: 'burst' });
  const mainLongs = mainPlan.filter((a) => a.kind === 'long');
  console.log(
    `disagg bench workload (the same seeded requests for every configuration): short requests open-loop, Poisson at ${SHORT_RATE}/s (${PROMPT_SHORT} prompt tokens -> ${SHORT_TOKENS} streamed); ` +
      `main window ${MAIN_WINDOW_S} s: ${mainPlan.length - mainLongs.length} short + ${mainLongs.length} long prompts of ${LONG_MIN}-${LONG_MAX} tokens (-> ${LONG_TOKENS}) in bursts of ${BURST.size}, ${BURST.spacingMs} ms apart, every ${BURST.everyS} s from ${BURST.firstS} s ` +
      `(${r4(BURST.size / BURST.everyS)} long/s on average); idle window: the same short requests without the long prompts`,
  );
  console.log('configurations: idle and disagg on `kvc up --prefillers 1 --decoders 1 --routing kv-aware` (prefiller CPU 0, decoder CPU 1; prompts of <= 256 uncached tokens prefilled on the decoder), coloc on `kvc up --prefillers 0 --decoders 2` (both engines on both CPUs, round-robin); every other setting at its default');
  console.log(
    `SLO: TTFT <= ${SLO.shortTtftMs} ms (short) / ${SLO.longTtftMs} ms (long) and the request's own ITL p99 <= ${SLO.itlP99Ms} ms; goodput = highest Poisson long-prompt rate (short requests as above) with >= ${ATTAINMENT * 100} % of short and of long requests meeting it, ` +
      `search from ${SEARCH.first}/s doubling/halving within [${SEARCH.min}, ${SEARCH.max}] then bisecting until within ${SEARCH.within * 100} %; a probe window holds ${PROBE_LONGS} long prompts on average (${PROBE_LONGS}/rate s, at least ${PROBE_MIN_S} s), one at ${SEARCH.near[0] * 100}-${SEARCH.near[1] * 100} % gets a second window (next seed, pooled); <= ${SEARCH.budgetS} s of probe windows per configuration`,
  );
  const results: Partial<Record<Config, ReturnType<typeof summary>>> = {};
  const series: { config: Config; t: number; itl_ms: number }[] = [];
  const curve: CurvePoint[] = [];
  const good: Partial<Record<Config, number>> = {};
  const searches: Partial<Record<Config, Awaited<ReturnType<typeof goodput>>>> = {};
  const steps: Partial<Record<Config, ReturnType<typeof stepIntervals> & { proxy_marked_down: number; proxy_prefills: Record<string, number> }>> = {};
  const keep = (name: Config, ds: Done[]) => {
    results[name] = summary(ds);
    for (const d of ds) for (const g of d.gaps) series.push({ config: name, t: g.t, itl_ms: r1(g.ms) });
    console.log(`${name}: ${JSON.stringify(results[name])}`);
  };

  for (const [name, args] of [
    ['disagg', ['--prefillers', '1', '--decoders', '1', '--routing', 'kv-aware']],
    ['coloc', ['--prefillers', '0', '--decoders', '2']],
  ] as const) {
    console.log(`\nstarting: kvc up ${args.join(' ')}`);
    const dep = await up([...args], logRoot);
    try {
      await warm(dep.url);
      const measured = async (config: Config, plan: Arrival[]) => {
        await settle(dep.engines);
        const before = await scrape(dep.decoder);
        const proxyBefore = await scrape(dep.url); // also resets the proxy's event-loop lag maximum
        const s0 = schedstat(dep.decoderPid);
        const downs0 = markedDown(dep.logDir);
        const t0 = performance.now();
        const ds = await window(dep.url, plan, MAIN_WINDOW_S);
        const sched = { before: s0, after: schedstat(dep.decoderPid), seconds: (performance.now() - t0) / 1000 };
        const proxyAfter = await scrape(dep.url);
        const proxyLag = value(proxyAfter, 'kvc_proxy_nodejs_eventloop_lag_max_seconds');
        steps[config] = {
          ...stepIntervals(before, await scrape(dep.decoder), proxyLag, sched),
          proxy_marked_down: markedDown(dep.logDir) - downs0,
          proxy_prefills: prefillsWhere(proxyBefore, proxyAfter),
        };
        keep(config, ds);
        console.log(`  ${config}: ${misses(ds, 'short')}; ${misses(ds, 'long')}`);
        console.log(`  ${config}: decoder ${name === 'coloc' ? 'engine-0' : 'decoder-0'} step intervals ${JSON.stringify(steps[config])}`);
      };
      if (name === 'disagg') await measured('idle', mainPlan.filter((a) => a.kind === 'short'));
      await measured(name, mainPlan);
      searches[name] = await goodput(dep.url, dep.engines, name, curve);
      good[name] = searches[name].rps;
      console.log(`  ${name} goodput: ${r4(good[name]!)} long prompts/s`);
    } finally {
      await dep.stop();
    }
  }
  // --keep-logs keeps every process's log (and deployment.json) for a closer look.
  if (process.argv.includes('--keep-logs')) console.log(`logs kept in ${logRoot}`);
  else rmSync(logRoot, { recursive: true, force: true });

  const bursts = [...new Set(mainLongs.map((a) => Math.floor(a.atMs / (BURST.everyS * 1000))))].map((k) => BURST.firstS + k * BURST.everyS);
  await plots(outDir, { results, goodput: good, searches, curve, series, slo: SLO, steps, bursts });
  console.log(`\nplots: ${join(outDir, 'itl_over_time.svg')}, ${join(outDir, 'slo_attainment.svg')}; ran ${((performance.now() - started) / 1000).toFixed(0)} s`);

  // The attainment curve (the SLO plot's points), one line per configuration, rates ascending.
  for (const config of ['coloc', 'disagg'] as const) {
    const pts = curve.filter((c) => c.config === config).sort((a, b) => a.rate - b.rate);
    const s = searches[config];
    console.log(
      `curve ${config}: ${pts.map((c) => `${c.rate}/s ${c.attainment} % (short ${c.short} %, long ${c.long} %; ${c.short_requests} short + ${c.long_requests} long, ${c.windows} window(s), ${c.seconds} s)`).join('; ')}` +
        (s ? ` -> goodput ${r4(s.rps)}/s, failed at ${s.failed ?? 'none tried'}, ${s.seconds} s of windows, stopped by the ${s.stoppedBy}` : ''),
    );
  }
  const idle = results.idle!.itl_p99_ms;
  const coloc = results.coloc!.itl_p99_ms;
  const dis = results.disagg!.itl_p99_ms;
  console.log(`targets: disagg ITL p99 ${dis} ms <= 1.5 x idle (${r1(idle * 1.5)}): ${dis <= idle * 1.5}; <= 0.2 x coloc (${r1(coloc * 0.2)}): ${dis <= coloc * 0.2}; goodput ${r4(good.disagg!)} >= 1.5 x coloc ${r4(good.coloc!)}: ${good.coloc! > 0 || good.disagg! > 0 ? good.disagg! >= 1.5 * good.coloc! : 'n/a (neither met the SLO at any rate tried)'}`);
  console.log(
    JSON.stringify({
      bench: 'disagg',
      idle_itl_p99_ms: idle,
      coloc_itl_p99_ms: coloc,
      disagg_itl_p99_ms: dis,
      coloc_goodput_rps: r4(good.coloc!),
      disagg_goodput_rps: r4(good.disagg!),
      long_ttft_p50_ms: results.disagg!.long_ttft_p50_ms,
    }),
  );
}

/**
 * `--probe CONFIG@RATE[xSECONDS]` (e.g. `disagg@0.7x30`): one Poisson window of that configuration
 * at that long-prompt rate (seed of repeat 0), with the decoder's own figures: for looking into a
 * probe of the goodput search (e.g. under `--cpu-prof`) without running the whole bench.
 */
async function probeOnly(arg: string | undefined, logRoot: string): Promise<void> {
  const m = /^(disagg|coloc)@([\d.]+)(?:x(\d+))?$/.exec(arg ?? '');
  if (!m) throw new Error(`--probe: expected CONFIG@RATE[xSECONDS] with CONFIG disagg or coloc (e.g. disagg@0.7x30), found ${JSON.stringify(arg ?? '')}`);
  const name = m[1] as 'disagg' | 'coloc';
  const rate = Number(m[2]);
  if (!(rate > 0)) throw new Error(`--probe: the rate must be a positive number of long prompts per second, found ${m[2]}`);
  const seconds = m[3] ? Number(m[3]) : probeSeconds(rate);
  const args = name === 'disagg' ? ['--prefillers', '1', '--decoders', '1', '--routing', 'kv-aware'] : ['--prefillers', '0', '--decoders', '2'];
  const dep = await up(args, logRoot);
  try {
    await warm(dep.url);
    await settle(dep.engines);
    const before = await scrape(dep.decoder);
    const proxyBefore = await scrape(dep.url);
    const s0 = schedstat(dep.decoderPid);
    const t0 = performance.now();
    const ds = await window(dep.url, schedule(seconds, probeSeed(rate, 0), { kind: 'poisson', rate }), seconds);
    const sched = { before: s0, after: schedstat(dep.decoderPid), seconds: (performance.now() - t0) / 1000 };
    const proxyAfter = await scrape(dep.url);
    const steps = { ...stepIntervals(before, await scrape(dep.decoder), value(proxyAfter, 'kvc_proxy_nodejs_eventloop_lag_max_seconds'), sched), proxy_prefills: prefillsWhere(proxyBefore, proxyAfter) };
    const a = attainment(ds);
    console.log(`${name} @ ${rate} long/s, ${seconds} s (decoder pid ${dep.decoderPid}): attainment short ${r1(a.short * 100)} %, long ${r1(a.long * 100)} %; ${misses(ds, 'short')}; ${misses(ds, 'long')}`);
    console.log(`  ${JSON.stringify(summary(ds))}`);
    console.log(`  decoder: ${JSON.stringify(steps)}`);
    // The gaps over the SLO, with when they happened, to line up with a --cpu-prof of the decoder.
    const slow = ds.flatMap((d) => d.gaps.filter((g) => g.ms > SLO.itlP99Ms).map((g) => `${g.t.toFixed(2)}s:${r1(g.ms)}ms`));
    console.log(`  gaps over ${SLO.itlP99Ms} ms (time in window: length): ${slow.join(' ') || 'none'}`);
  } finally {
    await dep.stop();
  }
}

await main();

// `npm run soak -- --minutes N`: a 2P2D deployment (built-in model, a small CPU tier, the Redis tier
// when redis-server is installed) under mixed load through the proxy for N minutes, with one fault
// a minute, in turn: process faults (kill -9 + restart of a prefiller, of a decoder, of the
// controller; SIGSTOP of a decoder for 5 s) and, when this machine can run network namespaces
// (root, iproute2, python3, /dev/net/tun), network faults on the hosts' links between them (50 ms
// delay, 3 % loss, a 4 Mbit/s cap, partitions of a prefiller's host and of the Redis host healed
// after seconds; bench/_soak_targets.ts). Without namespaces it runs on loopback and its first line
// and its verdict say why there are no network faults.
//
// The load is open at a fixed rate by default (--rate arrivals a minute, Poisson; at most
// --max-in-flight outstanding, arrivals beyond shed and counted: harness/rate_load.ts), so every
// minute carries the same load and memory is compared at equal load; --closed C runs C clients
// each sending its next request when its last ends instead (the rate then follows the CPU the
// deployment gets: a capacity probe, not a memory verdict).
//
// Every minute it prints the arrivals, answers by status, lost and shed, TTFT p50/p99, the load
// average, every process's RSS and cache bytes, and where each process's memory is (anonymous,
// file-backed, malloc's brk heap, V8 heap in use, V8 young generation, V8 external memory); the
// minutes also go to bench-results/soak/minutes.jsonl. Memory is judged net of the cache's own
// bytes (bench/_soak_memory.ts), sampled with the RSS. An engine whose /metrics cannot be read
// that minute (three tries) keeps its last reading if it is the same process (pid), else counts
// whole; the minute line says so and the JSON counts them (cache_readings_missed). The verdict
// compares the deployment's peak after the warm-up (the first --warmup-minutes, default 5) with
// its peak during the warm-up: flat when it grew by at most 10 %; the processes no fault restarted
// are judged the same way on their own (a restart's fresh process lowers the total). Nothing lost: every request sent
// was answered or failed with a reason within its bound (harness/load.ts LostHow says what is
// lost), no engine left with requests in flight, no transfer reservation left on a decoder. Writes
// bench-results/soak/soak.svg and ends with one JSON line.
import { appendFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { rssBytes } from '../harness/deployment.js';
import { eventually } from '../harness/faults.js';
import { startLoad, type LoadResult } from '../harness/load.js';
import { startRateLoad, type Arrivals } from '../harness/rate_load.js';
import { resultsDir, writeLinesSvg, type LineRow } from './_plot.js';
import { cacheBytes, gauge, memDetail } from './_soak_memory.js';
import { soakTarget, type Fault } from './_soak_targets.js';
import { RESERVATION_TTL_MS } from '../src/xfer/receiver.js';

/** The soak's options: flag → [default, help]; each is read from here only. */
const OPTIONS = {
  '--minutes': [1, 'minutes to run'],
  '--rate': [600, 'open load: arrivals a minute (the default load)'],
  '--max-in-flight': [64, 'open load: requests outstanding at most; arrivals beyond are shed'],
  '--arrivals': ['poisson', 'open load: poisson (seeded exponential gaps) or even'],
  '--closed': [0, 'closed load instead: this many clients, each sending its next request when its last ends'],
  '--tier-gib': [0.0625, 'CPU tier per engine (GiB; 64 MiB is full within minutes)'],
  '--long-prompt-tokens': [600, "every fifth request's new token-id prompt"],
  '--warmup-minutes': [5, 'minutes whose peak memory is the baseline (at most half the run)'],
  '--no-faults': [false, 'run the load alone'],
  '--no-netns': [false, 'run on loopback (no network faults)'],
} as const;
type Option = keyof typeof OPTIONS;
const usage = () => Object.entries(OPTIONS).map(([f, [d, h]]) => `  ${f}${typeof d === 'boolean' ? '' : ` (default ${d})`}: ${h}`).join('\n');
function fail(msg: string): never {
  process.stderr.write(`soak: ${msg}\noptions:\n${usage()}\n`);
  process.exit(2);
}
const given = new Map<string, string | true>();
{
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--concurrency') fail('--concurrency is now --closed C (a closed load); the default load is open at --rate arrivals a minute');
    if (!(a in OPTIONS)) fail(`unknown argument ${a}`);
    if (given.has(a)) fail(`${a} given twice`);
    if (typeof OPTIONS[a as Option][0] === 'boolean') given.set(a, true);
    else if (i + 1 >= argv.length || argv[i + 1]!.startsWith('--')) fail(`${a} expects a value`);
    else given.set(a, argv[++i]!);
  }
}
function num(name: Option, opts: { integer?: boolean; zero?: boolean } = {}): number {
  const raw = given.get(name);
  if (raw === undefined) return OPTIONS[name][0] as number;
  const v = Number(raw);
  if (!Number.isFinite(v) || v < 0 || (v === 0 && !opts.zero) || (opts.integer && !Number.isInteger(v))) {
    fail(`${name} expects a ${opts.integer ? 'whole ' : ''}number ${opts.zero ? '≥ 0' : '> 0'}, found ${raw}`);
  }
  return v;
}
const minutes = num('--minutes', { integer: true });
const closed = num('--closed', { integer: true, zero: true });
if (closed > 0 && (given.has('--rate') || given.has('--max-in-flight') || given.has('--arrivals'))) fail('--closed runs a closed load: --rate, --max-in-flight and --arrivals are for the open one');
const rate = num('--rate');
const maxInFlight = num('--max-in-flight', { integer: true });
const arrivals = (given.get('--arrivals') ?? OPTIONS['--arrivals'][0]) as string;
if (arrivals !== 'poisson' && arrivals !== 'even') fail(`--arrivals expects poisson or even, found ${arrivals}`);
const tierGib = num('--tier-gib');
const longPromptTokens = num('--long-prompt-tokens', { integer: true });
const warmup = Math.min(num('--warmup-minutes', { integer: true }), Math.floor(minutes / 2));
const faults = !given.has('--no-faults');
const MINUTE_MS = Number(process.env.KVC_SOAK_MINUTE_MS ?? 60_000);
const GROWTH_LIMIT = 0.1;
/** Each request's bound: unanswered by then, it is lost. */
const REQUEST_BOUND_MS = 120_000;
const MiB = 1048576;
const TRANSFER_OUTCOMES = ['done', 'failed', 'abandoned'] as const;

function pct(sorted: number[], p: number): number {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

/** The open or the closed load, seen the same way by the minutes. */
interface SoakLoad {
  results: LoadResult[];
  /** When each shed arrival came (the closed load sheds none). */
  shed: number[];
  offered(): number;
  inFlight(): number;
  peakInFlight(): number;
  lateMs(): number;
  stop(): Promise<LoadResult[]>;
}

async function main(): Promise<void> {
  const target = await soakTarget(
    { upArgs: ['--max-local-cpu-size', String(tierGib), '--chunk-size', '64'], networkFaultMs: Math.min(20_000, MINUTE_MS / 3), partitionMs: Math.min(5_000, MINUTE_MS / 6) },
    !given.has('--no-netns'),
  );
  const network = typeof target.networkFaults === 'string' ? [] : target.networkFaults;
  const noNetwork = typeof target.networkFaults === 'string' ? target.networkFaults : null;
  // Alternate process and network faults, so each kind comes round every few minutes.
  const schedule: Fault[] = [];
  for (let i = 0; i < Math.max(target.processFaults.length, network.length); i++) {
    if (target.processFaults[i]) schedule.push(target.processFaults[i]!);
    if (network[i]) schedule.push(network[i]!);
  }
  const loadWhat = closed > 0 ? `closed load of ${closed} clients` : `open load of ${rate} requests a minute (${arrivals}, at most ${maxInFlight} in flight, arrivals beyond shed)`;
  console.log(
    `soak: ${minutes} min (warm-up ${warmup}), 2P2D, ${loadWhat}, every fifth a new ${longPromptTokens}-token prompt, each bounded by ${REQUEST_BOUND_MS / 1000} s; CPU tier ${tierGib} GiB per engine, ` +
      `faults ${faults ? `on (${schedule.length} in turn, one a minute)` : 'off'}; ${target.where}${noNetwork ? `; ${noNetwork}` : ''}; logs in ${target.logDir}`,
  );
  const loadOptions = { timeoutMs: REQUEST_BOUND_MS, maxTokens: 8, send: target.send, longPromptTokens };
  let load: SoakLoad;
  if (closed > 0) {
    const l = startLoad(closed, loadOptions);
    load = { results: l.results, shed: [], offered: () => l.results.length + l.pending.size, inFlight: () => l.pending.size, peakInFlight: () => l.pending.size, lateMs: () => 0, stop: l.stop };
  } else {
    load = startRateLoad({ ...loadOptions, perMinute: rate, maxInFlight, arrivals: arrivals as Arrivals });
  }
  /** Per minute: process → bytes net of its cache. */
  const net: Record<string, number>[] = [];
  /** Per minute: process → its pid then (a restart changes it). */
  const pidsSeen: Record<string, number>[] = [];
  const perMinute: { minute: number; load1: number; offered: number; shed: number; requests: number; answered: number; failed_with_reason: number; lost: number; ttft_p99_ms: number; net_mib: number; rss_mib: Record<string, number>; cache_mib: Record<string, number> }[] = [];
  let seen = 0;
  let shedSeen = 0;
  let offeredSeen = 0;
  /**
   * Each engine process's (pid's) last reading of its transfer counters: a restarted decoder starts
   * them again from zero, so the run's transfers are the sum over every process of its last
   * reading (what a killed process did after its last reading is not counted).
   */
  const transfersByPid = new Map<number, Record<string, number>>();
  const readTransfers = (pid: number, text: string) => {
    if (text) transfersByPid.set(pid, Object.fromEntries(TRANSFER_OUTCOMES.map((o) => [o, gauge(text, 'kvc_xfer_transfers_total', `outcome="${o}"`)])));
  };
  /** Each engine's last cache reading, with the pid it was read from. */
  const lastCache = new Map<string, { pid: number; bytes: number }>();
  let cacheUnread = 0;
  /** /metrics, tried three times (a fault or the load can make one try fail); '' when all fail. */
  const readMetrics = async (url: string): Promise<string> => {
    for (let i = 0; i < 3; i++) {
      const t = await target.metrics(url);
      if (t !== '') return t;
      await new Promise((r) => setTimeout(r, 1_000));
    }
    return '';
  };
  // Every minute's figures, one JSON line each, for a look at where memory went.
  mkdirSync(resultsDir('soak'), { recursive: true });
  const minutesFile = join(resultsDir('soak'), 'minutes.jsonl');
  writeFileSync(minutesFile, '');
  try {
    // Minutes on the wall clock from the start: the readings at a minute's end (slow under load,
    // up to three tries per process) eat into the next minute instead of stretching the run.
    const start = Date.now();
    for (let m = 0; m < minutes; m++) {
      const end = start + (m + 1) * MINUTE_MS;
      const fault = faults ? schedule[m % schedule.length]! : null;
      // The fault lands a third into the minute, so its effect shows in this minute's line.
      const faultRun = fault ? new Promise((r) => setTimeout(r, Math.max(0, end - (2 * MINUTE_MS) / 3 - Date.now()))).then(fault.run) : Promise.resolve();
      await new Promise((r) => setTimeout(r, Math.max(0, end - Date.now())));
      await faultRun;
      const batch: LoadResult[] = load.results.slice(seen);
      seen = load.results.length;
      const shed = load.shed.length - shedSeen;
      shedSeen = load.shed.length;
      const offered = load.offered() - offeredSeen;
      offeredSeen += offered;
      const byStatus: Record<string, number> = {};
      const lostHow: Record<string, number> = {};
      for (const r of batch) {
        byStatus[r.status] = (byStatus[r.status] ?? 0) + 1;
        if (r.lost) lostHow[r.lost] = (lostHow[r.lost] ?? 0) + 1;
      }
      const lost = batch.filter((r) => r.lost).length;
      const answered = batch.filter((r) => !r.lost && r.status === 200).length;
      const ttft = batch.filter((r) => !r.lost && r.status === 200).map((r) => r.ttftMs).sort((a, b) => a - b);
      const rssNow: Record<string, number> = {};
      const cacheNow: Record<string, number> = {};
      const netNow: Record<string, number> = {};
      const detailNow: Record<string, Record<string, number>> = {};
      const unreadNow: string[] = [];
      for (const [name, pid] of target.pids()) {
        const url = target.metricsUrls.get(name);
        const text = url ? await readMetrics(url) : '';
        const engine = target.engines.some((e) => e.name === name);
        let cache = engine ? cacheBytes(text) : 0;
        if (engine && text === '') {
          // Unreadable this minute (cut off by a fault, stopped, or too slow under load): an unread
          // cache is not an empty one. The same process (same pid) holds what it held at its last
          // reading, since a tier full from the first minutes stays full; a process restarted and
          // never read counts whole.
          const known = lastCache.get(name);
          cache = known && known.pid === pid ? known.bytes : 0;
          unreadNow.push(known && known.pid === pid ? name : `${name} (new process: counted whole)`);
          cacheUnread++;
        } else if (engine) {
          lastCache.set(name, { pid, bytes: cache });
          readTransfers(pid, text);
        }
        const b = rssBytes(pid);
        rssNow[name] = Math.round(b / MiB);
        if (engine) cacheNow[name] = Math.round(cache / MiB);
        netNow[name] = Math.max(0, b - cache);
        detailNow[name] = memDetail(pid, text);
      }
      net.push(netNow);
      pidsSeen.push(Object.fromEntries(target.pids()));
      const line = {
        minute: m + 1,
        fault: fault?.what ?? null,
        load1: Math.round(loadavg()[0]! * 10) / 10,
        offered,
        shed,
        in_flight: load.inFlight(),
        peak_in_flight: load.peakInFlight(),
        generator_late_ms: Math.round(load.lateMs()),
        requests: batch.length,
        answered,
        failed_with_reason: batch.length - answered - lost,
        lost,
        lost_by_how: lostHow,
        by_status: byStatus,
        ttft_p50_ms: Math.round(pct(ttft, 50)),
        ttft_p99_ms: Math.round(pct(ttft, 99)),
        rss_mib: rssNow,
        cache_mib: cacheNow,
        net_mib: Math.round(Object.values(netNow).reduce((x, v) => x + v, 0) / MiB),
        cache_unread: unreadNow,
        memory_mib: detailNow,
      };
      perMinute.push(line);
      appendFileSync(minutesFile, JSON.stringify(line) + '\n');
      console.log(
        `minute ${m + 1} (load ${line.load1}): ${offered} arrived, ${shed} shed, ${batch.length} ended: status ${Object.entries(byStatus).map(([s, n]) => `${s}×${n}`).join(' ')}, lost ${lost}${lost ? ` (${Object.entries(lostHow).map(([h, n]) => `${h} ${n}`).join(', ')})` : ''}; ` +
          `in flight ${line.in_flight} (peak ${line.peak_in_flight}); TTFT p50 ${line.ttft_p50_ms} ms p99 ${line.ttft_p99_ms} ms; net of cache ${line.net_mib} MiB; ` +
          `RSS MiB ${Object.entries(rssNow).map(([k, v]) => `${k} ${v}${k in cacheNow ? ` (cache ${cacheNow[k]}${unreadNow.includes(k) ? ', unread: last reading' : unreadNow.some((u) => u.startsWith(`${k} `)) ? ', unread: new process, counted whole' : ''})` : ''}`).join(', ')}${fault ? `; fault: ${fault.what}` : ''}`,
      );
      console.log(`  memory MiB: ${Object.entries(detailNow).map(([k, d]) => `${k} ${Object.entries(d).map(([f, v]) => `${f} ${v}`).join(' ')}`).join('; ')}`);
    }
  } finally {
    await load.stop();
  }
  // Nothing lost: every request sent answered or failed with a reason within its bound, no engine
  // left holding requests, no reservation left. The requests still out when the minutes ended
  // finished (each within its bound) in load.stop() and are counted here.
  const lostByHow: Record<string, number> = {};
  const errors: Record<string, number> = {};
  for (const r of load.results) {
    if (r.lost) lostByHow[r.lost] = (lostByHow[r.lost] ?? 0) + 1;
    if (r.status !== 200) errors[r.status] = (errors[r.status] ?? 0) + 1;
  }
  const lost = load.results.filter((r) => r.lost).length;
  const lostExamples = load.results.filter((r) => r.lost).slice(0, 5).map((r) => `${r.lost} after ${Math.round(r.ttftMs)} ms: ${r.error ?? ''}`.slice(0, 200));
  let leftInFlight = 0;
  let leakedReservations = 0;
  // A decoder may hold a reservation for a request whose decode never reached it (its client went
  // away during the prefill). Nothing takes such a reservation, and the receiver's sweep frees it
  // after RESERVATION_TTL_MS: only one still held past that bound is leaked.
  let reservationsAtStop = 0;
  for (const e of target.engines) reservationsAtStop += gauge(await readMetrics(e.http), 'kvc_xfer_reservations');
  const stopped = Date.now();
  for (const e of target.engines) {
    await eventually(async () => {
      const t = await target.metrics(e.http);
      return t !== '' && gauge(t, 'kvc_engine_num_requests_running') + gauge(t, 'kvc_engine_num_requests_waiting') + gauge(t, 'kvc_xfer_reservations') === 0;
    }, Math.max(0, RESERVATION_TTL_MS + 15_000 - (Date.now() - stopped)));
    const t = await target.metrics(e.http);
    if (t === '') {
      leftInFlight += 1; // an engine that cannot answer at the end is counted as holding work
      continue;
    }
    leftInFlight += gauge(t, 'kvc_engine_num_requests_running') + gauge(t, 'kvc_engine_num_requests_waiting');
    leakedReservations += gauge(t, 'kvc_xfer_reservations');
    const pid = target.pids().get(e.name);
    if (pid !== undefined) readTransfers(pid, t);
  }
  const transfers = Object.fromEntries(TRANSFER_OUTCOMES.map((o) => [o, [...transfersByPid.values()].reduce((x, r) => x + r[o]!, 0)]));
  const settledS = Math.round((Date.now() - stopped) / 1000);
  await target.stop();

  // Memory net of cache: the deployment's total per minute; the warm-up's peak against the peak after it.
  const growthOf = (xs: number[]) => {
    const b = warmup > 0 ? Math.max(...xs.slice(0, warmup)) : xs[0] ?? 0;
    const l = xs.length > warmup ? Math.max(...xs.slice(warmup)) : b;
    return { base: b, later: l, growth: b > 0 ? l / b - 1 : 0 };
  };
  const total = net.map((m) => Object.values(m).reduce((s, v) => s + v, 0));
  const { base, later, growth } = growthOf(total);
  // A fault's restart gives the killed process a fresh, smaller memory, which lowers the
  // deployment's total and can hide growth elsewhere: the processes that ran the whole soak as one
  // process (the same pid every minute) are judged on their own as well.
  const steady = Object.keys(net[0] ?? {}).filter((name) => pidsSeen.every((p) => p[name] === pidsSeen[0]![name]));
  const steadyGrowth = growthOf(net.map((m) => steady.reduce((s, n) => s + (m[n] ?? 0), 0))).growth;
  const byProcess: Record<string, number> = {};
  for (const name of Object.keys(net[0] ?? {})) byProcess[name] = Math.round(growthOf(net.map((m) => m[name] ?? 0)).growth * 1000) / 10;
  const loads = perMinute.map((p) => p.load1).sort((a, b) => a - b);

  const rows: LineRow[] = [];
  for (const p of perMinute) {
    const x = p.minute;
    rows.push({ panel: 'RSS (MiB)', series: 'all processes', x, value: Object.values(p.rss_mib).reduce((s, v) => s + v, 0) });
    rows.push({ panel: 'cache bytes (MiB: CPU tiers, resident paged KV, held receive buffers)', series: 'all engines', x, value: Object.values(p.cache_mib).reduce((s, v) => s + v, 0) });
    rows.push({ panel: 'RSS net of cache (MiB)', series: 'all processes', x, value: p.net_mib });
    rows.push({ panel: 'TTFT p99 (ms)', series: 'proxy clients', x, value: Number.isFinite(p.ttft_p99_ms) ? p.ttft_p99_ms : 0 });
    rows.push({ panel: 'requests per minute', series: 'answered', x, value: p.answered });
    rows.push({ panel: 'errors per minute', series: 'failed with a reason', x, value: p.failed_with_reason });
    rows.push({ panel: 'errors per minute', series: 'lost', x, value: p.lost });
    rows.push({ panel: 'errors per minute', series: 'shed (not sent)', x, value: p.shed });
  }
  const svg = await writeLinesSvg(join(resultsDir('soak'), 'soak.svg'), `soak: ${minutes} min, 2P2D, ${closed > 0 ? `closed load, ${closed} clients` : `${rate} requests a minute`}, faults ${faults ? 'on' : 'off'}${noNetwork ? ' (no network faults)' : ''}`, rows, 'minute');
  console.log(`plot: ${svg}`);
  const shedTotal = load.shed.length;
  console.log(
    JSON.stringify({
      bench: 'soak',
      minutes,
      warmup_minutes: warmup,
      load: closed > 0 ? { kind: 'closed', clients: closed } : { kind: 'open', per_minute: rate, arrivals, max_in_flight: maxInFlight },
      tier_gib: tierGib,
      faults,
      network_faults: faults && !noNetwork,
      ...(noNetwork ? { network_faults_reason: noNetwork } : {}),
      load_average: { min: loads[0], median: pct(loads, 50), max: loads[loads.length - 1] },
      offered: load.offered(),
      shed: shedTotal,
      requests: load.results.length,
      answered: load.results.filter((r) => !r.lost && r.status === 200).length,
      errors_by_status: errors,
      lost,
      lost_by_how: lostByHow,
      ...(lost ? { lost_examples: lostExamples } : {}),
      left_in_flight: leftInFlight,
      reservations_at_stop: reservationsAtStop,
      leaked_reservations: leakedReservations,
      settled_after_s: settledS,
      transfers_by_outcome: transfers,
      memory_net_of_cache_mib: { warmup_peak: Math.round(base / MiB), after_peak: Math.round(later / MiB) },
      memory_growth_pct: Math.round(growth * 1000) / 10,
      cache_readings_missed: cacheUnread,
      memory_growth_pct_by_process: byProcess,
      never_restarted: steady,
      memory_growth_pct_never_restarted: Math.round(steadyGrowth * 1000) / 10,
      memory_flat_never_restarted: steadyGrowth <= GROWTH_LIMIT,
      memory_flat: growth <= GROWTH_LIMIT,
      ...(closed > 0 ? {} : { rate_held: shedTotal === 0 }),
      nothing_lost: lost === 0 && leftInFlight === 0 && leakedReservations === 0,
    }),
  );
}

main().catch((e) => {
  process.stderr.write(`soak: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});

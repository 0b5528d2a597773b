// `npm run soak -- --minutes N`: a 2P2D deployment (built-in model, a small CPU tier, the Redis tier
// when redis-server is installed) under steady mixed load through the proxy for N minutes, with one
// fault a minute, in turn: process faults (kill -9 + restart of a prefiller, of a decoder, of the
// controller; SIGSTOP of a decoder for 5 s) and, when this machine can run network namespaces
// (root, iproute2, python3, /dev/net/tun), network faults on the hosts' links between them (50 ms
// delay, 3 % loss, a 4 Mbit/s cap, partitions of a prefiller's host and of the Redis host healed
// after seconds; bench/_soak_targets.ts). Without namespaces it runs on loopback and its first line
// and its verdict say why there are no network faults.
//
// Every minute it prints the requests, errors by status, TTFT p50/p99, every process's RSS and
// cache bytes, and where each process's memory is (anonymous, file-backed, malloc's brk heap, V8
// heap in use, V8 external memory); the minutes also go to bench-results/soak/minutes.jsonl.
// Memory is judged net of the cache's own bytes: an engine's RSS minus its CPU tier's bytes
// (kvc_cache_bytes{location="LocalCPUBackend"}) and minus the resident part of its paged KV pool
// (kvc_engine_kv_cache_resident_bytes: pages touched once stay), sampled with the RSS, since both
// filling up to their size is the cache doing its job; the controller and the proxy count whole.
// An engine whose /metrics cannot be read that minute (three tries) keeps its last reading if it
// is the same process (pid), else counts whole; the minute line says so and the JSON counts them
// (cache_readings_missed). The verdict compares the deployment's peak after the warm-up (the first
// --warmup-minutes, default 5) with its peak during the warm-up: flat when it grew by at most
// 10 %. Nothing lost: every request answered (none hit its bound unanswered), no engine left with
// requests in flight, no transfer reservation left on a decoder. Writes
// bench-results/soak/soak.svg (RSS, cache bytes, memory net of cache, TTFT p99, errors per
// minute) and ends with one JSON line.
// Options: --minutes N (default 1), --concurrency C (default 16), --tier-gib G (the CPU tier per
// engine, default 0.0625 = 64 MiB, full within minutes), --long-prompt-tokens L (every fifth request's new prompt, default 600),
// --warmup-minutes W (default 5, at most half the run), --no-faults, --no-netns.
import { appendFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { rssBytes } from '../harness/deployment.js';
import { eventually, startLoad, type LoadResult } from '../harness/faults.js';
import { resultsDir, writeLinesSvg, type LineRow } from './_plot.js';
import { soakTarget, type Fault } from './_soak_targets.js';
import { RESERVATION_TTL_MS } from '../src/xfer/receiver.js';

function arg(name: string, def: number): number {
  const i = process.argv.indexOf(name);
  if (i < 0) return def;
  const v = Number(process.argv[i + 1]);
  if (!Number.isFinite(v) || v <= 0) {
    process.stderr.write(`soak: ${name} expects a positive number, found ${process.argv[i + 1]}\n`);
    process.exit(2);
  }
  return v;
}
const KNOWN = new Set(['--minutes', '--concurrency', '--tier-gib', '--long-prompt-tokens', '--warmup-minutes', '--no-faults', '--no-netns']);
for (const a of process.argv.slice(2)) {
  if (a.startsWith('--') && !KNOWN.has(a)) {
    process.stderr.write(`soak: unknown option ${a} (known: ${[...KNOWN].join(', ')})\n`);
    process.exit(2);
  }
}

const minutes = Math.round(arg('--minutes', 1));
const concurrency = Math.round(arg('--concurrency', 16));
const tierGib = arg('--tier-gib', 0.0625);
const longPromptTokens = Math.round(arg('--long-prompt-tokens', 600));
const warmup = Math.min(Math.round(arg('--warmup-minutes', 5)), Math.floor(minutes / 2));
const faults = !process.argv.includes('--no-faults');
const MINUTE_MS = Number(process.env.KVC_SOAK_MINUTE_MS ?? 60_000);
const GROWTH_LIMIT = 0.1;
const MiB = 1048576;

function pct(sorted: number[], p: number): number {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

/**
 * Where a process's resident memory is (MiB): anonymous and file-backed (/proc/PID/status), the
 * malloc main arena's brk heap ([heap] in /proc/PID/smaps), and for engines the V8 heap in use and
 * V8's external memory (ArrayBuffers, WASM memories) from their process metrics.
 */
function memDetail(pid: number, metrics: string): Record<string, number> {
  const out: Record<string, number> = {};
  try {
    const st = readFileSync(`/proc/${pid}/status`, 'utf8');
    for (const [k, f] of [['anon', 'RssAnon'], ['file', 'RssFile']] as const) {
      const m = new RegExp(`^${f}:\\s+(\\d+) kB`, 'm').exec(st);
      if (m) out[k] = Math.round(Number(m[1]) / 1024);
    }
    let inHeap = false;
    for (const l of readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
      if (/^[0-9a-f]+-[0-9a-f]+ /.test(l)) inHeap = l.endsWith('[heap]');
      else if (inHeap && l.startsWith('Rss:')) out.brk_heap = Math.round(Number(l.split(/\s+/)[1]) / 1024);
    }
  } catch {
    // the process is gone (a fault killed it): its figures are missing this minute
  }
  if (metrics) {
    out.js_heap_used = Math.round(gauge(metrics, 'kvc_engine_nodejs_heap_size_used_bytes') / MiB);
    out.external = Math.round(gauge(metrics, 'kvc_engine_nodejs_external_memory_bytes') / MiB);
  }
  return out;
}

function gauge(text: string, name: string, label = ''): number {
  let sum = 0;
  for (const l of text.split('\n')) if ((l.startsWith(`${name}{`) || l.startsWith(`${name} `)) && l.includes(label)) sum += Number(l.slice(l.lastIndexOf(' ') + 1));
  return sum;
}

async function main(): Promise<void> {
  const target = await soakTarget(
    { upArgs: ['--max-local-cpu-size', String(tierGib), '--chunk-size', '64'], networkFaultMs: Math.min(20_000, MINUTE_MS / 3), partitionMs: Math.min(5_000, MINUTE_MS / 6) },
    !process.argv.includes('--no-netns'),
  );
  const network = typeof target.networkFaults === 'string' ? [] : target.networkFaults;
  const noNetwork = typeof target.networkFaults === 'string' ? target.networkFaults : null;
  // Alternate process and network faults, so each kind comes round every few minutes.
  const schedule: Fault[] = [];
  for (let i = 0; i < Math.max(target.processFaults.length, network.length); i++) {
    if (target.processFaults[i]) schedule.push(target.processFaults[i]!);
    if (network[i]) schedule.push(network[i]!);
  }
  console.log(
    `soak: ${minutes} min (warm-up ${warmup}), 2P2D, ${concurrency} concurrent requests (every fifth a new ${longPromptTokens}-token prompt), CPU tier ${tierGib} GiB per engine, ` +
      `faults ${faults ? `on (${schedule.length} in turn, one a minute)` : 'off'}; ${target.where}${noNetwork ? `; ${noNetwork}` : ''}; logs in ${target.logDir}`,
  );
  const load = startLoad(target.proxy, concurrency, { timeoutMs: 120_000, maxTokens: 8, send: target.send, longPromptTokens });
  /** Per minute: process → bytes net of its cache. */
  const net: Record<string, number>[] = [];
  const perMinute: { minute: number; fault: string | null; requests: number; errors: number; by_status: Record<string, number>; ttft_p50_ms: number; ttft_p99_ms: number; rss_mib: Record<string, number>; cache_mib: Record<string, number> }[] = [];
  let seen = 0;
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
    // up to three tries per engine) eat into the next minute instead of stretching the run.
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
      const byStatus: Record<string, number> = {};
      for (const r of batch) byStatus[r.status] = (byStatus[r.status] ?? 0) + 1;
      const ttft = batch.filter((r) => r.status === 200).map((r) => r.ttftMs).sort((a, b) => a - b);
      const rssNow: Record<string, number> = {};
      const cacheNow: Record<string, number> = {};
      const netNow: Record<string, number> = {};
      const detailNow: Record<string, Record<string, number>> = {};
      const unreadNow: string[] = [];
      for (const [name, pid] of target.pids()) {
        const engine = target.engines.find((e) => e.name === name);
        const text = engine ? await readMetrics(engine.http) : '';
        // The cache's own bytes: the CPU tier's and the resident part of the paged KV pool.
        let cache = gauge(text, 'kvc_cache_bytes', 'location="LocalCPUBackend"') + gauge(text, 'kvc_engine_kv_cache_resident_bytes');
        if (engine && text === '') {
          // Unreadable this minute (cut off by a fault, stopped, or too slow under load): an unread
          // cache is not an empty one. The same process (same pid) holds what it held at its last
          // reading, since a tier full from the first minutes stays full; a process restarted and
          // never read counts whole.
          const known = lastCache.get(name);
          cache = known && known.pid === pid ? known.bytes : 0;
          unreadNow.push(known && known.pid === pid ? name : `${name} (new process: counted whole)`);
          cacheUnread++;
        } else if (engine) lastCache.set(name, { pid, bytes: cache });
        const b = rssBytes(pid);
        rssNow[name] = Math.round(b / MiB);
        if (engine) cacheNow[name] = Math.round(cache / MiB);
        netNow[name] = Math.max(0, b - cache);
        detailNow[name] = memDetail(pid, text);
      }
      net.push(netNow);
      const line = { minute: m + 1, fault: fault?.what ?? null, requests: batch.length, errors: batch.filter((r) => r.status !== 200).length, by_status: byStatus, ttft_p50_ms: Math.round(pct(ttft, 50)), ttft_p99_ms: Math.round(pct(ttft, 99)), rss_mib: rssNow, cache_mib: cacheNow, cache_unread: unreadNow, memory_mib: detailNow };
      perMinute.push(line);
      appendFileSync(minutesFile, JSON.stringify(line) + '\n');
      console.log(
        `minute ${m + 1}: ${batch.length} requests, status ${Object.entries(byStatus).map(([s, n]) => `${s}×${n}`).join(' ')}, TTFT p50 ${line.ttft_p50_ms} ms p99 ${line.ttft_p99_ms} ms; ` +
          `RSS MiB ${Object.entries(rssNow).map(([k, v]) => `${k} ${v}${k in cacheNow ? ` (cache ${cacheNow[k]}${unreadNow.includes(k) ? ', unread: last reading' : unreadNow.some((u) => u.startsWith(`${k} `)) ? ', unread: new process, counted whole' : ''})` : ''}`).join(', ')}${fault ? `; fault: ${fault.what}` : ''}`,
      );
      console.log(`  memory MiB: ${Object.entries(detailNow).map(([k, d]) => `${k} ${Object.entries(d).map(([f, v]) => `${f} ${v}`).join(' ')}`).join('; ')}`);
    }
  } finally {
    await load.stop();
  }
  // Nothing lost: every request answered, no engine left holding requests, no reservation left.
  const unanswered = load.results.filter((r) => r.status === 0).length;
  const errors: Record<string, number> = {};
  for (const r of load.results) if (r.status !== 200) errors[r.status] = (errors[r.status] ?? 0) + 1;
  let leftInFlight = 0;
  let leakedReservations = 0;
  const transfers: Record<string, number> = { done: 0, failed: 0, abandoned: 0 };
  // Stopping the load aborts the requests in flight; a decoder may hold a reservation for one whose
  // decode never reached it (its client went away during the prefill). Nothing takes such a
  // reservation, and the receiver's sweep frees it after RESERVATION_TTL_MS: only one still held
  // past that bound is leaked.
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
    for (const o of Object.keys(transfers)) transfers[o]! += gauge(t, 'kvc_xfer_transfers_total', `outcome="${o}"`);
  }
  const settledS = Math.round((Date.now() - stopped) / 1000);
  await target.stop();

  // Memory net of cache: the deployment's total per minute; the warm-up's peak against the peak after it.
  const total = net.map((m) => Object.values(m).reduce((s, v) => s + v, 0));
  const base = warmup > 0 ? Math.max(...total.slice(0, warmup)) : total[0] ?? 0;
  const later = total.length > warmup ? Math.max(...total.slice(warmup)) : base;
  const growth = base > 0 ? later / base - 1 : 0;
  const byProcess: Record<string, number> = {};
  for (const name of Object.keys(net[0] ?? {})) {
    const xs = net.map((m) => m[name] ?? 0);
    const b = warmup > 0 ? Math.max(...xs.slice(0, warmup)) : xs[0]!;
    const l = xs.length > warmup ? Math.max(...xs.slice(warmup)) : b;
    byProcess[name] = Math.round((b > 0 ? l / b - 1 : 0) * 1000) / 10;
  }

  const rows: LineRow[] = [];
  for (const p of perMinute) {
    const x = p.minute;
    rows.push({ panel: 'RSS (MiB)', series: 'all processes', x, value: Object.values(p.rss_mib).reduce((s, v) => s + v, 0) });
    rows.push({ panel: 'cache bytes (MiB, CPU tiers + resident paged KV)', series: 'all engines', x, value: Object.values(p.cache_mib).reduce((s, v) => s + v, 0) });
    rows.push({ panel: 'RSS net of cache (MiB)', series: 'all processes', x, value: Math.round(total[x - 1]! / MiB) });
    rows.push({ panel: 'TTFT p99 (ms)', series: 'proxy clients', x, value: Number.isFinite(p.ttft_p99_ms) ? p.ttft_p99_ms : 0 });
    rows.push({ panel: 'errors per minute', series: 'non-200 answers', x, value: p.errors });
  }
  const svg = await writeLinesSvg(join(resultsDir('soak'), 'soak.svg'), `soak: ${minutes} min, 2P2D, ${concurrency} concurrent, faults ${faults ? 'on' : 'off'}${noNetwork ? ' (no network faults)' : ''}`, rows, 'minute');
  console.log(`plot: ${svg}`);
  console.log(
    JSON.stringify({
      bench: 'soak',
      minutes,
      warmup_minutes: warmup,
      concurrency,
      tier_gib: tierGib,
      faults,
      network_faults: faults && !noNetwork,
      ...(noNetwork ? { network_faults_reason: noNetwork } : {}),
      requests: load.results.length,
      errors_by_status: errors,
      unanswered,
      left_in_flight: leftInFlight,
      reservations_at_stop: reservationsAtStop,
      leaked_reservations: leakedReservations,
      settled_after_s: settledS,
      transfers_by_outcome: transfers,
      memory_net_of_cache_mib: { warmup_peak: Math.round(base / MiB), after_peak: Math.round(later / MiB) },
      memory_growth_pct: Math.round(growth * 1000) / 10,
      cache_readings_missed: cacheUnread,
      memory_growth_pct_by_process: byProcess,
      memory_flat: growth <= GROWTH_LIMIT,
      nothing_lost: unanswered === 0 && leftInFlight === 0 && leakedReservations === 0,
    }),
  );
}

main().catch((e) => {
  process.stderr.write(`soak: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});

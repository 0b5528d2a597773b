// `npm run soak -- --minutes N`: a 2P2D deployment (`kvc up`, built-in model) under steady mixed
// load through the proxy for N minutes, with faults injected on a schedule (one per minute, in
// turn: kill -9 + restart of a prefiller, SIGSTOP of a decoder for 5 s, kill -9 + restart of a
// decoder, kill -9 + restart of the controller). Every minute it prints the requests, errors by
// status, TTFT p50/p99 and every process's RSS. Its last line is one JSON object: whether each
// process's RSS stayed flat (the second half's peak within 25 % + 64 MiB of the first half's) and
// whether anything was lost (a request never answered, or engines left with requests in flight).
// An engine's RSS is judged net of its CPU tier (RSS − kvc_cache_bytes{location="LocalCPUBackend"}
// from its /metrics, sampled with the RSS): the tier filling up to its size (5 GiB by default under
// `kvc up`) is the cache doing its job, not a leak; what is left is the process's own memory.
// Options: --minutes N (default 1), --concurrency C (default 16), --no-faults.
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { alive, rssBytes, startDeployment, type Deployment } from '../harness/deployment.js';
import { eventually, processImage, respawn, signal, startLoad, type LoadResult } from '../harness/faults.js';

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

const minutes = arg('--minutes', 1);
const concurrency = Math.round(arg('--concurrency', 16));
const faults = !process.argv.includes('--no-faults');
const MINUTE_MS = Number(process.env.KVC_SOAK_MINUTE_MS ?? 60_000);

function pct(sorted: number[], p: number): number {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

async function engineGauge(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\d+(?:\\.\\d+)?)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

/** Bytes an engine's in-memory (CPU) tier holds now; 0 when its metrics cannot be read (a killed or stopped engine). */
async function cpuTierBytes(url: string): Promise<number> {
  try {
    const text = await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
    const m = /^kvc_cache_bytes\{[^}]*location="LocalCPUBackend"[^}]*\} (\d+(?:\.\d+)?(?:e\+?\d+)?)$/m.exec(text);
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

async function main(): Promise<void> {
  // No automatic restarts by kvc up: the schedule restarts what it kills itself.
  const dep: Deployment = await startDeployment({ prefillers: 2, decoders: 2, args: ['--max-restarts', '0'] });
  const restarted: ChildProcess[] = [];
  const restart = async (name: string, pauseMs = 0) => {
    const pid = dep.pids.get(name)!;
    const image = processImage(pid);
    signal(pid, 'SIGKILL');
    await eventually(() => !alive(pid), 10_000, 20);
    if (pauseMs) await new Promise((r) => setTimeout(r, pauseMs));
    const child = respawn(image, join(dep.logDir, `${name}.restarted.log`));
    restarted.push(child);
    dep.pids.set(name, child.pid!);
  };
  const schedule: { what: string; run: () => Promise<void> }[] = [
    { what: 'kill -9 + restart prefiller-1', run: () => restart('prefiller-1') },
    {
      what: 'SIGSTOP decoder-1 for 5 s',
      run: async () => {
        const pid = dep.pids.get('decoder-1')!;
        signal(pid, 'SIGSTOP');
        await new Promise((r) => setTimeout(r, 5_000));
        signal(pid, 'SIGCONT');
      },
    },
    { what: 'kill -9 + restart decoder-0', run: () => restart('decoder-0') },
    { what: 'kill -9 + restart controller', run: () => restart('controller', 500) },
  ];

  console.log(`soak: ${minutes} min, 2P2D, ${concurrency} concurrent requests, faults ${faults ? 'on' : 'off'}; logs in ${dep.logDir}`);
  const load = startLoad(dep.proxy, concurrency, { timeoutMs: 120_000, maxTokens: 8 });
  const rss = new Map<string, number[]>();
  const perMinute: unknown[] = [];
  let seen = 0;
  try {
    for (let m = 0; m < minutes; m++) {
      const t0 = Date.now();
      const fault = faults ? schedule[m % schedule.length]! : null;
      // The fault lands mid-minute, so its effect shows in this minute's line.
      const faultRun = fault ? new Promise((r) => setTimeout(r, MINUTE_MS / 3)).then(fault.run) : Promise.resolve();
      await new Promise((r) => setTimeout(r, Math.max(0, MINUTE_MS - (Date.now() - t0))));
      await faultRun;
      const batch: LoadResult[] = load.results.slice(seen);
      seen = load.results.length;
      const byStatus: Record<string, number> = {};
      for (const r of batch) byStatus[r.status] = (byStatus[r.status] ?? 0) + 1;
      const ttft = batch.filter((r) => r.status === 200).map((r) => r.ttftMs).sort((a, b) => a - b);
      const rssNow: Record<string, number> = {};
      const tierNow: Record<string, number> = {};
      for (const [name, pid] of dep.pids) {
        const engine = dep.engines.find((e) => e.name === name);
        const tier = engine ? await cpuTierBytes(engine.http) : 0;
        const b = rssBytes(pid);
        rssNow[name] = Math.round(b / 1048576);
        if (engine) tierNow[name] = Math.round(tier / 1048576);
        if (!rss.has(name)) rss.set(name, []);
        // Judged net of the CPU tier (see the file comment).
        rss.get(name)!.push(Math.max(0, b - tier));
      }
      const line = { minute: m + 1, fault: fault?.what ?? null, requests: batch.length, by_status: byStatus, ttft_p50_ms: Math.round(pct(ttft, 50)), ttft_p99_ms: Math.round(pct(ttft, 99)), rss_mib: rssNow, cpu_tier_mib: tierNow };
      perMinute.push(line);
      console.log(
        `minute ${m + 1}: ${batch.length} requests, status ${Object.entries(byStatus).map(([s, n]) => `${s}×${n}`).join(' ')}, TTFT p50 ${line.ttft_p50_ms} ms p99 ${line.ttft_p99_ms} ms; ` +
          `RSS MiB ${Object.entries(rssNow).map(([k, v]) => `${k} ${v}${k in tierNow ? ` (CPU tier ${tierNow[k]})` : ''}`).join(', ')}${fault ? `; fault: ${fault.what}` : ''}`,
      );
    }
  } finally {
    await load.stop();
  }
  // Nothing lost: every request answered, and no engine left holding requests.
  const unanswered = load.results.filter((r) => r.status === 0).length;
  const errors: Record<string, number> = {};
  for (const r of load.results) if (r.status !== 200) errors[r.status] = (errors[r.status] ?? 0) + 1;
  let leftInFlight = 0;
  for (const e of dep.engines) {
    await eventually(async () => (await engineGauge(e.http, 'kvc_engine_num_requests_running')) === 0, 30_000);
    leftInFlight += (await engineGauge(e.http, 'kvc_engine_num_requests_running').catch(() => NaN)) || 0;
    leftInFlight += (await engineGauge(e.http, 'kvc_engine_num_requests_waiting').catch(() => NaN)) || 0;
  }
  const flat: Record<string, boolean> = {};
  for (const [name, xs] of rss) {
    const half = Math.max(1, Math.floor(xs.length / 2));
    const first = Math.max(...xs.slice(0, half));
    const second = xs.length > 1 ? Math.max(...xs.slice(half)) : first;
    flat[name] = second <= first * 1.25 + 64 * 1048576;
  }
  for (const c of restarted) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await dep.stop();
  const rssFlat = Object.values(flat).every(Boolean);
  console.log(
    JSON.stringify({
      bench: 'soak',
      minutes,
      concurrency,
      faults,
      requests: load.results.length,
      errors_by_status: errors,
      unanswered,
      left_in_flight: leftInFlight,
      // Engines: RSS net of their CPU tier's bytes; other processes: RSS.
      rss_flat: rssFlat,
      rss_flat_by_process: flat,
      nothing_lost: unanswered === 0 && leftInFlight === 0,
    }),
  );
}

main().catch((e) => {
  process.stderr.write(`soak: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});

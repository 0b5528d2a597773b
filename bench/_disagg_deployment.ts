// The deployments of the disaggregation bench and their own view of a window: `kvc up` on a free
// port offset, the engines' and proxy's metrics, the decoder's scheduler statistics, and waiting
// for a deployment to be idle between windows.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { isPortFree } from '../src/common/ports.js';
import { r1 } from './_disagg_workload.js';

const CLI = join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'cli', 'main.js');

// ---- deployments ------------------------------------------------------------------------------
export interface Deployment {
  url: string;
  /** HTTP address of the first decoder (`decoder-0`, or `engine-0` when colocated). */
  decoder: string;
  /** Its pid (read from the deployment.json `kvc up` writes), for /proc/<pid>/schedstat. */
  decoderPid: number | null;
  /** `kvc up --log-dir` of this deployment (the proxy's log is read for backends marked down). */
  logDir: string;
  /** HTTP address of every engine (prefillers, decoders, colocated engines). */
  engines: string[];
  /** HTTP address of every engine that serves streams (decoders, or colocated engines). */
  decoders: string[];
  /** Every process of the deployment by its `kvc up` name (controller, proxy, engines), with its pid. */
  procs: { name: string; pid: number }[];
  stop(): Promise<void>;
}

/** Starts `kvc up` with `args` on a free port offset; resolves when it prints "ready". */
export async function up(args: string[], logRoot: string): Promise<Deployment> {
  for (let attempt = 0; attempt < 20; attempt++) {
    const offset = 20000 + Math.floor(Math.random() * 200) * 100;
    if (!(await isPortFree(9100 + offset, '127.0.0.1')) || !(await isPortFree(7100 + offset, '127.0.0.1'))) continue;
    const logDir = join(logRoot, `up-${offset}`);
    const child: ChildProcess = spawn(process.execPath, [CLI, 'up', ...args, '--port-offset', String(offset), '--log-dir', logDir], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env },
    });
    let out = '';
    const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
    const ready = await new Promise<string | null>((res) => {
      const timer = setTimeout(() => res(null), 180_000);
      const onData = (d: Buffer) => {
        out += d.toString();
        const m = /endpoint: (http:\/\/[\d.]+:\d+)\/v1/.exec(out);
        if (m) {
          clearTimeout(timer);
          res(m[1]!);
        }
      };
      child.stdout!.on('data', onData);
      child.stderr!.on('data', onData);
      void exited.then(() => {
        clearTimeout(timer);
        res(null);
      });
    });
    const stop = async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 30_000);
        await exited;
        clearTimeout(t);
      }
    };
    if (ready) {
      process.on('exit', () => child.exitCode === null && child.kill('SIGKILL'));
      // The first decoder's HTTP port is 7200 + offset (docs/proxy.md), engine-0 too when colocated.
      let decoderPid: number | null = null;
      const engines: string[] = [];
      const decoders: string[] = [];
      let procs: { name: string; pid: number }[] = [];
      try {
        procs = (JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number }[] }).processes.map((p) => ({ name: p.name, pid: p.pid }));
        decoderPid = procs.find((p) => p.name === 'decoder-0' || p.name === 'engine-0')?.pid ?? null;
        // Prefillers listen on 7100 + i, decoders and colocated engines on 7200 + i (+ offset).
        for (const p of procs) {
          const m = /^(prefiller|decoder|engine)-(\d+)$/.exec(p.name);
          if (!m) continue;
          engines.push(`http://127.0.0.1:${(m[1] === 'prefiller' ? 7100 : 7200) + Number(m[2]) + offset}`);
          if (m[1] !== 'prefiller') decoders.push(engines[engines.length - 1]!);
        }
      } catch {
        /* no pid: the run-queue figures are reported as null; no engine list: windows do not wait to settle */
      }
      return { url: ready, decoder: `http://127.0.0.1:${7200 + offset}`, decoderPid, logDir, engines, decoders, procs, stop };
    }
    await stop();
    // Another program may take a port between the check and the start: try another offset.
    if (!/already in use|EADDRINUSE/.test(out)) throw new Error(`kvc up ${args.join(' ')} did not start:\n${out.slice(-3000)}`);
  }
  throw new Error('no free port offset found for kvc up');
}

// ---- the decoder's own view -------------------------------------------------------------------
/** The Prometheus text of a process's /metrics ('' if unreadable: reported as no data). */
export async function scrape(base: string): Promise<string> {
  try {
    const res = await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(10_000) });
    return res.status === 200 ? await res.text() : '';
  } catch {
    return '';
  }
}

/** Cumulative buckets (le → count) of one histogram, summed over its label sets (e.g. GC kinds). */
export function histogram(text: string, name: string): Map<number, number> {
  const out = new Map<number, number>();
  const re = new RegExp(`^${name}_bucket\\{[^}]*le="([^"]+)"[^}]*\\} (\\d+)`, 'gm');
  for (const m of text.matchAll(re)) {
    const le = m[1] === '+Inf' ? Infinity : Number(m[1]);
    out.set(le, (out.get(le) ?? 0) + Number(m[2]));
  }
  return out;
}

/** The value of a gauge or counter with a single label set (NaN if absent). */
export function value(text: string, name: string): number {
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? ([\\d.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

/** A counter's values per value of one label, summed over the other labels. */
function counterBy(text: string, name: string, label: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const m of text.matchAll(new RegExp(`^${name}\\{([^}]*)\\} ([\\d.e+-]+)$`, 'gm'))) {
    const v = new RegExp(`${label}="([^"]*)"`).exec(m[1]!)?.[1];
    if (v !== undefined) out.set(v, (out.get(v) ?? 0) + Number(m[2]));
  }
  return out;
}

/**
 * Where the proxy had prompts prefilled during a window (`remote`: a prefiller; `local_*`: the
 * decoder itself, and why): a long prompt prefilled on the decoder stalls its streams.
 */
export function prefillsWhere(beforeText: string, afterText: string): Record<string, number> {
  const before = counterBy(beforeText, 'kvc_proxy_prefills_total', 'where');
  const out: Record<string, number> = {};
  for (const [k, v] of counterBy(afterText, 'kvc_proxy_prefills_total', 'where')) if (v - (before.get(k) ?? 0) > 0) out[k] = v - (before.get(k) ?? 0);
  return out;
}

/** Sum of a histogram's _sum over its label sets. */
function histogramSum(text: string, name: string): number {
  let sum = 0;
  for (const m of text.matchAll(new RegExp(`^${name}_sum(?:\\{[^}]*\\})? ([\\d.e+-]+)$`, 'gm'))) sum += Number(m[1]);
  return sum;
}

/**
 * The kernel's scheduler statistics of a process: seconds it ran on a CPU and seconds it was
 * runnable but waited for one (/proc/<pid>/schedstat). The wait says how much of a stall other
 * programs on the same CPUs caused, which no change to the engine can remove.
 */
export function schedstat(pid: number | null): { run: number; wait: number } | null {
  if (pid === null) return null;
  try {
    const [run, wait] = readFileSync(`/proc/${pid}/schedstat`, 'utf8').trim().split(/\s+/).map(Number);
    return { run: run! / 1e9, wait: wait! / 1e9 };
  } catch {
    return null;
  }
}

/**
 * What the decoder itself saw during a window: how many intervals between its decode steps there
 * were, how many exceeded 50 ms and 100 ms, and the bucket bounds under which 99 % and all fell. A stall the
 * clients saw that is missing here happened after the engine (HTTP, proxy, the client's reads).
 */
export function stepIntervals(
  beforeText: string,
  afterText: string,
  proxyLagMaxS: number,
  sched: { before: ReturnType<typeof schedstat>; after: ReturnType<typeof schedstat>; seconds: number },
) {
  const name = 'kvc_engine_decode_step_interval_seconds';
  const before = histogram(beforeText, name);
  const after = histogram(afterText, name);
  const d = (le: number) => (after.get(le) ?? 0) - (before.get(le) ?? 0);
  const total = d(Infinity);
  const bounds = [...after.keys()].sort((a, b) => a - b);
  const p99 = bounds.find((le) => d(le) >= 0.99 * total);
  const max = bounds.find((le) => d(le) >= total);
  const ms = (le: number | undefined) => (le === undefined || !total ? null : le === Infinity ? 'inf' : le * 1000);
  // Garbage collection in the decoder (prom-client's default metrics: buckets 1, 10, 100 ms, …).
  const gc = 'kvc_engine_nodejs_gc_duration_seconds';
  const gcBefore = histogram(beforeText, gc);
  const gcAfter = histogram(afterText, gc);
  const g = (le: number) => (gcAfter.get(le) ?? 0) - (gcBefore.get(le) ?? 0);
  return {
    intervals: total,
    over_50ms: total - d(0.05),
    over_100ms: total - d(0.1),
    p99_le_ms: ms(p99),
    max_le_ms: ms(max),
    gc_pauses: g(Infinity),
    gc_over_10ms: g(Infinity) - g(0.01),
    gc_total_ms: r1((histogramSum(afterText, gc) - histogramSum(beforeText, gc)) * 1000),
    // Longest event-loop delay since the previous scrape (prom-client resets it per collection).
    event_loop_lag_max_ms: r1(value(afterText, 'kvc_engine_nodejs_eventloop_lag_max_seconds') * 1000),
    proxy_event_loop_lag_max_ms: r1(proxyLagMaxS * 1000),
    // Share of the window the decoder ran on a CPU, and waited runnable for one (machine load).
    cpu_share: sched.before && sched.after ? r1((100 * (sched.after.run - sched.before.run)) / sched.seconds) / 100 : null,
    runqueue_wait_share: sched.before && sched.after ? r1((100 * (sched.after.wait - sched.before.wait)) / sched.seconds) / 100 : null,
  };
}

/**
 * How many times the proxy has marked a backend down so far (its log lines): a prefiller marked
 * down while busy sends its long prompts to the decoder, the stall disaggregation must not have.
 */
export function markedDown(logDir: string): number {
  try {
    return (readFileSync(join(logDir, 'proxy.log'), 'utf8').match(/ marked down: /g) ?? []).length;
  } catch {
    return 0;
  }
}

/** Longest wait for a deployment to finish the work of the previous window (s). */
const SETTLE_MAX_S = 30;

/**
 * Waits until no engine has a request running or queued (requests cut at a window's drain deadline
 * are cancelled through the proxy, but a long prefill may still be finishing), at most SETTLE_MAX_S:
 * each window starts from an idle deployment, so one window's backlog does not fail the next.
 */
export async function settle(engines: string[]): Promise<void> {
  const t0 = performance.now();
  while (performance.now() - t0 < SETTLE_MAX_S * 1000) {
    let busy = 0;
    for (const e of engines) {
      const text = await scrape(e);
      busy += (value(text, 'kvc_engine_num_requests_running') || 0) + (value(text, 'kvc_engine_num_requests_waiting') || 0);
    }
    if (busy === 0) return;
    await new Promise((r) => setTimeout(r, 250));
  }
  console.log(`  (the deployment still had requests in flight ${SETTLE_MAX_S} s after the window: the next window starts anyway)`);
}

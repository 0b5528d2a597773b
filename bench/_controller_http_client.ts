// The load generator of the controller benchmark's HTTP lookups (bench/controller.ts part (b)), in a
// process of its own with nothing else on its heap. Before it had its own process, the timing loop
// ran in the benchmark's main process, which also held the in-process controller with its 1.2M
// indexed keys and the ingest's frames: the client's own scavenges and mark-compacts (with a large
// old generation) landed inside timed requests and were counted as the controller's latency.
//
// It measures the product's path unchanged: each request travels over HTTP (undici, one
// keep-alive connection per variant) to a controller process, with the same body the proxy sends.
// Per timed request it also records whether one of ITS OWN GCs (PerformanceObserver 'gc' entries)
// overlapped it, and over the timed rounds the run-queue wait (/proc/<pid>/schedstat, field 2) of
// itself and of each controller process, so that a slow request can be told apart as the
// client's GC, a wait for a CPU, or the controller's work (the controller's own
// onRequest→onResponse histogram, read by the parent from /metrics).
//
// Usage (by bench/controller.ts): node --expose-gc _controller_http_client.js '<Config JSON>'
// Prints `warm` after its warm-up requests, waits for a line on stdin, times, prints one JSON
// line (ClientResult) and exits.
import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import { PerformanceObserver } from 'node:perf_hooks';
import { Agent, request } from 'undici';
import { encodeTokenBody, TOKEN_BODY_CONTENT_TYPE } from '../src/protocol/token_body.js';

export interface ClientKind {
  name: string;
  url: string;
  body: 'json' | 'binary';
  /** The controller process serving it (for its run-queue wait). */
  pid: number;
}
export interface ClientConfig {
  kinds: ClientKind[];
  tokens: number;
  warmup: number;
  rounds: number;
  perRound: number;
  /** A request above this many ms counts as slow. */
  slowMs: number;
}
export interface ClientFigures {
  name: string;
  p50: number;
  p90: number;
  p99: number;
  n: number;
  /** Requests above slowMs, and how many of them overlapped one of the client's own GCs. */
  slow: number;
  slowDuringClientGc: number;
  /** Of the slow requests: how many had the client, or the controller, wait over 0.5 ms for a CPU while they ran. */
  slowClientWaited: number;
  slowControllerWaited: number;
  /** Slow requests with none of those (no client GC, neither process waited over 0.5 ms for a CPU). */
  slowOther: number;
}
export interface ClientResult {
  figs: ClientFigures[];
  clientGcs: number;
  clientGcMs: number;
  /** Run-queue wait over the timed rounds, ms: the client, and each controller pid. */
  clientRunQueueMs: number;
  controllerRunQueueMs: Record<string, number>;
}

/**
 * A process's run-queue wait read per request: the file is opened once and re-read from its start
 * (a few µs), outside each request's timing. NaN off Linux.
 */
class RunQueueProbe {
  private fd: number | null;
  private readonly buf = Buffer.alloc(128);
  constructor(pid: number | 'self') {
    try {
      this.fd = openSync(`/proc/${pid}/schedstat`, 'r');
    } catch {
      this.fd = null;
    }
  }
  ms(): number {
    if (this.fd === null) return NaN;
    const n = readSync(this.fd, this.buf, 0, this.buf.length, 0);
    return Number(this.buf.toString('latin1', 0, n).split(' ')[1]) / 1e6;
  }
  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

/** Time spent waiting on a run queue, ms (field 2 of /proc/<pid>/schedstat, ns); null off Linux. */
function runQueueMs(pid: number | 'self'): number | null {
  try {
    return Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[1]) / 1e6;
  } catch {
    return null;
  }
}

async function run(cfg: ClientConfig): Promise<ClientResult> {
  const prompt = Array.from({ length: cfg.tokens }, (_, i) => 1 + i);
  const json = JSON.stringify({ tokens: prompt });
  const bin = encodeTokenBody(prompt);
  const kinds = cfg.kinds.map((k) => ({
    ...k,
    payload: k.body === 'json' ? json : bin,
    ct: k.body === 'json' ? 'application/json' : TOKEN_BODY_CONTENT_TYPE,
    agent: new Agent({ connections: 1, keepAliveTimeout: 60_000 }),
    start: new Float64Array(cfg.rounds * cfg.perRound),
    lat: new Float64Array(cfg.rounds * cfg.perRound),
    // Run-queue wait of the client and of the controller during each timed request, ms.
    waitSelf: new Float64Array(cfg.rounds * cfg.perRound),
    waitCtl: new Float64Array(cfg.rounds * cfg.perRound),
    probe: new RunQueueProbe(k.pid),
    n: 0,
  }));
  const once = async (k: (typeof kinds)[number]) => {
    const r = await request(k.url, { method: 'POST', body: k.payload, headers: { 'content-type': k.ct }, dispatcher: k.agent });
    const j = (await r.body.json()) as { num_tokens?: number };
    if (r.statusCode !== 200 || (k.url.endsWith('/lookup') && j.num_tokens !== cfg.tokens)) throw new Error(`${k.name}: HTTP lookup sanity check failed: ${r.statusCode} ${JSON.stringify(j)}`);
  };
  for (const k of kinds) for (let i = 0; i < cfg.warmup; i++) await once(k);
  // Warmed up: the parent reads the controllers' figures, then says go (a line on stdin).
  process.stdout.write('warm\n');
  await new Promise<void>((r) => process.stdin.once('data', () => r()));
  process.stdin.pause();

  // The client's own GCs, as intervals on the performance.now() clock. Entries arrive after the
  // fact, so they are kept by time: only those inside a timed round (not the forced GC before it).
  const all: { start: number; end: number }[] = [];
  const windows: { start: number; end: number }[] = [];
  const obs = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) all.push({ start: e.startTime, end: e.startTime + e.duration });
  });
  obs.observe({ entryTypes: ['gc'] });
  const gc = (globalThis as { gc?: () => void }).gc;
  const pids = [...new Set(kinds.map((k) => k.pid))];
  const selfProbe = new RunQueueProbe('self');
  const rq0 = { self: runQueueMs('self'), ctl: pids.map((p) => runQueueMs(p)) };
  for (let round = 0; round < cfg.rounds; round++) {
    for (let j = 0; j < kinds.length; j++) {
      const k = kinds[(round + j) % kinds.length]!;
      // Each round starts from a collected client heap: no garbage of the previous round is
      // collected inside this one's requests (the forced GC itself is outside the timing).
      gc?.();
      await new Promise((r) => setImmediate(r));
      const w = { start: performance.now(), end: 0 };
      for (let i = 0; i < cfg.perRound; i++) {
        const s0 = selfProbe.ms();
        const c0 = k.probe.ms();
        const t = performance.now();
        await once(k);
        const t1 = performance.now();
        k.waitSelf[k.n] = selfProbe.ms() - s0;
        k.waitCtl[k.n] = k.probe.ms() - c0;
        k.start[k.n] = t;
        k.lat[k.n++] = t1 - t;
      }
      w.end = performance.now();
      windows.push(w);
    }
  }
  const rq1 = { self: runQueueMs('self'), ctl: pids.map((p) => runQueueMs(p)) };
  // Entries are delivered asynchronously: let the observer see the last ones.
  await new Promise((r) => setTimeout(r, 50));
  obs.disconnect();
  const gcs = all.filter((g) => windows.some((w) => g.start >= w.start && g.start < w.end));
  for (const k of kinds) await k.agent.close();

  const figs = kinds.map((k) => {
    const s = k.lat.slice(0, k.n).sort();
    const at = (p: number) => +s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!.toFixed(3);
    let slow = 0;
    let slowDuringClientGc = 0;
    let slowClientWaited = 0;
    let slowControllerWaited = 0;
    let slowOther = 0;
    for (let i = 0; i < k.n; i++) {
      if (k.lat[i]! <= cfg.slowMs) continue;
      slow++;
      const a = k.start[i]!;
      const b = a + k.lat[i]!;
      const inGc = gcs.some((g) => g.start < b && g.end > a);
      if (inGc) slowDuringClientGc++;
      if (k.waitSelf[i]! > 0.5) slowClientWaited++;
      if (k.waitCtl[i]! > 0.5) slowControllerWaited++;
      if (!inGc && k.waitSelf[i]! <= 0.5 && k.waitCtl[i]! <= 0.5) slowOther++;
    }
    k.probe.close();
    return { name: k.name, p50: at(50), p90: at(90), p99: at(99), n: k.n, slow, slowDuringClientGc, slowClientWaited, slowControllerWaited, slowOther };
  });
  const diff = (a: number | null, b: number | null) => (a === null || b === null ? NaN : +(b - a).toFixed(2));
  return {
    figs,
    clientGcs: gcs.length,
    clientGcMs: +gcs.reduce((a, g) => a + g.end - g.start, 0).toFixed(2),
    clientRunQueueMs: diff(rq0.self, rq1.self),
    controllerRunQueueMs: Object.fromEntries(pids.map((p, i) => [String(p), diff(rq0.ctl[i]!, rq1.ctl[i]!)])),
  };
}

if (!process.argv[2]) {
  process.stderr.write('usage: node --expose-gc _controller_http_client.js <config JSON>: started by bench/controller.ts, not a benchmark of its own\n');
  process.exit(2);
}
const cfg = JSON.parse(process.argv[2]) as ClientConfig;
process.stdout.write(JSON.stringify(await run(cfg)) + '\n');
process.exit(0);

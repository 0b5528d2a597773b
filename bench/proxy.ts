// `npm run bench -- proxy`
// (a) The proxy alone, against a minimal stub upstream (harness/proxy_stub.ts in its own process:
//     tokenize, prefill, decode stream with fixed small payloads): requests/s the proxy sustains
//     vs a client that drives the same three upstream calls itself, and the latency the proxy
//     adds at concurrency 1 (p50/p99 of proxy minus direct).
// (b) Real engines on the built-in model in 1P1D (`kvc up`): TTFT p50/p99 of streamed requests
//     through the proxy vs direct to one plain engine.
// (a) also runs, in the same rounds, the floor reference of bench/_proxy_floor.ts (a bare node:http
//     server making the same three calls: the least a process in the proxy's place can do):
//     floor_rps, and floor_ratio = floor_rps / direct_rps, what bounds proxy_rps / direct_rps here.
// Last line: {"bench":"proxy","proxy_rps":…,"direct_rps":…,"floor_rps":…,"floor_ratio":…,"overhead_p50_ms":…,"overhead_p99_ms":…,
//             "proxy_cpu_us_per_req":…,"ttft_proxy_p50_ms":…,"ttft_direct_p50_ms":…}
// `--stub-only` runs (a) alone and ends with {"bench":"proxy","stub_only":true,"proxy_rps":…,
// "direct_rps":…,"ratio":…,"overhead_p50_ms":…,"overhead_p99_ms":…,"proxy_cpu_us_per_req":…,
// "proxy_sys_us_per_req":…}.
// proxy_cpu_us_per_req: the proxy process's CPU time (user + system, /proc) per request, median
// of the proxy rounds.
// In (a), `--proxy-cli <path to another build's dist/src/cli/main.js>` runs that build's proxy
// instead (to compare two trees under the same bench), and `--cpu-prof-dir <dir>` has the proxy
// process write a V8 CPU profile there. (a) also prints the CPU per request of every process
// (client, stub, proxy, the proxy's kernel share apart) in both variants.
// `--stub-only --compare-cli <other build's main.js> [--rounds N]`: A/B of two proxy builds on one
// stub, rounds alternated (A B, B A, …), each one's CPU per request and req/s; ends with
// {"bench":"proxy","compare":true,"a_cpu_us_per_req","b_cpu_us_per_req","b_over_a","a_rps","b_rps"}.
// `--compare-floor` instead of `--compare-cli`: B is bench/_proxy_floor.ts, the least a process
// can do for the request (three calls, no checks or metrics): what the proxy's own work costs.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { performance } from 'node:perf_hooks';
import { Pool } from 'undici';
import { freePortRange } from '../src/common/ports.js';
import { freePortOffset } from '../src/deploy/free_offset.js';
import { percentile } from '../src/proxy/stats.js';
import { startStubEngine } from '../harness/proxy_stub.js';
import { startFloorProxy } from './_proxy_floor.js';

const here = dirname(fileURLToPath(import.meta.url));
const CLI = join(here, '..', 'src', 'cli', 'main.js');


function spawnNode(args: string[], env: NodeJS.ProcessEnv = {}): { child: ChildProcess; waitFor: (re: RegExp, ms: number) => Promise<void> } {
  const child = spawn(process.execPath, args, { env: { ...process.env, PYTHONHASHSEED: '0', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  return {
    child,
    waitFor: (re, ms) =>
      new Promise((resolve, reject) => {
        const end = Date.now() + ms;
        const tick = () => {
          if (re.test(out)) return resolve();
          if (child.exitCode !== null) return reject(new Error(`process exited: ${out.slice(-2000)}`));
          if (Date.now() > end) return reject(new Error(`timed out waiting for ${re}: ${out.slice(-2000)}`));
          setTimeout(tick, 50);
        };
        tick();
      }),
  };
}

async function stop(c: ChildProcess): Promise<void> {
  if (c.exitCode !== null || c.signalCode !== null) return;
  const gone = new Promise((r) => c.once('exit', r));
  c.kill('SIGTERM');
  const t = setTimeout(() => c.kill('SIGKILL'), 10_000);
  await gone;
  clearTimeout(t);
}

const json = (o: unknown) => ({ 'content-type': 'application/json', body: JSON.stringify(o) });

async function post(pool: Pool, path: string, body: unknown): Promise<Buffer> {
  const { 'content-type': ct, body: b } = json(body);
  const res = await pool.request({ method: 'POST', path, headers: { 'content-type': ct }, body: b, headersTimeout: 30_000, bodyTimeout: 30_000 });
  const buf = Buffer.from(await res.body.arrayBuffer());
  if (res.statusCode !== 200) throw new Error(`${path}: HTTP ${res.statusCode} ${buf.toString().slice(0, 200)}`);
  return buf;
}

/** One request as the proxy does it, driven by the client itself: tokenize, prefill, decode stream. */
async function directOnce(pool: Pool, i: number): Promise<void> {
  const prompt = `request ${i} about caches`;
  await post(pool, '/tokenize', { prompt });
  await post(pool, '/v1/completions', { prompt, max_tokens: 1, stream: false, kv_transfer_params: { disagg_spec: { req_id: `r${i}`, receiver_host: '127.0.0.1', receiver_init_port: 1, receiver_alloc_port: 2 } } });
  await post(pool, '/v1/completions', { prompt, max_tokens: 8, stream: true });
}

async function proxyOnce(pool: Pool, i: number): Promise<void> {
  await post(pool, '/v1/completions', { prompt: `request ${i} about caches`, max_tokens: 8, stream: true });
}

/** CPU time a process has used, µs, user and system, from /proc (Linux); null elsewhere. */
function processCpu(pid: number): { user: number; system: number } | null {
  try {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    // utime and stime, fields 14 and 15 of stat(5), in clock ticks of 10 ms (USER_HZ 100).
    return { user: Number(f[11]) * 10_000, system: Number(f[12]) * 10_000 };
  } catch {
    return null;
  }
}

let completed = 0;

async function throughput(fn: (i: number) => Promise<void>, concurrency: number, ms: number): Promise<number> {
  let done = 0;
  let i = 0;
  const end = performance.now() + ms;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < end) {
        await fn(i++);
        done++;
        completed++;
      }
    }),
  );
  return done / ((performance.now() - t0) / 1000);
}

/** `n` requests at concurrency 8 (or as many as fit in `capMs`). */
async function warmUp(fn: (i: number) => Promise<void>, n: number, capMs: number): Promise<void> {
  let i = 0;
  const end = performance.now() + capMs;
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (i < n && performance.now() < end) await fn(i++);
    }),
  );
}

async function latencies(fn: (i: number) => Promise<void>, n: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await fn(i);
    out.push(performance.now() - t);
  }
  return out.sort((a, b) => a - b);
}

/** Streams a completion and returns the ms until the first content event. */
async function ttft(pool: Pool, body: Record<string, unknown>): Promise<number> {
  const t = performance.now();
  const res = await pool.request({ method: 'POST', path: '/v1/completions', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }), headersTimeout: 120_000, bodyTimeout: 120_000 });
  if (res.statusCode !== 200) throw new Error(`HTTP ${res.statusCode}: ${await res.body.text()}`);
  let first = NaN;
  for await (const piece of res.body) {
    if (Number.isNaN(first) && String(piece).includes('"text"')) first = performance.now() - t;
  }
  return first;
}

async function stubPart() {
  const [stubPort, proxyPort, notifyPort] = [await freePortRange(1), await freePortRange(1), await freePortRange(1)];
  const stub = spawnNode([fileURLToPath(import.meta.url), '--stub-server', String(stubPort)]);
  // --cpu-prof-dir <dir>: the proxy process writes a V8 CPU profile there (to find its per-request cost).
  const profAt = process.argv.indexOf('--cpu-prof-dir');
  const prof = profAt > 0 ? ['--cpu-prof', '--cpu-prof-dir', process.argv[profAt + 1]!] : [];
  // --proxy-cli <main.js>: run another tree's proxy (e.g. an older build) under the same load, to compare.
  const cliAt = process.argv.indexOf('--proxy-cli');
  const cli = cliAt > 0 ? process.argv[cliAt + 1]! : CLI;
  const proxy = spawnNode([...prof, cli, 'proxy', '--port', String(proxyPort), '--prefiller-port', String(stubPort), '--decoder-port', String(stubPort),
    '--proxy-port', String(notifyPort), '--stats-interval', '3600']);
  // --compare-cli <main.js>: a second proxy, of another build, on the same stub; its rounds
  // alternate with this build's (A/B in the same minutes, so the machine's load moves both).
  const cmpAt = process.argv.indexOf('--compare-cli');
  // --compare-floor: B is the floor reference of bench/_proxy_floor.ts instead of another build.
  const floor = process.argv.includes('--compare-floor');
  const cmpPorts = cmpAt > 0 || floor ? [await freePortRange(1), await freePortRange(1)] : [];
  const other = floor
    ? spawnNode([fileURLToPath(import.meta.url), '--floor-server', String(cmpPorts[0]), String(stubPort)])
    : cmpAt > 0
      ? spawnNode([process.argv[cmpAt + 1]!, 'proxy', '--port', String(cmpPorts[0]), '--prefiller-port', String(stubPort), '--decoder-port', String(stubPort),
          '--proxy-port', String(cmpPorts[1]), '--stats-interval', '3600'])
      : null;
  let floorChild: ReturnType<typeof spawnNode> | null = null;
  try {
    if (other) {
      await stub.waitFor(/stub listening/, 20_000);
      await proxy.waitFor(/listening on/, 20_000);
      await other.waitFor(/listening on|floor listening/, 20_000);
      return await compareBuilds(proxy.child.pid!, proxyPort, other.child.pid!, cmpPorts[0]!);
    }
    // The floor reference (bench/_proxy_floor.ts: the same three calls and one answer, no checks,
    // metrics, timeouts or failover) in the same rounds: what any Node process in the proxy's
    // place reaches on this machine, next to what the proxy reaches.
    const floorPort = await freePortRange(1);
    floorChild = spawnNode([fileURLToPath(import.meta.url), '--floor-server', String(floorPort), String(stubPort)]);
    await stub.waitFor(/stub listening/, 20_000);
    await proxy.waitFor(/listening on/, 20_000);
    await floorChild.waitFor(/floor listening/, 20_000);
    const direct = new Pool(`http://127.0.0.1:${stubPort}`, { connections: 64 });
    const viaProxy = new Pool(`http://127.0.0.1:${proxyPort}`, { connections: 64 });
    const viaFloor = new Pool(`http://127.0.0.1:${floorPort}`, { connections: 64 });
    const d = (i: number) => directOnce(direct, i);
    const p = (i: number) => proxyOnce(viaProxy, i);
    const f = (i: number) => proxyOnce(viaFloor, i);
    // Warm-up by count, not time: the proxy is a fresh process whose JIT compiles its hot path
    // over its first few thousand requests (until then a request costs it 1.5-4x the CPU of later
    // ones); on a loaded machine a fixed time would cover too few of them.
    await warmUp(d, 3000, 30_000);
    await warmUp(p, 3000, 30_000);
    await warmUp(f, 3000, 30_000);
    const conc = 16;
    // Interleaved rounds, median of each: the machine's load (other processes) drifts over
    // time, and both variants should see the same drift.
    const dr: number[] = [];
    const pr: number[] = [];
    const fr: number[] = [];
    // The proxy process's CPU time per request in each proxy round: the figure that changes to
    // the per-request path move, less at the mercy of the machine's load than req/s.
    const proxyCpu: number[] = [];
    // Its kernel share (system time: the socket syscalls, loopback TCP included) apart, since
    // that part moves only with the number of reads and writes, not with the JavaScript.
    const proxySys: number[] = [];
    // Every process's CPU per request in both variants (client = this process, the stub, the
    // proxy): with all of them CPU-bound on a small machine, proxy_rps / direct_rps is about
    // (direct client + stub) / (proxied client + proxy + stub), so this says where it goes.
    const cpu = { dClient: [] as number[], dStub: [] as number[], pClient: [] as number[], pStub: [] as number[] };
    const total = (c: { user: number; system: number } | null) => (c ? c.user + c.system : NaN);
    const clientCpu = () => {
      const u = process.cpuUsage();
      return u.user + u.system;
    };
    for (let round = 0; round < 5; round++) {
      let [s0, k0, n0] = [total(processCpu(stub.child.pid!)), clientCpu(), completed];
      dr.push(await throughput(d, conc, 2000));
      cpu.dStub.push((total(processCpu(stub.child.pid!)) - s0) / (completed - n0));
      cpu.dClient.push((clientCpu() - k0) / (completed - n0));
      const c0 = processCpu(proxy.child.pid!);
      [s0, k0, n0] = [total(processCpu(stub.child.pid!)), clientCpu(), completed];
      pr.push(await throughput(p, conc, 2000));
      const c1 = processCpu(proxy.child.pid!);
      cpu.pStub.push((total(processCpu(stub.child.pid!)) - s0) / (completed - n0));
      cpu.pClient.push((clientCpu() - k0) / (completed - n0));
      if (c0 !== null && c1 !== null) {
        proxyCpu.push((c1.user + c1.system - c0.user - c0.system) / (completed - n0));
        proxySys.push((c1.system - c0.system) / (completed - n0));
      }
      fr.push(await throughput(f, conc, 2000));
    }
    const median = (a: number[]) => [...a].sort((x, y) => x - y)[a.length >> 1]!;
    const directRps = median(dr);
    const proxyRps = median(pr);
    const floorRps = median(fr);
    console.log(`  rounds (req/s) direct ${dr.map((v) => v.toFixed(0)).join(' ')} | proxy ${pr.map((v) => v.toFixed(0)).join(' ')} | floor reference ${fr.map((v) => v.toFixed(0)).join(' ')}`);
    const proxyCpuUs = proxyCpu.length ? median(proxyCpu) : NaN;
    const proxySysUs = proxySys.length ? median(proxySys) : NaN;
    if (proxyCpu.length) {
      console.log(`  proxy process CPU per request (µs, user + system): ${proxyCpu.map((v) => v.toFixed(0)).join(' ')}; median ${proxyCpuUs.toFixed(0)}`);
      console.log(`    of which system (kernel) time: ${proxySys.map((v) => v.toFixed(0)).join(' ')}; median ${proxySysUs.toFixed(0)}`);
    }
    const [dc, ds, pc, ps] = [median(cpu.dClient), median(cpu.dStub), median(cpu.pClient), median(cpu.pStub)];
    if (proxyCpu.length && Number.isFinite(ds)) {
      console.log(`  CPU per request (µs, medians): direct client ${dc.toFixed(0)} + stub ${ds.toFixed(0)} = ${(dc + ds).toFixed(0)}; ` +
        `proxied client ${pc.toFixed(0)} + proxy ${proxyCpuUs.toFixed(0)} + stub ${ps.toFixed(0)} = ${(pc + proxyCpuUs + ps).toFixed(0)}; ratio ${((dc + ds) / (pc + proxyCpuUs + ps)).toFixed(2)}`);
    }
    const ld = await latencies(d, 500);
    const lp = await latencies(p, 500);
    await direct.close();
    await viaProxy.close();
    await viaFloor.close();
    return {
      directRps,
      proxyRps,
      floorRps,
      proxyCpuUs,
      proxySysUs,
      directP50: percentile(ld, 50),
      directP99: percentile(ld, 99),
      proxyP50: percentile(lp, 50),
      proxyP99: percentile(lp, 99),
    };
  } finally {
    await stop(proxy.child);
    if (other) await stop(other.child);
    if (floorChild) await stop(floorChild.child);
    await stop(stub.child);
  }
}

/**
 * A/B of two proxy builds (`--compare-cli`): after 3,000 warm-up requests each, `rounds` pairs of
 * 2-second rounds at concurrency 16, in alternating order (A B, B A, …), each proxy's CPU per
 * request (/proc) and req/s per round; printed per round, as medians, and as the median of the
 * per-pair ratios (B / A), which the load of the minute moves least. Exits the bench after.
 */
async function compareBuilds(pidA: number, portA: number, pidB: number, portB: number): Promise<never> {
  const pools = [new Pool(`http://127.0.0.1:${portA}`, { connections: 64 }), new Pool(`http://127.0.0.1:${portB}`, { connections: 64 })];
  const fns = pools.map((pool) => (i: number) => proxyOnce(pool, i));
  const pids = [pidA, pidB];
  for (const f of fns) await warmUp(f, 3000, 60_000);
  const roundsAt = process.argv.indexOf('--rounds');
  const rounds = roundsAt > 0 ? Number(process.argv[roundsAt + 1]) : 8;
  const cpu: number[][] = [[], []];
  const sys: number[][] = [[], []];
  const rps: number[][] = [[], []];
  for (let r = 0; r < rounds; r++) {
    for (const k of r % 2 === 0 ? [0, 1] : [1, 0]) {
      const [c0, n0] = [processCpu(pids[k]!), completed];
      rps[k]!.push(await throughput(fns[k]!, 16, 2000));
      const c1 = processCpu(pids[k]!)!;
      cpu[k]!.push((c1.user + c1.system - c0!.user - c0!.system) / (completed - n0));
      sys[k]!.push((c1.system - c0!.system) / (completed - n0));
    }
  }
  const median = (a: number[]) => [...a].sort((x, y) => x - y)[a.length >> 1]!;
  const fmt = (a: number[]) => a.map((v) => v.toFixed(0)).join(' ');
  const ratios = cpu[1]!.map((b, i) => b / cpu[0]![i]!);
  const b = process.argv.includes('--compare-floor') ? 'the floor reference, bench/_proxy_floor.ts' : '--compare-cli';
  console.log(`A/B proxy builds, ${rounds} alternating pairs of 2-second rounds at concurrency 16 (A: this build, B: ${b})`);
  console.log(`  A CPU µs/request ${fmt(cpu[0]!)}; median ${median(cpu[0]!).toFixed(0)} (system ${median(sys[0]!).toFixed(0)}); req/s median ${median(rps[0]!).toFixed(0)}`);
  console.log(`  B CPU µs/request ${fmt(cpu[1]!)}; median ${median(cpu[1]!).toFixed(0)} (system ${median(sys[1]!).toFixed(0)}); req/s median ${median(rps[1]!).toFixed(0)}`);
  const q = [...ratios].sort((x, y) => x - y);
  console.log(`  B/A CPU per request, paired: median ${median(ratios).toFixed(2)} (min ${q[0]!.toFixed(2)}, max ${q[q.length - 1]!.toFixed(2)})`);
  console.log(JSON.stringify({ bench: 'proxy', compare: true, a_cpu_us_per_req: Math.round(median(cpu[0]!)), b_cpu_us_per_req: Math.round(median(cpu[1]!)), b_over_a: Math.round(median(ratios) * 100) / 100, a_rps: Math.round(median(rps[0]!)), b_rps: Math.round(median(rps[1]!)) }));
  for (const p of pools) await p.close();
  throw new CompareDone();
}

class CompareDone extends Error {}

async function realPart() {
  const offset = await freePortOffset({ prefillers: 1, decoders: 1, model: 'builtin:tiny', controller: false, host: '127.0.0.1' });
  const logDir = mkdtempSync(join(tmpdir(), 'kvc-bench-proxy-'));
  const up = spawnNode([CLI, 'up', '--no-controller', '--port-offset', String(offset), '--log-dir', logDir, '--startup-timeout', '150']);
  const refPort = await freePortRange(1, 40000, 50000);
  const ref = spawnNode([CLI, 'engine', '--port', String(refPort)]);
  try {
    await up.waitFor(/kvc up: ready/, 170_000);
    await ref.waitFor(/listening/, 120_000);
    const viaProxy = new Pool(`http://127.0.0.1:${9100 + offset}`, { connections: 4 });
    const direct = new Pool(`http://127.0.0.1:${refPort}`, { connections: 4 });
    const filler = Array.from({ length: 200 }, (_, k) => `token${k % 37}`).join(' ');
    const body = (i: number) => ({ model: 'builtin:tiny', prompt: `${i} ${filler} ${i}`, max_tokens: 4, temperature: 0 });
    for (let i = 0; i < 3; i++) {
      await ttft(viaProxy, body(1000 + i));
      await ttft(direct, body(2000 + i));
    }
    const tp: number[] = [];
    const td: number[] = [];
    for (let i = 0; i < 30; i++) {
      // Interleaved so both see the same machine load; distinct prompts so nothing is cached.
      tp.push(await ttft(viaProxy, body(i)));
      td.push(await ttft(direct, body(100 + i)));
    }
    await viaProxy.close();
    await direct.close();
    tp.sort((a, b) => a - b);
    td.sort((a, b) => a - b);
    return { proxyP50: percentile(tp, 50), proxyP99: percentile(tp, 99), directP50: percentile(td, 50), directP99: percentile(td, 99), logDir };
  } finally {
    await stop(up.child);
    await stop(ref.child);
  }
}

async function main() {
  const r2 = (v: number) => Math.round(v * 100) / 100;
  console.log('proxy benchmark (a): proxy alone against a stub upstream (tokenize + prefill + streamed decode, fixed small payloads)');
  let a;
  try {
    a = await stubPart();
  } catch (e) {
    if (e instanceof CompareDone) return; // --compare-cli printed its own figures
    throw e;
  }
  console.log(`  direct client doing the 3 calls itself: ${a.directRps.toFixed(0)} req/s at concurrency 16; latency p50 ${a.directP50.toFixed(2)} ms, p99 ${a.directP99.toFixed(2)} ms`);
  console.log(`  through the proxy:                      ${a.proxyRps.toFixed(0)} req/s at concurrency 16; latency p50 ${a.proxyP50.toFixed(2)} ms, p99 ${a.proxyP99.toFixed(2)} ms`);
  console.log(`  proxy/direct throughput ${(a.proxyRps / a.directRps).toFixed(2)} (target >= 0.7); added latency p50 ${(a.proxyP50 - a.directP50).toFixed(2)} ms (target <= 1), p99 ${(a.proxyP99 - a.directP99).toFixed(2)} ms`);
  console.log(`  floor reference (bench/_proxy_floor.ts) in the same rounds: ${a.floorRps.toFixed(0)} req/s, floor/direct ${(a.floorRps / a.directRps).toFixed(2)}, proxy/floor ${(a.proxyRps / a.floorRps).toFixed(2)}`);
  if (process.argv.includes('--stub-only')) {
    console.log(
      JSON.stringify({
        bench: 'proxy',
        stub_only: true,
        proxy_rps: r2(a.proxyRps),
        direct_rps: r2(a.directRps),
        ratio: r2(a.proxyRps / a.directRps),
        floor_rps: r2(a.floorRps),
        floor_ratio: r2(a.floorRps / a.directRps),
        overhead_p50_ms: r2(a.proxyP50 - a.directP50),
        overhead_p99_ms: r2(a.proxyP99 - a.directP99),
        proxy_cpu_us_per_req: Math.round(a.proxyCpuUs),
        proxy_sys_us_per_req: Math.round(a.proxySysUs),
      }),
    );
    return;
  }
  console.log('proxy benchmark (b): real engines, built-in model, 1P1D via kvc up, ~200-token prompts, streamed, 30 requests each');
  const b = await realPart();
  console.log(`  TTFT through the proxy (prefiller + xfer + decoder): p50 ${b.proxyP50.toFixed(1)} ms, p99 ${b.proxyP99.toFixed(1)} ms`);
  console.log(`  TTFT direct to one engine:                           p50 ${b.directP50.toFixed(1)} ms, p99 ${b.directP99.toFixed(1)} ms`);
  console.log(
    JSON.stringify({
      bench: 'proxy',
      proxy_rps: r2(a.proxyRps),
      direct_rps: r2(a.directRps),
      floor_rps: r2(a.floorRps),
      floor_ratio: r2(a.floorRps / a.directRps),
      overhead_p50_ms: r2(a.proxyP50 - a.directP50),
      overhead_p99_ms: r2(a.proxyP99 - a.directP99),
      proxy_cpu_us_per_req: Math.round(a.proxyCpuUs),
      proxy_sys_us_per_req: Math.round(a.proxySysUs),
      ttft_proxy_p50_ms: r2(b.proxyP50),
      ttft_direct_p50_ms: r2(b.directP50),
    }),
  );
}

if (process.argv[2] === '--floor-server') {
  await startFloorProxy(Number(process.argv[3]), Number(process.argv[4]));
  // Exit (not die) on SIGTERM, so a --cpu-prof of it is written.
  process.once('SIGTERM', () => process.exit(0));
  process.stdout.write('floor listening\n');
} else if (process.argv[2] === '--stub-server') {
  // Child mode: serve the stub upstream until killed.
  const s = await startStubEngine('stub', Number(process.argv[3]));
  process.stdout.write(`stub listening ${s.port}\n`);
} else {
  await main();
}

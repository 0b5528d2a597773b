// Part (c) of `npm run bench -- controller`: move and copy throughput between two cache instances in
// two child processes, beside raw loopback TCP and xfer (bench/_xfer_run.ts) in the same run, for a
// few chunk sizes of a Llama-3-8B-shaped KV cache (32 layers × 8 KV heads × 128 head dim, f16: 128
// KiB per token), and the end-to-end latency of a 256-token move.
//   - a move or copy is timed from the HTTP request to the controller until its event is finished
//     (EventLog.onComplete in this process, which runs the controller), 256 MiB each;
//   - raw TCP: a source process writes one chunk-sized buffer repeatedly, a sink process reads and
//     discards (the same bytes per round);
//   - xfer: an xfer sender and receiver process, the same bytes per round, two requests in flight;
//   - the machine is shared and its load changes by the second, so per chunk size the four are
//     measured in alternating rounds and the medians of the per-round rates compared;
//   - a copy goes into a destination that does not hold the chunks (after each copy, untimed, a move
//     back empties it without giving its memory back, as an instance in use keeps it).
// This module is also the program of the instance processes (`instance <id> <monitorPort> <fill> <chunkTokens> <dtype> <modelId>`),
// and, run with no argument (`node dist/bench/_move.js`), this part alone with its own controller.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { request } from 'undici';
import { DType, encodeChunk, payloadBytes, type KvLayout } from '../src/common/chunk.js';
import { validateCacheConfig } from '../src/common/config.js';
import { chunkKeys } from '../src/common/keys.js';
import { freePortRange } from '../src/common/ports.js';
import type { EventRecord } from '../src/controller/events.js';
import type { Operations } from '../src/controller/operations.js';
import { startController } from '../src/controller/server.js';
import { attachController } from '../src/kvc/controller_client.js';
import { KvcStore } from '../src/kvc/store.js';
import { resultsDir, writeBarsSvg } from './_plot.js';
import { tcpBaseline, xferRun } from './_xfer_run.js';

const self = fileURLToPath(import.meta.url);
const MODEL = 'bench-llama-3-8b';
export const LLAMA3_8B: KvLayout = { dtype: DType.f16, numLayers: 32, numKvHeads: 8, headDim: 128 };
/** Chunk sizes in tokens: 2, 8 and 32 MiB chunks. */
const CHUNK_TOKENS = [16, 64, 256];
const MOVE_BYTES = 256 * 2 ** 20;
const ROUNDS = 3;
/** 256-token moves timed for the latency figure. */
const LATENCY_MOVES = 60;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const range = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};

// ---- the instance processes --------------------------------------------------------------------
async function childInstance(id: string, monitorPort: number, fill: number, chunkTokens: number, layout: KvLayout = LLAMA3_8B, modelId = MODEL): Promise<void> {
  const base = await freePortRange(2);
  const { config: cfg } = validateCacheConfig({
    chunk_size: chunkTokens,
    max_local_cpu_size: 1.5,
    enable_controller: true,
    kvc_instance_id: id,
    controller_url: `127.0.0.1:${monitorPort}`,
    kvc_worker_port: base,
    distributed_url: `127.0.0.1:${base + 1}`,
  });
  const store = await KvcStore.create(cfg);
  if (fill > 0) {
    const payload = randomBytes(payloadBytes(layout, chunkTokens));
    for (const s of chunkKeys(range(fill * chunkTokens), { modelId, chunkSize: chunkTokens, seed: 0n, kvDtype: layout.dtype })) {
      await store.put(s.key, encodeChunk(layout, chunkTokens, s.key, payload), 'LocalCPUBackend');
    }
  }
  const att = await attachController(store, cfg, { modelId, chunkSize: chunkTokens, seed: 0n, layout });
  while (att.state !== 'live') await sleep(20);
  // Signed off (bye) when the bench is done with it, so the controller does not reap it later.
  process.once('SIGTERM', () => void att.close().finally(() => process.exit(0)));
  process.stdout.write(`ready ${cfg.distributed_url}\n`);
}

/** An instance process holding `fill` chunks of `chunkTokens` tokens in the CPU tier; `ready` resolves to its peer address. */
export function spawnInstance(id: string, monitorPort: number, fill: number, chunkTokens: number, dtype: DType = LLAMA3_8B.dtype, modelId = MODEL): { child: ChildProcess; ready: Promise<string> } {
  const child = spawn(process.execPath, [self, 'instance', id, String(monitorPort), String(fill), String(chunkTokens), String(dtype), modelId], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const ready = (async () => {
    const deadline = Date.now() + 120_000;
    while (!/ready \S+\n/.test(out)) {
      if (child.exitCode !== null || Date.now() > deadline) throw new Error(`instance ${id} did not start: ${out}`);
      await sleep(20);
    }
    return /ready (\S+)\n/.exec(out)![1]!;
  })();
  return { child, ready };
}

// ---- timing moves through the controller -------------------------------------------------------
/** Moves and copies through the controller's HTTP API, each timed from the request until its event completed. */
class Mover {
  private readonly done = new Map<string, { ev: EventRecord; at: number }>();
  private readonly waiting = new Map<string, (d: { ev: EventRecord; at: number }) => void>();

  constructor(
    private readonly url: string,
    ops: Operations,
  ) {
    const prev = ops.events.onComplete;
    ops.events.onComplete = (ev) => {
      prev?.(ev);
      const d = { ev, at: performance.now() };
      const w = this.waiting.get(ev.event_id);
      if (w) w(d);
      else this.done.set(ev.event_id, d);
    };
  }

  /** Seconds from the request until the event finished; throws when it failed. */
  async run(from: string, to: string, tokens: number[], copy: boolean): Promise<number> {
    const t0 = performance.now();
    const r = await request(`${this.url}/move`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ old_position: [from, 'LocalCPUBackend'], new_position: [to, 'LocalCPUBackend'], tokens, copy }),
    });
    const j = (await r.body.json()) as { event_id: string; num_tokens: number };
    if (j.num_tokens !== tokens.length) throw new Error(`${copy ? 'copy' : 'move'} ${from} → ${to} scheduled ${j.num_tokens} of ${tokens.length} tokens: ${JSON.stringify(j)}`);
    const d = this.done.get(j.event_id) ?? (await new Promise<{ ev: EventRecord; at: number }>((res) => this.waiting.set(j.event_id, res)));
    this.done.delete(j.event_id);
    this.waiting.delete(j.event_id);
    if (d.ev.status !== 'finished') throw new Error(`${copy ? 'copy' : 'move'} ${from} → ${to} failed: ${d.ev.error}`);
    return (d.at - t0) / 1000;
  }
}

export interface SizeFigures {
  chunkTokens: number;
  chunkMiB: number;
  /** Gbit/s per round. */
  tcp: number[];
  xfer: number[];
  move: number[];
  copy: number[];
}

export interface MoveFigures {
  sizes: SizeFigures[];
  /** 256-token move, request to finished, ms. */
  latencyMs: number[];
}

export async function moveBench(ctlUrl: string, monitorPort: number, ops: Operations): Promise<MoveFigures> {
  const mover = new Mover(ctlUrl, ops);
  const sizes: SizeFigures[] = [];
  let latencyMs: number[] = [];
  for (const chunkTokens of CHUNK_TOKENS) {
    const chunk = payloadBytes(LLAMA3_8B, chunkTokens) + 64;
    const n = Math.round(MOVE_BYTES / payloadBytes(LLAMA3_8B, chunkTokens));
    const bytes = n * chunk;
    const gbps = (s: number) => (bytes * 8) / s / 1e9;
    const [idA, idB] = [`mv-A-${chunkTokens}`, `mv-B-${chunkTokens}`];
    const a = spawnInstance(idA, monitorPort, n, chunkTokens);
    const b = spawnInstance(idB, monitorPort, 0, chunkTokens);
    const f: SizeFigures = { chunkTokens, chunkMiB: chunk / 2 ** 20, tcp: [], xfer: [], move: [], copy: [] };
    try {
      await Promise.all([a.ready, b.ready]);
      const tokens = range(n * chunkTokens);
      const move = (from: string, to: string) => mover.run(from, to, tokens, false);
      const copy = async () => {
        const s = await mover.run(idA, idB, tokens, true);
        await move(idB, idA); // untimed: B is empty again, its memory kept
        return s;
      };
      // Warm-up: both instances' pools touch their pages once.
      await move(idA, idB);
      await move(idB, idA);
      await copy();
      for (let r = 0; r < ROUNDS; r++) {
        f.tcp.push((await tcpBaseline(bytes, chunk)).gbps);
        f.move.push(gbps(await move(idA, idB)));
        f.move.push(gbps(await move(idB, idA)));
        f.copy.push(gbps(await copy()));
        // The same bytes over xfer: n chunks in 8 requests (2 in flight), fresh processes.
        const x = await xferRun(LLAMA3_8B, chunkTokens, Math.max(1, n / 8), 8, `mv${chunkTokens}-${r}`);
        f.xfer.push(x.gbps);
      }
      if (chunkTokens === 256) {
        // One 256-token chunk back and forth: the latency of a small move, request to finished.
        const one = range(256);
        for (let i = 0; i < 4; i++) await mover.run(i % 2 ? idB : idA, i % 2 ? idA : idB, one, false);
        const ms: number[] = [];
        for (let i = 0; i < LATENCY_MOVES; i++) ms.push(1000 * (await mover.run(i % 2 ? idB : idA, i % 2 ? idA : idB, one, false)));
        latencyMs = ms;
      }
    } finally {
      for (const c of [a.child, b.child]) {
        c.kill('SIGTERM');
        setTimeout(() => c.kill('SIGKILL'), 5000).unref();
      }
    }
    sizes.push(f);
  }
  return { sizes, latencyMs };
}

/** Prints the figures and writes the plot; returns the fields of the JSON line. */
export async function reportMoves(m: MoveFigures): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  const rows = [];
  for (const s of m.sizes) {
    const [tcp, xfer, move, copy] = [median(s.tcp), median(s.xfer), median(s.move), median(s.copy)];
    const mib = Math.round(s.chunkMiB);
    console.log(`(c) ${mib} MiB chunks (${s.chunkTokens} tokens), 256 MiB per transfer, ${s.tcp.length} alternating rounds, medians: raw TCP ${tcp.toFixed(2)} Gbit/s, xfer ${xfer.toFixed(2)} (${(xfer / tcp).toFixed(2)} x), move ${move.toFixed(2)} (${(move / tcp).toFixed(2)} x), copy ${copy.toFixed(2)} (${(copy / tcp).toFixed(2)} x)`);
    console.log(`    per round: tcp ${s.tcp.map((x) => x.toFixed(1)).join(' ')} | xfer ${s.xfer.map((x) => x.toFixed(1)).join(' ')} | move ${s.move.map((x) => x.toFixed(1)).join(' ')} | copy ${s.copy.map((x) => x.toFixed(1)).join(' ')}`);
    const panel = `${mib} MiB chunks`;
    rows.push(...[['raw TCP', tcp], ['xfer', xfer], ['move', move], ['copy', copy]].map(([series, value]) => ({ panel, series: series as string, value: +(value as number).toFixed(2) })));
    Object.assign(out, {
      [`tcp_gbps_${mib}mib`]: +tcp.toFixed(3),
      [`xfer_gbps_${mib}mib`]: +xfer.toFixed(3),
      [`move_gbps_${mib}mib`]: +move.toFixed(3),
      [`copy_gbps_${mib}mib`]: +copy.toFixed(3),
      [`move_tcp_ratio_${mib}mib`]: +(move / tcp).toFixed(3),
      [`copy_tcp_ratio_${mib}mib`]: +(copy / tcp).toFixed(3),
    });
  }
  const p50 = pct(m.latencyMs, 50);
  const p99 = pct(m.latencyMs, 99);
  console.log(`(c) 256-token move (one 32 MiB chunk), HTTP request until the event is finished, ${m.latencyMs.length} moves: p50 ${p50.toFixed(1)} ms, p99 ${p99.toFixed(1)} ms`);
  const plot = await writeBarsSvg(join(resultsDir('controller'), 'move.svg'), 'Move and copy between two instance processes vs raw TCP and xfer, same run (Gbit/s, medians)', rows, 'Gbit/s');
  console.log(`    plot: ${plot}`);
  return { ...out, move_256_tokens_p50_ms: +p50.toFixed(2), move_256_tokens_p99_ms: +p99.toFixed(2) };
}

if (process.argv[1] === self && process.argv[2] === 'instance') {
  const [id, monitorPort, fill, chunkTokens, dtype, modelId] = process.argv.slice(3);
  await childInstance(id!, Number(monitorPort), Number(fill), Number(chunkTokens), { ...LLAMA3_8B, dtype: Number(dtype) as DType }, modelId);
} else if (process.argv[1] === self) {
  // `node dist/bench/_move.js`: this part alone (while working on the move path), with its own controller.
  const base = await freePortRange(2);
  const ctl = await startController({ host: '127.0.0.1', port: base, monitorPort: base + 1, heartbeatTimeoutMs: 60_000, seed: 0n });
  const fields = await reportMoves(await moveBench(ctl.url, base + 1, ctl.ops));
  await ctl.close();
  console.log(JSON.stringify({ bench: 'controller-move', ...fields }));
  process.exit(0);
}

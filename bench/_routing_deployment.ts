// The routing benchmark's deployment (`kvc up` 2P2D of the built-in model) and what it reads from
// it: the time to a streamed request's first token, and every engine's and the proxy's counters
// (where prompt tokens came from, P2P fetches, tier contents, routing decisions), before and after
// a run.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import { freePortOffset } from '../src/deploy/free_offset.js';
import { byLabel, scrape, sum } from './_scrape.js';

const CLI = join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'cli', 'main.js');

export interface Deployment {
  proc: ChildProcess;
  proxy: string;
  controller: string;
  /** The deployment secret (`kvc up` writes it into the log directory): /clear needs it. */
  secret: string;
  engines: { name: string; url: string }[];
  stop(): Promise<void>;
}

/**
 * Starts `kvc up` 2P2D with `routing` and the flags in `args`; another port offset is tried when a
 * port was taken meanwhile (the machine is shared).
 */
export async function up(routing: string, args: string[]): Promise<Deployment> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await upOnce(routing, args);
    } catch (e) {
      if (attempt >= 3 || !/EADDRINUSE|already in use/.test((e as Error).message)) throw e;
      console.log(`(a port was taken by another process; retrying on another offset)`);
    }
  }
}

async function upOnce(routing: string, args: string[]): Promise<Deployment> {
  const off = await freePortOffset({ prefillers: 2, decoders: 2, model: 'builtin:tiny', controller: true, host: '127.0.0.1' });
  const logDir = mkdtempSync(join(tmpdir(), `kvc-bench-routing-${routing}-`));
  const proc = spawn(process.execPath, [CLI, 'up', '--prefillers', '2', '--decoders', '2', '--routing', routing, '--port-offset', String(off), '--log-dir', logDir, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, KVC_LOG_LEVEL: 'warn' },
  });
  let out = '';
  proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const deadline = Date.now() + 240_000;
  while (!out.includes('kvc up: ready')) {
    if (proc.exitCode !== null || Date.now() > deadline) {
      proc.kill('SIGKILL');
      throw new Error(`kvc up (${routing}) did not become ready:\n${out.slice(-3000)}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  const engines = [
    { name: 'prefiller-0', url: `http://127.0.0.1:${7100 + off}` },
    { name: 'prefiller-1', url: `http://127.0.0.1:${7101 + off}` },
    { name: 'decoder-0', url: `http://127.0.0.1:${7200 + off}` },
    { name: 'decoder-1', url: `http://127.0.0.1:${7201 + off}` },
  ];
  return {
    proc,
    proxy: `http://127.0.0.1:${9100 + off}`,
    controller: `http://127.0.0.1:${9000 + off}`,
    secret: readFileSync(join(logDir, 'deployment.secret'), 'utf8').trim(),
    engines,
    async stop() {
      if (proc.exitCode === null) proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 20_000);
      await exited;
      clearTimeout(t);
    },
  };
}

/** One streamed request; resolves with the time to its first token, in ms. */
export async function ttftOf(proxy: string, prompt: number[]): Promise<number> {
  const t0 = performance.now();
  const res = await fetch(`${proxy}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'builtin:tiny', prompt, max_tokens: 16, temperature: 0, stream: true }),
    signal: AbortSignal.timeout(300_000),
  });
  if (!res.ok || !res.body) throw new Error(`request failed: HTTP ${res.status} ${await res.text()}`);
  let first = 0;
  const dec = new TextDecoder();
  let buf = '';
  for await (const piece of res.body as unknown as AsyncIterable<Uint8Array>) {
    if (!first) {
      buf += dec.decode(piece, { stream: true });
      if (/data: \{/.test(buf)) first = performance.now() - t0;
    }
  }
  if (!first) throw new Error('stream ended without a token');
  return first;
}

/** What one engine did, from its own counters (the breakdown of where prompt tokens came from). */
export interface EngineCounters {
  /** Prompt tokens it computed. */
  computed: number;
  /** Prompt tokens loaded from its cache (its own tiers, and chunks P2P brought into them). */
  fromCache: number;
  /** Prompt tokens that arrived by xfer from a prefiller (a decoder's disaggregated requests). */
  fromTransfer: number;
  /** Chunks that arrived from peers (P2P), and P2P fetches that ended early. */
  p2pChunks: number;
  p2pFailures: number;
  /** P2P fetches that ended early, by reason (controller, connect, closed, corrupt, timeout, refused). */
  p2pFailureReasons: Map<string, number>;
  /** Its CPU tier when scraped: chunks, of them cold and replicas (the rest are kept by recency); copies it declined so far. */
  tierChunks: number;
  tierCold: number;
  tierReplicas: number;
  declined: number;
  /** Chunks its CPU tier evicted. */
  evicted: number;
}

export interface Counters {
  computed: number;
  fromCache: number;
  engines: Map<string, EngineCounters>;
  prefills: Map<string, number>;
  /** Proxy: prefills by where (remote, local_short_uncached, ...) and routing decisions by reason. */
  where: Map<string, number>;
  reasons: Map<string, number>;
}

export async function counters(d: Deployment): Promise<Counters> {
  let computed = 0;
  let fromCache = 0;
  const engines = new Map<string, EngineCounters>();
  for (const e of d.engines) {
    const m = await scrape(e.url);
    const c: EngineCounters = {
      computed: sum(m, 'kvc_engine_prompt_tokens_computed_total'),
      fromCache: sum(m, 'kvc_engine_tokens_loaded_by_source_total', (l) => l.includes('source="cache"')),
      fromTransfer: sum(m, 'kvc_engine_tokens_loaded_by_source_total', (l) => l.includes('source="transfer"')),
      p2pChunks: sum(m, 'kvc_p2p_chunks_total'),
      p2pFailures: sum(m, 'kvc_p2p_failures_total'),
      p2pFailureReasons: byLabel(m, 'kvc_p2p_failures_total', 'reason'),
      evicted: sum(m, 'kvc_cache_evicted_chunks_total'),
      tierChunks: sum(m, 'kvc_cache_chunks'),
      tierCold: sum(m, 'kvc_cache_cold_chunks'),
      tierReplicas: sum(m, 'kvc_cache_replica_chunks'),
      declined: sum(m, 'kvc_cache_declined_copies_total'),
    };
    engines.set(e.name, c);
    computed += c.computed;
    fromCache += c.fromCache;
  }
  const pm = await scrape(d.proxy);
  const prefills = new Map<string, number>();
  for (const e of d.engines) prefills.set(e.name, sum(pm, 'kvc_proxy_prefills_total', (l) => l.includes(`instance="${e.name}(`)));
  return { computed, fromCache, engines, prefills, where: byLabel(pm, 'kvc_proxy_prefills_total', 'where'), reasons: byLabel(pm, 'kvc_proxy_routing_decisions_total', 'reason') };
}

/** Prints what each engine computed, loaded and fetched during a run (after − before), and the proxy's decisions. */
export function breakdown(before: Counters, after: Counters, requests: number): void {
  const d = (a: number, b: number) => Math.round(a - b);
  const parts: string[] = [];
  for (const [name, a] of after.engines) {
    const b = before.engines.get(name)!;
    const why = [...a.p2pFailureReasons].map(([k, v]) => [k, v - (b.p2pFailureReasons.get(k) ?? 0)] as const).filter(([, v]) => v > 0).map(([k, v]) => `${k} ${v}`).join(' ');
    parts.push(
      `${name}: computed ${d(a.computed, b.computed)}, cache ${d(a.fromCache, b.fromCache)}, xfer ${d(a.fromTransfer, b.fromTransfer)}, ` +
        `p2p chunks ${d(a.p2pChunks, b.p2pChunks)} (failed ${d(a.p2pFailures, b.p2pFailures)}${why ? `: ${why}` : ''}), evicted ${d(a.evicted, b.evicted)}, ` +
        `declined ${d(a.declined, b.declined)}, tier at the end ${a.tierChunks} chunks (${a.tierCold} cold, ${a.tierReplicas} replicas)`,
    );
  }
  const delta = (a: Map<string, number>, b: Map<string, number>) =>
    [...a].map(([k, v]) => [k, d(v, b.get(k) ?? 0)] as const).filter(([, v]) => v > 0).map(([k, v]) => `${k} ${v}`).join(', ');
  console.log(`  per engine (tokens): ${parts.join('; ')}`);
  console.log(`  proxy (${requests} requests): prefills ${delta(after.where, before.where)}; decisions ${delta(after.reasons, before.reasons)}`);
}

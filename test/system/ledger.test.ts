// The hit-rate ledger on real processes (docs/ledger.md): a `kvc up` deployment of two colocated
// engines (no P2P, 16-token chunks, a small disk tier and no CPU tier, so that a test can remove a
// chunk file behind an engine's back), a controller and the proxy. Every reason is produced by
// what the deployment really did and read back from the response's usage.kvc, the engines'
// kvc_engine_computed_chunks_total and the proxy's kvc_proxy_computed_chunks_total.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { startDeployment, type Deployment } from '../../harness/deployment.js';
import { tempDir } from '../../harness/temp_dir.js';
import { chunkKeys } from '../../src/common/keys.js';
import { chunkBytes, DType, sealChunk } from '../../src/common/chunk.js';

const CHUNK = 16;

interface Ledger {
  predicted_cached_tokens: number | null;
  reused_tokens: number;
  computed_tokens: number;
  computed_chunks: Record<string, number>;
  instance: string | null;
}

async function complete(url: string, prompt: number[]): Promise<Ledger> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'builtin:tiny', prompt, max_tokens: 1, temperature: 0 }),
    signal: AbortSignal.timeout(60_000),
  });
  const body = (await r.json()) as { usage?: { kvc?: Ledger } };
  assert.equal(r.status, 200, JSON.stringify(body));
  assert.ok(body.usage?.kvc, `no usage.kvc in ${JSON.stringify(body)}`);
  return body.usage.kvc;
}

let seed = 1;
/** Distinct random token ids (each prompt its own). */
function prompt(n: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    seed = (seed * 1103515245 + 12345) >>> 0;
    out.push(100 + (seed % 30_000));
  }
  return out;
}

/** Waits until the controller's index holds `n` tokens of `tokens` on `instance` (its ops are batched). */
async function indexed(d: Deployment, tokens: number[], instance: string, n: number): Promise<void> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const r = (await (await fetch(`${d.controller}/prefix_lookup`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ tokens }) })).json()) as { instances: Record<string, number> };
    if ((r.instances[instance] ?? 0) === n) return;
    if (Date.now() > deadline) throw new Error(`index: ${instance} holds ${r.instances[instance] ?? 0} tokens of the prompt, expected ${n}`);
    await new Promise((res) => setTimeout(res, 50));
  }
}

async function counter(url: string, name: string, reason: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = new RegExp(`^${name}\\{[^}]*reason="${reason}"[^}]*\\} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

test('every computed chunk gets its reason: cold, not_fetched, stale_index, evicted, mismatch, partial', { timeout: 600_000 }, async () => {
  const disk = tempDir('kvc-ledger-disk-');
  // 12 chunks of 16 tokens (32,832 bytes each) per engine.
  const d = await startDeployment({ prefillers: 0, decoders: 2, args: ['--no-p2p', '--chunk-size', String(CHUNK), '--max-local-cpu-size', '0', '--local-disk', disk, '--max-local-disk-size', String((12.5 * 32_832) / 2 ** 30)] });
  /** Waits until the proxy's sums (of the engines' /health counters) are above zero for every reason of `which`. */
  const proxySees = async (which: string[]): Promise<void> => {
    const deadline = Date.now() + 30_000;
    for (;;) {
      const seen = await Promise.all(which.map((x) => counter(d.proxy, 'kvc_proxy_computed_chunks_total', x)));
      if (seen.every((v) => v > 0)) return;
      if (Date.now() > deadline) throw new Error(`the proxy's ledger counters (${which.join(', ')}): ${seen.join(', ')}`);
      await new Promise((res) => setTimeout(res, 200));
    }
  };
  try {
    const [a, b] = d.engines;
    assert.ok(a && b, 'two engines');
    // cold, and the partial last chunk: 3 full chunks + 5 tokens nobody stored.
    const p = prompt(3 * CHUNK + 5);
    const first = await complete(a.http, p);
    assert.deepEqual(first.computed_chunks, { cold: 3, partial: 1 });
    assert.equal(first.reused_tokens, 0);
    assert.equal(first.computed_tokens, p.length);
    assert.equal(first.instance, a.name);
    await indexed(d, p, a.name, p.length);
    // not_fetched: b lacks what a holds, and does not fetch it (no P2P).
    const second = await complete(b.http, p);
    assert.deepEqual(second.computed_chunks, { not_fetched: 3, partial: 1 });
    // The same prompt on a again: all reused but the last token.
    const third = await complete(a.http, p);
    assert.deepEqual(third.computed_chunks, {});
    assert.equal(third.reused_tokens, p.length - 1);

    // stale_index: a's first chunk file removed behind its back; its index (and the controller's)
    // still list it. The two chunks after it, held but cut off, take its reason.
    const [k0] = chunkKeys(p, { modelId: (await modelId(a.http)), chunkSize: CHUNK, seed: 0n, discardPartialChunks: false });
    rmSync(join(disk, a.name, `${k0!.key}.kvc`));
    const stale = await complete(a.http, p);
    assert.deepEqual(stale.computed_chunks, { stale_index: 3, partial: 1 });

    // evicted: r stored on a, then pushed out of a's 12 chunks by 5 other prompts; b never had it.
    const r = prompt(3 * CHUNK);
    assert.deepEqual((await complete(a.http, r)).computed_chunks, { cold: 3 });
    await indexed(d, r, a.name, r.length);
    for (let i = 0; i < 5; i++) await complete(a.http, prompt(3 * CHUNK));
    await indexed(d, r, a.name, 0);
    assert.deepEqual((await complete(a.http, r)).computed_chunks, { evicted: 3 });

    // A chunk held elsewhere after the break takes the break's reason: h stored on a, its first
    // chunk moved to b and pushed out of b's tier there, so a holds h's later chunks without their
    // head. b computing h cannot use them (a prefix is imported unbroken): evicted, all three.
    const h = prompt(3 * CHUNK);
    assert.deepEqual((await complete(a.http, h)).computed_chunks, { cold: 3 });
    await indexed(d, h, a.name, h.length);
    const mv = await fetch(`${d.controller}/move`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${d.secret}` }, body: JSON.stringify({ old_position: [a.name, 'LocalDiskBackend'], new_position: [b.name, 'LocalDiskBackend'], tokens: h.slice(0, CHUNK) }) });
    assert.equal(mv.status, 200, await mv.text());
    await indexed(d, h, b.name, CHUNK);
    await indexed(d, h, a.name, 0);
    for (let i = 0; i < 4; i++) await complete(b.http, prompt(3 * CHUNK));
    await indexed(d, h, b.name, 0);
    assert.deepEqual((await complete(b.http, h)).computed_chunks, { evicted: 3 });

    // The engines count the same (before b restarts and starts counting from zero).
    const reasons = ['cold', 'not_fetched', 'stale_index', 'evicted', 'partial'];
    for (const reason of reasons) assert.ok((await counter(a.http, 'kvc_engine_computed_chunks_total', reason)) + (await counter(b.http, 'kvc_engine_computed_chunks_total', reason)) > 0, reason);
    assert.equal(await counter(b.http, 'kvc_engine_computed_chunks_total', 'not_fetched'), 3);

    // mismatch: a chunk filed under the right key but stored with another KV dtype (f16), put on
    // b's disk tier while b is down; kvc up restarts b, whose tier indexes it at start.
    const q = prompt(2 * CHUNK);
    const [q0] = chunkKeys(q, { modelId: await modelId(b.http), chunkSize: CHUNK, seed: 0n, discardPartialChunks: false });
    const f16 = { dtype: DType.f16, numLayers: 4, numKvHeads: 2, headDim: 32 };
    const buf = new Uint8Array(chunkBytes(f16, CHUNK));
    mkdirSync(join(disk, b.name), { recursive: true });
    writeFileSync(join(disk, b.name, `${q0!.key}.kvc`), sealChunk(buf, f16, CHUNK, q0!.key));
    // The proxy samples each engine's counters from its /health; what b counted since the last
    // sample dies with b. Wait until the proxy has seen b's counts, so that what is checked after
    // the restart is the proxy keeping them, not the timing of its last sample.
    await proxySees(reasons);
    process.kill(b.pid, 'SIGKILL');
    await waitRestarted(d, b.name, b.pid);
    assert.ok(readdirSync(join(disk, b.name)).includes(`${q0!.key}.kvc`), 'the f16 chunk survived the restart');
    assert.deepEqual((await complete(b.http, q)).computed_chunks, { mismatch: 1, cold: 1 });

    // The proxy sums the engines' counters from their /health (b's restart included).
    assert.equal(await counter(b.http, 'kvc_engine_computed_chunks_total', 'mismatch'), 1);
    await proxySees([...reasons, 'mismatch']);
    assert.equal(await counter(d.proxy, 'kvc_proxy_computed_chunks_total', 'unexplained'), 0);
  } finally {
    await d.stop();
  }
});

async function modelId(url: string): Promise<string> {
  const r = (await (await fetch(`${url}/v1/models`)).json()) as { data: { kvc_model_id: string }[] };
  return r.data[0]!.kvc_model_id;
}

/** Waits until `kvc up` restarted `name` (a new pid) and it answers /health. */
async function waitRestarted(d: Deployment, name: string, oldPid: number): Promise<void> {
  const e = d.engines.find((x) => x.name === name)!;
  const deadline = Date.now() + 120_000;
  for (;;) {
    // deployment.json is rewritten by `kvc up` on every change: a read may catch it half written.
    let pid: number | undefined;
    try {
      pid = d.refreshPids().get(name);
    } catch {
      pid = undefined;
    }
    if (pid !== undefined && pid !== oldPid) {
      const ok = await fetch(`${e.http}/health`).then((r) => r.ok, () => false);
      if (ok) {
        e.pid = pid;
        return;
      }
    }
    if (Date.now() > deadline) throw new Error(`${name} was not restarted within 120 s`);
    await new Promise((res) => setTimeout(res, 200));
  }
}

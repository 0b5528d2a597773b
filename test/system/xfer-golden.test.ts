// The golden test of disaggregated prefill, on real processes: a kv_producer
// engine prefills and transfers KV to kv_consumer engines through xfer; the consumer's greedy
// output equals a single kv_both engine's, token for token, for prompts shorter than, equal to
// and across chunk boundaries (chunk_size 16), and its /metrics show the loaded prompt tokens
// (n − skip_last_n_tokens, with skip 1 and with skip 3).
//
// Token for token: the API exposes no token ids (logprobs are not supported), so outputs are
// compared as streams: one SSE event per generated token that adds visible text, so the list of
// pieces (not only their concatenation) must match, and so must completion_tokens.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Pull } from 'zeromq';
import { stringify } from 'yaml';
import { freePortRange } from '../../harness/ports.js';
import { decodeNotice } from '../../src/xfer/notify.js';
import { onFreePorts, startKvc, waitListening, postJson, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

const CHUNK = 16;
const procs: Proc[] = [];
let pull: Pull | null = null;
let base = 0;
const url = (i: number) => `http://127.0.0.1:${base + i}`;
// ports: base+0 kv_both, base+1 producer, base+2 consumer, base+3 init, base+4 alloc, base+5 proxy notify, base+6 proxy HTTP,
//        base+7 consumer with skip_last_n_tokens 3, base+8 its init, base+9 its alloc
const SKIP2 = 3;

function connector(role: string, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: role, kv_connector_extra_config: { discard_partial_chunks: false, ...extra } });
}

/**
 * Starts the four engines and this test's notify PULL on `b`..`b`+9 and waits until each engine
 * itself says it listens (a port found free can be bound by another run on the machine first; its
 * server would answer our URL: once it was another suite's `kvc up` decoder, and this file then
 * talked to it until that deployment stopped). On failure stops what it started.
 */
async function startOn(b: number): Promise<void> {
  base = b;
  const dir = tempDir('kvc-xfer-golden-');
  const yaml = (name: string, o: Record<string, unknown>) => {
    const p = join(dir, name);
    writeFileSync(p, stringify({ chunk_size: CHUNK, ...o }));
    return p;
  };
  const both = yaml('both.yaml', { local_cpu: false, max_local_cpu_size: 0 });
  const prefiller = yaml('prefiller.yaml', {
    local_cpu: false,
    max_local_cpu_size: 0,
    max_local_disk_size: 0,
    enable_xfer: true,
    enable_xpyd: true,
    xfer_role: 'sender',
    xfer_proxy_host: '127.0.0.1',
    xfer_proxy_port: base + 5,
    xfer_buffer_size: 1073741824,
    xfer_buffer_device: 'cuda',
  });
  const decoder = yaml('decoder.yaml', {
    local_cpu: false,
    max_local_cpu_size: 0,
    enable_xfer: true,
    enable_xpyd: true,
    xfer_role: 'receiver',
    xfer_peer_host: '127.0.0.1',
    xfer_peer_init_port: base + 3,
    xfer_peer_alloc_port: base + 4,
    xfer_buffer_size: 2147483648,
    xfer_buffer_device: 'cuda',
    xfer_backends: ['tcp'],
  });
  const decoder2 = yaml('decoder2.yaml', {
    local_cpu: false,
    max_local_cpu_size: 0,
    enable_xfer: true,
    xfer_role: 'receiver',
    xfer_peer_host: '127.0.0.1',
    xfer_peer_init_port: base + 8,
    xfer_peer_alloc_port: base + 9,
    xfer_buffer_size: 1073741824,
  });
  const common = ['engine', '--model', 'builtin:tiny', '--max-num-seqs', '4', '--enforce-eager', '--no-enable-prefix-caching', '--disable-log-requests'];
  try {
    pull = new Pull({ linger: 0, receiveTimeout: 10_000 });
    await pull.bind(`tcp://127.0.0.1:${base + 5}`);
    procs.push(startKvc([...common, '--port', String(base), '--kv-transfer-config', connector('kv_both')], { KVC_CONFIG_FILE: both }));
    procs.push(startKvc([...common, '--port', String(base + 1), '--kv-transfer-config', connector('kv_producer', { kvc_rpc_port: 'producer1' })], { KVC_CONFIG_FILE: prefiller }));
    procs.push(startKvc([...common, '--port', String(base + 2), '--kv-transfer-config', connector('kv_consumer', { kvc_rpc_port: 'consumer1', skip_last_n_tokens: 1 })], { KVC_CONFIG_FILE: decoder }));
    procs.push(startKvc([...common, '--port', String(base + 7), '--kv-transfer-config', connector('kv_consumer', { kvc_rpc_port: 'consumer2', skip_last_n_tokens: SKIP2 })], { KVC_CONFIG_FILE: decoder2 }));
    await Promise.all([0, 1, 2, 7].map((i, k) => waitListening(procs[k]!, base + i)));
  } catch (e) {
    await Promise.all(procs.splice(0).map((p) => p.kill()));
    pull?.close();
    pull = null;
    throw e;
  }
}

before(async () => {
  await onFreePorts(() => freePortRange(10), startOn);
});

after(async () => {
  await Promise.all(procs.map((p) => p.kill()));
  pull?.close();
});

async function transferLoaded(i = 2): Promise<number> {
  const r = await fetch(`${url(i)}/metrics`, { signal: AbortSignal.timeout(5000) });
  const text = await r.text();
  const m = text.match(/^kvc_engine_tokens_loaded_by_source_total\{[^}]*source="transfer"[^}]*\} (\d+)/m);
  return m ? Number(m[1]) : 0;
}

/** A streamed completion: the visible text of each generated token in order, and the usage. */
async function streamed(u: string, body: Record<string, unknown>): Promise<{ pieces: string[]; text: string; completionTokens: number }> {
  const r = await fetch(`${u}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal: AbortSignal.timeout(60_000),
  });
  const raw = await r.text();
  assert.equal(r.status, 200, raw);
  const pieces: string[] = [];
  let completionTokens = -1;
  for (const line of raw.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const ev = JSON.parse(line.slice(6));
    if (ev.usage) completionTokens = ev.usage.completion_tokens;
    for (const c of ev.choices ?? []) if (c.text) pieces.push(c.text);
  }
  return { pieces, text: pieces.join(''), completionTokens };
}

/** Prefills `tokens` on the producer, transfers to the consumer at url(http) (receiver ports init/alloc), then decodes there. */
async function disaggregated(tokens: number[], maxTokens: number, consumer: { http: number; init: number; alloc: number }) {
  const n = tokens.length;
  const reqId = `golden-${consumer.http}-${n}-${Date.now()}`;
  const disagg_spec = { req_id: reqId, receiver_host: '127.0.0.1', receiver_init_port: base + consumer.init, receiver_alloc_port: base + consumer.alloc };
  const req = { model: 'builtin:tiny', prompt: tokens, temperature: 0, ignore_eos: true };
  const pre = await postJson(`${url(1)}/v1/completions`, { ...req, max_tokens: 1, kv_transfer_params: { disagg_spec } });
  assert.equal(pre.status, 200, JSON.stringify(pre.json));
  // the notice was pushed before the prefiller answered
  const [msg] = await pull!.receive();
  assert.deepEqual(decodeNotice(msg!), { req_id: reqId, prefiller: 'producer1', num_chunks: Math.ceil(n / CHUNK), num_tokens: n, ok: true });
  const before = await transferLoaded(consumer.http);
  const out = await streamed(url(consumer.http), { ...req, max_tokens: maxTokens, kv_transfer_params: { ...(pre.json.kv_transfer_params ?? {}), disagg_spec } });
  return { out, loaded: (await transferLoaded(consumer.http)) - before };
}

const prompt = (n: number, salt: number) => Array.from({ length: n }, (_, i) => 5 + ((i * 37 + salt * 11) % 200));

test('startup: cuda buffer device falls back to host memory with a one-line warning', async () => {
  for (const p of [procs[1]!, procs[2]!]) await p.waitFor(/xfer_buffer_device "cuda" is not available on this CPU engine; the transfer buffer uses host memory/, 5000);
  await procs[2]!.waitFor(/receiver consumer1 listening on 127\.0\.0\.1/, 5000);
});

for (const [n, what] of [
  [5, 'shorter than a chunk'],
  [16, 'exactly one chunk'],
  [17, 'one token past a chunk boundary'],
  [32, 'exactly two chunks'],
  [40, 'across two boundaries (3 chunks)'],
] as const) {
  test(`prefiller → decoder greedy output equals kv_both's token for token: prompt of ${n} tokens (${what})`, async () => {
    const tokens = prompt(n, n);
    const single = await streamed(url(0), { model: 'builtin:tiny', prompt: tokens, max_tokens: 8, temperature: 0, ignore_eos: true });
    assert.equal(single.completionTokens, 8);
    assert.ok(single.pieces.length > 0);
    const { out, loaded } = await disaggregated(tokens, 8, { http: 2, init: 3, alloc: 4 });
    assert.deepEqual(out.pieces, single.pieces, 'decoder output differs from the single engine');
    assert.equal(out.completionTokens, 8);
    // skip_last_n_tokens = 1: every prompt token but the last came from the transfer
    assert.equal(loaded, n - 1);
  });
}

for (const n of [5, 16, 32, 40]) {
  test(`a decoder with skip_last_n_tokens ${SKIP2} loads n − ${SKIP2} prompt tokens and recomputes the rest, same output: ${n} tokens`, async () => {
    const tokens = prompt(n, 100 + n);
    const single = await streamed(url(0), { model: 'builtin:tiny', prompt: tokens, max_tokens: 8, temperature: 0, ignore_eos: true });
    const { out, loaded } = await disaggregated(tokens, 8, { http: 7, init: 8, alloc: 9 });
    assert.deepEqual(out.pieces, single.pieces, 'decoder output differs from the single engine');
    assert.equal(out.completionTokens, 8);
    assert.equal(loaded, n - SKIP2);
  });
}

test('a decoder request whose transfer never happened is computed locally with the same output', async () => {
  const tokens = prompt(33, 3);
  const req = { model: 'builtin:tiny', prompt: tokens, max_tokens: 6, temperature: 0, ignore_eos: true };
  const single = await postJson(`${url(0)}/v1/completions`, req);
  const before = await transferLoaded();
  const disagg_spec = { req_id: 'never-sent', receiver_host: '127.0.0.1', receiver_init_port: base + 3, receiver_alloc_port: base + 4 };
  const dec = await postJson(`${url(2)}/v1/completions`, { ...req, kv_transfer_params: { disagg_spec } });
  assert.equal(dec.status, 200);
  assert.equal(dec.json.choices[0].text, single.json.choices[0].text);
  assert.equal(await transferLoaded(), before);
});

test('through the real proxy (1P1D): same greedy output as kv_both, KV loaded from the transfer', async () => {
  // hand the notify port over from this test's PULL to the proxy's
  pull?.close();
  pull = null;
  const proxy = startKvc([
    'proxy', '--port', String(base + 6),
    '--prefiller-port', String(base + 1), '--decoder-port', String(base + 2),
    '--decoder-init-port', String(base + 3), '--decoder-alloc-port', String(base + 4),
    '--proxy-port', String(base + 5),
  ]);
  procs.push(proxy);
  await waitListening(proxy, base + 6, 30_000);
  const req = { model: 'builtin:tiny', prompt: 'the quick brown fox jumps over the lazy dog and keeps running far away', max_tokens: 8, temperature: 0, ignore_eos: true };
  const single = await postJson(`${url(0)}/v1/completions`, req);
  assert.equal(single.status, 200, JSON.stringify(single.json));
  const n = single.json.usage.prompt_tokens as number;
  const before = await transferLoaded();
  const viaProxy = await postJson(`${url(6)}/v1/completions`, req);
  assert.equal(viaProxy.status, 200, JSON.stringify(viaProxy.json));
  assert.equal(viaProxy.json.choices[0].text, single.json.choices[0].text);
  assert.equal((await transferLoaded()) - before, n - 1);
});

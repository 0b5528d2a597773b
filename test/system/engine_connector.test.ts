// KvcConnectorV1 in role kv_both: the second time a prompt is served its KV comes from the
// cache instance, the output is token for token the same as computing it, and /metrics
// shows the tokens loaded. Real processes for the end-to-end path; in-process engines for
// discard_partial_chunks and for a corrupted chunk (never served, recomputed instead).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { HEADER_BYTES, verifyChunk } from '../../src/common/chunk.js';
import { validateCacheConfig } from '../../src/common/config.js';
import { freePortRange } from '../../harness/ports.js';
import { startEngine, type Engine } from '../../src/engine/server.js';
import { postJson, startKvc, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

const MODEL = 'builtin:tiny';
const CONNECTOR = JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both', kv_connector_extra_config: { discard_partial_chunks: false } });

/** A prompt of exactly n token ids (ordinary vocabulary entries, no special tokens). */
const ids = (n: number, salt = 0) => Array.from({ length: n }, (_, i) => 1000 + ((i * 37 + salt * 101) % 20000));

async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

async function complete(url: string, prompt: number[] | string, extra: Record<string, unknown> = {}) {
  const r = await postJson(`${url}/v1/completions`, { model: MODEL, prompt, max_tokens: 8, temperature: 0, ignore_eos: true, ...extra });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return { text: r.json.choices[0].text as string, cached: r.json.usage.prompt_tokens_details.cached_tokens as number };
}

describe('KvcConnectorV1 kv_both (real processes)', () => {
  let dir: string;
  let plain: Proc;
  let cached: Proc;
  let plainUrl: string;
  let url: string;

  before(async () => {
    dir = tempDir('kvc-engine-conn-');
    const yaml = join(dir, 'cache.yaml');
    writeFileSync(yaml, 'chunk_size: 16\nlocal_cpu: true\nmax_local_cpu_size: 0.05\n');
    const base = await freePortRange(2);
    plain = startKvc(['engine', '--port', String(base), '--model', MODEL, '--max-model-len', '256']);
    cached = startKvc(['engine', '--port', String(base + 1), '--model', MODEL, '--max-model-len', '256', '--kv-transfer-config', CONNECTOR], { KVC_CONFIG_FILE: yaml });
    plainUrl = (await plain.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
    url = (await cached.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
  });

  after(async () => {
    await Promise.all([plain?.kill(), cached?.kill()]);
    rmSync(dir, { recursive: true, force: true });
  });

  it('a repeated prompt is served from the cache with identical greedy output', async () => {
    const prompt = ids(40); // chunks of 16 + 16 + a partial 8
    const truth = await complete(plainUrl, prompt);
    const first = await complete(url, prompt);
    assert.equal(first.cached, 0);
    assert.equal(first.text, truth.text);
    assert.equal(await metric(url, 'kvc_engine_chunks_saved_total'), 3);
    const second = await complete(url, prompt);
    // Everything but the last prompt token came from the cache (its logits are needed).
    assert.equal(second.cached, 39);
    assert.equal(second.text, truth.text);
    assert.equal(await metric(url, 'kvc_engine_tokens_loaded_total'), 39);
    assert.equal(await metric(url, 'kvc_engine_chunks_saved_total'), 3, 'nothing is stored twice');
  });

  it('a shared prefix is loaded and only the rest computed (chunk-aligned and not)', async () => {
    const before = await metric(url, 'kvc_engine_tokens_loaded_total');
    const a = ids(32, 1);
    await complete(url, a);
    const b = [...a, ...ids(11, 2)]; // same first 2 chunks, new tail
    const truth = await complete(plainUrl, b);
    const got = await complete(url, b);
    assert.equal(got.cached, 32);
    assert.equal(got.text, truth.text);
    const again = await complete(url, a); // exactly two full chunks: load 31, compute 1
    assert.equal(again.cached, 31);
    assert.equal(again.text, (await complete(plainUrl, a)).text);
    assert.equal(await metric(url, 'kvc_engine_tokens_loaded_total'), before + 32 + 31);
  });

  it('cache hits give identical output for chat and streaming through the openai client', async () => {
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
    const plainClient = new OpenAI({ baseURL: `${plainUrl}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'system', content: 'You are a helpful assistant that answers in one short sentence.' },
      { role: 'user', content: 'What is the tallest mountain on Earth and how tall is it?' },
    ];
    const truth = (await plainClient.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0 })).choices[0]!.message.content;
    const outputs: string[] = [];
    let lastCached = -1;
    for (let i = 0; i < 2; i++) {
      let text = '';
      const s = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } });
      for await (const c of s) {
        text += c.choices[0]?.delta.content ?? '';
        if (c.usage) lastCached = (c.usage as unknown as { prompt_tokens_details: { cached_tokens: number } }).prompt_tokens_details.cached_tokens;
      }
      outputs.push(text);
    }
    assert.deepEqual(outputs, [truth, truth]);
    assert.ok(lastCached > 16, `second chat request should load its prompt from the cache (cached_tokens=${lastCached})`);
  });

  it('kv_transfer_params are accepted and ignored in kv_both (same output, cache still used, none returned)', async () => {
    const prompt = ids(20, 3);
    const body = { model: MODEL, prompt, max_tokens: 4, temperature: 0, ignore_eos: true };
    const truth = await postJson(`${plainUrl}/v1/completions`, body);
    const withParams = await postJson(`${url}/v1/completions`, { ...body, kv_transfer_params: { note: 'kv_both ignores it', disagg_spec: { req_id: 'x' } } });
    assert.equal(withParams.status, 200, JSON.stringify(withParams.json));
    assert.equal(withParams.json.choices[0].text, truth.json.choices[0].text);
    assert.equal(withParams.json.kv_transfer_params, undefined, 'kv_both sends nothing back');
    // The KV was saved as usual: the same prompt again, with parameters, is a cache hit.
    const again = await postJson(`${url}/v1/completions`, { ...body, kv_transfer_params: { note: 'again' } });
    assert.equal(again.json.usage.prompt_tokens_details.cached_tokens, 19);
    assert.equal(again.json.choices[0].text, truth.json.choices[0].text);
    assert.equal(again.json.kv_transfer_params, undefined);
  });

  it('SIGTERM shuts the engine down cleanly (store closed, exit code 0)', async () => {
    const code = await cached.kill('SIGTERM');
    assert.equal(code, 0);
    assert.match(cached.output(), /SIGTERM: shutting down/);
  });
});

describe('KvcConnectorV1 in process', () => {
  let engines: Engine[] = [];
  const start = async (discard: boolean) => {
    const e = await startEngine({
      model: MODEL,
      maxModelLen: 256,
      kvTransferConfig: { kv_connector: 'KvcConnectorV1', kv_role: 'kv_both', kv_connector_extra_config: { discard_partial_chunks: discard, skip_last_n_tokens: 0 } },
      cacheConfig: validateCacheConfig({ chunk_size: 16, max_local_cpu_size: 0.05 }).config,
    });
    engines.push(e);
    return e;
  };

  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    engines = [];
  });

  it('LocalDiskBackend: KV saved by one engine is loaded by the next one after a restart', async () => {
    const disk = tempDir('kvc-engine-disk-');
    try {
      const cfg = validateCacheConfig({ chunk_size: 16, local_cpu: false, max_local_disk_size: 0.01, local_disk: disk }).config;
      const opts = { model: MODEL, maxModelLen: 256, kvTransferConfig: CONNECTOR, cacheConfig: cfg };
      const prompt = ids(40, 6);
      const a = await startEngine(opts);
      const first = await complete(a.url, prompt);
      assert.equal(first.cached, 0);
      await a.close();
      const b = await startEngine(opts);
      engines.push(b);
      const second = await complete(b.url, prompt);
      assert.equal(second.cached, 39);
      assert.equal(second.text, first.text);
    } finally {
      rmSync(disk, { recursive: true, force: true });
    }
  });

  it('discard_partial_chunks: the partial last chunk is neither stored nor loaded', async () => {
    const e = await start(true);
    const prompt = ids(40, 4);
    const first = await complete(e.url, prompt);
    assert.equal(e.store!.keys('LocalCPUBackend').length, 2);
    const second = await complete(e.url, prompt);
    assert.equal(second.cached, 32);
    assert.equal(second.text, first.text);
  });

  it('a corrupted chunk is rejected and recomputed, output unchanged', async () => {
    const e = await start(false);
    const prompt = ids(48, 5); // three full chunks
    const first = await complete(e.url, prompt);
    const keys = e.connector!.spans(prompt).map((s) => s.key);
    assert.equal(keys.length, 3);
    // Flip one payload byte of the second chunk in place: its checksum no longer matches.
    const buf = e.store!.cpu()!.peek(keys[1]!)!;
    buf[HEADER_BYTES + 100]! ^= 0xff;
    const second = await complete(e.url, prompt);
    assert.equal(second.cached, 16, 'only the chunk before the corrupted one is used');
    assert.equal(second.text, first.text);
    // The bad copy was dropped and the recomputed KV stored again: the chunk now verifies.
    verifyChunk(e.store!.cpu()!.peek(keys[1]!)!, keys[1]!);
    const third = await complete(e.url, prompt);
    assert.equal(third.cached, 47);
    assert.equal(third.text, first.text);
  });
});

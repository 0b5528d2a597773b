// Conformance: kvc driven the way an LMCache or vLLM user drives their own stack, through real
// processes (a `kvc controller`, two `kvc engine`s with cache instances registered to it, and a
// `kvc proxy` in front of the engines): LMCache-shaped controller calls with LMCache's answers,
// the `openai` client with vLLM's extra request fields, and a scrape of the vllm:* / lmcache:*
// names. docs/coming-from-lmcache-vllm.md lists what this checks and what still differs.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { freePortRange } from '../../harness/ports.js';
import { postJson, startKvc, waitHttp, waitUntil as waitFor, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

const MODEL = 'builtin:tiny';
const CHUNK = 32;
const CONNECTOR = JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both' });
const CPU = 'LocalCPUBackend';

const procs: Proc[] = [];
let ctl = '';
const engine = { A: '', B: '' };
let proxy = '';

const waitUntil = <T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 30_000) => waitFor(what, fn, timeoutMs, 100);
const prompt = (tag: string) => `${tag}: the KV cache is a movable object. ` + Array.from({ length: 40 }, (_, i) => `${tag}${i}`).join(' ');
const tokenize = async (text: string) => (await postJson(`${engine.A}/tokenize`, { model: MODEL, prompt: text })).json.tokens as number[];
const lookup = async (tokens: number[], extra: Record<string, unknown> = {}) => {
  const r = await postJson(`${ctl}/lookup`, { tokens, ...extra });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json as { event_id: string; layout_info: Record<string, [string, number]> };
};
const finished = (event_id: string) =>
  waitUntil(`event ${event_id}`, async () => {
    const r = await postJson(`${ctl}/check_finish`, { event_id });
    return r.json.status === 'finished' || r.json.status === 'failed' ? r.json : undefined;
  });

before(async () => {
  const base = await freePortRange(9);
  ctl = `http://127.0.0.1:${base}`;
  const c = startKvc(['controller', '--port', String(base), '--monitor-port', String(base + 1)]);
  procs.push(c);
  await c.waitFor(/kvc controller ready/, 20_000);
  const dir = tempDir('kvc-conformance-');
  for (const [i, who] of (['A', 'B'] as const).entries()) {
    const yaml = join(dir, `${who}.yaml`);
    writeFileSync(
      yaml,
      [`chunk_size: ${CHUNK}`, 'local_cpu: true', 'max_local_cpu_size: 0.01', 'max_local_disk_size: 0', 'enable_controller: true', `kvc_instance_id: engine-${who}`,
        `controller_url: 127.0.0.1:${base + 1}`, `kvc_worker_port: ${base + 2 + 3 * i}`, `distributed_url: 127.0.0.1:${base + 3 + 3 * i}`].join('\n'),
    );
    const port = base + 4 + 3 * i;
    engine[who] = `http://127.0.0.1:${port}`;
    procs.push(startKvc(['engine', '--port', String(port), '--model', MODEL, '--kv-transfer-config', CONNECTOR], { KVC_CONFIG_FILE: yaml }));
  }
  await Promise.all(Object.values(engine).map((u) => waitHttp(`${u}/health`, 120_000)));
  await waitUntil('both engines registered', async () => (await (await fetch(`${ctl}/instances`)).json()).instances.length === 2);
  const proxyPort = base + 8;
  proxy = `http://127.0.0.1:${proxyPort}`;
  procs.push(startKvc(['proxy', '--port', String(proxyPort), '--num-prefillers', '0', '--decoder-port', `${base + 4},${base + 7}`]));
  await waitHttp(`${proxy}/health`, 30_000);
});

after(async () => {
  for (const p of procs.reverse()) await p.kill();
});

describe('LMCache controller API', () => {
  it('lookup answers {event_id, layout_info: {instance: [location, num_tokens]}}', async () => {
    const p = prompt('lookup');
    await postJson(`${engine.A}/v1/completions`, { model: MODEL, prompt: p, max_tokens: 1 });
    const tokens = await tokenize(p);
    const r = await waitUntil('indexed', async () => ((await lookup(tokens)).layout_info['engine-A'] ? lookup(tokens) : undefined));
    assert.match(r.event_id, /\S/);
    const [location, n] = r.layout_info['engine-A']!;
    assert.equal(location, CPU);
    assert.equal(n, tokens.length, 'the whole prompt, its last partial chunk included');
    assert.equal(r.layout_info['engine-B'], undefined);
  });

  it('move with should_copy: true copies (the source keeps its chunks); check_finish answers status', async () => {
    const p = prompt('copy');
    await postJson(`${engine.A}/v1/completions`, { model: MODEL, prompt: p, max_tokens: 1 });
    const tokens = await tokenize(p);
    await waitUntil('indexed on A', async () => (await lookup(tokens)).layout_info['engine-A']);
    const mv = await postJson(`${ctl}/move`, { old_position: ['engine-A', CPU], new_position: ['engine-B', CPU], tokens, should_copy: true });
    assert.equal(mv.status, 200, JSON.stringify(mv.json));
    assert.equal(typeof mv.json.event_id, 'string');
    assert.ok(mv.json.num_tokens >= CHUNK, JSON.stringify(mv.json));
    assert.equal((await finished(mv.json.event_id)).status, 'finished');
    const both = await waitUntil('on A and B', async () => {
      const l = await lookup(tokens);
      return l.layout_info['engine-A'] && l.layout_info['engine-B'] ? l : undefined;
    });
    assert.equal(both.layout_info['engine-A']![1], both.layout_info['engine-B']![1], 'a copy: both hold the prompt');
  });

  it('pin, health, query_instance, query_worker_info answer with LMCache fields', async () => {
    const p = prompt('pin');
    await postJson(`${engine.B}/v1/completions`, { model: MODEL, prompt: p, max_tokens: 1 });
    const tokens = await tokenize(p);
    await waitUntil('indexed on B', async () => (await lookup(tokens)).layout_info['engine-B']);
    const pin = await postJson(`${ctl}/pin`, { instance_id: 'engine-B', location: CPU, tokens });
    assert.deepEqual(Object.keys(pin.json).sort(), ['event_id', 'num_tokens']);
    assert.equal((await finished(pin.json.event_id)).status, 'finished');

    const h = await postJson(`${ctl}/health`, { instance_id: 'engine-A' });
    assert.equal(h.status, 200);
    assert.equal(typeof h.json.event_id, 'string');
    assert.deepEqual(h.json.error_codes, { 0: 0 });

    const q = await postJson(`${ctl}/query_instance`, { event_id: 'qi-1', ip: '127.0.0.1' });
    assert.deepEqual([q.json.event_id, q.json.res], ['qi-1', 'engine-A']);

    const w = await postJson(`${ctl}/query_worker_info`, { instance_id: 'engine-B', worker_ids: [0] });
    assert.equal(w.status, 200, JSON.stringify(w.json));
    assert.equal(typeof w.json.event_id, 'string');
    const info = w.json.worker_infos[0];
    assert.deepEqual(Object.keys(info).sort(), ['distributed_url', 'instance_id', 'ip', 'last_heartbeat_time', 'port', 'registration_time', 'worker_id']);
    assert.deepEqual([info.instance_id, info.worker_id, info.ip], ['engine-B', 0, '127.0.0.1']);
    assert.ok(Math.abs(info.last_heartbeat_time - Date.now() / 1000) < 60, 'seconds since the epoch');
  });

  it('clear: keep_fraction is refused with the reason and clears nothing; a plain clear answers {event_id, num_tokens}', async () => {
    const p = prompt('clear');
    await postJson(`${engine.A}/v1/completions`, { model: MODEL, prompt: p, max_tokens: 1 });
    const tokens = await tokenize(p);
    await waitUntil('indexed on A', async () => (await lookup(tokens)).layout_info['engine-A']);
    const partial = await postJson(`${ctl}/clear`, { instance_id: 'engine-A', location: CPU, keep_fraction: 0.5 });
    assert.equal(partial.status, 400);
    assert.equal(partial.json.error.param, 'keep_fraction');
    assert.match(partial.json.error.message, /not supported by kvc/);
    assert.ok((await lookup(tokens)).layout_info['engine-A'], 'nothing was cleared');
    const c = await postJson(`${ctl}/clear`, { instance_id: 'engine-A', location: CPU });
    assert.equal(c.status, 200, JSON.stringify(c.json));
    assert.equal(typeof c.json.event_id, 'string');
    assert.ok(c.json.num_tokens >= CHUNK, JSON.stringify(c.json));
    assert.equal((await finished(c.json.event_id)).status, 'finished');
    await waitUntil('cleared', async () => !(await lookup(tokens)).layout_info['engine-A']);
  });

  it('an unknown field is a 400 naming it and the closest known name, and changes nothing', async () => {
    const r = await postJson(`${ctl}/move`, { old_position: ['engine-A', CPU], new_position: ['engine-B', CPU], tokens: [1, 2], shouldcopy: true });
    assert.equal(r.status, 400);
    assert.deepEqual([r.json.error.code, r.json.error.param], ['unknown_field', 'shouldcopy']);
    assert.match(r.json.error.message, /did you mean `should_copy`\?/);
  });
});

describe('vLLM request fields (openai client)', () => {
  let client: OpenAI;
  before(() => {
    client = new OpenAI({ baseURL: `${engine.A}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
  });
  // vLLM's fields are not in the openai client's types: they go in the body as vLLM's docs show.
  const create = (body: Record<string, unknown>) => client.completions.create({ model: MODEL, max_tokens: 2, temperature: 0, ...body } as unknown as OpenAI.CompletionCreateParamsNonStreaming);

  it('request_id is the request id; priority is accepted', async () => {
    const r = await create({ prompt: 'hello', request_id: 'my-req-42', priority: -3 });
    assert.equal(r.id, 'cmpl-my-req-42');
  });

  it('cache_salt: KV is shared only between requests of the same salt', async () => {
    const p = prompt('salted');
    const cached = async (salt?: string) => {
      const r = await create({ prompt: p, ...(salt ? { cache_salt: salt } : {}) });
      return (r.usage as unknown as { prompt_tokens_details: { cached_tokens: number } }).prompt_tokens_details.cached_tokens;
    };
    assert.equal(await cached('tenant-1'), 0);
    const tokens = await tokenize(p);
    // The salted chunks are indexed under salted keys only: unsalted lookup misses, salted finds.
    await waitUntil('salted chunks indexed', async () => (await lookup(tokens, { cache_salt: 'tenant-1' })).layout_info['engine-A']);
    assert.equal((await lookup(tokens)).layout_info['engine-A'], undefined);
    assert.equal(await cached('tenant-2'), 0, 'another salt reuses nothing');
    assert.equal(await cached(), 0, 'no salt reuses nothing');
    assert.ok((await cached('tenant-1')) >= CHUNK, 'the same salt reuses the prompt');
  });

  it('add_special_tokens: false leaves BOS out of the prompt', async () => {
    const withBos = await create({ prompt: 'count me' });
    const without = await create({ prompt: 'count me', add_special_tokens: false });
    assert.equal(without.usage!.prompt_tokens, withBos.usage!.prompt_tokens - 1);
  });

  it('stream_options.continuous_usage_stats puts usage in every chunk', async () => {
    const stream = await client.completions.create({ model: MODEL, prompt: 'hi', max_tokens: 3, temperature: 0, stream: true, stream_options: { include_usage: true, continuous_usage_stats: true } } as unknown as OpenAI.CompletionCreateParamsStreaming);
    const usage: number[] = [];
    for await (const chunk of stream) usage.push(chunk.usage?.completion_tokens ?? -1);
    assert.ok(usage.length >= 4, `chunks: ${usage.join(',')}`);
    assert.ok(usage.every((n) => n >= 0), `every chunk carries usage: ${usage.join(',')}`);
    assert.equal(usage.at(-1), 3);
  });

  it('errors carry param, the field at fault', async () => {
    await assert.rejects(create({ prompt: 'x', temperature: 7 }), (e: InstanceType<typeof OpenAI.APIError>) => e.status === 400 && e.param === 'temperature');
    await assert.rejects(create({ prompt: 'x', cache_salt: '' }), (e: InstanceType<typeof OpenAI.APIError>) => e.status === 400 && e.param === 'cache_salt');
  });
});

describe('vLLM routes on the engine and the proxy', () => {
  it('/version and /ping', async () => {
    for (const url of [engine.A, proxy]) {
      const v = await (await fetch(`${url}/version`)).json();
      assert.match(v.version, /^\d+\.\d+\.\d+/);
      assert.equal((await fetch(`${url}/ping`)).status, 200);
      assert.equal((await fetch(`${url}/ping`, { method: 'POST' })).status, 200);
    }
  });

  it('the proxy answers /tokenize and /detokenize as the engines do, a bad field as a 400', async () => {
    const body = { model: MODEL, prompt: 'through the proxy' };
    const direct = await postJson(`${engine.A}/tokenize`, body);
    const viaProxy = await postJson(`${proxy}/tokenize`, body);
    assert.deepEqual(viaProxy, direct);
    const text = await postJson(`${proxy}/detokenize`, { model: MODEL, tokens: direct.json.tokens });
    assert.equal(text.status, 200);
    assert.equal(text.json.prompt.trim(), 'through the proxy');
    const bad = await postJson(`${proxy}/tokenize`, { model: MODEL, prompt: 'x', add_special_token: false });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'add_special_token');
  });
});

describe('metrics under vLLM and LMCache names', () => {
  it('an engine scrape has the vllm:* and lmcache:* series dashboards query', async () => {
    const text = await (await fetch(`${engine.A}/metrics`)).text();
    const value = (series: string) => {
      const m = text.match(new RegExp(`^${series.replace(/[{}"]/g, (c) => `\\${c}`)}(?:\\{[^}]*\\})? (\\S+)$`, 'm'));
      assert.ok(m, `${series} in the scrape`);
      return Number(m[1]);
    };
    for (const name of ['vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc']) assert.ok(value(name) >= 0);
    assert.ok(value('vllm:prompt_tokens_total') > 0);
    assert.ok(value('vllm:generation_tokens_total') > 0);
    assert.ok(value('vllm:prefix_cache_queries_total') >= value('vllm:prefix_cache_hits_total'));
    assert.ok(value('vllm:prefix_cache_hits_total') > 0, 'the salted prompt was a hit');
    assert.match(text, /^vllm:request_success_total\{[^}]*finished_reason="length"[^}]*\} [1-9]/m);
    for (const h of ['time_to_first_token_seconds', 'inter_token_latency_seconds', 'e2e_request_latency_seconds', 'request_queue_time_seconds', 'request_prefill_time_seconds', 'request_decode_time_seconds', 'request_inference_time_seconds']) {
      assert.ok(value(`vllm:${h}_count`) > 0, h);
    }
    // vLLM's bounds: beyond 60 s.
    assert.match(text, /^vllm:time_to_first_token_seconds_bucket\{[^}]*le="2560"/m);
    assert.match(text, /^vllm:e2e_request_latency_seconds_bucket\{[^}]*le="7680"/m);
    assert.match(text, /model_name="builtin:tiny"/);
    assert.ok(value('lmcache:num_requested_tokens_total') >= value('lmcache:num_hit_tokens_total'));
    assert.ok(value('lmcache:num_retrieve_requests_total') > 0);
    assert.ok(value('lmcache:num_store_requests_total') > 0);
    assert.ok(value('lmcache:num_stored_tokens_total') >= CHUNK);
    assert.ok(value('lmcache:local_cache_usage') >= 0);
    assert.ok(value('lmcache:time_to_retrieve_count') > 0);
  });
});

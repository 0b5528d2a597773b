// A real `kvc engine` process (kv_both, a CPU tier of ~14 chunks) under KVC_LOG_FORMAT=json:
// /metrics has the cache figures with their Prometheus types (hits, bytes and time read and
// written, bytes per tier, evictions) and the scheduler's step histogram; stdout has one JSON
// request line per request with its id, prompt and cached tokens, TTFT and duration. With
// --disable-log-requests there is none. The periodic statistics line is checked in process
// with a short interval.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePortRange } from '../../harness/ports.js';
import { EngineMetrics } from '../../src/engine/metrics.js';
import { EngineStatsLog } from '../../src/engine/stats_log.js';
import { postJson, startKvc, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

const MODEL = 'builtin:tiny';
const CONNECTOR = JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both', kv_connector_extra_config: { discard_partial_chunks: false } });
const ids = (n: number, salt = 0) => Array.from({ length: n }, (_, i) => 1000 + ((i * 37 + salt * 101) % 20000));

function value(text: string, name: string, labels = ''): number {
  const esc = labels.replace(/[{}"]/g, (c) => `\\${c}`);
  const m = new RegExp(`^${name}\\{[^}]*${esc}[^}]*\\} ([0-9.e+-]+)$`, 'm').exec(text) ?? new RegExp(`^${name} ([0-9.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

const type = (text: string, name: string) => new RegExp(`^# TYPE ${name} (\\w+)$`, 'm').exec(text)?.[1];

describe('engine metrics and request log lines (real process)', () => {
  let dir: string;
  let logged: Proc;
  let quiet: Proc;
  let url = '';
  let quietUrl = '';

  before(async () => {
    dir = tempDir('kvc-engine-metrics-');
    const yaml = join(dir, 'cache.yaml');
    // ~512 KiB: about 14 chunks of 16 tokens of the built-in model, so filling it evicts.
    writeFileSync(yaml, 'chunk_size: 16\nlocal_cpu: true\nmax_local_cpu_size: 0.0005\n');
    const base = await freePortRange(2);
    const args = ['engine', '--model', MODEL, '--max-model-len', '256', '--kv-transfer-config', CONNECTOR];
    logged = startKvc([...args, '--port', String(base)], { KVC_CONFIG_FILE: yaml, KVC_LOG_FORMAT: 'json' });
    quiet = startKvc([...args, '--port', String(base + 1), '--disable-log-requests'], { KVC_CONFIG_FILE: yaml, KVC_LOG_FORMAT: 'json' });
    url = (await logged.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
    quietUrl = (await quiet.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
  });

  after(async () => {
    await Promise.all([logged?.kill(), quiet?.kill()]);
    rmSync(dir, { recursive: true, force: true });
  });

  const complete = async (base: string, prompt: number[]) => {
    const r = await postJson(`${base}/v1/completions`, { model: MODEL, prompt, max_tokens: 4, temperature: 0, ignore_eos: true });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return r.json as { id: string; usage: { prompt_tokens_details: { cached_tokens: number } } };
  };

  test('cache, eviction and scheduler metrics with their types', async () => {
    await complete(url, ids(40));
    const again = await complete(url, ids(40));
    assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0, 'the repeat is a cache hit');
    for (let i = 1; i <= 8; i++) await complete(url, ids(64, i)); // 32 more chunks: past the tier's room
    const m = await (await fetch(`${url}/metrics`)).text();
    for (const [name, t] of [
      ['kvc_cache_query_tokens_total', 'counter'], ['kvc_cache_hit_tokens_total', 'counter'],
      ['kvc_cache_retrieved_bytes_total', 'counter'], ['kvc_cache_retrieve_duration_seconds', 'histogram'],
      ['kvc_cache_stored_bytes_total', 'counter'], ['kvc_cache_store_duration_seconds', 'histogram'],
      ['kvc_cache_evicted_chunks_total', 'counter'], ['kvc_cache_bytes', 'gauge'], ['kvc_cache_capacity_bytes', 'gauge'],
      ['kvc_cache_cold_chunks', 'gauge'], ['kvc_cache_replica_chunks', 'gauge'],
      ['kvc_engine_step_duration_seconds', 'histogram'], ['kvc_engine_num_requests_running', 'gauge'],
      ['kvc_xfer_sent_bytes_total', 'counter'],
    ] as const) assert.equal(type(m, name), t, `# TYPE of ${name}`);
    assert.equal(value(m, 'kvc_cache_query_tokens_total'), 40 + 40 + 8 * 64);
    assert.equal(value(m, 'kvc_cache_hit_tokens_total'), again.usage.prompt_tokens_details.cached_tokens);
    assert.ok(value(m, 'kvc_cache_retrieved_chunks_total') >= 2);
    assert.ok(value(m, 'kvc_cache_retrieved_bytes_total') > 0);
    assert.ok(value(m, 'kvc_cache_retrieve_duration_seconds_count') >= 1);
    assert.ok(value(m, 'kvc_cache_stored_bytes_total') > 0);
    assert.equal(value(m, 'kvc_cache_store_duration_seconds_count'), value(m, 'kvc_engine_chunks_saved_total'));
    const used = value(m, 'kvc_cache_bytes', 'location="LocalCPUBackend"');
    const cap = value(m, 'kvc_cache_capacity_bytes', 'location="LocalCPUBackend"');
    assert.ok(used > 0 && used <= cap, `bytes ${used} within capacity ${cap}`);
    assert.ok(value(m, 'kvc_cache_evicted_chunks_total', 'location="LocalCPUBackend"') > 0, 'filling the tier evicted chunks');
    // The segments are parts of the tier: no controller here, so no replicas.
    const cpu = 'location="LocalCPUBackend"';
    assert.equal(value(m, 'kvc_cache_replica_chunks', cpu), 0);
    assert.ok(value(m, 'kvc_cache_cold_chunks', cpu) <= value(m, 'kvc_cache_chunks', cpu));
    assert.ok(value(m, 'kvc_engine_step_duration_seconds_count', 'phase="prefill"') >= 1);
    assert.ok(value(m, 'kvc_engine_step_duration_seconds_count', 'phase="decode"') >= 1);
  });

  test('one JSON request line per request; none with --disable-log-requests', async () => {
    const first = await complete(url, ids(48, 9));
    const second = await complete(url, ids(48, 9));
    const lines = () => logged.output().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>);
    const reqLines = () => lines().filter((l) => l.component === 'engine.requests');
    const find = async (id: string) => {
      const end = Date.now() + 20_000;
      for (;;) {
        // The OpenAI id is `cmpl-<request id>`.
        const hit = reqLines().filter((l) => id === `cmpl-${String(l.request_id)}`);
        if (hit.length) return hit;
        if (Date.now() > end) assert.fail(`no request line for ${id} in:\n${logged.output().slice(-3000)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    const [a] = await find(first.id);
    const [b] = await find(second.id);
    for (const l of [a!, b!]) {
      assert.equal(l.level, 'info');
      assert.equal(l.prompt_tokens, 48);
      assert.equal(l.generated_tokens, 4);
      assert.equal(typeof l.ttft_ms, 'number');
      assert.ok((l.duration_ms as number) >= (l.ttft_ms as number));
      assert.equal(l.finish_reason, 'length');
      assert.match(String(l.msg), /^request \S+: prompt 48 tokens \(\d+ cached\), generated 4, TTFT [\d.]+ ms, duration [\d.]+ ms, finish length$/);
    }
    assert.equal(a!.cached_tokens, 0);
    assert.equal(b!.cached_tokens, second.usage.prompt_tokens_details.cached_tokens);
    assert.ok(lines().every((l) => typeof l.time === 'string' && typeof l.component === 'string'), 'every stdout line is a JSON log object');

    await complete(quietUrl, ids(48, 9));
    // Stop the process so that everything it printed has been read, then look.
    await quiet.kill('SIGTERM');
    assert.match(quiet.output(), /"msg":"SIGTERM: shutting down"/);
    assert.doesNotMatch(quiet.output(), /engine\.requests/);
  });
});

test('the periodic statistics line: printed while busy, once more when idle, then quiet', async () => {
  const metrics = new EngineMetrics({ model: 'm' });
  const out: string[] = [];
  const write = process.stdout.write.bind(process.stdout);
  // Capture this process's log lines for the duration of the test.
  process.stdout.write = ((chunk: string | Uint8Array, ...rest: unknown[]) => {
    if (String(chunk).includes('[engine.stats]')) out.push(String(chunk));
    return write(chunk as string, ...(rest as []));
  }) as typeof process.stdout.write;
  const waitLines = async (n: number) => {
    const end = Date.now() + 10_000;
    while (out.length < n) {
      if (Date.now() > end) assert.fail(`expected ${n} statistics lines, got: ${out.join('')}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  };
  const log = new EngineStatsLog(metrics, 20);
  try {
    await log.ready;
    metrics.promptTokens.inc(100);
    metrics.cacheQueryTokens.inc(100);
    metrics.cacheHitTokens.inc(25);
    metrics.running.set(1);
    await waitLines(1);
    assert.match(out[0]!, /Avg prompt throughput: [\d.]+ tokens\/s, Avg generation throughput: 0\.0 tokens\/s, Running: 1 reqs, Waiting: 0 reqs, KV cache usage: 0\.0%, Prefix cache hit rate: 25\.0%/);
    metrics.running.set(0);
    // (A tick before the change may print one more busy line: wait for the closing one.)
    const closing = /Running: 0 reqs, Waiting: 0 reqs, KV cache usage: 0\.0%, Prefix cache hit rate: -/;
    for (const end = Date.now() + 10_000; !out.some((l) => closing.test(l)); await new Promise((r) => setTimeout(r, 10))) {
      if (Date.now() > end) assert.fail(`no closing line in: ${out.join('')}`);
    }
    // Idle now: several intervals pass (each one re-reads the metrics) and nothing more is printed.
    const before = out.length;
    assert.match(out[before - 1]!, closing, 'the closing line is the last one');
    for (let i = 0; i < 5; i++) await new Promise((r) => setTimeout(r, 30));
    assert.equal(out.length, before, `idle lines: ${out.slice(before).join('')}`);
  } finally {
    log.stop();
    process.stdout.write = write;
  }
});

// Log formats and the engine's log lines: KVC_LOG_FORMAT=json (one JSON object per line with the
// line's figures as fields), refusal of unknown KVC_LOG_LEVEL / KVC_LOG_FORMAT values, the
// per-request line and the vLLM-like periodic statistics line (quiet when idle).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { formatLine, logEnvErrors } from '../../src/common/log.js';
import { requestLine } from '../../src/engine/request_log.js';
import { statsLine } from '../../src/engine/stats_log.js';
import type { EngineSample } from '../../src/protocol/instance_stats.js';
import { CLI } from '../../harness/proc.js';

const t = new Date('2026-01-02T03:04:05.678Z');

test('text and JSON line formats; fields never replace the fixed keys', () => {
  assert.equal(formatLine('text', t, 'warn', 'engine', 'hello', { a: 1 }), '2026-01-02T03:04:05.678Z WARN  [engine] hello\n');
  const j = JSON.parse(formatLine('json', t, 'info', 'engine.requests', 'done', { request_id: 'cmpl-1', ttft_ms: 12.5, level: 'x', none: null }));
  assert.deepEqual(j, { time: '2026-01-02T03:04:05.678Z', level: 'info', component: 'engine.requests', msg: 'done', request_id: 'cmpl-1', ttft_ms: 12.5, field_level: 'x', none: null });
  assert.ok(formatLine('json', t, 'info', 'c', 'line "with" quotes\nand newline').split('\n').length === 2, 'one line, newline escaped');
});

test('unknown KVC_LOG_LEVEL / KVC_LOG_FORMAT values are named; the kvc command refuses them at start', () => {
  assert.deepEqual(logEnvErrors({ KVC_LOG_LEVEL: 'info', KVC_LOG_FORMAT: 'json' }), []);
  assert.deepEqual(logEnvErrors({}), []);
  assert.deepEqual(logEnvErrors({ KVC_LOG_LEVEL: 'verbose', KVC_LOG_FORMAT: 'xml' }), [
    'KVC_LOG_LEVEL: expected one of debug, info, warn, error, found "verbose"',
    'KVC_LOG_FORMAT: expected one of text, json, found "xml"',
  ]);
  const r = spawnSync(process.execPath, [CLI, 'keys', '--help'], { env: { ...process.env, KVC_LOG_FORMAT: 'yaml' }, encoding: 'utf8', timeout: 30_000 });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /^kvc: KVC_LOG_FORMAT: expected one of text, json, found "yaml"$/m);
});

test('KVC_LOG_FORMAT=json: a process writes one JSON object per line', () => {
  // In a child process: the format is read from the environment when the process starts.
  const code = `import('${new URL('../../src/common/log.js', import.meta.url).href}').then((m) => m.logger('probe').info('ready', { port: 9000 }))`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', code], { env: { ...process.env, KVC_LOG_FORMAT: 'json', KVC_LOG_LEVEL: 'info' }, encoding: 'utf8', timeout: 30_000 });
  assert.equal(r.status, 0, r.stderr);
  const line = JSON.parse(r.stdout.trim());
  assert.equal(line.component, 'probe');
  assert.equal(line.msg, 'ready');
  assert.equal(line.port, 9000);
  assert.match(line.time, /^\d{4}-\d\d-\d\dT/);
});

test('request line: id, prompt and cached tokens, TTFT, duration', () => {
  const l = requestLine({ requestId: 'cmpl-7', promptTokens: 120, cachedTokens: 96, receivedTokens: 0, generatedTokens: 16, ttftMs: 45.23, durationMs: 310.44, finishReason: 'length' });
  assert.equal(l.text, 'request cmpl-7: prompt 120 tokens (96 cached), generated 16, TTFT 45.2 ms, duration 310.4 ms, finish length');
  assert.deepEqual(l.fields, { request_id: 'cmpl-7', prompt_tokens: 120, cached_tokens: 96, received_tokens: 0, generated_tokens: 16, ttft_ms: 45.2, duration_ms: 310.4, finish_reason: 'length' });
  const none = requestLine({ requestId: 'cmpl-8', promptTokens: 10, cachedTokens: 0, receivedTokens: 8, generatedTokens: 0, ttftMs: null, durationMs: 3, finishReason: 'abort' });
  assert.equal(none.text, 'request cmpl-8: prompt 10 tokens (0 cached, 8 received), generated 0, TTFT -, duration 3.0 ms, finish abort');
});

const sample = (o: Partial<EngineSample> = {}): EngineSample => ({
  prompt_tokens: 0, query_tokens: 0, cached_tokens: 0, transferred_tokens: 0, generation_tokens: 0, ttft_sum_seconds: 0, ttft_count: 0,
  requests_running: 0, requests_waiting: 0, kv_usage_ratio: 0, ...o,
});

test('statistics line: throughput, running/waiting, KV usage, hit rate; quiet when idle after one closing line', () => {
  const a = sample();
  const b = sample({ prompt_tokens: 1000, query_tokens: 1000, cached_tokens: 250, generation_tokens: 200, requests_running: 2, requests_waiting: 1, kv_usage_ratio: 0.041 });
  const l = statsLine(a, b, 10, false)!;
  assert.equal(l.text, 'Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 20.0 tokens/s, Running: 2 reqs, Waiting: 1 reqs, KV cache usage: 4.1%, Prefix cache hit rate: 25.0%');
  assert.equal(l.active, true);
  assert.equal(l.fields.prefix_cache_hit_rate, 0.25);
  // Requests done: one closing line showing 0 running, then nothing while idle.
  const c = sample({ ...b, requests_running: 0, requests_waiting: 0, kv_usage_ratio: 0 });
  const closing = statsLine(b, c, 10, true)!;
  assert.match(closing.text, /^Avg prompt throughput: 0\.0 tokens\/s, Avg generation throughput: 0\.0 tokens\/s, Running: 0 reqs, Waiting: 0 reqs, KV cache usage: 0\.0%, Prefix cache hit rate: -$/);
  assert.equal(closing.active, false);
  assert.equal(statsLine(c, c, 10, false), null);
  // A decoder says how much of its prompts arrived by transfer.
  const d = sample({ ...c, prompt_tokens: 1100, query_tokens: 1100, transferred_tokens: 90 });
  assert.match(statsLine(c, d, 10, false)!.text, /Prefix cache hit rate: 0\.0%, KV received by transfer: 90\.0%$/);
});

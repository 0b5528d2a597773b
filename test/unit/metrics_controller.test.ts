// The controller's side of observability, in process with its real parts (Registry, EventLog,
// Operations, the HTTP API): heartbeat stats (usage per location, engine samples, bounded and
// dropped with the instance, malformed ones refused without losing the heartbeat), counters and
// histograms with their Prometheus types, operation and HTTP latency, GET /events and the
// dashboard's routes.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { FastifyInstance } from 'fastify';
import { EventLog } from '../../src/controller/events.js';
import { buildHttpApi } from '../../src/controller/http_api.js';
import { Operations } from '../../src/controller/operations.js';
import { ENGINE_SAMPLES_KEPT, Registry } from '../../src/controller/registry.js';
import { MONITOR_PROTOCOL_VERSION, packKeys } from '../../src/protocol/monitor.js';
import type { EngineSample } from '../../src/protocol/instance_stats.js';

const register = (instance_id: string) => ({
  t: 'register', v: MONITOR_PROTOCOL_VERSION, instance_id, worker_id: 0, session: `s-${instance_id}`, ip: '127.0.0.1', worker_port: 1,
  distributed_url: null, chunk_size: 16, model_id: 'm', seed: '0', locations: ['LocalCPUBackend', 'LocalDiskBackend'], pid: 1,
});
const engine = (n: number): EngineSample => ({
  prompt_tokens: 10 * n, query_tokens: 10 * n, cached_tokens: 5 * n, transferred_tokens: 0, generation_tokens: n,
  ttft_sum_seconds: 0.01 * n, ttft_count: n, requests_running: 0, requests_waiting: 0, kv_usage_ratio: 0,
});
const usage = { LocalCPUBackend: { bytes: 2048, capacity_bytes: 1 << 20, chunks: 2, pinned: 1 } };

describe('heartbeat stats in the registry', () => {
  test('usage and engine samples are kept, bounded, and dropped with the instance', () => {
    const r = new Registry({ heartbeatTimeoutMs: 1000, seed: 0n });
    assert.equal(r.handle('rA', register('A'), 0)?.t, 'welcome');
    assert.equal(r.handle('rA', { t: 'ops', ops: [[1, 'LocalCPUBackend', packKeys(['00000000000000aa', '00000000000000bb'])]] }, 1), null);
    assert.deepEqual(r.engineSamples(), { A: [] });
    assert.equal(r.handle('rA', { t: 'hb', stats: { locations: usage, engine: engine(1) } }, 5)?.t, 'hb_ack');
    const ops = new Operations(r, new EventLog(), 0n, { commandMs: 1000, transferMs: 1000 });
    const loc = (ops.describeInstances()[0] as { workers: { locations: Record<string, unknown> }[] }).workers[0]!.locations.LocalCPUBackend;
    assert.deepEqual(loc, { chunks: 2, bytes: 2048, capacity_bytes: 1 << 20, pinned: 1 });
    for (let i = 2; i <= ENGINE_SAMPLES_KEPT + 5; i++) r.handle('rA', { t: 'hb', stats: { locations: usage, engine: engine(i) } }, 5 + i);
    const kept = r.engineSamples().A!;
    assert.equal(kept.length, ENGINE_SAMPLES_KEPT);
    assert.equal(kept.at(-1)!.prompt_tokens, 10 * (ENGINE_SAMPLES_KEPT + 5));
    assert.equal(kept.at(-1)!.t, 10 + ENGINE_SAMPLES_KEPT, 'stamped with the controller clock');
    assert.equal(r.handle('rA', { t: 'bye' }, 2000), null);
    assert.deepEqual(r.engineSamples(), {});
  });

  test('malformed stats are refused naming the field; the heartbeat still counts; a plain hb is fine', () => {
    const r = new Registry({ heartbeatTimeoutMs: 1000, seed: 0n });
    r.handle('rB', register('B'), 0);
    const reply = r.handle('rB', { t: 'hb', stats: { locations: { LocalCPUBackend: { ...usage.LocalCPUBackend, bytes: -1 } } } }, 900);
    assert.equal(reply?.t, 'error');
    assert.match((reply as { message: string }).message, /malformed hb message: stats: locations\.LocalCPUBackend\.bytes: expected a non-negative number/);
    assert.equal(r.stats.badMessages, 1);
    assert.equal(r.reap(1500).length, 0, 'the heartbeat at 900 kept the worker alive');
    assert.equal(r.handle('rB', { t: 'hb' }, 1600)?.t, 'hb_ack');
  });
});

describe('controller metrics and routes', () => {
  let app: FastifyInstance;
  let ops: Operations;
  const get = async (url: string) => app.inject({ method: 'GET', url });

  before(async () => {
    const r = new Registry({ heartbeatTimeoutMs: 10_000, seed: 0n });
    ops = new Operations(r, new EventLog(), 0n, { commandMs: 1000, transferMs: 1000 });
    app = await buildHttpApi(ops);
    r.handle('rA', register('A'), Date.now());
  });
  after(() => app.close());

  test('types: counters, gauges, histograms; operations and HTTP requests observed', async () => {
    // An operation that completes at once: a move of an empty token list.
    const mv = await app.inject({ method: 'POST', url: '/move', payload: { old_position: ['A', 'LocalCPUBackend'], new_position: ['A', 'LocalDiskBackend'], tokens: [] } });
    assert.equal(mv.statusCode, 200, mv.body);
    await get('/instances');
    await get('/no-such-route');
    const m = (await get('/metrics')).body;
    const type = (name: string) => new RegExp(`^# TYPE ${name} (\\w+)$`, 'm').exec(m)?.[1];
    assert.equal(type('kvc_controller_admitted_keys_total'), 'counter');
    assert.equal(type('kvc_controller_registrations_total'), 'counter');
    assert.equal(type('kvc_controller_instances'), 'gauge');
    assert.equal(type('kvc_controller_operations_total'), 'counter');
    assert.equal(type('kvc_controller_operation_duration_seconds'), 'histogram');
    assert.equal(type('kvc_controller_http_request_duration_seconds'), 'histogram');
    assert.doesNotMatch(m, /^# TYPE kvc_controller_\w+_total gauge$/m, 'no counter exported as a gauge');
    assert.match(m, /^kvc_controller_registrations_total 1$/m);
    assert.match(m, /^kvc_controller_operations_total\{kind="move",status="finished"\} 1$/m);
    assert.match(m, /^kvc_controller_operation_duration_seconds_count\{kind="move",status="finished"\} 1$/m);
    assert.match(m, /^kvc_controller_http_request_duration_seconds_count\{method="POST",route="\/move",code="200"\} 1$/m);
    assert.match(m, /^kvc_controller_http_request_duration_seconds_count\{method="GET",route="\/instances",code="200"\} 1$/m);
    assert.match(m, /^kvc_controller_http_request_duration_seconds_count\{method="GET",route="unmatched",code="404"\} 1$/m);
    // A second scrape does not count the registrations twice.
    assert.match((await get('/metrics')).body, /^kvc_controller_registrations_total 1$/m);
  });

  test('GET /events: newest first, bounded, bad parameters named', async () => {
    for (let i = 0; i < 3; i++) await app.inject({ method: 'POST', url: '/pin', payload: { tokens: [], instance_id: 'A', location: 'LocalCPUBackend' } });
    const r = await get('/events?limit=2');
    assert.equal(r.statusCode, 200);
    const body = r.json() as { events: { kind: string; created_at: string }[]; counts: Record<string, number> };
    assert.equal(body.events.length, 2);
    assert.deepEqual(body.events.map((e) => e.kind), ['pin', 'pin']);
    assert.ok(body.events[0]!.created_at >= body.events[1]!.created_at);
    assert.equal(body.counts.finished, 4);
    for (const [q, re] of [['limit=0', /field `limit`: expected an integer from 1 to 1000/], ['limit=x', /field `limit`/], ['limit=5000', /field `limit`/], ['top=3', /field `top`: unknown field; known fields: limit/]] as const) {
      const bad = await get(`/events?${q}`);
      assert.equal(bad.statusCode, 400, q);
      assert.match(bad.json().error.message, re);
    }
  });

  test('the dashboard: page, its files, the charting library from node_modules, the state snapshot', async () => {
    const page = await get('/');
    assert.equal(page.statusCode, 200);
    assert.match(page.headers['content-type'] as string, /^text\/html/);
    assert.doesNotMatch(page.body, /https?:\/\//, 'nothing loaded from another origin');
    for (const [url, ct] of [['/dashboard/app.js', /javascript/], ['/dashboard/style.css', /css/], ['/dashboard/vendor/uPlot.iife.min.js', /javascript/], ['/dashboard/vendor/uPlot.min.css', /css/]] as const) {
      const r = await get(url);
      assert.equal(r.statusCode, 200, url);
      assert.match(r.headers['content-type'] as string, ct, url);
    }
    for (const url of ['/dashboard/vendor/package.json', '/dashboard/../../package.json', '/dashboard/index.html.bak']) assert.equal((await get(url)).statusCode, 404, url);
    for (const url of ['/dashboard', '/dashboard/']) {
      const r = await get(url);
      assert.equal(r.statusCode, 302, url);
      assert.equal(r.headers.location, '/');
    }
    const st = (await get('/dashboard/state')).json() as { instances: { instance_id: string }[]; events: unknown[]; event_counts: Record<string, number>; engine_samples: Record<string, unknown[]> };
    assert.deepEqual(st.instances.map((i) => i.instance_id), ['A']);
    assert.ok(st.events.length > 0 && st.events.length <= 50);
    assert.deepEqual(Object.keys(st.engine_samples), ['A']);
  });
});

// Controller tests: a real `kvc controller` process, cache instances
// in process (KvcStore + attachController) and, where a process must die, in a child process
// (this same file started with KVC_CTL_TEST_CHILD=1). Chunk sizes and layouts are tiny except
// in the kill-mid-move test, which needs a transfer long enough to interrupt. The transfer safety
// tests run on the same controller from controller_transfer_safety.ts.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { Dealer } from 'zeromq';
import { decode } from '@msgpack/msgpack';
import { DType, verifyChunk, type KvLayout } from '../../src/common/chunk.js';
import { chunkKeys } from '../../src/common/keys.js';
import { freePortRange } from '../../harness/ports.js';
import { encodeMsg, packKeys, PROTOCOL_VERSION } from '../../src/protocol/monitor.js';
import { onFreePorts, postJson, startKvc, waitHttp, type Proc } from '../../harness/proc.js';
import { CHUNK, makeChunk, MODEL, putPrompt, range, startInstance, waitUntil, type ControllerContext, type Instance, type Lookup } from './controller_fixtures.js';
import { transferSafetyTests } from './controller_transfer_safety.js';

// ---- child mode: a cache instance in its own process, so a test can SIGKILL it ----------------
if (process.env.KVC_CTL_TEST_CHILD === '1') {
  const layout = JSON.parse(process.env.KVC_CTL_LAYOUT!) as KvLayout;
  const inst = await startInstance(process.env.KVC_CTL_ID!, Number(process.env.KVC_CTL_MONITOR), {
    cpuGiB: Number(process.env.KVC_CTL_CPU_GIB),
    chunkSize: Number(process.env.KVC_CTL_CHUNK),
    layout,
  });
  // A chunk of a move is admitted only at its COMMIT; the first reservation is its first byte arriving.
  const reserve = inst.store.reserveIncoming.bind(inst.store);
  inst.store.reserveIncoming = (bytes) => (process.stdout.write('receiving\n'), reserve(bytes));
  await waitUntil('registration', () => inst.att.state === 'live');
  process.stdout.write(`child ready ${inst.att.workerPort}\n`);
} else {
  registerTests();
}

function registerTests(): void {
  let ctl: Proc;
  let http: number;
  let monitor: number;
  let url: string;
  const startController = async () => {
    ctl = startKvc(['controller', '--port', String(http), '--monitor-port', String(monitor), '--heartbeat-timeout', '3', '--command-timeout', '3']);
    await ctl.waitFor(/kvc controller ready/, 60_000);
  };
  const instances: Instance[] = [];
  let A: Instance;
  let B: Instance;

  const lookup = async (tokens: number[]) => {
    const r = await postJson(`${url}/lookup`, { tokens });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return r.json as Lookup;
  };
  const waitEvent = async (event_id: string, timeoutMs = 20_000) =>
    waitUntil(`event ${event_id}`, async () => {
      const r = await postJson(`${url}/check_finish`, { event_id });
      assert.equal(r.status, 200);
      return r.json.status === 'finished' || r.json.status === 'failed' ? (await (await fetch(`${url}/events/${event_id}`)).json()) : undefined;
    }, timeoutMs);

  const ctx: ControllerContext = { url: '', monitor: 0, instances, lookup, waitEvent };

  before(async () => {
    // Other ports when one was taken before the controller bound it (another file picked it too).
    await onFreePorts(() => freePortRange(2), async (base) => {
      http = base;
      monitor = base + 1;
      url = `http://127.0.0.1:${http}`;
      await startController();
    });
    Object.assign(ctx, { url, monitor });
    A = await startInstance('inst-A', monitor, { disk: true });
    B = await startInstance('inst-B', monitor);
    instances.push(A, B);
    await waitUntil('both registered', () => A.att.state === 'live' && B.att.state === 'live');
  });

  after(async () => {
    for (const i of instances) await i.close().catch(() => {});
    await ctl?.kill();
  });

  describe('registration and index', () => {
    test('instances register with their addresses, locations and chunk counts', async () => {
      const r = await (await fetch(`${url}/instances`)).json();
      const ids = r.instances.map((i: { instance_id: string }) => i.instance_id);
      assert.deepEqual(ids, ['inst-A', 'inst-B']);
      const a = r.instances[0].workers[0];
      assert.equal(a.worker_port, A.cfg.kvc_worker_port);
      assert.equal(a.distributed_url, A.cfg.distributed_url);
      assert.equal(a.model_id, MODEL);
      assert.equal(a.chunk_size, CHUNK);
      assert.deepEqual(Object.keys(a.locations).sort(), ['LocalCPUBackend', 'LocalDiskBackend']);
    });

    test('admits and evicts reach the index; lookup reports the chunk-aligned prefix per instance', async () => {
      const tokens = range(40, 1000); // 2 full chunks + a partial one of 8 tokens
      await putPrompt(A.store, tokens, 'LocalCPUBackend');
      const got = await waitUntil('lookup on A', async () => {
        const l = await lookup(tokens);
        return l.layout_detail['inst-A']?.matched_tokens === 40 ? l : undefined;
      });
      assert.deepEqual(got.layout_detail['inst-A'], { location: 'LocalCPUBackend', matched_tokens: 40, locations: { LocalCPUBackend: 40 } });
      assert.deepEqual(got.layout_info['inst-A'], ['LocalCPUBackend', 40], "LMCache's [location, num_tokens]");
      assert.equal(got.layout_detail['inst-B'], undefined);
      // A longer prompt sharing the prefix matches the prefix only.
      assert.equal((await lookup([...tokens.slice(0, 32), 7, 7, 7])).layout_detail['inst-A']?.matched_tokens, 32);
      // Evicting the second chunk cuts the prefix at the first.
      const spans = chunkKeys(tokens, { modelId: MODEL, chunkSize: CHUNK, seed: 0n });
      await A.store.remove(spans[1]!.key, 'LocalCPUBackend');
      await waitUntil('evict reported', async () => (await lookup(tokens)).layout_detail['inst-A']?.matched_tokens === 16);
      await A.store.clear('LocalCPUBackend');
      await waitUntil('clear reported', async () => (await lookup(tokens)).num_tokens === 0);
      const empty = await lookup([]);
      assert.deepEqual({ ...empty, event_id: undefined }, { event_id: undefined, layout_info: {}, num_tokens: 0, layout_detail: {} });
      assert.match(empty.event_id, /^lookup-/);
    });

    test('lookup bodies give the same answer through the token fast path and the generic path', async () => {
      const tokens = range(48, 5000);
      await putPrompt(A.store, tokens, 'LocalCPUBackend');
      await waitUntil('indexed', async () => (await lookup(tokens)).layout_detail['inst-A']?.matched_tokens === 48);
      const fast = await postJson(`${url}/lookup`, `{ "tokens" : [ ${tokens.join(' , ')} ] }`);
      const generic = await postJson(`${url}/lookup`, { tokens });
      assert.equal(fast.status, 200);
      // Each answer has its own event id (LMCache's field); the rest is the same.
      assert.deepEqual({ ...fast.json, event_id: 0 }, { ...generic.json, event_id: 0 });
      // An extra key is refused (strict schema), even when the tokens are valid.
      assert.equal((await postJson(`${url}/lookup`, { tokens, note: 'x' })).status, 400);
      assert.equal(fast.json.layout_detail['inst-A'].matched_tokens, 48);
      const pf = await postJson(`${url}/prefix_lookup`, { tokens });
      const pg = await postJson(`${url}/prefix_lookup`, { tokens: [...tokens] });
      assert.equal((await postJson(`${url}/prefix_lookup`, { note: 'x', tokens })).status, 400);
      assert.equal(pf.status, 200);
      assert.deepEqual(pf.json, pg.json);
      assert.equal(pf.json.instances['inst-A'], 48);
      await A.store.clear('LocalCPUBackend');
      await waitUntil('cleared', async () => (await lookup(tokens)).num_tokens === 0);
    });

    test('query_instance, health, healthz and metrics', async () => {
      const q = await postJson(`${url}/query_instance`, { ip: '127.0.0.1' });
      assert.equal(q.status, 200);
      assert.deepEqual(q.json.instance_ids, ['inst-A', 'inst-B']);
      assert.equal(q.json.res, 'inst-A');
      assert.equal((await postJson(`${url}/query_instance`, { ip: '10.9.9.9' })).status, 404);
      const h = await postJson(`${url}/health`, { instance_id: 'inst-B' });
      assert.equal(h.status, 200);
      assert.equal(h.json.healthy, true);
      assert.deepEqual(h.json.error_codes, { 0: 0 });
      assert.equal(h.json.workers[0].instance_id, 'inst-B');
      assert.equal((await fetch(`${url}/healthz`)).status, 200);
      // At least one finished event, so the finished count must be positive.
      const e = await postJson(`${url}/move`, { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalCPUBackend'], tokens: [] });
      assert.equal((await postJson(`${url}/check_finish`, { event_id: e.json.event_id })).json.status, 'finished');
      const m = await (await fetch(`${url}/metrics`)).text();
      assert.match(m, /kvc_controller_instances 2/);
      assert.match(m, /kvc_controller_index_keys \d+/);
      const finished = /kvc_controller_operations_total\{kind="move",status="finished"\} (\d+)/.exec(m);
      assert.ok(finished, 'finished event count is exported');
      assert.ok(Number(finished[1]) >= 1, `finished event count ${finished[1]} should be positive`);
    });
  });

  describe('HTTP errors', () => {
    const cases: [string, unknown, number, RegExp][] = [
      ['/move', { old_position: 'inst-A', new_position: ['inst-B', 'LocalCPUBackend'] }, 400, /old_position/],
      ['/move', { old_position: ['inst-A'], new_position: ['inst-B', 'LocalCPUBackend'] }, 400, /old_position/],
      ['/move', { old_position: ['inst-A', 5], new_position: ['inst-B', 'LocalCPUBackend'] }, 400, /old_position\[1\]/],
      ['/move', { old_position: ['inst-A', 'LocalCPUBackend'] }, 400, /new_position/],
      ['/move', { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalCPUBackend'], tokens: [1, 'x'] }, 400, /tokens\[1\]/],
      ['/move', { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalCPUBackend'], tokens: [1.5] }, 400, /tokens\[0\]/],
      ['/move', { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalCPUBackend'], copy: 'yes' }, 400, /copy/],
      ['/move', { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-A', 'LocalCPUBackend'], tokens: [1] }, 400, /new_position/],
      ['/move', { old_position: ['nope', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalCPUBackend'], tokens: [1] }, 404, /unknown instance "nope"/],
      ['/move', { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalDiskBackend'], tokens: [1] }, 404, /location "LocalDiskBackend"/],
      ['/move', { old_position: ['inst-A', 'GPU'], new_position: ['inst-B', 'LocalCPUBackend'], tokens: [1] }, 404, /old_position\[1\]/],
      ['/pin', { instance_id: 'inst-A', location: 'LocalCPUBackend' }, 400, /tokens/],
      ['/pin', { tokens: [1], location: 'LocalCPUBackend' }, 400, /instance_id/],
      ['/pin', { tokens: [1], instance_id: 'inst-A' }, 400, /location/],
      ['/pin', { tokens: [1], instance_id: 'ghost', location: 'LocalCPUBackend' }, 404, /ghost/],
      ['/unpin', { tokens: [1], instance_id: 'inst-A', location: 'Nowhere' }, 404, /Nowhere/],
      ['/lookup', { tokens: 'abc' }, 400, /tokens/],
      ['/lookup', [1, 2], 400, /JSON object/],
      ['/lookup', '{"tokens": [1,', 400, /malformed JSON/],
      // Bodies the token fast path leaves to the generic path: the same field-naming 400s.
      ['/lookup', '{"tokens":[1,-1]}', 400, /tokens\[1\]/],
      ['/lookup', '{"tokens":[4294967296]}', 400, /tokens\[0\]/],
      ['/lookup', '{"tokens":[1.5]}', 400, /tokens\[0\]/],
      ['/prefix_lookup', { tokens: 'abc' }, 400, /tokens/],
      ['/prefix_lookup', '{"tokens":[1,"x"]}', 400, /tokens\[1\]/],
      ['/prefix_lookup', '{"tokens": [1,', 400, /malformed JSON/],
      ['/clear', { instance_id: 'inst-A' }, 400, /location/],
      ['/clear', { instance_id: 'ghost', location: 'LocalCPUBackend' }, 404, /ghost/],
      ['/health', {}, 400, /instance_id/],
      ['/health', { instance_id: 'ghost' }, 404, /ghost/],
      ['/check_finish', { event_id: 'no-such-event' }, 404, /no-such-event/],
      ['/check_finish', { event_id: 3 }, 400, /event_id/],
      ['/query_instance', {}, 400, /ip/],
      // Strict bodies: an unknown field is refused by name, with the closest known one.
      ['/move', { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalCPUBackend'], tokens: [1], cpy: true }, 400, /field `cpy`: unknown field \(did you mean `copy`\?\)/],
      ['/move', { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalCPUBackend'], tokens: [1], copy: true, should_copy: false }, 400, /field `should_copy`: .*send one of them/],
      ['/pin', { tokens: [1], instance_id: 'inst-A', location: 'LocalCPUBackend', instanceid: 'x' }, 400, /field `instanceid`: unknown field \(did you mean `instance_id`\?\)/],
      ['/lookup', { tokens: [1], token: [2] }, 400, /field `token`: unknown field \(did you mean `tokens`\?\)/],
      ['/prefix_lookup', { tokens: [1], salt: 'x' }, 400, /field `salt`: unknown field/],
      ['/clear', { instance_id: 'inst-A', location: 'LocalCPUBackend', keep_fraction: 0.5 }, 400, /field `keep_fraction`: not supported by kvc/],
      ['/clear', { instance_id: 'inst-A', location: 'LocalCPUBackend', include_pined: true }, 400, /did you mean `include_pinned`/],
      ['/health', { instance_id: 'inst-A', verbose: true }, 400, /field `verbose`: unknown field/],
      ['/check_finish', { event_id: 'x', eventid: 'y' }, 400, /did you mean `event_id`/],
      ['/query_worker_info', { instance_id: 'ghost' }, 404, /ghost/],
      ['/query_worker_info', { instance_id: 'inst-A', worker_ids: [7] }, 404, /no worker 7/],
    ];
    for (const [path, body, status, re] of cases) {
      test(`${path} ${typeof body === 'string' ? body : JSON.stringify(body)} → ${status}`, async () => {
        const r = await postJson(`${url}${path}`, body);
        assert.equal(r.status, status, JSON.stringify(r.json));
        assert.match(r.json.error.message, re);
        assert.equal(typeof r.json.error.type, 'string');
        if (status === 400 && r.json.error.code !== 'invalid_json') assert.equal(typeof r.json.error.param, 'string', 'a 400 names its field in `param`');
      });
    }
    test('GET /events/{unknown} → 404 and unknown routes → 404', async () => {
      const r = await fetch(`${url}/events/nope`);
      assert.equal(r.status, 404);
      assert.match((await r.json()).error.message, /nope/);
      assert.equal((await fetch(`${url}/nothing-here`)).status, 404);
    });
    test('a worker that refuses connections → 503, one that never answers → 504; the controller survives', async () => {
      const silent = net.createServer(() => {}); // accepts, never answers
      const port = await freePortRange(2);
      await new Promise<void>((r) => silent.listen(port, '127.0.0.1', r));
      const ghosts: Dealer[] = [];
      try {
        for (const [id, wport] of [['refuses', port + 1], ['silent', port]] as const) {
          const d = new Dealer({ routingId: `test-${id}`, linger: 0 });
          d.connect(`tcp://127.0.0.1:${monitor}`);
          ghosts.push(d);
          await d.send(encodeMsg({ t: 'register', v: PROTOCOL_VERSION, instance_id: id, worker_id: 0, session: id, ip: '127.0.0.1', worker_port: wport, distributed_url: null, chunk_size: CHUNK, model_id: MODEL, seed: '0', locations: ['LocalCPUBackend'], pid: 1 }));
          await d.receive();
        }
        const refused = await postJson(`${url}/pin`, { tokens: range(16), instance_id: 'refuses', location: 'LocalCPUBackend' });
        assert.equal(refused.status, 503, JSON.stringify(refused.json));
        assert.match(refused.json.error.message, /not reachable/);
        const t0 = Date.now();
        const slow = await postJson(`${url}/health`, { instance_id: 'silent' });
        assert.equal(slow.status, 200, JSON.stringify(slow.json));
        assert.deepEqual([slow.json.healthy, slow.json.error_codes], [false, { 0: 504 }], JSON.stringify(slow.json));
        assert.ok(Date.now() - t0 < 8000);
        assert.equal((await fetch(`${url}/healthz`)).status, 200);
      } finally {
        for (const d of ghosts) d.close();
        silent.close();
      }
    });
    test('a second instance with an instance id already in use elsewhere is refused', async () => {
      const d = new Dealer({ routingId: 'test-duplicate', linger: 0 });
      d.connect(`tcp://127.0.0.1:${monitor}`);
      try {
        await d.send(encodeMsg({ t: 'register', v: PROTOCOL_VERSION, instance_id: 'inst-A', worker_id: 0, session: 'dup', ip: '127.0.0.1', worker_port: 1, distributed_url: '127.0.0.1:2', chunk_size: CHUNK, model_id: MODEL, seed: '0', locations: ['LocalCPUBackend'], pid: 1 }));
        const [reply] = await d.receive();
        const { decode } = await import('@msgpack/msgpack');
        const m = decode(reply!) as { t: string; message: string };
        assert.equal(m.t, 'error');
        assert.match(m.message, /already registered/);
        const r = await (await fetch(`${url}/instances`)).json();
        const a = r.instances.find((i: { instance_id: string }) => i.instance_id === 'inst-A');
        assert.equal(a.workers[0].worker_port, A.cfg.kvc_worker_port, 'the live registration is kept');
      } finally {
        d.close();
      }
    });
    test('an instance holding another KV dtype than the live instances of its model is refused', async () => {
      const d = new Dealer({ routingId: 'test-dtype', linger: 0 });
      d.connect(`tcp://127.0.0.1:${monitor}`);
      try {
        await d.send(encodeMsg({ t: 'register', v: PROTOCOL_VERSION, instance_id: 'inst-f16', worker_id: 0, session: 'f16', ip: '127.0.0.1', worker_port: 1, distributed_url: null, chunk_size: CHUNK, model_id: MODEL, seed: '0', kv_dtype: 'f16', locations: ['LocalCPUBackend'], pid: 1 }));
        const [reply] = await d.receive();
        const { decode } = await import('@msgpack/msgpack');
        const m = decode(reply!) as { t: string; message: string };
        assert.equal(m.t, 'error');
        assert.match(m.message, /holds KV as f16, but instance "inst-[A-Z]" of model "ctl-test-model" holds f32/);
        const r = await (await fetch(`${url}/instances`)).json();
        assert.equal(r.instances.some((i: { instance_id: string }) => i.instance_id === 'inst-f16'), false);
        assert.ok(r.instances.every((i: { workers: { kv_dtype: string }[] }) => i.workers.every((w) => w.kv_dtype === 'f32')));
      } finally {
        d.close();
      }
    });
    test('malformed monitor messages are dropped without harm', async () => {
      const d = new Dealer({ routingId: 'garbage', linger: 0 });
      d.connect(`tcp://127.0.0.1:${monitor}`);
      try {
        await d.send(Buffer.from([0xc1, 0xff, 0x00]));
        await d.send(encodeMsg({ t: 'register', v: PROTOCOL_VERSION } as never));
        const [reply] = await d.receive();
        assert.match(JSON.stringify(reply ? await import('@msgpack/msgpack').then((m) => m.decode(reply)) : null), /malformed register/);
        assert.equal((await fetch(`${url}/healthz`)).status, 200);
      } finally {
        d.close();
      }
    });
  });

  describe('operations', () => {
    test('empty tokens: num_tokens 0 and the event is already finished', async () => {
      const r = await postJson(`${url}/move`, { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalCPUBackend'] });
      assert.equal(r.status, 200);
      assert.equal(r.json.num_tokens, 0);
      assert.equal(typeof r.json.event_id, 'string');
      const c = await postJson(`${url}/check_finish`, { event_id: r.json.event_id });
      assert.equal(c.json.status, 'finished');
    });

    test('move within an instance: LocalCPUBackend → LocalDiskBackend', async () => {
      const tokens = range(48, 5000);
      const spans = await putPrompt(A.store, tokens, 'LocalCPUBackend');
      await waitUntil('indexed', async () => (await lookup(tokens)).layout_detail['inst-A']?.matched_tokens === 48);
      const r = await postJson(`${url}/move`, { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-A', 'LocalDiskBackend'], tokens, copy: false });
      assert.equal(r.status, 200, JSON.stringify(r.json));
      assert.deepEqual(Object.keys(r.json).sort(), ['event_id', 'num_tokens']);
      assert.equal(r.json.num_tokens, 48);
      const ev = await waitEvent(r.json.event_id);
      assert.equal(ev.status, 'finished', ev.error);
      assert.equal(ev.kind, 'move');
      assert.ok(ev.started_at && ev.finished_at);
      for (const s of spans) {
        assert.equal(A.store.has(s.key, 'LocalCPUBackend'), false);
        assert.equal(A.store.has(s.key, 'LocalDiskBackend'), true);
      }
      const l = await waitUntil('index moved', async () => {
        const x = await lookup(tokens);
        return x.layout_detail['inst-A']?.location === 'LocalDiskBackend' && !x.layout_detail['inst-A'].locations.LocalCPUBackend ? x : undefined;
      });
      assert.equal(l.layout_detail['inst-A']!.matched_tokens, 48);
    });

    test('move across instances peer to peer: source emptied, destination verified, lookup shows only B', async () => {
      const tokens = range(64, 9000);
      const spans = await putPrompt(A.store, tokens, 'LocalCPUBackend');
      // num_tokens counts only the prefix the source holds: ask for more tokens than it has.
      const asked = [...tokens, ...range(16, 777)];
      await waitUntil('indexed', async () => (await lookup(tokens)).layout_detail['inst-A']?.matched_tokens === 64);
      const r = await postJson(`${url}/move`, { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalCPUBackend'], tokens: asked });
      assert.equal(r.status, 200, JSON.stringify(r.json));
      assert.equal(r.json.num_tokens, 64);
      const ev = await waitEvent(r.json.event_id);
      assert.equal(ev.status, 'finished', ev.error);
      for (const s of spans) {
        assert.equal(A.store.has(s.key, 'LocalCPUBackend'), false);
        const got = await B.store.get(s.key, undefined, 'LocalCPUBackend');
        assert.ok(got);
        verifyChunk(got, s.key);
        assert.deepEqual(got, makeChunk(s.key, s.end - s.start));
      }
      await waitUntil('lookup shows only B', async () => {
        const l = await lookup(tokens);
        return !l.layout_detail['inst-A'] && l.layout_detail['inst-B']?.matched_tokens === 64;
      });
      // copy: true keeps the source.
      const c = await postJson(`${url}/move`, { old_position: ['inst-B', 'LocalCPUBackend'], new_position: ['inst-A', 'LocalCPUBackend'], tokens, copy: true });
      assert.equal(c.json.num_tokens, 64);
      const cev = await waitEvent(c.json.event_id);
      assert.equal(cev.status, 'finished', cev.error);
      assert.equal(cev.kind, 'copy');
      for (const s of spans) {
        assert.ok(A.store.has(s.key, 'LocalCPUBackend'));
        assert.ok(B.store.has(s.key, 'LocalCPUBackend'));
      }
      await waitUntil('lookup shows both', async () => {
        const l = await lookup(tokens);
        return l.layout_detail['inst-A']?.matched_tokens === 64 && l.layout_detail['inst-B']?.matched_tokens === 64;
      });
      // Nothing held: num_tokens 0, finished.
      const none = await postJson(`${url}/move`, { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-B', 'LocalCPUBackend'], tokens: range(32, 424242) });
      assert.equal(none.json.num_tokens, 0);
      assert.equal((await postJson(`${url}/check_finish`, { event_id: none.json.event_id })).json.status, 'finished');
    });

    test('a move carries each chunk\'s pin to its destination (within and across instances); a copy leaves its new copies unpinned', async () => {
      // Start from empty locations (earlier tests left chunks), so the clear below counts only these.
      for (const [id, loc] of [['inst-A', 'LocalCPUBackend'], ['inst-A', 'LocalDiskBackend'], ['inst-B', 'LocalCPUBackend']]) {
        assert.equal((await postJson(`${url}/clear`, { instance_id: id, location: loc, include_pinned: true })).status, 200);
      }
      const tokens = range(64, 31_000);
      const spans = await putPrompt(A.store, tokens, 'LocalCPUBackend');
      await waitUntil('indexed', async () => (await lookup(tokens)).layout_detail['inst-A']?.matched_tokens === 64);
      // Pin the first two of the four chunks only: exactly those must stay pinned wherever they go.
      const p = await postJson(`${url}/pin`, { tokens: tokens.slice(0, 32), instance_id: 'inst-A', location: 'LocalCPUBackend' });
      assert.equal((await waitEvent(p.json.event_id)).status, 'finished');
      const pinnedAt = (i: Instance, loc: 'LocalCPUBackend' | 'LocalDiskBackend') => spans.map((s) => i.store.isPinned(s.key, loc));
      assert.deepEqual(pinnedAt(A, 'LocalCPUBackend'), [true, true, false, false]);
      // Within the instance: CPU → disk.
      let r = await postJson(`${url}/move`, { old_position: ['inst-A', 'LocalCPUBackend'], new_position: ['inst-A', 'LocalDiskBackend'], tokens, copy: false });
      assert.equal((await waitEvent(r.json.event_id)).status, 'finished');
      assert.deepEqual(pinnedAt(A, 'LocalDiskBackend'), [true, true, false, false], 'pins moved with the chunks to disk');
      // Across instances: A's disk → B's CPU, peer to peer.
      r = await postJson(`${url}/move`, { old_position: ['inst-A', 'LocalDiskBackend'], new_position: ['inst-B', 'LocalCPUBackend'], tokens, copy: false });
      assert.equal((await waitEvent(r.json.event_id)).status, 'finished');
      for (const s of spans) assert.equal(A.store.has(s.key, 'LocalDiskBackend'), false);
      assert.deepEqual(pinnedAt(B, 'LocalCPUBackend'), [true, true, false, false], 'pins moved with the chunks to the other instance');
      // A copy back: the source keeps its pins, the copies are unpinned.
      r = await postJson(`${url}/move`, { old_position: ['inst-B', 'LocalCPUBackend'], new_position: ['inst-A', 'LocalCPUBackend'], tokens, copy: true });
      assert.equal((await waitEvent(r.json.event_id)).status, 'finished');
      assert.deepEqual(pinnedAt(B, 'LocalCPUBackend'), [true, true, false, false]);
      assert.deepEqual(pinnedAt(A, 'LocalCPUBackend'), [false, false, false, false], 'a copy is an unpinned replica');
      // /clear over pinned chunks says what it removed and what it kept.
      await waitUntil('B indexed', async () => (await lookup(tokens)).layout_detail['inst-B']?.matched_tokens === 64);
      const c = await postJson(`${url}/clear`, { instance_id: 'inst-B', location: 'LocalCPUBackend' });
      assert.equal(c.status, 200, JSON.stringify(c.json));
      assert.equal(c.json.num_chunks, 2, 'the two unpinned chunks removed');
      assert.equal(c.json.num_tokens, 2 * CHUNK);
      assert.equal(c.json.kept_chunks, 2, 'the two pinned chunks kept');
      assert.equal((await waitEvent(c.json.event_id)).status, 'finished');
      assert.deepEqual(spans.map((s) => B.store.has(s.key, 'LocalCPUBackend')), [true, true, false, false]);
      const all = await postJson(`${url}/clear`, { instance_id: 'inst-B', location: 'LocalCPUBackend', include_pinned: true });
      assert.deepEqual([all.json.num_chunks, all.json.kept_chunks], [2, 0]);
      await postJson(`${url}/clear`, { instance_id: 'inst-A', location: 'LocalCPUBackend' });
    });

    test('pin keeps chunks through eviction pressure; unpin makes them evictable; clear empties a location', async () => {
      await B.store.clear('LocalCPUBackend');
      const tokens = range(32, 31337);
      const spans = await putPrompt(B.store, tokens, 'LocalCPUBackend');
      const p = await postJson(`${url}/pin`, { tokens, instance_id: 'inst-B', location: 'LocalCPUBackend' });
      assert.equal(p.status, 200, JSON.stringify(p.json));
      assert.deepEqual(Object.keys(p.json).sort(), ['event_id', 'num_tokens']);
      assert.equal(p.json.num_tokens, 32);
      assert.equal((await waitEvent(p.json.event_id)).status, 'finished');
      for (const s of spans) assert.ok(B.store.isPinned(s.key, 'LocalCPUBackend'));
      // Fill B's CPU tier (10 MiB) several times over with other prompts.
      const big: KvLayout = { dtype: DType.f32, numLayers: 8, numKvHeads: 8, headDim: 64 }; // 256 KiB per 16 tokens... per chunk
      for (let i = 0; i < 120; i++) {
        const t = range(CHUNK, 100_000 + i * CHUNK);
        const [s] = chunkKeys(t, { modelId: MODEL, chunkSize: CHUNK, seed: 0n });
        await B.store.put(s!.key, makeChunk(s!.key, CHUNK, big), 'LocalCPUBackend');
      }
      for (const s of spans) assert.ok(B.store.has(s.key, 'LocalCPUBackend'), 'pinned chunk was evicted');
      const u = await postJson(`${url}/unpin`, { tokens, instance_id: 'inst-B', location: 'LocalCPUBackend' });
      assert.equal(u.json.num_tokens, 32);
      assert.equal((await waitEvent(u.json.event_id)).status, 'finished');
      for (let i = 0; i < 120; i++) {
        const t = range(CHUNK, 900_000 + i * CHUNK);
        const [s] = chunkKeys(t, { modelId: MODEL, chunkSize: CHUNK, seed: 0n });
        await B.store.put(s!.key, makeChunk(s!.key, CHUNK, big), 'LocalCPUBackend');
      }
      assert.ok(spans.some((s) => !B.store.has(s.key, 'LocalCPUBackend')), 'unpinned chunks should be evictable');
      const c = await postJson(`${url}/clear`, { instance_id: 'inst-B', location: 'LocalCPUBackend' });
      assert.equal(c.status, 200);
      assert.equal((await waitEvent(c.json.event_id)).status, 'finished');
      assert.equal(B.store.keys('LocalCPUBackend').length, 0);
      await waitUntil('index emptied for B', async () => {
        const r = await (await fetch(`${url}/instances`)).json();
        return r.instances.find((i: { instance_id: string }) => i.instance_id === 'inst-B').workers[0].locations.LocalCPUBackend.chunks === 0;
      });
    });
  });

  transferSafetyTests(ctx);

  describe('failures', () => {
    test('destination killed mid-move: source intact, event failed', async () => {
      // 32 chunks of 4 MiB: long enough a transfer to interrupt after the first stored chunk.
      // f32 like the other instances of MODEL on this controller: one KV dtype per model.
      const layout: KvLayout = { dtype: DType.f32, numLayers: 4, numKvHeads: 4, headDim: 128 };
      const chunkSize = 256;
      const src = await startInstance('inst-src', monitor, { cpuGiB: 0.25, chunkSize, layout });
      instances.push(src);
      const child: ChildProcess = spawn(process.execPath, [fileURLToPath(import.meta.url)], {
        env: { ...process.env, KVC_CTL_TEST_CHILD: '1', KVC_CTL_ID: 'inst-dst', KVC_CTL_MONITOR: String(monitor), KVC_CTL_CPU_GIB: '0.25', KVC_CTL_CHUNK: String(chunkSize), KVC_CTL_LAYOUT: JSON.stringify(layout) },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      let armed = false;
      child.stdout!.on('data', (d) => {
        out += d;
        // Kill the destination the moment its first chunk of the move starts arriving: nothing
        // can have been committed yet.
        if (armed && /receiving/.test(out)) {
          armed = false;
          child.kill('SIGKILL');
        }
      });
      child.stderr!.on('data', (d) => (out += d));
      try {
        await waitUntil('child instance ready', () => /child ready/.test(out), 20_000);
        await waitUntil('src live', () => src.att.state === 'live');
        const tokens = range(32 * chunkSize, 50_000);
        const spans = await putPrompt(src.store, tokens, 'LocalCPUBackend', chunkSize, layout);
        armed = true;
        const r = await postJson(`${url}/move`, { old_position: ['inst-src', 'LocalCPUBackend'], new_position: ['inst-dst', 'LocalCPUBackend'], tokens, copy: false });
        assert.equal(r.status, 200, JSON.stringify(r.json));
        assert.equal(r.json.num_tokens, tokens.length);
        await waitUntil('destination killed while its first chunk arrived', () => child.signalCode === 'SIGKILL', 20_000);
        const ev = await waitEvent(r.json.event_id, 30_000);
        assert.equal(ev.status, 'failed');
        assert.match(ev.error, /inst-src|peer|closed|failed/);
        for (const s of spans) assert.ok(src.store.has(s.key, 'LocalCPUBackend'), `source lost chunk ${s.index}`);
        assert.equal((await lookup(tokens)).layout_detail['inst-src']?.matched_tokens, tokens.length);
      } finally {
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
        await src.close();
        instances.splice(instances.indexOf(src), 1);
      }
    });

    test('a worker that stops heartbeating is reaped and its chunks leave the index', async () => {
      const d = new Dealer({ routingId: 'test-reaped', linger: 0 });
      d.connect(`tcp://127.0.0.1:${monitor}`);
      try {
        await d.send(encodeMsg({ t: 'register', v: PROTOCOL_VERSION, instance_id: 'doomed', worker_id: 0, session: 's', ip: '127.0.0.9', worker_port: 1, distributed_url: null, chunk_size: CHUNK, model_id: MODEL, seed: '0', locations: ['LocalCPUBackend'], pid: 1 }));
        await d.receive();
        const tokens = range(32, 60_000);
        const keys = chunkKeys(tokens, { modelId: MODEL, chunkSize: CHUNK, seed: 0n }).map((s) => s.key);
        await d.send(encodeMsg({ t: 'sync', location: 'LocalCPUBackend', keys: packKeys(keys), reset: true, last: true }));
        await waitUntil('doomed indexed', async () => (await lookup(tokens)).layout_detail.doomed?.matched_tokens === 32);
        // No heartbeats from here on: reaped after the 3 s timeout.
        await waitUntil('reaped', async () => {
          const r = await (await fetch(`${url}/instances`)).json();
          return !r.instances.some((i: { instance_id: string }) => i.instance_id === 'doomed');
        }, 10_000);
        assert.deepEqual((await lookup(tokens)).layout_detail, {});
        assert.equal((await postJson(`${url}/health`, { instance_id: 'doomed' })).status, 404);
      } finally {
        d.close();
      }
      // The live instances kept heartbeating and are still there.
      const r = await (await fetch(`${url}/instances`)).json();
      assert.deepEqual(r.instances.map((i: { instance_id: string }) => i.instance_id), ['inst-A', 'inst-B']);
    });

    test('a restarted controller rebuilds its index from the instances, with no instance restarted', async () => {
      const tokens = range(48, 70_000);
      await putPrompt(B.store, tokens, 'LocalCPUBackend');
      await waitUntil('indexed', async () => (await lookup(tokens)).layout_detail['inst-B']?.matched_tokens === 48, 60_000);
      await ctl.kill('SIGKILL');
      await startController();
      // Bounds are generous (a loaded machine slows the restart and the instances' rejoin): only a hang fails.
      await waitHttp(`${url}/healthz`, 60_000);
      const l = await waitUntil('index rebuilt', async () => {
        const x = await lookup(tokens);
        return x.layout_detail['inst-B']?.matched_tokens === 48 ? x : undefined;
      }, 60_000);
      assert.equal(l.num_tokens, 48);
      await waitUntil('both instances back', async () => {
        const r = await (await fetch(`${url}/instances`)).json();
        return r.instances.length === 2;
      }, 60_000);
      // And operations work against the new controller.
      const p = await postJson(`${url}/pin`, { tokens, instance_id: 'inst-B', location: 'LocalCPUBackend' });
      assert.equal(p.json.num_tokens, 48);
      assert.equal((await waitEvent(p.json.event_id)).status, 'finished');
    });
  });
}

// Replica-aware eviction (docs/storage.md): the LruIndex's replica segment, the hint message's
// schema, the registry's hints when a worker is dropped to be synced again, and the whole path on
// real processes: a `kvc controller` process and two cache instances in this process
// (KvcStore + attachController) that store the same chunks; where an instance must die without
// signing off, it runs in a child process (harness/instance_child.ts).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { DType, encodeChunk, payloadBytes, type KvLayout } from '../../src/common/chunk.js';
import { chunkKeys, type ChunkKey } from '../../src/common/keys.js';
import { freePortRange } from '../../harness/ports.js';
import { attachController, type ControllerAttachment } from '../../src/kvc/controller_client.js';
import { LruIndex, type Entry } from '../../src/kvc/lru_index.js';
import { KvcStore } from '../../src/kvc/store.js';
import { Registry } from '../../src/controller/registry.js';
import { ReplicaHints } from '../../src/controller/replica_hints.js';
import { packKeys, PROTOCOL_VERSION } from '../../src/protocol/monitor.js';
import { replicaHintMsgSchema, type ReplicaHintMsg } from '../../src/protocol/replica_hint.js';
import { controllerInstanceConfig } from '../../harness/cache_instance.js';
import { startKvc, type Proc } from '../../harness/proc.js';

const MODEL = 'replica-test-model';
const CHUNK = 16;
const LAYOUT: KvLayout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 4 };

const entry = (): Entry => ({ bytes: 1, pinned: false });
const k = (i: number) => i.toString(16).padStart(16, '0') as ChunkKey;

describe('LruIndex replica segment', () => {
  test('victims: cold first, then replicas newest first, then least recently used', () => {
    const idx = new LruIndex<Entry>();
    for (let i = 1; i <= 6; i++) idx.add(k(i), entry());
    idx.add(k(7), entry(), { evictFirst: true });
    assert.equal(idx.setReplica(k(2), true), true);
    assert.equal(idx.setReplica(k(3), true), true);
    assert.equal(idx.replicaCount, 2);
    assert.deepEqual(idx.keys(), [k(7), k(3), k(2), k(1), k(4), k(5), k(6)]);
    assert.deepEqual(idx.victims(0, 7 - 4), [k(7), k(3), k(2), k(1)]);
  });

  test('a read keeps a replica a replica, at the oldest end of the segment; a last-copy hint moves a cold entry or a replica to main', () => {
    const idx = new LruIndex<Entry>();
    for (let i = 1; i <= 4; i++) idx.add(k(i), entry());
    idx.setReplica(k(1), true);
    idx.setReplica(k(2), true);
    idx.touch(k(2));
    assert.equal(idx.replicaCount, 2);
    // Newest first: 1 was marked last but 2 was read, so 2 is the last duplicate to go.
    assert.deepEqual(idx.keys(), [k(1), k(2), k(3), k(4)]);
    idx.setReplica(k(2), false);
    assert.deepEqual(idx.keys(), [k(1), k(3), k(4), k(2)]);
    // A last-copy hint leaves an entry that is in main where it is.
    idx.setReplica(k(3), false);
    assert.deepEqual(idx.keys(), [k(1), k(3), k(4), k(2)]);
    idx.add(k(5), entry(), { evictFirst: true });
    idx.setReplica(k(5), false);
    assert.equal(idx.coldCount, 0);
    assert.deepEqual(idx.keys(), [k(1), k(3), k(4), k(2), k(5)]);
    // A cold entry that is read joins main (a copy used here, not known to be held elsewhere).
    idx.add(k(6), entry(), { evictFirst: true });
    idx.touch(k(6));
    assert.deepEqual(idx.keys(), [k(1), k(3), k(4), k(2), k(5), k(6)]);
  });

  test('a prompt that used replicas orders them head last at the oldest end: its tail goes first', () => {
    const idx = new LruIndex<Entry>();
    for (let i = 1; i <= 5; i++) idx.add(k(i), entry());
    for (const i of [1, 2, 3, 4]) idx.setReplica(k(i), true);
    // Loading reads the prefix head first, then marks it used head last.
    for (const i of [1, 2, 3]) idx.touch(k(i));
    idx.touchHeadLast([k(1), k(2), k(3)]);
    assert.deepEqual(idx.keys(), [k(4), k(3), k(2), k(1), k(5)]);
  });

  test('an evict-first admission takes room only from cold entries and replicas, never from main', () => {
    const idx = new LruIndex<Entry>();
    for (let i = 1; i <= 3; i++) idx.add(k(i), entry());
    idx.add(k(4), entry(), { evictFirst: true });
    idx.setReplica(k(3), true);
    // Capacity 4, all used: one more needs one victim; two more, two.
    assert.deepEqual(idx.victims(1, 4, { evictFirst: true }), [k(4)]);
    assert.deepEqual(idx.victims(2, 4, { evictFirst: true }), [k(4), k(3)]);
    assert.equal(idx.victims(3, 4, { evictFirst: true }), null, 'main (1, 2) is never a victim for it');
    assert.deepEqual(idx.victims(3, 4), [k(4), k(3), k(1)], 'an ordinary admission falls through to main');
  });

  test('clearing the marks makes every replica ordinary again, oldest first', () => {
    const idx = new LruIndex<Entry>();
    for (let i = 1; i <= 4; i++) idx.add(k(i), entry());
    idx.setReplica(k(1), true);
    idx.setReplica(k(3), true);
    idx.clearReplicas();
    assert.equal(idx.replicaCount, 0);
    assert.deepEqual(idx.keys(), [k(2), k(4), k(1), k(3)]);
  });

  test('pins win, unknown keys are moot, deletes leave no trace', () => {
    const idx = new LruIndex<Entry>();
    idx.add(k(1), entry());
    idx.add(k(2), entry());
    idx.pin(k(1));
    idx.setReplica(k(1), true);
    assert.deepEqual(idx.victims(0, 1), [k(2)]);
    assert.equal(idx.setReplica(k(9), true), false);
    assert.equal(idx.size, 2);
    idx.delete(k(1));
    assert.equal(idx.replicaCount, 0);
    assert.equal(idx.bytes, 1);
    assert.equal(idx.pinnedCount, 0);
  });
});

test('the replica hint message: one flag byte per packed key, named when wrong', () => {
  const ok = replicaHintMsgSchema.safeParse({ t: 'replicas', location: 'LocalCPUBackend', keys: new Uint8Array(16), held_elsewhere: new Uint8Array([1, 0]) });
  assert.equal(ok.success, true);
  const bad = replicaHintMsgSchema.safeParse({ t: 'replicas', location: 'LocalCPUBackend', keys: new Uint8Array(16), held_elsewhere: new Uint8Array([1]) });
  assert.equal(bad.success, false);
  assert.match(JSON.stringify(bad.error!.issues), /held_elsewhere/);
  const odd = replicaHintMsgSchema.safeParse({ t: 'replicas', location: 'LocalCPUBackend', keys: new Uint8Array(12), held_elsewhere: new Uint8Array([1]) });
  assert.equal(odd.success, false);
});

/** A registry with replica hints, in this process: what it sends, and how to register instances. */
function hintRegistry() {
  const reg = new Registry({ heartbeatTimeoutMs: 10_000, seed: 0n, secret: null });
  const sent: { to: string; flags: number[] }[] = [];
  reg.replicas = new ReplicaHints(reg, (to: string, m: ReplicaHintMsg) => sent.push({ to, flags: [...m.held_elsewhere] }));
  /** The hints sent once the current turn's are flushed. */
  const settle = async () => {
    await new Promise((r) => setImmediate(r));
    return sent.splice(0);
  };
  const register = (id: string, session: string, port: number) => reg.handle(session, {
    t: 'register', v: PROTOCOL_VERSION, instance_id: id, worker_id: 0, session, ip: '127.0.0.1', worker_port: port,
    distributed_url: null, chunk_size: CHUNK, model_id: MODEL, seed: '0', locations: ['LocalCPUBackend'], pid: 1,
  });
  return { reg, settle, register };
}

test('a worker dropped to be synced again, or signing off: the survivor is told it holds the last copy', async () => {
  const { reg, settle, register } = hintRegistry();
  const keys = packKeys([k(1), k(2), k(3)]);
  const sync = (session: string) => reg.handle(session, { t: 'sync', location: 'LocalCPUBackend', keys, reset: true, last: true });
  assert.equal(register('A', 'a1', 7001)?.t, 'welcome');
  sync('a1');
  assert.equal(register('B', 'b1', 7002)?.t, 'welcome');
  sync('b1');
  assert.deepEqual(await settle(), [{ to: 'b1', flags: [1, 1, 1] }], 'B, the second holder, holds duplicates');
  // A's engine restarts (a new session replaces the old one): A's keys leave the index and A
  // syncs them again, having forgotten its marks. B holds the only indexed copies meanwhile: its
  // marks are cleared, and A's re-synced copies are the duplicates now (not both marked).
  assert.equal(register('A', 'a2', 7001)?.t, 'welcome');
  sync('a2');
  assert.deepEqual(await settle(), [{ to: 'b1', flags: [0, 0, 0] }, { to: 'a2', flags: [1, 1, 1] }]);
  // B signs off: A holds the last copies.
  reg.handle('b1', { t: 'bye' });
  assert.deepEqual(await settle(), [{ to: 'a2', flags: [0, 0, 0] }]);
  // A signs off too: nobody is left to tell.
  reg.handle('a2', { t: 'bye' });
  assert.deepEqual(await settle(), []);
  assert.equal(reg.stats.replicaLastCopy, 6);
});

test('three holders: when the first copy is evicted, the oldest remaining holder keeps it; a later copy leaving tells nobody', async () => {
  const { reg, settle, register } = hintRegistry();
  const keys = packKeys([k(1), k(2)]);
  const op = (session: string, kind: 0 | 1) => reg.handle(session, { t: 'ops', ops: [[kind, 'LocalCPUBackend', keys]] });
  for (const [id, s, port] of [['A', 'a', 7001], ['B', 'b', 7002], ['C', 'c', 7003]] as const) assert.equal(register(id, s, port)?.t, 'welcome');
  op('a', 1);
  op('b', 1);
  op('c', 1);
  assert.deepEqual(await settle(), [{ to: 'b', flags: [1, 1] }, { to: 'c', flags: [1, 1] }], 'the later copies are duplicates');
  // C (a duplicate) evicts: A still keeps the first copy, B stays a duplicate: no hint.
  op('c', 0);
  assert.deepEqual(await settle(), []);
  op('c', 1);
  assert.deepEqual(await settle(), [{ to: 'c', flags: [1, 1] }]);
  // A (the first copy) evicts: B, the oldest remaining holder, keeps it; C stays a duplicate.
  op('a', 0);
  assert.deepEqual(await settle(), [{ to: 'b', flags: [0, 0] }]);
  // B evicts too: C holds the last copy.
  op('b', 0);
  assert.deepEqual(await settle(), [{ to: 'c', flags: [0, 0] }]);
});

interface Instance {
  store: KvcStore;
  att: ControllerAttachment;
  close(): Promise<void>;
}

async function startInstance(id: string, monitorPort: number): Promise<Instance> {
  const cfg = await controllerInstanceConfig(id, monitorPort, { chunkSize: CHUNK });
  const store = await KvcStore.create(cfg);
  const att = await attachController(store, cfg, { modelId: MODEL, chunkSize: CHUNK, seed: 0n, layout: LAYOUT, flushMs: 5 });
  return { store, att, close: async () => { await att.close(); await store.close(); } };
}

async function putPrompt(store: KvcStore, tokens: number[]): Promise<ChunkKey[]> {
  const spans = chunkKeys(tokens, { modelId: MODEL, chunkSize: CHUNK, seed: 0n });
  for (const s of spans) await store.put(s.key, encodeChunk(LAYOUT, s.end - s.start, s.key, new Uint8Array(payloadBytes(LAYOUT, s.end - s.start))), 'LocalCPUBackend');
  return spans.map((s) => s.key);
}

async function waitUntil(what: string, fn: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!fn()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const range = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);

for (const hints of ['on', 'off'] as const) {
  describe(`replica hints ${hints}: a real controller process and two instances`, () => {
    let ctl: Proc;
    let http: number;
    let A: Instance;
    let B: Instance;
    before(async () => {
      http = await freePortRange(2);
      ctl = startKvc(['controller', '--port', String(http), '--monitor-port', String(http + 1), '--replica-hints', hints]);
      await ctl.waitFor(/kvc controller ready/, 60_000);
      A = await startInstance('rep-A', http + 1);
      B = await startInstance('rep-B', http + 1);
      await waitUntil('both registered', () => A.att.state === 'live' && B.att.state === 'live');
    });
    after(async () => {
      await A?.close();
      await B?.close();
      await ctl?.kill('SIGTERM');
    });

    test(hints === 'on'
      ? 'the second holder is told its copies are duplicates; when the first evicts them, it holds the last copy'
      : 'no hints: both copies stay ordinary entries', async () => {
      const keys = await putPrompt(A.store, range(64, 1000));
      // A stored first (alone): its copies are ordinary.
      await new Promise((r) => setTimeout(r, 300));
      assert.equal(A.store.cpu()!.replicaChunks(), 0);
      await putPrompt(B.store, range(64, 1000));
      if (hints === 'off') {
        await new Promise((r) => setTimeout(r, 500));
        assert.equal(B.store.cpu()!.replicaChunks(), 0, 'no hint without --replica-hints on');
        return;
      }
      await waitUntil('B told its 4 chunks are held elsewhere', () => B.store.cpu()!.replicaChunks() === keys.length);
      assert.equal(A.store.cpu()!.replicaChunks(), 0, 'the first copy stays ordinary');
      // B's duplicates are its first victims (after nothing cold), newest (the prompt's tail) first.
      assert.deepEqual(B.store.cpu()!.keys().slice(0, keys.length), [...keys].reverse());
      // A drops its copies: B now holds the last ones and keeps them by recency again.
      for (const key of keys.slice(0, 2)) await A.store.remove(key, 'LocalCPUBackend');
      await waitUntil('B told it holds the last copy of 2 chunks', () => B.store.cpu()!.replicaChunks() === keys.length - 2);
      await A.store.clear('LocalCPUBackend');
      await waitUntil('B holds every last copy', () => B.store.cpu()!.replicaChunks() === 0);
      assert.equal(B.store.cpu()!.coldChunks(), 0);
      assert.equal(B.store.cpu()!.keys().length, keys.length, 'B lost nothing');
      const metrics = await (await fetch(`http://127.0.0.1:${http}/metrics`)).text();
      assert.match(metrics, new RegExp(`kvc_controller_replica_hints_held_elsewhere_total ${keys.length}\\b`));
      assert.match(metrics, new RegExp(`kvc_controller_replica_hints_last_copy_total ${keys.length}\\b`));
    });
  });
}

describe('last copies when an instance leaves the index: a real controller process', () => {
  let ctl: Proc;
  let http: number;
  let B: Instance;
  const counter = async (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(await (await fetch(`http://127.0.0.1:${http}/metrics`)).text())?.[1] ?? NaN);
  before(async () => {
    http = await freePortRange(2);
    // A short heartbeat timeout: the killed instance is reaped within about 2.5 s.
    ctl = startKvc(['controller', '--port', String(http), '--monitor-port', String(http + 1), '--heartbeat-timeout', '2']);
    await ctl.waitFor(/kvc controller ready/, 60_000);
    B = await startInstance('leave-B', http + 1);
    await waitUntil('B registered', () => B.att.state === 'live');
  });
  after(async () => {
    await B?.close();
    await ctl?.kill('SIGTERM');
  });

  test("A signs off: B's copies, marked because A had them first, are ordinary again and outlive B's older chunks", async () => {
    const A = await startInstance('leave-A', http + 1);
    try {
      await waitUntil('A registered', () => A.att.state === 'live');
      // B's own prompt, stored before anything else: its oldest chunks by recency.
      const own = await putPrompt(B.store, range(64, 20_000));
      const shared = await putPrompt(A.store, range(64, 21_000));
      await new Promise((r) => setTimeout(r, 300));
      await putPrompt(B.store, range(64, 21_000));
      await waitUntil('B told its copies are held elsewhere', () => B.store.cpu()!.replicaChunks() === shared.length);
      // B's duplicates are its first victims, ahead of its own older prompt.
      assert.deepEqual(B.store.cpu()!.keys(), [...[...shared].reverse(), ...own]);
      const before = await counter('kvc_controller_replica_hints_last_copy_total');
      await A.close(); // a clean stop: `bye`
      await waitUntil('B told it holds the last copies', () => B.store.cpu()!.replicaChunks() === 0);
      // Plain recency again: B's own older prompt leaves before the copies it received later
      // (these come in the index's order, not the prompt's).
      const order = B.store.cpu()!.keys();
      assert.deepEqual(order.slice(0, own.length), own);
      assert.deepEqual(order.slice(own.length).sort(), [...shared].sort());
      assert.equal(await counter('kvc_controller_replica_hints_last_copy_total') - before, shared.length);
    } finally {
      if (A.att.state !== 'closed') await A.close();
    }
  });

  test("A is killed (no sign-off) and reaped: B's copies are ordinary again", async () => {
    const tokens = range(64, 22_000);
    const child: ChildProcess = spawn(process.execPath, [fileURLToPath(new URL('../../harness/instance_child.js', import.meta.url)), JSON.stringify({ id: 'leave-A-child', monitorPort: http + 1, modelId: MODEL, chunkSize: CHUNK, layout: LAYOUT, tokens })], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout!.on('data', (d) => (out += d));
    child.stderr!.on('data', (d) => (out += d));
    try {
      await waitUntil('the child instance registered and stored its chunks', () => /stored 4/.test(out), 30_000);
      await new Promise((r) => setTimeout(r, 300));
      const shared = await putPrompt(B.store, tokens);
      await waitUntil('B told its copies are held elsewhere', () => B.store.cpu()!.replicaChunks() === shared.length);
      const reapedBefore = await counter('kvc_controller_reaped_workers_total');
      child.kill('SIGKILL');
      await waitUntil('B told it holds the last copies', () => B.store.cpu()!.replicaChunks() === 0);
      assert.equal(await counter('kvc_controller_reaped_workers_total') - reapedBefore, 1, 'the child was reaped, not signed off');
      assert.deepEqual(B.store.cpu()!.keys().slice(-shared.length).sort(), [...shared].sort(), 'the copies are at the recent end of main');
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  });
});

describe('replica marks across a controller restart', () => {
  let ctl: Proc;
  let http: number;
  let A: Instance;
  let B: Instance;
  const startCtl = async () => {
    ctl = startKvc(['controller', '--port', String(http), '--monitor-port', String(http + 1), '--heartbeat-timeout', '2']);
    await ctl.waitFor(/kvc controller ready/, 60_000);
  };
  before(async () => {
    http = await freePortRange(2);
    await startCtl();
    A = await startInstance('restart-A', http + 1);
    B = await startInstance('restart-B', http + 1);
    await waitUntil('both registered', () => A.att.state === 'live' && B.att.state === 'live');
  });
  after(async () => {
    await A?.close();
    await B?.close();
    await ctl?.kill('SIGTERM');
  });

  test('instances forget the old advice when they re-register; the sync marks only what others hold', async () => {
    const keys = await putPrompt(A.store, range(64, 5000));
    await new Promise((r) => setTimeout(r, 300));
    await putPrompt(B.store, range(64, 5000));
    await waitUntil('B marked', () => B.store.cpu()!.replicaChunks() === keys.length);
    // A leaves (its copies leave the index with it, and B is told it holds the last copies), then
    // the controller restarts: B re-registers, forgets its marks and syncs; nobody else holds its
    // chunks, so nothing is marked again.
    await A.close();
    await ctl.kill('SIGKILL');
    await startCtl();
    const counter = async (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(await (await fetch(`http://127.0.0.1:${http}/metrics`)).text())?.[1] ?? NaN);
    const deadline = Date.now() + 30_000;
    while ((await counter('kvc_controller_synced_keys_total')) < keys.length) {
      assert.ok(Date.now() < deadline, 'B re-synced with the new controller');
      await new Promise((r) => setTimeout(r, 50));
    }
    await waitUntil('B holds its chunks unmarked', () => B.store.cpu()!.replicaChunks() === 0);
    assert.equal(await counter('kvc_controller_replica_hints_held_elsewhere_total'), 0);
    assert.equal(B.store.cpu()!.keys().length, keys.length, 'B lost nothing');
    // A comes back with the same chunks and syncs after B: A's copies are the duplicates now.
    A = await startInstance('restart-A', http + 1);
    await putPrompt(A.store, range(64, 5000));
    await waitUntil('A marked as the second holder', () => A.store.cpu()!.replicaChunks() === keys.length);
    assert.equal(B.store.cpu()!.replicaChunks(), 0);
  });
});

test('kvc controller --replica-hints takes on or off, naming the flag otherwise', async () => {
  const http = await freePortRange(2);
  const p = startKvc(['controller', '--port', String(http), '--monitor-port', String(http + 1), '--replica-hints', 'maybe']);
  await p.waitFor(/--replica-hints: expected one of on, off, found "maybe"/, 30_000);
  const code = await p.kill('SIGTERM');
  assert.notEqual(code, 0);
});

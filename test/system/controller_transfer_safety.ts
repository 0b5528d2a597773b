// The controller's transfer safety, on the controller and instances controller.test.ts starts (so no
// second controller starts): moves that do not fit, deadlines, cancelled requests, pins held while
// bytes are on the wire, and the peer port's frame checks. Two instances of their own, S and D, hold
// 512 KiB chunks so that transfers take long enough to interrupt.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { decode, encode } from '@msgpack/msgpack';
import { DType, type KvLayout } from '../../src/common/chunk.js';
import { transferHolds } from '../../src/kvc/transfer_holds.js';
import { WorkerOps } from '../../src/kvc/worker_ops.js';
import { startPeerServer } from '../../src/kvc/worker_peer.js';
import { postJson } from '../../harness/proc.js';
import { CHUNK, makeChunk, putPrompt, range, startInstance, waitUntil, type ControllerContext, type Instance } from './controller_fixtures.js';

export function transferSafetyTests(ctx: ControllerContext): void {
describe('transfer safety', () => {
  // 512 KiB chunks (16 tokens): a source with room for many, a destination with room for ~19.
  const big: KvLayout = { dtype: DType.f32, numLayers: 8, numKvHeads: 8, headDim: 64 };
  let S: Instance;
  let D: Instance;
  const workerUrl = (i: Instance) => `http://127.0.0.1:${i.cfg.kvc_worker_port}`;
  const pinnedIn = (i: Instance, loc: 'LocalCPUBackend' | 'LocalDiskBackend') => i.store.stats().find((x) => x.location === loc)!.pinned;
  const movesInFlight = async (i: Instance) => ((await (await fetch(`${workerUrl(i)}/health`)).json()) as { moves_in_flight: number }).moves_in_flight;

  before(async () => {
    S = await startInstance('inst-S', ctx.monitor, { cpuGiB: 0.06, disk: true, diskGiB: 0.005, layout: big });
    D = await startInstance('inst-D', ctx.monitor, { cpuGiB: 0.01, layout: big });
    ctx.instances.push(S, D);
    await waitUntil('S and D live', () => S.att.state === 'live' && D.att.state === 'live');
  });
  after(async () => {
    for (const i of [S, D]) {
      await i?.close().catch(() => {});
      if (i) ctx.instances.splice(ctx.instances.indexOf(i), 1);
    }
  });

  test('a move bigger than the destination: refused, nothing lost, event failed, no pin left behind', async () => {
    await D.store.clear('LocalCPUBackend');
    // Some older chunks on D that LRU may evict: those are fine to lose.
    await putPrompt(D.store, range(64, 123_000), 'LocalCPUBackend', CHUNK, big);
    const tokens = range(40 * CHUNK, 200_000); // 40 chunks = 20 MiB, D holds ~10 MiB
    const spans = await putPrompt(S.store, tokens, 'LocalCPUBackend', CHUNK, big);
    await waitUntil('indexed', async () => (await ctx.lookup(tokens)).layout_detail['inst-S']?.matched_tokens === tokens.length);
    const r = await postJson(`${ctx.url}/move`, { old_position: ['inst-S', 'LocalCPUBackend'], new_position: ['inst-D', 'LocalCPUBackend'], tokens, copy: false });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.num_tokens, tokens.length);
    const ev = await ctx.waitEvent(r.json.event_id);
    assert.equal(ev.status, 'failed', 'a move that did not fit cannot be reported finished');
    assert.match(ev.error, /full|no room/);
    for (const s of spans) {
      assert.ok(S.store.has(s.key, 'LocalCPUBackend') || D.store.has(s.key, 'LocalCPUBackend'), `chunk ${s.index} is on neither side`);
      assert.ok(S.store.has(s.key, 'LocalCPUBackend'), `failed move deleted source chunk ${s.index}`);
    }
    // D's transfer pins are released once the connection is gone.
    await waitUntil('D unpinned', () => pinnedIn(D, 'LocalCPUBackend') === 0);
    // A move that fits still works, byte for byte.
    const fits = tokens.slice(0, 8 * CHUNK);
    const ok = await postJson(`${ctx.url}/move`, { old_position: ['inst-S', 'LocalCPUBackend'], new_position: ['inst-D', 'LocalCPUBackend'], tokens: fits, copy: false });
    const okEv = await ctx.waitEvent(ok.json.event_id);
    assert.equal(okEv.status, 'finished', okEv.error);
    for (const s of spans.slice(0, 8)) {
      assert.equal(S.store.has(s.key, 'LocalCPUBackend'), false);
      assert.deepEqual(await D.store.get(s.key, undefined, 'LocalCPUBackend'), makeChunk(s.key, CHUNK, big));
    }
    assert.equal(pinnedIn(D, 'LocalCPUBackend'), 0);
    await S.store.clear('LocalCPUBackend');
  });

  test('a move inside an instance into a smaller disk tier: refused, source intact, no pin left behind', async () => {
    const tokens = range(24 * CHUNK, 300_000); // 12 MiB into a ~5 MiB disk tier
    const spans = await putPrompt(S.store, tokens, 'LocalCPUBackend', CHUNK, big);
    await waitUntil('indexed', async () => (await ctx.lookup(tokens)).layout_detail['inst-S']?.matched_tokens === tokens.length);
    const r = await postJson(`${ctx.url}/move`, { old_position: ['inst-S', 'LocalCPUBackend'], new_position: ['inst-S', 'LocalDiskBackend'], tokens, copy: false });
    assert.equal(r.json.num_tokens, tokens.length);
    const ev = await ctx.waitEvent(r.json.event_id);
    assert.equal(ev.status, 'failed');
    assert.match(ev.error, /no room|full/);
    for (const s of spans) assert.ok(S.store.has(s.key, 'LocalCPUBackend'), `failed move deleted source chunk ${s.index}`);
    assert.equal(pinnedIn(S, 'LocalDiskBackend'), 0);
    await S.store.clear('LocalDiskBackend');
    await S.store.clear('LocalCPUBackend');
  });

  test('the deadline passing before the delete phase keeps the source (in an instance and across instances)', async () => {
    // A clock that jumps past the deadline the moment the destination stored the last chunk.
    let t = 1_000_000;
    const ops = new WorkerOps(S.store, 'inst-S', { now: () => t });
    const local = await putPrompt(S.store, range(3 * CHUNK, 400_000), 'LocalCPUBackend', CHUNK, big);
    const lastLocal = local.at(-1)!.key;
    const onAdmit = (e: { location: string; keys: string[] }) => {
      if (e.location === 'LocalDiskBackend' && e.keys.includes(lastLocal)) t += 10 * 60_000;
    };
    S.store.on('admit', onAdmit);
    try {
      await assert.rejects(
        ops.move({ keys: local.map((s) => s.key), location: 'LocalCPUBackend', copy: false, target: { location: 'LocalDiskBackend' }, deadline_ms: 60_000 }),
        /did not complete within 60000 ms \(before deleting the source\)/,
      );
    } finally {
      S.store.off('admit', onAdmit);
    }
    for (const s of local) assert.ok(S.store.has(s.key, 'LocalCPUBackend'));
    await S.store.clear('LocalDiskBackend');

    const cross = await putPrompt(S.store, range(3 * CHUNK, 410_000), 'LocalCPUBackend', CHUNK, big);
    const lastCross = cross.at(-1)!.key;
    const onAdmitD = (e: { keys: string[] }) => {
      if (e.keys.includes(lastCross)) t += 10 * 60_000;
    };
    D.store.on('admit', onAdmitD);
    try {
      await assert.rejects(
        ops.move({ keys: cross.map((s) => s.key), location: 'LocalCPUBackend', copy: false, target: { location: 'LocalCPUBackend', distributed_url: D.cfg.distributed_url }, deadline_ms: 60_000 }),
        /before deleting the source/,
      );
    } finally {
      D.store.off('admit', onAdmitD);
    }
    for (const s of cross) assert.ok(S.store.has(s.key, 'LocalCPUBackend'));
    await S.store.clear('LocalCPUBackend');
  });

  test('a move whose controller request goes away is cancelled and keeps its source', async () => {
    await D.store.clear('LocalCPUBackend');
    const spans = await putPrompt(S.store, range(12 * CHUNK, 500_000), 'LocalCPUBackend', CHUNK, big);
    const keys = spans.map((s) => s.key);
    const req = new AbortController();
    // The controller's side of the request disappears as soon as the destination's first chunk
    // starts arriving (a chunk of a move joins the destination's index only at its COMMIT).
    const reserve = D.store.reserveIncoming;
    D.store.reserveIncoming = (bytes) => {
      D.store.reserveIncoming = reserve;
      req.abort();
      return reserve.call(D.store, bytes);
    };
    const sent = fetch(`${workerUrl(S)}/move`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ keys, location: 'LocalCPUBackend', copy: false, target: { location: 'LocalCPUBackend', distributed_url: D.cfg.distributed_url }, deadline_ms: 60_000 }),
      signal: req.signal,
    });
    await assert.rejects(sent);
    await waitUntil('the worker finished with the move', async () => (await movesInFlight(S)) === 0);
    for (const s of spans) assert.ok(S.store.has(s.key, 'LocalCPUBackend'), `cancelled move deleted source chunk ${s.index}`);
    await waitUntil('D unpinned', () => pinnedIn(D, 'LocalCPUBackend') === 0);
    await waitUntil('D left clean', () => D.store.cpu()!.reserved === 0);
    for (const s of spans) assert.ok(!D.store.has(s.key, 'LocalCPUBackend'), `the cancelled move left chunk ${s.index} at the destination`);
    assert.equal(pinnedIn(S, 'LocalCPUBackend'), 0);
    await S.store.clear('LocalCPUBackend');
  });

  test('a memory-tier chunk stays pinned while its bytes wait on the socket, and is unpinned afterwards', async () => {
    // A peer that accepts the transfer and then stops reading: the send stalls with a chunk queued.
    const stalled = net.createServer((sock) => {
      sock.once('data', () => {
        const body = encode({ ok: true });
        const head = Buffer.alloc(5);
        head.writeUInt32LE(body.byteLength, 0);
        head.writeUInt8(0x81, 4);
        sock.write(Buffer.concat([head, body]));
        sock.pause();
      });
      sock.on('error', () => {});
    });
    await new Promise<void>((r) => stalled.listen(0, '127.0.0.1', r));
    const port = (stalled.address() as net.AddressInfo).port;
    const spans = await putPrompt(S.store, range(40 * CHUNK, 600_000), 'LocalCPUBackend', CHUNK, big);
    const keys = spans.map((s) => s.key);
    const req = new AbortController();
    const sent = fetch(`${workerUrl(S)}/move`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ keys, location: 'LocalCPUBackend', copy: true, target: { location: 'LocalCPUBackend', distributed_url: `127.0.0.1:${port}` }, deadline_ms: 60_000 }),
      signal: req.signal,
    }).catch((e: Error) => e);
    try {
      const queued = await waitUntil('a chunk held while queued', () => keys.find((k) => S.store.isPinned(k, 'LocalCPUBackend')));
      // Eviction pressure: more than the whole CPU tier of other chunks (only microtasks run
      // meanwhile, so the send cannot progress). The queued chunk must not be recycled.
      for (let i = 0; i < 130; i++) await putPrompt(S.store, range(CHUNK, 700_000 + i * CHUNK), 'LocalCPUBackend', CHUNK, big);
      assert.ok(S.store.has(queued, 'LocalCPUBackend'), 'a chunk being sent was evicted');
      const bytes = await S.store.get(queued, undefined, 'LocalCPUBackend');
      assert.deepEqual(bytes, makeChunk(queued, CHUNK, big));
    } finally {
      req.abort();
      await sent;
      stalled.close();
    }
    await waitUntil('the worker finished with the move', async () => (await movesInFlight(S)) === 0);
    assert.equal(pinnedIn(S, 'LocalCPUBackend'), 0, 'the send left a chunk pinned');
    assert.equal(transferHolds(S.store).size, 0);
    await S.store.clear('LocalCPUBackend');
  });

  test('a pin asked while a transfer holds the chunk survives the end of the transfer', async () => {
    const holds = transferHolds(D.store);
    const [s] = await putPrompt(D.store, range(CHUNK, 800_000), 'LocalCPUBackend', CHUNK, big);
    assert.ok(holds.hold(s!.key, 'LocalCPUBackend'));
    new WorkerOps(D.store, 'inst-D').pin([s!.key], 'LocalCPUBackend');
    holds.release(s!.key, 'LocalCPUBackend');
    assert.ok(D.store.isPinned(s!.key, 'LocalCPUBackend'));
    // And one that was not pinned before is unpinned when the hold ends.
    const [u] = await putPrompt(D.store, range(CHUNK, 810_000), 'LocalCPUBackend', CHUNK, big);
    holds.hold(u!.key, 'LocalCPUBackend');
    holds.hold(u!.key, 'LocalCPUBackend');
    holds.release(u!.key, 'LocalCPUBackend');
    assert.ok(D.store.isPinned(u!.key, 'LocalCPUBackend'), 'still held by the second transfer');
    holds.release(u!.key, 'LocalCPUBackend');
    assert.equal(D.store.isPinned(u!.key, 'LocalCPUBackend'), false);
    D.store.unpin(s!.key, 'LocalCPUBackend');
  });

  test('peer port: huge or premature frame headers close the connection without reserving memory; idle connections close', async () => {
    const [host, port] = [D.cfg.distributed_url!.split(':')[0]!, Number(D.cfg.distributed_url!.split(':')[1])];
    /** Sends `bytes`, then resolves with the error the peer names when it closes the connection. */
    const probe = (bytes: Buffer) =>
      new Promise<string>((resolve, reject) => {
        const sock = net.connect({ host, port }, () => sock.write(bytes));
        let got = Buffer.alloc(0);
        sock.on('data', (d) => (got = Buffer.concat([got, d])));
        sock.on('error', () => {});
        sock.on('close', () => {
          const errors: string[] = [];
          for (let off = 0; off + 5 <= got.length; ) {
            const len = got.readUInt32LE(off);
            const m = decode(got.subarray(off + 5, off + 5 + len)) as { error?: string };
            if (m.error) errors.push(m.error);
            off += 5 + len;
          }
          resolve(errors.join('; '));
        });
        setTimeout(() => reject(new Error('the peer kept the connection open')), 10_000).unref();
      });
    const header = (len: number, type: number) => {
      const h = Buffer.alloc(5);
      h.writeUInt32LE(len, 0);
      h.writeUInt8(type, 4);
      return h;
    };
    const hello = encode({ v: 1, location: 'LocalCPUBackend', count: 1, from: 'test' });
    const before = process.memoryUsage().arrayBuffers;
    assert.match(await probe(header(2 ** 31 - 1, 1)), /HELLO frame of 2147483647 bytes exceeds 65536/);
    assert.match(await probe(header(1000, 2)), /CHUNK before HELLO/);
    assert.match(await probe(header(100, 9)), /unknown frame type 9/);
    assert.match(await probe(Buffer.concat([header(hello.byteLength, 1), hello, header(2 ** 30, 2)])), /CHUNK frame of 1073741824 bytes exceeds the largest chunk/);
    assert.ok(process.memoryUsage().arrayBuffers - before < 64 * 1024 * 1024, 'a frame header reserved memory');
    // An idle connection is closed (a short idle limit on a second server of the same store).
    const idle = await startPeerServer(D.store, '127.0.0.1', 0, { layout: big, chunkSize: CHUNK, idleMs: 200 });
    try {
      const closed = await new Promise<string>((resolve) => {
        const sock = net.connect({ host: '127.0.0.1', port: idle.port });
        let got = Buffer.alloc(0);
        sock.on('data', (d) => (got = Buffer.concat([got, d])));
        sock.on('error', () => {});
        sock.on('close', () => resolve(got.length > 5 ? String((decode(got.subarray(5)) as { error?: string }).error) : ''));
      });
      assert.match(closed, /no traffic for 200 ms/);
    } finally {
      await idle.close();
    }
    // The instance keeps serving: a copy into D still completes.
    const tokens = range(4 * CHUNK, 900_000);
    await putPrompt(S.store, tokens, 'LocalCPUBackend', CHUNK, big);
    await waitUntil('indexed', async () => (await ctx.lookup(tokens)).layout_detail['inst-S']?.matched_tokens === tokens.length);
    const c = await postJson(`${ctx.url}/move`, { old_position: ['inst-S', 'LocalCPUBackend'], new_position: ['inst-D', 'LocalCPUBackend'], tokens, copy: true });
    const ev = await ctx.waitEvent(c.json.event_id);
    assert.equal(ev.status, 'finished', ev.error);
  });
});
}

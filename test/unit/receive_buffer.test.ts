// The xfer receiver's buffer (src/xfer/receive_buffer.ts) without sockets: ALLOC checks and
// grants, the byte accounting in size classes, the FIFO queue and the per-sender share, chunk
// arrival (owner, length, checksum), take/release, sessions closing, cancels and expiry.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { sizeClass } from '../../src/common/buffer_pool.js';
import { chunkBytes, DType, encodeChunk, HEADER_BYTES, payloadBytes } from '../../src/common/chunk.js';
import { ReceiveBuffer, type AllocReply, type ReceiveBufferOptions } from '../../src/xfer/receive_buffer.js';

const layout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 4 };
const CHUNK_TOKENS = 16;
const FULL = chunkBytes(layout, CHUNK_TOKENS);
/** Accounted bytes of one full chunk. */
const COST = sizeClass(FULL);

function key(i: number): string {
  return i.toString(16).padStart(16, '0');
}

function chunk(k: string, tokens = CHUNK_TOKENS): Uint8Array {
  const f = new Float32Array(payloadBytes(layout, tokens) / 4);
  for (let i = 0; i < f.length; i++) f[i] = parseInt(k.slice(-4), 16) + i / 8;
  return encodeChunk(layout, tokens, k, new Uint8Array(f.buffer));
}

function makeBuffer(o: Partial<ReceiveBufferOptions> = {}): ReceiveBuffer {
  return new ReceiveBuffer({ bufferBytes: 4 * COST, maxChunkBytes: FULL, ttlMs: 1000, claimWindowMs: 100_000, maxAllocWaitMs: 60_000, deadlineFloorMs: 60_000, ...o });
}

/** ALLOC and its reply; `settled` tells whether the reply has come yet (queued ALLOCs answer later). */
function alloc(b: ReceiveBuffer, session: string, reqId: string, chunks: [string, number][], waitMs = 60_000) {
  let settled = false;
  const reply = new Promise<AllocReply>((resolve) =>
    b.alloc({ id: 1, session, req_id: reqId, chunks, wait_ms: waitMs }, (r) => {
      settled = true;
      resolve(r);
    }),
  );
  return { reply, settled: () => settled };
}

/** What the init port does with one DATA frame: the body into its target slot, hashed there, then arrival. */
function deliver(b: ReceiveBuffer, session: string, reqId: string, bytes: Uint8Array, corrupt = false) {
  const meta = { req_id: reqId, key: readKey(bytes) };
  const entry = b.chunkTarget(session, meta, bytes.byteLength);
  let body: Uint8Array | null = null;
  let payloadSum: bigint | null = null;
  if (entry) {
    body = entry.buf!.subarray(0, bytes.byteLength);
    body.set(bytes);
    if (corrupt) body[HEADER_BYTES + 5]! ^= 1;
    const h = b.hasher(entry.buf!);
    h.update(body.subarray(HEADER_BYTES));
    payloadSum = h.digest();
  }
  return b.chunkArrived({ session, meta, entry, body, bodyLen: bytes.byteLength, payloadSum });
}

function readKey(c: Uint8Array): string {
  return new DataView(c.buffer, c.byteOffset + 32, 8).getBigUint64(0, true).toString(16).padStart(16, '0');
}

test('receive buffer: a bad ALLOC is refused with what is wrong and changes nothing', async () => {
  const b = makeBuffer();
  const s = b.openSession();
  const cases: [unknown, RegExp][] = [
    [{ id: 1, session: s, req_id: '', chunks: [[key(1), FULL]], wait_ms: 0 }, /malformed ALLOC: req_id/],
    [{ id: 1, session: s, req_id: 'r', chunks: [['xyz', FULL]], wait_ms: 0 }, /malformed ALLOC: chunks\.0\.0/],
    [{ id: 1, session: 'nobody', req_id: 'r', chunks: [[key(1), FULL]], wait_ms: 0 }, /unknown "session"/],
    [{ id: 1, session: s, req_id: 'r', chunks: [[key(1), FULL + 1]], wait_ms: 0 }, /size \d+ is outside \(64, \d+\]/],
    [{ id: 1, session: s, req_id: 'r', chunks: [[key(1), HEADER_BYTES]], wait_ms: 0 }, /is outside/],
  ];
  for (const [meta, why] of cases) {
    const r = await new Promise<AllocReply>((resolve) => b.alloc(meta, resolve));
    assert.equal(r.ok, false);
    assert.match(r.error!, why);
  }
  const big = await alloc(b, s, 'big', [0, 1, 2, 3, 4].map((i) => [key(i), FULL])).reply;
  assert.match(big.error!, /more than the whole receiver buffer/);
  assert.deepEqual({ ...b.stats(), poolBytes: 0 }, { ...makeBuffer().stats(), poolBytes: 0, sessions: 1, allocRefused: 1 });
});

test('receive buffer: a reservation is accounted in size classes, filled by its own sender, taken and released', async () => {
  const completed: [string, string[]][] = [];
  const b = makeBuffer({ onComplete: (reqId, keys) => completed.push([reqId, keys]) });
  const s = b.openSession();
  const c1 = chunk(key(1));
  const c2 = chunk(key(2), 5); // a partial last chunk
  const r = await alloc(b, s, 'req', [[key(1), c1.byteLength], [key(2), c2.byteLength], [key(1), c1.byteLength]]).reply;
  assert.deepEqual(r, { ok: true, have: [] });
  assert.equal(b.stats().reservedBytes, 2 * COST, 'the repeated key is reserved once');
  assert.equal(b.lookup([key(1), key(2)]), 0);

  // Only the owner session, for its request, with the announced length, may write a chunk.
  const other = b.openSession();
  assert.deepEqual(deliver(b, other, 'req', c1), { ok: false, error: `no reservation expects chunk ${key(1)} of ${c1.byteLength} bytes for request req` });
  assert.equal(b.chunkTarget(s, { req_id: 'other', key: key(1) }, c1.byteLength), null);
  assert.equal(b.chunkTarget(s, { req_id: 'req', key: key(1) }, c1.byteLength - 1), null);

  assert.deepEqual(deliver(b, s, 'req', c1), { ok: true });
  assert.deepEqual(deliver(b, s, 'req', c1), { ok: false, error: 'already held' });
  assert.equal(b.lookup([key(1), key(2)]), 1);
  assert.deepEqual(completed, []);
  assert.deepEqual(deliver(b, s, 'req', c2), { ok: true });
  assert.deepEqual(completed, [['req', [key(1), key(2)]]]);

  const t = await b.take([key(1), key(2), key(3)], 'req');
  assert.deepEqual(t.keys, [key(1), key(2)]);
  assert.equal(t.numTokens, CHUNK_TOKENS + 5);
  assert.deepEqual(t.chunks[0], c1);
  assert.deepEqual(t.chunks[1], c2);
  const st = b.stats();
  assert.equal(st.chunksReceived, 2);
  assert.equal(st.bytesReceived, c1.byteLength + c2.byteLength);
  assert.equal(st.chunksRejected, 2);
  t.release();
  t.release(); // twice is harmless
  assert.equal(b.stats().reservedBytes, 0);
  assert.equal(b.stats().entries, 0);
  assert.equal(b.release('req'), false, 'the take released the reservation');
});

test('receive buffer: keys already held or in the engine cache come back in `have` and reserve nothing', async () => {
  const b = makeBuffer({ heldLocally: (k) => k === key(9) });
  const s = b.openSession();
  assert.deepEqual(await alloc(b, s, 'a', [[key(1), FULL]]).reply, { ok: true, have: [] });
  const r = await alloc(b, s, 'b', [[key(1), FULL], [key(9), FULL], [key(2), FULL]]).reply;
  assert.deepEqual(r, { ok: true, have: [key(1), key(9)] });
  assert.equal(b.stats().reservedBytes, 2 * COST);
  assert.match((await alloc(b, s, 'b', [[key(3), FULL]]).reply).error!, /req_id "b" already has a reservation/);
  // take() steps over a key the engine holds and stops at the first one missing.
  assert.deepEqual(deliver(b, s, 'a', chunk(key(1))), { ok: true });
  const t = await b.take([key(1), key(9), key(2)], 'b');
  assert.deepEqual(t.keys, [key(1)]);
  t.release();
  assert.equal(b.stats().reservations, 1, "b's reservation went with its take; a's stays");
  assert.equal(b.stats().reservedBytes, COST, 'key 2 left with b; key 1 is still held by a');
  assert.equal(b.release('a'), true);
  assert.deepEqual([b.stats().reservedBytes, b.stats().entries], [0, 0]);
});

test('receive buffer: a full buffer queues ALLOCs first come first served; freed space grants them in order', async () => {
  const b = makeBuffer({ bufferBytes: 2 * COST });
  const s = b.openSession();
  assert.equal((await alloc(b, s, 'a', [[key(1), FULL], [key(2), FULL]]).reply).ok, true);
  const q1 = alloc(b, s, 'b', [[key(3), FULL]]);
  const q2 = alloc(b, s, 'c', [[key(4), FULL]]);
  assert.equal(q1.settled() || q2.settled(), false, 'both wait');
  assert.match((await alloc(b, s, 'b', [[key(5), FULL]]).reply).error!, /req_id "b" already has a reservation/);
  assert.equal(b.release('a'), true);
  assert.deepEqual(await q1.reply, { ok: true, have: [] });
  assert.deepEqual(await q2.reply, { ok: true, have: [] });
  assert.equal(b.stats().reservedBytes, 2 * COST);
  // A wait that runs out is refused with the figures.
  const late = await alloc(b, s, 'd', [[key(6), FULL]], 0).reply;
  assert.match(late.error!, /receiver buffer full: request d needs 4096 bytes, 8192 of 8192 reserved, waited 0 ms/);
  assert.equal(b.stats().allocRefused, 1);
  // close() answers whoever still waits.
  const last = alloc(b, s, 'e', [[key(7), FULL]]);
  b.close();
  assert.deepEqual(await last.reply, { ok: false, error: 'receiver is shutting down' });
});

test('receive buffer: with two senders one may hold half the buffer, and waiting for its own share does not block the other', async () => {
  const b = makeBuffer({ bufferBytes: 4 * COST });
  const s1 = b.openSession();
  const s2 = b.openSession();
  assert.equal((await alloc(b, s1, 'a', [[key(1), FULL], [key(2), FULL]]).reply).ok, true);
  const over = alloc(b, s1, 'b', [[key(3), FULL]]);
  assert.equal(over.settled(), false, 's1 is at its half');
  assert.deepEqual(await alloc(b, s2, 'c', [[key(4), FULL]]).reply, { ok: true, have: [] }, 's2 overtakes the waiting s1');
  assert.match((await alloc(b, s2, 'd', [[key(5), FULL], [key(6), FULL], [key(7), FULL]]).reply).error!, /more than one sender may hold reserved \(8192\)/);
  b.release('a');
  assert.deepEqual(await over.reply, { ok: true, have: [] });
  // A configured share applies whatever the number of senders.
  const c = makeBuffer({ maxReservedPerSender: COST });
  const lone = c.openSession();
  assert.match((await alloc(c, lone, 'x', [[key(1), FULL], [key(2), FULL]]).reply).error!, /more than one sender may hold reserved \(4096\)/);
});

test('receive buffer: a sender that closes or cancels settles its unsent chunks; a waiting take wakes with what is usable', async () => {
  const b = makeBuffer();
  const s1 = b.openSession();
  const s2 = b.openSession();
  assert.equal((await alloc(b, s1, 'a', [[key(1), FULL], [key(2), FULL]]).reply).ok, true);
  // s2's request needs the same keys: it is told to skip them and waits on s1's copies.
  assert.deepEqual(await alloc(b, s2, 'b', [[key(1), FULL], [key(2), FULL]]).reply, { ok: true, have: [key(1), key(2)] });
  assert.deepEqual(deliver(b, s1, 'a', chunk(key(1))), { ok: true });
  // s1 is cut in the middle of key 2 (its target taken, its bytes never completed).
  const cut = b.chunkTarget(s1, { req_id: 'a', key: key(2) }, FULL);
  assert.ok(cut);
  const waiting = b.take([key(1), key(2)], 'b', 60_000);
  const queued = alloc(b, s1, 'q', [[key(3), FULL]]);
  assert.equal(queued.settled(), false, 's1 holds its half of the buffer');
  b.closeSession(s1, cut);
  const t = await waiting;
  assert.deepEqual(t.keys, [key(1)], 'key 2 will never come: the take returns at once with key 1');
  assert.match((await queued.reply).error!, /sender session [0-9a-f]+ closed/, 'not granted with the space its own cut chunk freed');
  assert.equal(b.hasSession(s1), false);
  t.release();
  b.release('a');
  assert.deepEqual([b.stats().reservedBytes, b.stats().entries, b.stats().reservations], [0, 0, 0]);

  // CANCEL on the init port: unsent chunks of that request go; on the alloc port the reservation too.
  assert.equal((await alloc(b, s2, 'c', [[key(7), FULL], [key(8), FULL]]).reply).ok, true);
  assert.equal(b.discardUnsent(s2, 'c'), 2);
  assert.equal(b.stats().reservations, 1);
  b.withdrawAlloc(s2, 'c');
  assert.deepEqual([b.stats().reservedBytes, b.stats().reservations], [0, 0]);
});

test('receive buffer: a corrupt chunk is refused and leaves the index; its space is free again', async () => {
  const b = makeBuffer();
  const s = b.openSession();
  assert.equal((await alloc(b, s, 'a', [[key(1), FULL]]).reply).ok, true);
  const r = deliver(b, s, 'a', chunk(key(1)), true);
  assert.deepEqual(r, { ok: false, error: `checksum mismatch for chunk ${key(1)}` });
  assert.deepEqual([b.lookup([key(1)]), b.stats().entries, b.stats().reservedBytes, b.stats().chunksRejected], [0, 0, 0, 1]);
  // A chunk whose reservation went away while it arrived is refused too, and its slot returned.
  assert.equal((await alloc(b, s, 'b', [[key(2), FULL]]).reply).ok, true);
  const c = chunk(key(2));
  const e = b.chunkTarget(s, { req_id: 'b', key: key(2) }, c.byteLength)!;
  b.release('b');
  e.buf!.set(c);
  const h = b.hasher(e.buf!);
  h.update(e.buf!.subarray(HEADER_BYTES, c.byteLength));
  assert.deepEqual(b.chunkArrived({ session: s, meta: { req_id: 'b', key: key(2) }, entry: e, body: e.buf!.subarray(0, c.byteLength), bodyLen: c.byteLength, payloadSum: h.digest() }), {
    ok: false,
    error: 'reservation expired while receiving',
  });
  assert.equal(e.buf, null);
});

test('receive buffer: reservations nobody takes expire after ttlMs; claimed ones stay', async () => {
  let now = 1_000;
  const b = makeBuffer({ ttlMs: 500, now: () => now });
  const s = b.openSession();
  assert.equal((await alloc(b, s, 'a', [[key(1), FULL]]).reply).ok, true);
  assert.equal((await alloc(b, s, 'b', [[key(2), FULL]]).reply).ok, true);
  assert.deepEqual(deliver(b, s, 'b', chunk(key(2))), { ok: true });
  const t = await b.take([key(2)], 'b');
  now += 500;
  b.sweep();
  assert.equal(b.stats().reservations, 2, 'not older than ttlMs yet');
  now += 1;
  b.sweep();
  assert.deepEqual([b.stats().reservations, b.stats().reservationsExpired, b.stats().reservedBytes], [1, 1, COST]);
  t.release();
  assert.deepEqual([b.stats().reservations, b.stats().reservedBytes], [0, 0]);
});

test('receive buffer: every transfer ends done, failed or abandoned, and its room is released', async () => {
  const cuts: string[] = [];
  const b = makeBuffer({ deadlineFloorMs: 50, cutSession: (s) => cuts.push(s) });
  const s = b.openSession();
  const ended = () => b.stats().transfers;
  // done: every chunk arrived
  assert.equal((await alloc(b, s, 'done', [[key(1), FULL]]).reply).ok, true);
  assert.deepEqual(ended(), { done: 0, failed: 0, abandoned: 0, inFlight: 1 });
  assert.equal(deliver(b, s, 'done', chunk(key(1))).ok, true);
  assert.deepEqual(ended(), { done: 1, failed: 0, abandoned: 0, inFlight: 0 });
  (await b.take([key(1)], 'done')).release();
  // failed: a corrupt chunk
  await alloc(b, s, 'bad', [[key(2), FULL]]).reply;
  assert.equal(deliver(b, s, 'bad', chunk(key(2)), true).ok, false);
  assert.equal(ended().failed, 1);
  b.release('bad');
  // abandoned: one of two chunks arrives, the other never starts; the deadline ends it, and the
  // consumer waiting until then wakes with the one that arrived
  await alloc(b, s, 'half', [[key(3), FULL], [key(4), FULL]]).reply;
  deliver(b, s, 'half', chunk(key(3)));
  const left = b.msUntilEnded('half');
  assert.ok(left !== null && left <= 50 + Math.ceil((2 * FULL * 1000) / (16 * 1024 * 1024)));
  const t = await b.take([key(3), key(4)], 'half', 60_000);
  assert.deepEqual(t.keys, [key(3)]);
  assert.equal(ended().abandoned, 1);
  assert.equal(b.msUntilEnded('half'), null);
  t.release();
  // abandoned mid-chunk: the stalled connection is cut, which discards the half-written chunk
  await alloc(b, s, 'stall', [[key(5), FULL]]).reply;
  const writing = b.chunkTarget(s, { req_id: 'stall', key: key(5) }, FULL);
  assert.ok(writing);
  const waiting = b.take([key(5)], 'stall', 60_000);
  while (cuts.length === 0) await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(cuts, [s]);
  b.closeSession(s, writing); // what the listener does when the cut connection closes
  const none = await waiting;
  assert.deepEqual(none.keys, []);
  none.release();
  // killed sender: its session closes before the chunk arrives
  const s2 = b.openSession();
  await alloc(b, s2, 'killed', [[key(6), FULL]]).reply;
  b.closeSession(s2, null);
  assert.deepEqual(ended(), { done: 1, failed: 2, abandoned: 2, inFlight: 0 });
  b.release('killed');
  assert.equal(b.stats().reservedBytes, 0);
  assert.equal(b.stats().reservations, 0);
  b.close();
});

test('receive buffer: a request that ended frees its reservation at once, refuses a later ALLOC for it, and leaves a claimed one to its request', async () => {
  const b = makeBuffer();
  const s = b.openSession();
  // ended after its transfer: released, counted, room back
  assert.equal((await alloc(b, s, 'gone', [[key(1), FULL]]).reply).ok, true);
  assert.deepEqual(deliver(b, s, 'gone', chunk(key(1))), { ok: true });
  assert.equal(b.endRequest('gone'), 'released');
  assert.deepEqual([b.stats().reservations, b.stats().reservedBytes, b.stats().reservationsReleased], [0, 0, 1]);
  // ended before its ALLOC: the ALLOC that comes later is refused, nothing reserved
  assert.equal(b.endRequest('early'), 'none');
  const late = await alloc(b, s, 'early', [[key(2), FULL]]).reply;
  assert.equal(late.ok, false);
  assert.match(late.error!, /request early has ended/);
  assert.equal(b.stats().reservations, 0);
  // ended mid-transfer: abandoned, its unsent chunk discarded, its later DATA refused
  assert.equal((await alloc(b, s, 'mid', [[key(3), FULL], [key(4), FULL]]).reply).ok, true);
  assert.deepEqual(deliver(b, s, 'mid', chunk(key(3))), { ok: true });
  assert.equal(b.endRequest('mid'), 'released');
  assert.equal(deliver(b, s, 'mid', chunk(key(4))).ok, false);
  assert.deepEqual(b.stats().transfers, { done: 1, failed: 0, abandoned: 1, inFlight: 0 });
  // claimed by its request (it arrived at the engine): the proxy's release leaves it; the request frees it
  assert.equal((await alloc(b, s, 'mine', [[key(5), FULL]]).reply).ok, true);
  assert.equal(b.claim('mine'), true);
  assert.equal(b.endRequest('mine'), 'taken');
  assert.equal(b.stats().reservations, 1);
  assert.equal(b.endRequest('mine', true), 'released');
  assert.deepEqual([b.stats().reservations, b.stats().reservedBytes], [0, 0]);
  b.close();
});

test('receive buffer: a reservation whose transfer ended is freed after the claim window when its request never came; a claimed one waits', async () => {
  let now = 1_000;
  const b = makeBuffer({ ttlMs: 100_000, claimWindowMs: 300, now: () => now });
  const s = b.openSession();
  for (const [r, k] of [['orphan', key(7)], ['queued', key(8)]] as const) {
    assert.equal((await alloc(b, s, r, [[k, FULL]]).reply).ok, true);
    assert.deepEqual(deliver(b, s, r, chunk(k)), { ok: true });
  }
  b.claim('queued'); // its request waits in the engine's queue
  now += 300;
  b.sweep();
  assert.equal(b.stats().reservations, 2, 'within the window');
  now += 1;
  b.sweep();
  assert.deepEqual([b.stats().reservations, b.stats().reservationsExpired], [1, 1]);
  (await b.take([key(8)], 'queued')).release();
  assert.deepEqual([b.stats().reservations, b.stats().reservedBytes, b.stats().reservationsTaken], [0, 0, 1]);
  b.close();
});

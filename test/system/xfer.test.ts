// xfer library: handshake, reservations, dedup, backpressure, TTL, exact accounting, notices.
// Sender and receiver talk over real loopback TCP; cross-process cases are in xfer-procs.test.ts.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { Pull } from 'zeromq';
import { DType, chunkBytes, verifyChunk, type KvLayout } from '../../src/common/chunk.js';
import { validateCacheConfig } from '../../src/common/config.js';
import { freePortRange } from '../../harness/ports.js';
import { XferReceiver, XferSender, createXfer, decodeNotice, type DisaggSpec, type OutChunk } from '../../src/xfer/index.js';
import { syntheticChunk, syntheticKey } from '../../src/xfer/peer.js';
import { FrameParser, FrameType, PROTOCOL_VERSION, writeFrame } from '../../src/protocol/xfer_frames.js';

const layout: KvLayout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 8 };
const CHUNK = 16;
const MODEL = 'builtin-test';
const FULL = chunkBytes(layout, CHUNK); // 4160 bytes

const closers: (() => unknown)[] = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

async function receiver(extra: Partial<Parameters<typeof XferReceiver.start>[0]> = {}) {
  const port = await freePortRange(2);
  const r = await XferReceiver.start({
    host: '127.0.0.1',
    initPort: port,
    allocPort: port + 1,
    bufferBytes: 1 << 20,
    layout,
    chunkSize: CHUNK,
    modelId: MODEL,
    ...extra,
  });
  closers.push(() => r.close());
  const spec = (req_id: string): DisaggSpec => ({ req_id, receiver_host: '127.0.0.1', receiver_init_port: port, receiver_alloc_port: port + 1 });
  return { r, spec };
}

function sender(extra: Partial<ConstructorParameters<typeof XferSender>[0]> = {}) {
  const s = new XferSender({ layout, chunkSize: CHUNK, modelId: MODEL, bufferBytes: 1 << 20, ...extra });
  closers.push(() => s.close());
  return s;
}

/** Collects what the loggers write to stderr (warnings) until restore(). */
function captureStderr(): { lines: string[]; restore(): void } {
  const lines: string[] = [];
  const orig = process.stderr.write.bind(process.stderr);
  (process.stderr as any).write = (s: string | Uint8Array, ...rest: any[]) => {
    lines.push(String(s));
    return orig(s as any, ...rest);
  };
  return { lines, restore: () => void ((process.stderr as any).write = orig) };
}

/** `p`, or a failure naming `what` if it has not settled within `ms` (a generous bound, not a measurement). */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let t!: NodeJS.Timeout;
  return Promise.race([p, new Promise<T>((_, rej) => (t = setTimeout(() => rej(new Error(`${what}: still pending after ${ms} ms`)), ms)))]).finally(() => clearTimeout(t));
}

async function until(cond: () => boolean, what: string, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((res) => setTimeout(res, 10));
  }
}

function chunks(seed: number, tokens: number[], keyOf = (i: number) => syntheticKey(seed, i)): OutChunk[] {
  return tokens.map((n, i) => ({ key: keyOf(i), numTokens: n, data: syntheticChunk(layout, n, keyOf(i), seed * 1000 + i) }));
}

test('handshake: a sender with another layout, chunk size or model is refused with a clear message', async () => {
  const { r, spec } = await receiver();
  const bad = sender({ layout: { ...layout, numLayers: 4 }, chunkSize: 32 });
  const res = await bad.send(spec('bad-1'), chunks(1, [CHUNK]));
  assert.equal(res.ok, false);
  assert.match(res.error!, /refused the handshake: incompatible sender/);
  assert.match(res.error!, /chunk_size 32 \(receiver uses 16\)/);
  assert.match(res.error!, /layers=4/);
  const other = sender({ modelId: 'other-model' });
  const res2 = await other.send(spec('bad-2'), chunks(1, [CHUNK]));
  assert.match(res2.error!, /model "other-model" \(receiver serves "builtin-test"\)/);
  assert.equal(r.stats().reservedBytes, 0);
});

test('chunks arrive verified in order; keys the receiver holds are not sent twice', async () => {
  const { r, spec } = await receiver();
  const s = sender();
  const a = chunks(7, [CHUNK, CHUNK, 5]);
  const resA = await s.send(spec('req-a'), a);
  assert.equal(resA.ok, true, resA.error);
  assert.deepEqual([resA.sent, resA.skipped, resA.numTokens], [3, 0, 37]);
  // req-b shares the first two chunks (same prefix), then diverges
  const b = [...a.slice(0, 2), ...chunks(8, [9], () => syntheticKey(8, 99))];
  const resB = await s.send(spec('req-b'), b);
  assert.equal(resB.ok, true, resB.error);
  assert.deepEqual([resB.sent, resB.skipped], [1, 2]);
  assert.equal(r.lookup(a.map((c) => c.key)), 3);
  assert.equal(r.lookup(b.map((c) => c.key)), 3);
  const takenA = await r.take(a.map((c) => c.key), 'req-a');
  assert.equal(takenA.numTokens, 37);
  takenA.chunks.forEach((c, i) => {
    verifyChunk(c, a[i]!.key);
    assert.deepEqual(c, a[i]!.data);
  });
  takenA.release();
  // shared chunks survive until req-b is consumed too
  assert.equal(r.lookup(b.map((c) => c.key)), 3);
  const takenB = await r.take(b.map((c) => c.key)); // found by keys, no req_id
  assert.equal(takenB.keys.length, 3);
  takenB.release();
  assert.deepEqual([r.stats().reservedBytes, r.stats().reservations, r.stats().entries], [0, 0, 0]);
  assert.ok(r.stats().poolBytes > 0 && r.stats().poolBytes <= 8 * FULL, 'memory grows on demand, only what was used');
});

test('a full receiver buffer makes the sender wait up to its deadline, then give up; freed space lets a waiter in', async () => {
  const { r, spec } = await receiver({ bufferBytes: 1 << 20 });
  // size class rounding: a 4160-byte chunk is accounted as 8192
  const n = Math.floor((1 << 20) / 8192);
  const s = sender({ allocWaitMs: 300 });
  const big = await s.send(spec('fill'), chunks(3, Array(n).fill(CHUNK)));
  assert.equal(big.ok, true, big.error);
  assert.equal(r.stats().reservedBytes, n * 8192);
  const t0 = Date.now();
  const logged = captureStderr();
  let late;
  try {
    late = await s.send(spec('late'), chunks(4, [CHUNK]));
  } finally {
    logged.restore();
  }
  assert.equal(late.ok, false);
  assert.ok(Date.now() - t0 >= 280, 'waited for the deadline');
  assert.match(late.error!, /receiver buffer full: request late needs 8192 bytes/);
  // the reason is logged on both sides: the prefiller goes on without the transfer
  const text = logged.lines.join('');
  assert.match(text, /WARN +\[xfer-send\] transfer of late to 127\.0\.0\.1:\d+ failed, the decoder will recompute: .*receiver buffer full: request late needs 8192 bytes, \d+ of 1048576 reserved, waited 300 ms/);
  assert.match(text, /WARN +\[xfer-recv\] receiver buffer full: request late needs 8192 bytes/);
  // now a waiting sender gets in as soon as space is released
  const s2 = sender({ allocWaitMs: 5000 });
  const waiting = s2.send(spec('waiter'), chunks(5, [CHUNK]));
  await new Promise((res) => setTimeout(res, 100));
  assert.equal(r.release('fill'), true);
  const w = await waiting;
  assert.equal(w.ok, true, w.error);
  assert.equal(r.lookup([syntheticKey(5, 0)]), 1);
  r.release('waiter');
  assert.equal(r.stats().reservedBytes, 0);
});

test('reservations never consumed expire after the TTL', async () => {
  const { r, spec } = await receiver({ ttlMs: 300 });
  const s = sender();
  const res = await s.send(spec('forgotten'), chunks(9, [CHUNK, CHUNK]));
  assert.equal(res.ok, true, res.error);
  assert.ok(r.stats().reservedBytes > 0);
  const deadline = Date.now() + 3000;
  while (r.stats().reservedBytes > 0 && Date.now() < deadline) await new Promise((res2) => setTimeout(res2, 50));
  assert.equal(r.stats().reservedBytes, 0);
  assert.equal(r.stats().reservationsExpired, 1);
  assert.equal(r.lookup([syntheticKey(9, 0)]), 0);
});

// (Not expiry: a 400 ms TTL here freed requests a loaded machine had not taken yet; expiry is
// tested on a test clock in receive_buffer.test.ts. Requests that end unused are ended as the
// proxy ends them, which is what frees them in a deployment.)
test('exact accounting: after 1000 requests (taken, released, shared, refused, ended unused) no byte is reserved', async () => {
  const { r, spec } = await receiver({ bufferBytes: 2 << 20 });
  const senders = [sender(), sender(), sender()];
  const N = 1000;
  let ok = 0;
  const run = async (i: number) => {
    const s = senders[i % senders.length]!;
    // prompts share prefixes in groups of 10: dedup and refcounting get exercised
    const group = Math.floor(i / 10);
    const keys = (j: number) => (j < 2 ? syntheticKey(100000 + group, j) : syntheticKey(200000 + i, j));
    const cs = chunks(group, [CHUNK, CHUNK, 1 + (i % CHUNK)], keys);
    // every 50th request is sent twice under one req_id (refused the second time)
    const res = await s.send(spec(`r${i}`), cs);
    if (i % 50 === 0) assert.equal((await s.send(spec(`r${i}`), cs)).ok, false);
    if (res.ok) ok++;
    if (i % 7 === 3) {
      assert.equal(r.endRequest(`r${i}`), 'released'); // never consumed: its request ended
      return;
    }
    const t = await r.take(cs.map((c) => c.key), `r${i}`, 2000);
    if (i % 2 === 0) assert.equal(t.keys.length, 3);
    t.release();
    if (i % 11 === 0) t.release(); // double release is harmless
  };
  for (let i = 0; i < N; i += 20) await Promise.all(Array.from({ length: 20 }, (_, j) => run(i + j)));
  assert.equal(ok, N);
  const st = r.stats();
  assert.deepEqual([st.reservedBytes, st.reservations, st.entries], [0, 0, 0]);
  assert.deepEqual([st.reservationsReleased, st.reservationsExpired], [Math.ceil((N - 3) / 7), 0]);
  assert.ok(st.poolBytes <= (2 << 20) + 4 * 8192, 'memory stays within the buffer bound');
});

test('the notice {req_id, prefiller, num_chunks, num_tokens, ok} reaches the proxy PULL after the ack', async () => {
  const { spec } = await receiver();
  const proxyPort = await freePortRange(1);
  const pull = new Pull({ linger: 0, receiveTimeout: 5000 });
  await pull.bind(`tcp://127.0.0.1:${proxyPort}`);
  closers.push(() => pull.close());
  const s = sender({ proxyHost: '127.0.0.1', proxyPort, senderId: 'prefiller-0' });
  const res = await s.send(spec('note-1'), chunks(11, [CHUNK, 3]));
  assert.equal(res.ok, true);
  assert.equal(res.notified, true);
  const [msg] = await pull.receive();
  assert.deepEqual(decodeNotice(msg!), { req_id: 'note-1', prefiller: 'prefiller-0', num_chunks: 2, num_tokens: 19, ok: true });
  // a receiver that is down: the notice says so, and send() still answers promptly
  const dead = await s.send({ ...spec('note-2'), receiver_init_port: 1, receiver_alloc_port: 2 }, chunks(12, [CHUNK]));
  assert.equal(dead.ok, false);
  const n2 = decodeNotice((await pull.receive())[0]!);
  assert.equal(n2.req_id, 'note-2');
  assert.equal(n2.ok, false);
  assert.match(n2.error!, /cannot connect to receiver_init_port 127\.0\.0\.1:1/);
});

test('bad disagg_spec fields are named; a receiver cannot be asked for more than its buffer', async () => {
  const { spec } = await receiver({ bufferBytes: 1 << 20 });
  const s = sender();
  const r1 = await s.send({ ...spec('x'), receiver_init_port: 70000 }, chunks(1, [CHUNK]));
  assert.match(r1.error!, /disagg_spec\.receiver_init_port: expected a port/);
  const r2 = await s.send({ ...spec(''), req_id: '' }, chunks(1, [CHUNK]));
  assert.match(r2.error!, /disagg_spec\.req_id/);
  const huge = await s.send(spec('huge'), chunks(2, Array(200).fill(CHUNK)));
  assert.match(huge.error!, /more than the whole receiver buffer/);
  const wrongSize = await s.send(spec('ws'), [{ key: syntheticKey(1, 0), numTokens: 4, data: syntheticChunk(layout, 5, syntheticKey(1, 0), 1) }]);
  assert.match(wrongSize.error!, /but 4 tokens of this layout make/);
});

test('createXfer: cuda buffer device falls back to host memory with a warning; unknown backend stops start-up', async () => {
  const port = await freePortRange(2);
  const base = { enable_xfer: true, xfer_role: 'receiver', xfer_peer_host: '127.0.0.1', xfer_peer_init_port: port, xfer_peer_alloc_port: port + 1 };
  const cfg = validateCacheConfig({ ...base, xfer_buffer_device: 'cuda', xfer_buffer_size: 2147483648 }).config;
  const lines: string[] = [];
  const orig = process.stderr.write.bind(process.stderr);
  (process.stderr as any).write = (s: string) => (lines.push(String(s)), true);
  let x;
  try {
    x = await createXfer(cfg, { layout, chunkSize: CHUNK, modelId: MODEL });
  } finally {
    (process.stderr as any).write = orig;
  }
  assert.equal(x?.role, 'receiver');
  if (x?.role === 'receiver') {
    closers.push(() => x.receiver.close());
    // 2 GiB configured, nothing preallocated
    assert.equal(x.receiver.stats().capacityBytes, 2147483648);
    assert.equal(x.receiver.stats().poolBytes, 0);
  }
  assert.equal(lines.filter((l) => /xfer_buffer_device "cuda".*host memory/.test(l)).length, 1);
  const senderCfg = validateCacheConfig({ enable_xfer: true, xfer_role: 'sender', xfer_proxy_host: '127.0.0.1', xfer_proxy_port: 7500, xfer_backends: ['rdma'] }).config;
  await assert.rejects(createXfer(senderCfg, { layout, chunkSize: CHUNK, modelId: MODEL }), /xfer_backends": unknown backend "rdma"; supported: tcp/);
  assert.equal(await createXfer(validateCacheConfig({}).config, { layout, chunkSize: CHUNK, modelId: MODEL }), null);
});

test('garbage on either port closes that connection only; the receiver keeps serving', async () => {
  const { r, spec } = await receiver();
  const { receiver_init_port: initPort, receiver_alloc_port: allocPort } = spec('x');
  const junk = async (port: number, bytes: Buffer) => {
    const s = net.connect(port, '127.0.0.1');
    await new Promise<void>((res, rej) => s.once('connect', res).once('error', rej));
    s.write(bytes);
    await new Promise<void>((res) => {
      const t = setTimeout(() => (s.destroy(), res()), 3000);
      s.once('close', () => (clearTimeout(t), res()));
    });
    return s.destroyed;
  };
  assert.equal(await junk(initPort, Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n')), true);
  assert.equal(await junk(allocPort, Buffer.from([0x46, 0x58, 1, 3, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0])), true); // meta length 2 GiB
  const hdr = Buffer.alloc(12);
  hdr.writeUInt16LE(0x5846, 0);
  hdr.writeUInt8(1, 2);
  hdr.writeUInt8(5, 3); // DATA before HELLO
  assert.equal(await junk(initPort, hdr), true);
  const res = await sender().send(spec('after-junk'), chunks(21, [CHUNK]));
  assert.equal(res.ok, true, res.error);
  assert.equal(r.lookup([syntheticKey(21, 0)]), 1);
});

test('a sender that fails between chunks cancels: its never-sent chunks wake every waiting consumer at once', async () => {
  const { r, spec } = await receiver();
  const s = sender();
  const keys = [0, 1, 2].map((j) => syntheticKey(31, j));
  let breakExport!: () => void;
  const broken = new Promise<void>((res) => (breakExport = res));
  const a: OutChunk[] = [
    { key: keys[0]!, numTokens: CHUNK, data: syntheticChunk(layout, CHUNK, keys[0]!, 1) },
    { key: keys[1]!, numTokens: CHUNK, data: async () => (await broken, Promise.reject(new Error('export of chunk 1 failed'))) },
    { key: keys[2]!, numTokens: CHUNK, data: syntheticChunk(layout, CHUNK, keys[2]!, 3) },
  ];
  const sending = s.send(spec('fail-a'), a);
  await until(() => r.lookup(keys) === 1, 'the first chunk');
  // another request on another link shares the first two chunks: both reported as held
  const b = await sender().send(spec('share-b'), chunks(31, [CHUNK, CHUNK]));
  assert.equal(b.ok, true, b.error);
  assert.deepEqual([b.sent, b.skipped], [0, 2]);
  // both consumers wait (as the engine plugin does) for chunk 1, still pending
  const takeA = r.take(keys, 'fail-a', 60_000);
  const takeB = r.take(keys.slice(0, 2), 'share-b', 60_000);
  breakExport();
  const res = await sending;
  assert.equal(res.ok, false);
  assert.match(res.error!, /export of chunk 1 failed/);
  // without the CANCEL they would wait the full 60 s for bytes nobody sends
  const [tA, tB] = await within(Promise.all([takeA, takeB]), 10_000, 'take of a failed transfer');
  assert.deepEqual(tA.keys, [keys[0]]);
  assert.deepEqual(tB.keys, [keys[0]]);
  tA.release();
  tB.release();
  const st = r.stats();
  assert.deepEqual([st.reservedBytes, st.reservations, st.entries], [0, 0, 0]);
});

test('DATA is accepted only from the session that made the reservation', async () => {
  const { r, spec } = await receiver();
  const key = syntheticKey(41, 0);
  const good = syntheticChunk(layout, CHUNK, key, 1);
  let go!: () => void;
  const gate = new Promise<void>((res) => (go = res));
  const sending = sender().send(spec('mine'), [{ key, numTokens: CHUNK, data: async () => (await gate, good) }]);
  await until(() => r.stats().reservations === 1, 'the reservation');
  // another sender, handshaken and so holding a valid session of its own, writes into it
  const { receiver_init_port: initPort } = spec('x');
  const sock = net.connect(initPort, '127.0.0.1');
  closers.push(() => sock.destroy());
  const frames: { type: FrameType; meta: any }[] = [];
  const parser = new FrameParser(0, () => null, (type, meta) => frames.push({ type, meta }));
  sock.on('data', (d) => parser.push(d));
  await new Promise<void>((res, rej) => sock.once('connect', res).once('error', rej));
  writeFrame(sock, FrameType.Hello, { version: PROTOCOL_VERSION, sender_id: 'intruder', model_id: MODEL, chunk_size: CHUNK, dtype: layout.dtype, num_layers: layout.numLayers, num_kv_heads: layout.numKvHeads, head_dim: layout.headDim });
  await until(() => frames.length === 1, 'HELLO_REPLY');
  assert.equal(frames[0]!.meta.ok, true);
  const forged = syntheticChunk(layout, CHUNK, key, 999); // well-formed, valid checksum, other bytes
  writeFrame(sock, FrameType.Data, { req_id: 'mine', key }, forged);
  await until(() => frames.length === 2, 'the ACK');
  assert.equal(frames[1]!.type, FrameType.Ack);
  assert.equal(frames[1]!.meta.ok, false);
  assert.match(frames[1]!.meta.error, /no reservation expects chunk/);
  assert.equal(r.lookup([key]), 0, 'the forged chunk was not stored');
  // the rightful sender's bytes are the ones served
  go();
  const res = await sending;
  assert.equal(res.ok, true, res.error);
  const t = await r.take([key], 'mine');
  assert.deepEqual(t.chunks[0], good);
  t.release();
});

test('an ALLOC whose answer comes too late is withdrawn: its reservation does not wait for the TTL', async () => {
  const { r, spec } = await receiver(); // TTL 120 s
  const { receiver_alloc_port: allocPort } = spec('x');
  // a relay in front of the alloc port that loses every answer (a stalled path back)
  const relayPort = await freePortRange(1);
  const socks = new Set<net.Socket>();
  const srv = net.createServer((client) => {
    const up = net.connect(allocPort, '127.0.0.1');
    socks.add(client).add(up);
    client.pipe(up);
    up.on('data', () => undefined);
    const close = () => (client.destroy(), up.destroy());
    client.on('close', close).on('error', close);
    up.on('close', close).on('error', close);
  });
  await new Promise<void>((res) => srv.listen(relayPort, '127.0.0.1', () => res()));
  closers.push(() => (socks.forEach((x) => x.destroy()), new Promise((res) => srv.close(res))));
  const s = sender({ allocWaitMs: 50, allocReplyGraceMs: 200 });
  const res = await s.send({ ...spec('lost-reply'), receiver_alloc_port: relayPort }, chunks(51, [CHUNK, CHUNK]));
  assert.equal(res.ok, false);
  assert.match(res.error!, /reservation for lost-reply .*no answer within 250 ms/);
  // granted on arrival (space was free), then withdrawn by the sender's CANCEL
  await until(() => r.stats().reservations === 0 && r.stats().reservedBytes === 0, 'the withdrawal', 10_000);
  assert.equal(r.stats().entries, 0);
  assert.equal(r.stats().reservationsExpired, 0);
});

test('after a burst the idle receiver gives its pool memory back', async () => {
  const { r, spec } = await receiver({ ttlMs: 400 }); // sweeps every 100 ms
  const s = sender();
  const burst = await Promise.all(Array.from({ length: 8 }, (_, i) => s.send(spec(`burst-${i}`), chunks(60 + i, [CHUNK, CHUNK, CHUNK, CHUNK]))));
  for (const b of burst) assert.equal(b.ok, true, b.error);
  const peak = r.stats().poolBytes; // all 32 chunks live: nothing trimmable yet
  assert.ok(peak >= 32 * 8192, `the burst's chunks are held in pooled buffers (${peak})`);
  for (let i = 0; i < 8; i++) (await r.take([0, 1, 2, 3].map((j) => syntheticKey(60 + i, j)), `burst-${i}`)).release();
  assert.equal(r.stats().reservedBytes, 0);
  // released buffers are kept for reuse while busy, given back once idle (without the trim they stay at the peak)
  await until(() => r.stats().poolBytes === 0, 'the pool to be trimmed');
  // and it grows again on demand
  const again = await s.send(spec('after-trim'), chunks(70, [CHUNK]));
  assert.equal(again.ok, true, again.error);
  assert.equal(r.lookup([syntheticKey(70, 0)]), 1);
});

test('a malformed ALLOC or CANCEL is refused naming the field and reserves nothing; the connection keeps serving', async () => {
  const { r, spec } = await receiver();
  const { receiver_init_port: initPort, receiver_alloc_port: allocPort } = spec('x');
  const open = async (port: number) => {
    const sock = net.connect(port, '127.0.0.1');
    closers.push(() => sock.destroy());
    const frames: { type: FrameType; meta: any }[] = [];
    const parser = new FrameParser(0, () => null, (type, meta) => frames.push({ type, meta }));
    sock.on('data', (d) => parser.push(d));
    await new Promise<void>((res, rej) => sock.once('connect', res).once('error', rej));
    return { sock, frames };
  };
  const init = await open(initPort);
  writeFrame(init.sock, FrameType.Hello, { version: PROTOCOL_VERSION, sender_id: 't', model_id: MODEL, chunk_size: CHUNK, dtype: layout.dtype, num_layers: layout.numLayers, num_kv_heads: layout.numKvHeads, head_dim: layout.headDim });
  await until(() => init.frames.length === 1, 'HELLO_REPLY');
  const session: string = init.frames[0]!.meta.session;
  const alloc = await open(allocPort);
  const key = syntheticKey(77, 0);
  const good = { session, req_id: 'a1', chunks: [[key, FULL]], wait_ms: 100 };
  const cases: [object, RegExp][] = [
    [{ ...good, id: 'one' }, /malformed ALLOC: id: expected a number/],
    [{ ...good, req_id: '' }, /malformed ALLOC: req_id: expected a non-empty string/],
    [{ ...good, chunks: [] }, /malformed ALLOC: chunks: expected a non-empty array of \[key, bytes\]/],
    [{ ...good, chunks: [['XYZ', FULL]] }, /malformed ALLOC: chunks\.0\.0: expected a 16-digit lowercase hex chunk key/],
    [{ ...good, chunks: [[key, 1.5]] }, /malformed ALLOC: chunks\.0\.1: expected an integer number of bytes/],
    [{ ...good, wait_ms: -1 }, /malformed ALLOC: wait_ms: expected a number >= 0/],
    [{ ...good, session: 'nope' }, /alloc: unknown "session"/],
    [{ ...good, chunks: [[key, FULL * 2]] }, new RegExp(`alloc: chunk ${key} size ${FULL * 2} is outside`)],
  ];
  for (const [i, [meta]] of cases.entries()) writeFrame(alloc.sock, FrameType.Alloc, { id: i, ...meta });
  // a CANCEL with the wrong shape is ignored on both ports (no reply, nothing torn down)
  writeFrame(alloc.sock, FrameType.Cancel, { session: 42, req_id: ['a1'] });
  writeFrame(init.sock, FrameType.Cancel, { req_id: 7 });
  await until(() => alloc.frames.length === cases.length, 'the ALLOC_REPLYs');
  for (const [i, [, re]] of cases.entries()) {
    const reply = alloc.frames.find((f) => f.meta.id === i) ?? alloc.frames[i]!;
    assert.equal(reply.type, FrameType.AllocReply);
    assert.equal(reply.meta.ok, false, `case ${i}`);
    assert.match(reply.meta.error, re, `case ${i}`);
  }
  assert.equal(r.stats().reservations, 0);
  // the same connection then reserves with a well-formed ALLOC
  writeFrame(alloc.sock, FrameType.Alloc, { id: 99, ...good });
  await until(() => alloc.frames.length === cases.length + 1, 'the good ALLOC_REPLY');
  assert.deepEqual(alloc.frames.at(-1)!.meta, { id: 99, ok: true, have: [] });
  assert.equal(r.stats().reservations, 1);
});

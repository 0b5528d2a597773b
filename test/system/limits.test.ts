// The limits of docs/limits.md, each checked where it applies: JSON depth, protocol errors and
// per-client connections of the shared HTTP server; the xfer receiver's per-sender reservation
// limit and its handling of alloc connections that never name a session; the controller's ZeroMQ
// message-size limit (an oversized message must not grow its memory).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { Dealer } from 'zeromq';
import { DType, chunkBytes, type KvLayout } from '../../src/common/chunk.js';
import { createHttpServer } from '../../src/common/http.js';
import { jsonDeeperThan } from '../../src/common/limits.js';
import { freePortRange } from '../../harness/ports.js';
import { XferReceiver } from '../../src/xfer/index.js';
import { FrameParser, FrameType, PROTOCOL_VERSION, writeFrame } from '../../src/protocol/xfer_frames.js';
import { startKvc, waitHttp } from '../../harness/proc.js';
import { rssBytes } from '../../harness/deployment.js';

const closers: (() => unknown)[] = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

/** Raw HTTP over one socket: what the server wrote until it closed (or `ms` passed). */
function rawHttp(port: number, text: string, ms = 5_000): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    let got = '';
    const t = setTimeout(() => {
      s.destroy();
      resolve(got);
    }, ms);
    s.on('data', (d) => (got += d.toString()));
    s.on('error', () => undefined);
    s.on('close', () => {
      clearTimeout(t);
      resolve(got);
    });
    s.on('connect', () => s.write(text));
  });
}
const bodyOf = (raw: string) => JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4));

test('jsonDeeperThan: depth counted outside strings, escapes included', () => {
  assert.equal(jsonDeeperThan('[[[1]]]', 3), false);
  assert.equal(jsonDeeperThan('[[[[1]]]]', 3), true);
  assert.equal(jsonDeeperThan('{"a":"[[[[[[\\"[[[[","b":[1]}', 2), false);
  assert.equal(jsonDeeperThan('{"a":"\\\\","b":[[[1]]]}', 3), true, 'an escaped backslash ends before the quote');
});

test('HTTP server: depth limit, bad URL, oversized headers, garbage and connections per client, all in the OpenAI shape', async () => {
  const app = createHttpServer({ name: 'limits-test', maxJsonDepth: 8, maxConnectionsPerClient: 3 });
  app.post('/echo', async (req) => ({ ok: true, body: req.body }));
  await app.listen({ host: '127.0.0.1', port: 0 });
  closers.push(() => app.close());
  const port = (app.server.address() as net.AddressInfo).port;
  const post = (body: string) => fetch(`http://127.0.0.1:${port}/echo`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });

  const deep = await post(`{"x":${'['.repeat(5000)}${']'.repeat(5000)}}`);
  assert.equal(deep.status, 400);
  assert.equal(((await deep.json()) as any).error.code, 'json_too_deep');
  assert.equal((await post('{"x":[[[1]]]}')).status, 200, 'ordinary nesting passes');

  const badUrl = await rawHttp(port, 'GET /%ff%fe HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n');
  assert.match(badUrl, /^HTTP\/1\.1 400/);
  assert.equal(bodyOf(badUrl).error.code, 'invalid_url');

  const bigHeaders = await rawHttp(port, `GET /${'a'.repeat(100_000)} HTTP/1.1\r\nhost: x\r\n\r\n`);
  assert.match(bigHeaders, /^HTTP\/1\.1 431/);
  assert.equal(bodyOf(bigHeaders).error.code, 'headers_too_large');

  const garbage = await rawHttp(port, 'NOT HTTP AT ALL\r\n\r\n');
  assert.match(garbage, /^HTTP\/1\.1 400/);
  assert.equal(typeof bodyOf(garbage).error.message, 'string');

  // Connections per client: the 4th open connection from one address is refused with 429.
  const held: net.Socket[] = [];
  for (let i = 0; i < 3; i++) {
    const s = net.connect({ host: '127.0.0.1', port });
    await new Promise((r) => s.once('connect', r));
    held.push(s);
  }
  await new Promise((r) => setTimeout(r, 100));
  const fourth = await rawHttp(port, 'GET /x HTTP/1.1\r\nhost: x\r\n\r\n');
  assert.match(fourth, /^HTTP\/1\.1 429/);
  assert.equal(bodyOf(fourth).error.code, 'too_many_connections');
  for (const s of held) s.destroy();
  await new Promise((r) => setTimeout(r, 100));
  assert.equal((await post('{}')).status, 200, 'served again once they are closed');
});

const layout: KvLayout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 8 };
const CHUNK = 16;
const MODEL = 'limits-test';
const FULL = chunkBytes(layout, CHUNK);

/** A raw xfer client: HELLO on the init port, ALLOCs on the alloc port, replies collected. */
async function xferClient(initPort: number, allocPort: number) {
  const replies = new Map<number, (m: any) => void>();
  const init = net.connect({ host: '127.0.0.1', port: initPort });
  const alloc = net.connect({ host: '127.0.0.1', port: allocPort });
  await Promise.all([new Promise((r) => init.once('connect', r)), new Promise((r) => alloc.once('connect', r))]);
  closers.push(() => init.destroy(), () => alloc.destroy());
  const session = await new Promise<string>((resolve, reject) => {
    const p = new FrameParser(0, () => null, (type, meta: any) => (type === FrameType.HelloReply && meta.ok ? resolve(meta.session) : reject(new Error(JSON.stringify(meta)))));
    init.on('data', (d) => p.push(d));
    writeFrame(init, FrameType.Hello, { version: PROTOCOL_VERSION, sender_id: 'limits', model_id: MODEL, chunk_size: CHUNK, dtype: layout.dtype, num_layers: layout.numLayers, num_kv_heads: layout.numKvHeads, head_dim: layout.headDim });
  });
  const ap = new FrameParser(0, () => null, (_type, meta: any) => replies.get(meta.id)?.(meta));
  alloc.on('data', (d) => ap.push(d));
  let id = 0;
  return {
    session,
    allocate(reqId: string, n: number, waitMs = 0, offset = 0): Promise<{ ok: boolean; error?: string }> {
      const myId = ++id;
      const chunks = Array.from({ length: n }, (_, i) => [`${reqId.padEnd(8, '0').slice(0, 8)}${(offset + i).toString(16).padStart(8, '0')}`, FULL]);
      return new Promise((resolve) => {
        replies.set(myId, resolve);
        writeFrame(alloc, FrameType.Alloc, { id: myId, session, req_id: reqId, chunks, wait_ms: waitMs });
      });
    },
  };
}

test('xfer receiver: one sender cannot reserve more than its share; the others are still served', async () => {
  const port = await freePortRange(2);
  const r = await XferReceiver.start({ host: '127.0.0.1', initPort: port, allocPort: port + 1, bufferBytes: 64 * 8192, layout, chunkSize: CHUNK, modelId: MODEL, maxAllocWaitMs: 2_000 });
  closers.push(() => r.close());
  const greedy = await xferClient(port, port + 1);
  const other = await xferClient(port, port + 1);
  const whole = await greedy.allocate('aaaa0001', 40);
  assert.equal(whole.ok, false, 'more than half the buffer in one request is refused at once');
  assert.match(whole.error!, /more than one sender may hold reserved/);
  assert.equal((await greedy.allocate('aaaa0002', 24)).ok, true, 'within its share');
  const over = greedy.allocate('aaaa0003', 24, 300, 100);
  assert.equal((await other.allocate('bbbb0001', 24)).ok, true, 'another sender is served while the first waits at its limit');
  const late = await over;
  assert.equal(late.ok, false, 'the sender over its share waited and was refused');
});

test('xfer receiver: an alloc connection that never names a live session is closed', async () => {
  const port = await freePortRange(2);
  const r = await XferReceiver.start({ host: '127.0.0.1', initPort: port, allocPort: port + 1, bufferBytes: 1 << 20, layout, chunkSize: CHUNK, modelId: MODEL, helloTimeoutMs: 300 });
  closers.push(() => r.close());
  const s = net.connect({ host: '127.0.0.1', port: port + 1 });
  s.on('error', () => undefined);
  const closed = await new Promise<boolean>((resolve) => {
    const t = setTimeout(() => resolve(false), 10_000);
    s.once('close', () => {
      clearTimeout(t);
      resolve(true);
    });
  });
  assert.ok(closed, 'closed by the receiver');
});

test('controller monitor port: a message over the size limit is dropped without growing the controller', async () => {
  const port = await freePortRange(2);
  const ctl = startKvc(['controller', '--host', '127.0.0.1', '--port', String(port), '--monitor-port', String(port + 1)]);
  closers.push(() => ctl.kill());
  await waitHttp(`http://127.0.0.1:${port}/healthz`);
  const before = rssBytes(ctl.child.pid!);
  const d = new Dealer({ linger: 0 });
  d.connect(`tcp://127.0.0.1:${port + 1}`);
  closers.push(() => d.close());
  // The controller's socket refuses a message over its size limit by disconnecting the sender
  // (ZMQ_MAXMSGSIZE): waited for, instead of a fixed 3 s, then the controller's memory is read.
  const disconnected = new Promise<boolean>((resolve) => {
    const t = setTimeout(() => resolve(false), 60_000);
    d.events.on('disconnect', () => {
      clearTimeout(t);
      resolve(true);
    });
  });
  const big = Buffer.alloc(256 * 1024 * 1024, 7);
  await d.send([big]);
  assert.ok(await disconnected, 'the controller disconnected the sender of the oversized message');
  const grown = rssBytes(ctl.child.pid!) - before;
  assert.ok(grown < 100 * 1024 * 1024, `controller RSS grew by ${Math.round(grown / 1048576)} MiB for one 256 MiB message`);
  assert.equal((await fetch(`http://127.0.0.1:${port}/healthz`)).status, 200, 'still serving');
});

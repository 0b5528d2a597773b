// xfer across real processes: many senders → one receiver, one sender → many receivers, and
// integrity (a byte flipped in flight, a connection cut in flight) through a TCP relay that
// sits between a sender process and a receiver process.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { DType, type KvLayout } from '../src/common/chunk.js';
import { freePortRange } from '../src/common/ports.js';
import { syntheticKey } from '../src/xfer/peer.js';

const PEER = join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'xfer', 'peer.js');
const layout: KvLayout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 8 };
const CHUNK = 16;
const MODEL = 'builtin-test';

interface Peer {
  child: ChildProcess;
  call(op: string, args?: Record<string, unknown>, timeoutMs?: number): Promise<any>;
  kill(): Promise<void>;
}
const peers: Peer[] = [];
const cleanups: (() => unknown)[] = [];
after(async () => {
  for (const c of cleanups) await c();
  await Promise.all(peers.map((p) => p.kill()));
});

async function startPeer(cfg: Record<string, unknown>): Promise<Peer> {
  const child = fork(PEER, [JSON.stringify(cfg)], { stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  let next = 1;
  const waiting = new Map<number, (m: any) => void>();
  const ready = new Promise<any>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`peer did not start in 10 s:\n${out}`)), 10_000);
    child.on('message', (m: any) => {
      if ('ready' in m) {
        clearTimeout(t);
        m.ready ? resolve(m) : reject(new Error(m.error));
      } else waiting.get(m.id)?.(m);
    });
  });
  const peer: Peer = {
    child,
    call(op, args = {}, timeoutMs = 20_000) {
      const id = next++;
      return new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`peer op ${op} timed out; output:\n${out.slice(-3000)}`)), timeoutMs);
        waiting.set(id, (m) => {
          clearTimeout(t);
          waiting.delete(id);
          m.ok ? resolve(m.result) : reject(new Error(m.error));
        });
        child.send({ id, op, ...args });
      });
    },
    async kill() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await gone;
    },
  };
  peers.push(peer);
  await ready;
  return peer;
}

async function startReceiver(extra: Record<string, unknown> = {}) {
  const port = await freePortRange(2);
  const p = await startPeer({ role: 'receiver', host: '127.0.0.1', initPort: port, allocPort: port + 1, bufferBytes: 8 << 20, layout, chunkSize: CHUNK, modelId: MODEL, ...extra });
  const spec = (req_id: string, initPort = port) => ({ req_id, receiver_host: '127.0.0.1', receiver_init_port: initPort, receiver_alloc_port: port + 1 });
  return { p, port, spec };
}

const startSender = (id: string) => startPeer({ role: 'sender', layout, chunkSize: CHUNK, modelId: MODEL, bufferBytes: 1 << 20, senderId: id });

test('several sender processes to one receiver process at once', async () => {
  const { p: recv, spec } = await startReceiver();
  const senders = await Promise.all([0, 1, 2].map((i) => startSender(`prefiller-${i}`)));
  const jobs: Promise<any>[] = [];
  for (let r = 0; r < 8; r++) {
    senders.forEach((s, i) => {
      const seed = 100 * i + r;
      jobs.push(s.call('send', { spec: spec(`s${i}-r${r}`), seed, tokens: [CHUNK, CHUNK, CHUNK, 7] }).then((res) => ({ res, seed })));
    });
  }
  const done = await Promise.all(jobs);
  for (const { res } of done) assert.equal(res.ok, true, res.error);
  for (const { res, seed } of done) {
    const keys = [0, 1, 2, 3].map((j) => syntheticKey(seed, j));
    const t = await recv.call('take', { keys, reqId: res.reqId });
    assert.deepEqual(t, { keys, numTokens: 55 });
  }
  const st = await recv.call('stats');
  assert.equal(st.chunksReceived, 3 * 8 * 4);
  assert.equal(st.sessions, 3);
  assert.deepEqual([st.reservedBytes, st.reservations, st.entries], [0, 0, 0]);
});

test('one sender process to several receiver processes', async () => {
  const recvs = await Promise.all([0, 1, 2].map(() => startReceiver()));
  const s = await startSender('prefiller-x');
  const results = await Promise.all(
    recvs.flatMap(({ spec }, i) => [0, 1, 2, 3].map((r) => s.call('send', { spec: spec(`d${i}-r${r}`), seed: 10 * i + r, tokens: [CHUNK, 3] }))),
  );
  for (const res of results) assert.equal(res.ok, true, res.error);
  for (let i = 0; i < recvs.length; i++) {
    const recv = recvs[i]!.p;
    for (let r = 0; r < 4; r++) {
      const keys = [0, 1].map((j) => syntheticKey(10 * i + r, j));
      assert.equal(await recv.call('lookup', { keys }), 2);
      // a chunk sent to receiver i is on receiver i only
      const other = recvs[(i + 1) % recvs.length]!.p;
      assert.equal(await other.call('lookup', { keys }), 0);
      assert.deepEqual(await recv.call('take', { keys, reqId: `d${i}-r${r}` }), { keys, numTokens: 19 });
    }
    assert.equal((await recv.call('stats')).reservedBytes, 0);
  }
});

/**
 * A TCP relay in front of a receiver's init port. `onByte(offset)` sees the sender → receiver
 * stream's absolute offsets: it can flip a byte or cut both connections.
 */
async function relay(targetPort: number, mode: { corruptAt?: number; cutAt?: number }) {
  const port = await freePortRange(1);
  const conns = new Set<net.Socket>();
  const srv = net.createServer((client) => {
    const upstream = net.connect(targetPort, '127.0.0.1');
    conns.add(client).add(upstream);
    let seen = 0;
    client.on('data', (d) => {
      const start = seen;
      seen += d.length;
      if (mode.cutAt !== undefined && seen > mode.cutAt) {
        upstream.write(d.subarray(0, mode.cutAt - start > 0 ? mode.cutAt - start : 0), () => {
          upstream.destroy();
          client.destroy();
        });
        mode.cutAt = undefined;
        return;
      }
      if (mode.corruptAt !== undefined && mode.corruptAt >= start && mode.corruptAt < seen) {
        d = Buffer.from(d);
        d[mode.corruptAt - start] ^= 0xff;
        mode.corruptAt = undefined;
      }
      upstream.write(d);
    });
    upstream.on('data', (d) => client.write(d));
    const close = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('close', close).on('error', close);
    upstream.on('close', close).on('error', close);
  });
  await new Promise<void>((r) => srv.listen(port, '127.0.0.1', () => r()));
  cleanups.push(() => {
    for (const c of conns) c.destroy();
    return new Promise((r) => srv.close(() => r(undefined)));
  });
  return port;
}

// HELLO frame ≈ 12 + ~110 bytes meta; the first DATA frame's body (4160 bytes) starts after ~60 more.
const INSIDE_FIRST_CHUNK = 1500;

test('a chunk corrupted in flight is rejected by its checksum and never used', async () => {
  const { p: recv, port, spec } = await startReceiver();
  const via = await relay(port, { corruptAt: INSIDE_FIRST_CHUNK });
  const s = await startSender('prefiller-c');
  const res = await s.call('send', { spec: spec('corrupt-1', via), seed: 5, tokens: [CHUNK, CHUNK] });
  assert.equal(res.ok, false);
  assert.match(res.error, /receiver rejected chunk .*checksum mismatch/);
  const keys = [0, 1].map((j) => syntheticKey(5, j));
  assert.equal(await recv.call('lookup', { keys }), 0, 'the corrupted first chunk is not there, so nothing is usable');
  assert.equal((await recv.call('stats')).chunksRejected, 1);
  // the link still works: sent again, only the rejected chunk travels (chunk 1 is held, verified)
  const again = await s.call('send', { spec: spec('corrupt-2', via), seed: 5, tokens: [CHUNK, CHUNK] });
  assert.equal(again.ok, true, again.error);
  assert.deepEqual([again.sent, again.skipped], [1, 1]);
  assert.deepEqual((await recv.call('take', { keys, reqId: 'corrupt-2' })).keys, keys);
  // the failed request's reservation, once released, leaves nothing behind
  assert.equal(await recv.call('release', { reqId: 'corrupt-1' }), true);
  const st = await recv.call('stats');
  assert.deepEqual([st.reservedBytes, st.reservations, st.entries], [0, 0, 0]);
});

test('a transfer cut in flight is never used and leaves nothing reserved after release', async () => {
  const { p: recv, port, spec } = await startReceiver();
  const via = await relay(port, { cutAt: INSIDE_FIRST_CHUNK + 4160 });
  const s = await startSender('prefiller-k');
  const res = await s.call('send', { spec: spec('cut-1', via), seed: 6, tokens: [CHUNK, CHUNK, CHUNK] });
  assert.equal(res.ok, false);
  assert.match(res.error, /connection to receiver .* lost/);
  const keys = [0, 1, 2].map((j) => syntheticKey(6, j));
  // the first chunk may have made it whole (and verified); the cut one and after never count
  const have = await recv.call('lookup', { keys });
  assert.ok(have <= 1, `at most the chunk before the cut is usable, found ${have}`);
  const t = await recv.call('take', { keys, reqId: 'cut-1' });
  assert.equal(t.keys.length, have);
  const st = await recv.call('stats');
  assert.deepEqual([st.reservedBytes, st.reservations], [0, 0]);
  // the sender reconnects on demand for the next request
  const next = await s.call('send', { spec: spec('cut-2'), seed: 6, tokens: [CHUNK, CHUNK, CHUNK] });
  assert.equal(next.ok, true, next.error);
  assert.deepEqual((await recv.call('take', { keys, reqId: 'cut-2' })).keys, keys);
});

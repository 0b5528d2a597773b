// xfer across real processes: many senders → one receiver, one sender → many receivers, and
// integrity (a byte flipped in flight, a connection cut in flight) through a TCP relay that
// sits between a sender process and a receiver process.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { DType, type KvLayout } from '../../src/common/chunk.js';
import { freePortRange } from '../../harness/ports.js';
import { syntheticKey } from '../../src/xfer/peer.js';

const PEER = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'src', 'xfer', 'peer.js');
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
  child.once('exit', (code, sig) => {
    for (const w of [...waiting.values()]) w({ ok: false, error: `peer exited (${code ?? sig})` });
  });
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
 * A TCP relay in front of a receiver's init port, watching the sender → receiver stream:
 *   corruptAt  flips the byte at that absolute offset;
 *   holdAt     forwards bytes up to that offset, then holds back the rest;
 *   holdAfterData  forwards up to the end of that many whole DATA frames, then holds back the rest.
 * Held bytes are never delivered; cut() closes both sides (a connection cut in flight).
 */
async function relay(targetPort: number, mode: { corruptAt?: number; holdAt?: number; holdAfterData?: number }) {
  const port = await freePortRange(1);
  const conns = new Set<net.Socket>();
  const srv = net.createServer((client) => {
    const upstream = net.connect(targetPort, '127.0.0.1');
    conns.add(client).add(upstream);
    let seen = Buffer.alloc(0); // everything the sender wrote (small in these tests)
    let forwarded = 0;
    let limit = mode.holdAt ?? Infinity;
    let scan = 0; // next frame header to look at
    let dataFrames = 0;
    client.on('data', (d) => {
      const start = seen.length;
      if (mode.corruptAt !== undefined && mode.corruptAt >= start && mode.corruptAt < start + d.length) {
        d = Buffer.from(d);
        d[mode.corruptAt - start] ^= 0xff;
        mode.corruptAt = undefined;
      }
      seen = Buffer.concat([seen, d]);
      if (mode.holdAfterData !== undefined) {
        while (limit === Infinity && seen.length >= scan + 12) {
          const end = scan + 12 + seen.readUInt32LE(scan + 4) + seen.readUInt32LE(scan + 8);
          if (seen[scan + 3] === 5 && ++dataFrames === mode.holdAfterData) limit = end;
          scan = end;
        }
      }
      const upTo = Math.min(seen.length, limit);
      if (upTo > forwarded) upstream.write(seen.subarray(forwarded, upTo));
      forwarded = Math.max(forwarded, upTo);
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
  const cut = () => {
    for (const c of conns) c.destroy();
  };
  cleanups.push(() => {
    cut();
    return new Promise((r) => srv.close(() => r(undefined)));
  });
  return { port, cut };
}

/** Polls `cond` (async) until true; a generous bound turns a hang into a failure. */
async function until(cond: () => Promise<boolean>, what: string, ms = 15_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** `p`, or a failure naming `what` if it has not settled within `ms` (a generous bound, not a measurement). */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let t!: NodeJS.Timeout;
  return Promise.race([p, new Promise<T>((_, rej) => (t = setTimeout(() => rej(new Error(`${what}: still pending after ${ms} ms`)), ms)))]).finally(() => clearTimeout(t));
}

// HELLO frame ≈ 12 + ~110 bytes meta; the first DATA frame's body (4160 bytes) starts after ~60 more.
const INSIDE_FIRST_CHUNK = 1500;

test('a chunk corrupted in flight is rejected by its checksum and never used', async () => {
  const { p: recv, port, spec } = await startReceiver();
  const { port: via } = await relay(port, { corruptAt: INSIDE_FIRST_CHUNK });
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
  // the second chunk's body is cut ~1.5 KB in; the first chunk arrives whole before the cut
  const via = await relay(port, { holdAt: INSIDE_FIRST_CHUNK + 4160 });
  const s = await startSender('prefiller-k');
  const sending = s.call('send', { spec: spec('cut-1', via.port), seed: 6, tokens: [CHUNK, CHUNK, CHUNK] });
  const keys = [0, 1, 2].map((j) => syntheticKey(6, j));
  await until(async () => (await recv.call('lookup', { keys })) === 1, 'the first chunk');
  via.cut();
  const res = await sending;
  assert.equal(res.ok, false);
  assert.match(res.error, /connection to receiver .* lost/);
  // exactly the chunk before the cut is usable; the cut one and the one after never count
  assert.equal(await recv.call('lookup', { keys }), 1);
  const t = await recv.call('take', { keys, reqId: 'cut-1' });
  assert.deepEqual(t, { keys: [keys[0]], numTokens: CHUNK });
  const st = await recv.call('stats');
  assert.deepEqual([st.reservedBytes, st.reservations], [0, 0]);
  // the sender reconnects on demand for the next request
  const next = await s.call('send', { spec: spec('cut-2'), seed: 6, tokens: [CHUNK, CHUNK, CHUNK] });
  assert.equal(next.ok, true, next.error);
  assert.deepEqual((await recv.call('take', { keys, reqId: 'cut-2' })).keys, keys);
});

test('a sender process killed between two whole chunks: consumers waiting for the rest wake at once with the usable prefix', async () => {
  // A's reservation must outlive the steps below, whatever the machine's load: its transfer
  // deadline (floor 5 s by default) would otherwise free chunk 1 and B would send it itself.
  const { p: recv, port, spec } = await startReceiver({ deadlineFloorMs: 120_000 });
  const via = await relay(port, { holdAfterData: 1 }); // chunk 0 goes through whole, nothing of chunk 1
  // Both senders started first: a process start (seconds on a loaded machine) is not part of the steps.
  const [a, b] = await Promise.all([startSender('prefiller-dies'), startSender('prefiller-shares')]);
  const keys = [0, 1, 2].map((j) => syntheticKey(8, j));
  const sending = a.call('send', { spec: spec('dies-1', via.port), seed: 8, tokens: [CHUNK, CHUNK, CHUNK] }).catch((e: Error) => e);
  await until(async () => (await recv.call('lookup', { keys })) === 1, 'the first chunk');
  // another prefiller's request shares the first two chunks: both reported as held, not sent
  const rb = await b.call('send', { spec: spec('shares-1'), seed: 8, tokens: [CHUNK, CHUNK] });
  assert.deepEqual([rb.ok, rb.sent, rb.skipped], [true, 0, 2], rb.error);
  // both consumers wait for chunk 1 as the engine does (take with a wait), here for up to 2 minutes
  const takeA = recv.call('take', { keys, reqId: 'dies-1', waitMs: 120_000 }, 60_000);
  const takeB = recv.call('take', { keys: keys.slice(0, 2), reqId: 'shares-1', waitMs: 120_000 }, 60_000);
  assert.equal((await recv.call('stats')).readyEntries, 1); // answered after both takes started waiting
  await a.kill(); // SIGKILL: the process is gone between chunk 0 and chunk 1
  assert.match(String(await sending), /peer exited/);
  // the receiver settles the dead session's never-sent chunks: no one waits for them
  const [tA, tB] = await within(Promise.all([takeA, takeB]), 15_000, 'takes after the sender died');
  assert.deepEqual(tA, { keys: [keys[0]], numTokens: CHUNK });
  assert.deepEqual(tB, { keys: [keys[0]], numTokens: CHUNK });
  const st = await recv.call('stats');
  assert.deepEqual([st.reservedBytes, st.reservations, st.entries], [0, 0, 0]);
});

test('exact accounting across processes: 1000 requests with a small buffer, deadlines, corrupted chunks and failed exports leave no byte reserved', async () => {
  // 40 chunk slots (8 KiB size class each): with unconsumed reservations held until their TTL,
  // concurrent requests regularly find it full
  // The short TTL is what makes the buffer fill and free again within the test; a reservation it
  // expires before the test could take it says nothing, so "all there" is asserted for each
  // request whose take ended within the TTL of its send's start (it cannot have expired), and
  // some must be (under any load, most RPCs take milliseconds).
  const TTL = 300;
  const { p: recv, spec } = await startReceiver({ bufferBytes: 40 * 8192, ttlMs: TTL });
  const senders = await Promise.all([0, 1, 2].map((i) => startPeer({ role: 'sender', layout, chunkSize: CHUNK, modelId: MODEL, bufferBytes: 1 << 20, senderId: `acct-${i}`, allocWaitMs: 30 })));
  // A full buffer, made to happen: whether the mixed load below ever finds the buffer full
  // depends on how its sends overlap, so the outcome and its accounting are first shown on a
  // receiver of six slots whose reservations do not expire: two 3-chunk requests fill it, a
  // third is refused as full, and once one is taken the third gets in.
  {
    const { p: small, spec: smallSpec } = await startReceiver({ bufferBytes: 6 * 8192, ttlMs: 600_000 });
    const s = senders[0]!;
    const req = (n: number) => ({ spec: smallSpec(`full-${n}`), seed: 500000 + n, keys: [0, 1, 2].map((j) => syntheticKey(500000 + n, j)), tokens: [CHUNK, CHUNK, CHUNK] });
    for (const n of [0, 1]) assert.equal((await s.call('send', req(n))).ok, true);
    const refused = await s.call('send', req(2));
    assert.match(String(refused.error), /receiver buffer full/);
    assert.equal((await small.call('stats')).allocRefused, 1);
    assert.equal((await small.call('take', { keys: req(0).keys, reqId: 'full-0' })).keys.length, 3);
    assert.equal((await s.call('send', req(2))).ok, true, 'the room freed by a take lets the refused request in');
    for (const n of [1, 2]) assert.equal((await small.call('take', { keys: req(n).keys, reqId: `full-${n}` })).keys.length, 3);
    const st = await small.call('stats');
    assert.deepEqual([st.reservedBytes, st.reservations, st.entries], [0, 0, 0]);
  }
  const N = 1000;
  const outcome = { ok: 0, full: 0, rejected: 0, exportFailed: 0, duplicate: 0, expired: 0 };
  const takes = { checked: 0, late: 0 };
  const run = async (i: number) => {
    const s = senders[i % senders.length]!;
    // groups of 10 share their first two chunks: dedup and refcounting across senders
    const group = Math.floor(i / 10);
    const keys = [syntheticKey(300000 + group, 0), syntheticKey(300000 + group, 1), syntheticKey(400000 + i, 2)];
    const corrupt = i % 13 === 5 ? [2] : i % 89 === 7 ? [0] : [];
    const failAt = i % 17 === 9 ? 1 : undefined;
    const args = { spec: spec(`p${i}`), seed: group, keys, tokens: [CHUNK, CHUNK, 1 + (i % CHUNK)], corrupt, failAt };
    const t0 = Date.now(); // the reservation is made after this
    const res = await s.call('send', args);
    for (const r of i % 50 === 0 ? [res, await s.call('send', args)] : [res]) {
      if (r.ok) outcome.ok++;
      else if (/receiver buffer full/.test(r.error)) outcome.full++;
      else if (/receiver rejected chunk .*checksum mismatch/.test(r.error)) outcome.rejected++;
      else if (/synthetic export failure/.test(r.error)) outcome.exportFailed++;
      else if (/already has a reservation/.test(r.error)) outcome.duplicate++;
      // The 300 ms TTL can run out while a loaded machine is still sending: the receiver has
      // dropped the reservation and refuses its chunks. Counted, and checked below against the
      // receiver's own expiries, so a refusal with no expiry behind it still fails.
      else if (/no reservation expects chunk|reservation expired while receiving/.test(r.error)) outcome.expired++;
      else assert.fail(`unexpected failure of p${i}: ${r.error}`);
    }
    if (i % 7 === 3) return; // never consumed: must expire
    const t = await recv.call('take', { keys, reqId: `p${i}`, waitMs: 2000 });
    // what it sent itself and saw acked is all there (chunks it got in `have` may have failed in another request)
    if (res.ok && res.sent === 3) {
      if (Date.now() - t0 < TTL) {
        assert.equal(t.keys.length, 3, `p${i}`);
        takes.checked++;
      } else takes.late++;
    }
  };
  for (let i = 0; i < N; i += 30) await Promise.all(Array.from({ length: Math.min(30, N - i) }, (_, j) => run(i + j)));
  await until(async () => {
    const st = await recv.call('stats');
    return st.reservedBytes === 0 && st.reservations === 0 && st.entries === 0;
  }, 'every reservation to be consumed or to expire', 60_000);
  const st = await recv.call('stats');
  assert.deepEqual([st.reservedBytes, st.reservations, st.entries], [0, 0, 0]);
  // every kind of outcome really happened
  // (full: shown above; here it happens or not with the overlap, and is accounted when it does)
  assert.ok(st.allocRefused >= outcome.full, JSON.stringify(outcome));
  assert.ok(outcome.rejected > 0 && st.chunksRejected > 0, JSON.stringify(outcome));
  assert.ok(outcome.exportFailed > 0 && outcome.ok > N / 4, JSON.stringify(outcome));
  assert.ok(st.reservationsExpired > 0);
  assert.ok(outcome.expired <= st.reservationsExpired + st.transfers.abandoned, `${outcome.expired} sends refused as expired, but the receiver expired ${st.reservationsExpired} and abandoned ${st.transfers.abandoned}`);
  assert.ok(takes.checked > 0, `no take ended within the TTL: ${JSON.stringify(takes)}`);
  assert.ok(st.poolBytes <= 40 * 8192 + 4 * 8192, 'memory stays within the buffer bound');
});

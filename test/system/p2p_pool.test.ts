// P2P connection reuse (docs/p2p.md "Connection reuse"), against a real holder (a KvcStore behind
// startPeerServer, with a deployment secret so every FETCH is sealed) reached through a relay this
// test controls: it counts the connections the requester opens, records what the requester sends,
// and can cut or black-hole a kept connection. Checks, on outcomes only (no time thresholds):
// the second fetch from a holder reuses the first one's connection (counted); each FETCH on a kept
// connection is checked on its own (a replayed one is refused on the same connection); a kept
// connection the holder closes (its process gone) leaves the pool and the next fetch opens a new
// one; a kept connection that is cut, or goes silent, when the next FETCH is written is replaced by
// a new one within the same deadline and the fetch gets every chunk.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { Registry as PromRegistry } from 'prom-client';
import { chunkBytes, HEADER_BYTES, sealChunk, type KvLayout } from '../../src/common/chunk.js';
import { chunkKeys } from '../../src/common/keys.js';
import { setDeploymentSecret } from '../../src/common/auth.js';
import { KvcStore } from '../../src/kvc/store.js';
import { startPeerServer, type PeerServer } from '../../src/kvc/worker_peer.js';
import { P2pClient } from '../../src/kvc/p2p_client.js';
import { P2pMetrics } from '../../src/kvc/p2p_metrics.js';
import { fetchFromPeer } from '../../src/kvc/p2p_fetch.js';
import { fetchFrame } from '../../src/kvc/p2p_serve.js';
import { PeerConnPool } from '../../src/kvc/p2p_pool.js';
import { FrameReader } from '../../src/protocol/frame_reader.js';
import { decodePeerControl, PEER_FRAMES, PeerFrame, peerControlFrame, peerFetchEndSchema } from '../../src/protocol/peer_frames.js';

const layout: KvLayout = { dtype: 0, numLayers: 2, numKvHeads: 1, headDim: 4 } as KvLayout;
const keys = chunkKeys(Array.from({ length: 40 }, (_, i) => i + 3), { modelId: 'm', chunkSize: 4, seed: 0n }).map((s) => s.key);

function chunk(key: string, fill: number): Uint8Array {
  const buf = new Uint8Array(chunkBytes(layout, 4));
  buf.subarray(HEADER_BYTES).fill(fill);
  return sealChunk(buf, layout, 4, key);
}

/** A TCP relay in front of the holder: counts connections, records client bytes, can cut or swallow. */
class Relay {
  connections = 0;
  /** What to do with the next client bytes on an already used connection. */
  mode: 'pass' | 'cut' | 'blackhole' = 'pass';
  /** While set, what the holder sends is held back (a slow link), until release(). */
  private held: (() => void)[] | null = null;
  readonly sent: Buffer[] = [];
  hold(): void {
    this.held = [];
  }
  release(): void {
    const h = this.held ?? [];
    this.held = null;
    for (const f of h) f();
  }
  private readonly server: net.Server;
  private readonly pairs = new Set<[net.Socket, net.Socket]>();
  constructor(private readonly target: () => number) {
    this.server = net.createServer((c) => {
      this.connections++;
      const up = net.connect({ host: '127.0.0.1', port: this.target() });
      const pair: [net.Socket, net.Socket] = [c, up];
      this.pairs.add(pair);
      let used = false;
      c.on('data', (d: Buffer) => {
        if (used && this.mode !== 'pass') {
          const m = this.mode;
          this.mode = 'pass';
          if (m === 'cut') {
            c.destroy();
            up.destroy();
          }
          return; // blackhole: swallowed, nothing answered, nothing closed
        }
        used = true;
        this.sent.push(Buffer.from(d));
        up.write(d);
      });
      up.on('data', (d) => (this.held ? this.held.push(() => c.write(d)) : c.write(d)));
      for (const s of pair) {
        s.on('error', () => {});
        s.on('close', () => {
          c.destroy();
          up.destroy();
          this.pairs.delete(pair);
        });
      }
    });
  }
  async listen(): Promise<number> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    return (this.server.address() as net.AddressInfo).port;
  }
  close(): Promise<void> {
    for (const [a, b] of this.pairs) (a.destroy(), b.destroy());
    return new Promise((r) => this.server.close(() => r()));
  }
}

let store: KvcStore;
let holder: PeerServer;
let holderPort = 0;
let relay: Relay;
let relayPort = 0;

before(async () => {
  setDeploymentSecret('p2p-pool-test-secret-0123456789abcdef');
  store = await KvcStore.create({ local_cpu: true, max_local_cpu_size: 0.01, max_local_disk_size: 0, local_disk: null });
  for (let i = 0; i < 8; i++) await store.put(keys[i]!, chunk(keys[i]!, i + 1));
  holder = await startPeerServer(store, '127.0.0.1', 0, { layout, chunkSize: 4 });
  holderPort = holder.port;
  relay = new Relay(() => holderPort);
  relayPort = await relay.listen();
});

after(async () => {
  await relay.close();
  await holder.close();
  await store.close();
  setDeploymentSecret(null);
});

function client(metrics: P2pMetrics, me: KvcStore): P2pClient {
  const holders = [{ instance_id: 'holder', peer_url: `127.0.0.1:${relayPort}`, location: 'LocalCPUBackend', chunks: 8 }];
  return new P2pClient({ store: me, instanceId: 'me', layout, chunkSize: 4, timeoutMs: 30_000, askHolders: async () => holders, metrics });
}

const value = async (reg: PromRegistry, name: string, label = '') => {
  const line = (await reg.metrics()).split('\n').find((l) => l.startsWith(name) && l.includes(label));
  return Number(line?.slice(line.lastIndexOf(' ') + 1) ?? NaN);
};

test('the second fetch from a holder reuses the first one\'s connection; every FETCH on it is sealed on its own', async () => {
  const me = await KvcStore.create({ local_cpu: true, max_local_cpu_size: 0.01, max_local_disk_size: 0, local_disk: null });
  const reg = new PromRegistry();
  const m = new P2pMetrics(reg);
  const c = client(m, me);
  try {
    const before = relay.connections;
    const a = await c.fetch(keys.slice(0, 4));
    assert.deepEqual([...a.values()].map((x) => x[HEADER_BYTES]), [1, 2, 3, 4]);
    assert.equal(await value(reg, 'kvc_p2p_idle_connections'), 1, 'the connection is kept after a clean FETCH_END');
    const b = await c.fetch(keys.slice(4, 8));
    assert.deepEqual([...b.values()].map((x) => x[HEADER_BYTES]), [5, 6, 7, 8]);
    assert.equal(relay.connections - before, 1, 'one TCP connection for both fetches');
    assert.equal(await value(reg, 'kvc_p2p_connections_total', 'how="new"'), 1);
    assert.equal(await value(reg, 'kvc_p2p_connections_total', 'how="reused"'), 1);
    assert.equal(await value(reg, 'kvc_p2p_fetches_total', 'outcome="hit"'), 2);
    // Many fetches on the one kept connection (the holder keeps no per-fetch state on it).
    for (let i = 0; i < 12; i++) assert.equal((await c.fetch(keys.slice(i % 4, 8))).size, 8 - (i % 4));
    assert.equal(relay.connections - before, 1, 'still one TCP connection');
  } finally {
    c.close();
    await me.close();
  }
  // The first FETCH as it crossed the wire, replayed on a connection that is kept open: refused by
  // its nonce, while a freshly sealed FETCH before it on the same connection was served.
  const captured = relay.sent.find((b) => b[4] === PeerFrame.Fetch)!;
  assert.ok(captured, 'the relay saw the FETCH');
  const answers = await rawFetches(holderPort, [peerControlFrame(PeerFrame.Fetch, fetchFrame('raw', keys.slice(0, 1), true)), captured]);
  assert.equal(answers[0]!.ok, true, JSON.stringify(answers[0]));
  assert.equal(answers[0]!.keep, true);
  assert.equal(answers[1]!.ok, false);
  assert.match(answers[1]!.error ?? '', /replayed_nonce/);
});

/** Writes each FETCH on one connection after the previous answer's FETCH_END; returns the FETCH_ENDs. */
async function rawFetches(port: number, frames: Buffer[]) {
  const sock = net.connect({ host: '127.0.0.1', port });
  sock.on('error', () => {});
  await new Promise<void>((r) => sock.once('connect', () => r()));
  return rawFetchesOn(sock, frames);
}

async function rawFetchesOn(sock: net.Socket, frames: Buffer[]) {
  const ends: { ok: boolean; sent: number; error?: string; keep?: boolean }[] = [];
  await new Promise<void>((resolve, reject) => {
    const next = () => (ends.length < frames.length ? sock.write(frames[ends.length]!) : (sock.destroy(), resolve()));
    const reader = new FrameReader(PEER_FRAMES, {
      sink: (_t, _m, len) => Buffer.alloc(len),
      onFrame: (type, _m, body) => {
        if (type !== PeerFrame.FetchEnd) return;
        const r = decodePeerControl(peerFetchEndSchema, 'FETCH_END', body!);
        if (!r.ok) return reject(new Error(r.error));
        ends.push(r.msg);
        next();
      },
    });
    sock.removeAllListeners('data');
    sock.on('data', (d) => reader.push(d));
    sock.on('close', () => (ends.length < frames.length ? reject(new Error(`closed after ${ends.length} answers: ${JSON.stringify(ends)}`)) : resolve()));
    next();
  });
  return ends;
}

test('a kept connection whose holder went away leaves the pool; the next fetch opens a new one', async () => {
  const pool = new PeerConnPool();
  const hows: string[] = [];
  const counting = new PeerConnPool({ onConnection: (h) => hows.push(h) });
  const url = `127.0.0.1:${relayPort}`;
  const fetch = (p: PeerConnPool, ks: string[]) => fetchFromPeer({ peerUrl: url, keys: ks, from: 't', deadline: Date.now() + 30_000, layout, chunkSize: 4, pool: p });
  try {
    assert.equal((await fetch(counting, keys.slice(0, 2))).failure, null);
    assert.equal(counting.size, 1);
    // The holder's process ends: its peer port and every connection close.
    await holder.close();
    await waitFor(() => counting.size === 0, 'the pool to drop the closed connection');
    holder = await startPeerServer(store, '127.0.0.1', holderPort, { layout, chunkSize: 4 });
    const r = await fetch(counting, keys.slice(0, 2));
    assert.equal(r.failure, null, r.error ?? '');
    assert.equal(r.chunks.length, 2);
    assert.deepEqual(hows, ['new', 'new']);
  } finally {
    pool.close();
    counting.close();
  }
});

for (const mode of ['cut', 'blackhole'] as const) {
  test(`a kept connection ${mode === 'cut' ? 'cut' : 'gone silent'} when the next FETCH is written is replaced within the same deadline`, async () => {
    const hows: string[] = [];
    const pool = new PeerConnPool({ onConnection: (h) => hows.push(h) });
    const url = `127.0.0.1:${relayPort}`;
    const fetch = (ks: string[]) => fetchFromPeer({ peerUrl: url, keys: ks, from: 't', deadline: Date.now() + 30_000, layout, chunkSize: 4, pool });
    try {
      assert.equal((await fetch(keys.slice(0, 3))).failure, null);
      relay.mode = mode;
      const r = await fetch(keys.slice(0, 6));
      assert.equal(r.failure, null, r.error ?? '');
      assert.deepEqual(r.chunks.map((x) => x[HEADER_BYTES]), [1, 2, 3, 4, 5, 6]);
      assert.deepEqual(hows, ['new', 'stale', 'new']);
      assert.equal(pool.size, 1, 'the new connection is kept in its place');
    } finally {
      relay.mode = 'pass';
      pool.close();
    }
  });
}

test('a fetch past its deadline returns what arrived; the rest is stopped and drained, and the connection kept', async () => {
  const hows: string[] = [];
  const pool = new PeerConnPool({ onConnection: (h) => hows.push(h) });
  const url = `127.0.0.1:${relayPort}`;
  try {
    relay.hold();
    // Nothing of the answer can arrive before this deadline: the relay holds it back.
    const late = await fetchFromPeer({ peerUrl: url, keys: keys.slice(0, 8), from: 't', deadline: Date.now() + 300, layout, chunkSize: 4, pool });
    assert.equal(late.failure, 'timeout');
    assert.equal(late.chunks.length, 0);
    assert.equal(pool.size, 0, 'not kept while the answer is still coming');
    relay.release();
    await waitFor(() => pool.size === 1, 'the drained connection to be kept');
    const r = await fetchFromPeer({ peerUrl: url, keys: keys.slice(0, 8), from: 't', deadline: Date.now() + 30_000, layout, chunkSize: 4, pool });
    assert.equal(r.failure, null, r.error ?? '');
    assert.deepEqual(r.chunks.map((x) => x[HEADER_BYTES]), [1, 2, 3, 4, 5, 6, 7, 8]);
    assert.deepEqual(hows, ['new', 'reused']);
  } finally {
    relay.release();
    pool.close();
  }
});

test('a holder told to stop ends its answer early with FETCH_END and keeps the connection', async () => {
  // FETCH and FETCH_STOP written together: the holder stops before its first chunk (or after one).
  const sock = net.connect({ host: '127.0.0.1', port: holderPort });
  sock.on('error', () => {});
  await new Promise<void>((r) => sock.once('connect', () => r()));
  sock.write(Buffer.concat([peerControlFrame(PeerFrame.Fetch, fetchFrame('raw', keys.slice(0, 8), true)), peerControlFrame(PeerFrame.FetchStop, {})]));
  const end = await new Promise<{ ok: boolean; sent: number; keep?: boolean }>((resolve, reject) => {
    const reader = new FrameReader(PEER_FRAMES, {
      sink: (_t, _m, len) => Buffer.alloc(len),
      onFrame: (type, _m, body) => {
        if (type !== PeerFrame.FetchEnd) return;
        const r = decodePeerControl(peerFetchEndSchema, 'FETCH_END', body!);
        return r.ok ? resolve(r.msg) : reject(new Error(r.error));
      },
    });
    sock.on('data', (d) => reader.push(d));
    sock.on('close', () => reject(new Error('closed before FETCH_END')));
  });
  assert.equal(end.ok, true);
  assert.equal(end.keep, true);
  assert.ok(end.sent < 8, `stopped early (${end.sent} of 8 sent)`);
  // A FETCH_STOP with no FETCH under way (it crossed the FETCH_END) is ignored: the connection serves the next FETCH.
  const again = await rawFetchesOn(sock, [Buffer.concat([peerControlFrame(PeerFrame.FetchStop, {}), peerControlFrame(PeerFrame.Fetch, fetchFrame('raw', keys.slice(0, 2), true))])]);
  assert.deepEqual(again.map((e) => [e.ok, e.sent]), [[true, 2]]);
});

test('without a pool the holder closes the connection after FETCH_END, as before', async () => {
  const before = relay.connections;
  for (let i = 0; i < 2; i++) {
    const r = await fetchFromPeer({ peerUrl: `127.0.0.1:${relayPort}`, keys: keys.slice(0, 2), from: 't', deadline: Date.now() + 30_000, layout, chunkSize: 4 });
    assert.equal(r.failure, null, r.error ?? '');
  }
  assert.equal(relay.connections - before, 2);
});

async function waitFor(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 600 && !cond(); i++) await new Promise((r) => setTimeout(r, 50));
  assert.ok(cond(), `${what} (not within 30 s)`);
}

// P2P prefix sharing on real processes (docs/p2p.md): a `kvc controller` with a deployment
// secret and two `kvc engine --enable-p2p` processes (kv_both, built-in model) whose cache
// instances register with it.
//   - a prefix computed by A is a P2P hit on B: B computes only the tail, its greedy output is
//     A's, and afterwards the controller's index finds the prompt on both under the same keys;
//   - a holder that answers with a corrupt chunk, or a short reply, is a fallback: the verified
//     chunks before it are used, the rest is computed, the output is unchanged;
//   - the holder SIGKILLed while B's fetch is waiting on it: B's request succeeds, output identical;
//   - the controller killed: B's fetch fails at once (no holder query) and B computes.
// The engines hold their KV in float16 (--kv-cache-dtype): P2P moves 16-bit chunks, keyed with the
// dtype (engines elsewhere keep the float32 default); the hostile holder
// registers with the same dtype.
// The hostile holder is a test peer registered with the controller like an instance (it serves
// A's real chunk bytes, damaged); nothing stands in for a kvc component.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { Dealer } from 'zeromq';
import { chunkKeys } from '../../src/common/keys.js';
import { DType } from '../../src/common/dtype.js';
import { setDeploymentSecret } from '../../src/common/auth.js';
import { seal, sealTag, stamp } from '../../src/common/replay.js';
import { decodeMsg, encodeMsg, MONITOR_PROTOCOL_VERSION, packKeys } from '../../src/protocol/monitor.js';
import { decodePeerControl, PEER_FRAMES, PeerFrame, peerChunkHead, peerControlFrame, peerFetchEndSchema, peerFetchSchema, type PeerFetch } from '../../src/protocol/peer_frames.js';
import { FrameReader } from '../../src/protocol/frame_reader.js';
import { postJson, waitUntil as waitFor } from '../../harness/proc.js';
import { completeText, matchedOn, metricValue, startControllerEngines, tokenizeOn, type ControllerEngines, type Who } from '../../harness/controller_engines.js';

const CHUNK = 32;
const SECRET = 'p2p-test-secret-' + randomBytes(8).toString('hex');
const AUTH = { authorization: `Bearer ${SECRET}` };

let d: ControllerEngines;
/** The id the engines' chunk keys use (GET /v1/models kvc_model_id). */
let modelId = '';

const waitUntil = <T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 30_000) => waitFor(what, fn, timeoutMs, 50);

const completion = (who: Who, prompt: string) => postJson(`${d.url[who]}/v1/completions`, { model: 'builtin:tiny', prompt, max_tokens: 8, temperature: 0 }, 120_000);
const complete = (who: Who, prompt: string) => completeText(d.url[who], prompt);
const tokenize = (prompt: string) => tokenizeOn(d.url.B, prompt);
const matched = (tokens: number[], id: string) => matchedOn(d.ctlUrl, tokens, id);
/** A metric's value on an engine (sum over series matching every label given). */
const metric = (who: Who, name: string, labels: Record<string, string> = {}) => metricValue(d.url[who], name, labels);
const computed = (who: Who) => metric(who, 'kvc_engine_prompt_tokens_computed_total');
const prompt = (tag: string, n = 50) => `${tag}: ` + Array.from({ length: n }, (_, i) => `${tag}w${i}`).join(' ');

before(async () => {
  setDeploymentSecret(SECRET);
  d = await startControllerEngines({
    chunkSize: CHUNK,
    instanceId: (who) => `engine-${who}`,
    yaml: () => [
      'max_local_cpu_size: 0.05',
      // Long enough that in the kill test the SIGKILL, not the time bound, ends B's fetch.
      'p2p_timeout_ms: 60000',
    ],
    engineArgs: ['--enable-p2p', '--kv-cache-dtype', 'float16'],
    env: { KVC_DEPLOYMENT_SECRET: SECRET },
  });
  modelId = (await (await fetch(`${d.url.B}/v1/models`)).json()).data[0].kvc_model_id;
});

after(async () => {
  await d?.stop();
});

test('a prefix computed by A is a P2P hit on B: fewer tokens computed, same output, same keys in the index', async () => {
  const p = prompt('shared');
  const tokens = await tokenize(p);
  assert.ok(tokens.length > 4 * CHUNK, `prompt of ${tokens.length} tokens`);
  const outA = await complete('A', p);
  const onA = await waitUntil('prompt indexed on A', async () => (await matched(tokens, 'engine-A')) || undefined);
  assert.ok(onA >= 4 * CHUNK, `A holds ${onA} tokens`);
  assert.equal(await matched(tokens, 'engine-B'), 0);

  const [c0, hits0, chunks0] = [await computed('B'), await metric('B', 'kvc_p2p_fetches_total', { outcome: 'hit' }), await metric('B', 'kvc_p2p_chunks_total')];
  const outB = await complete('B', p);
  assert.equal(outB, outA, 'greedy output from peer KV must be identical');
  const cB = (await computed('B')) - c0;
  assert.ok(cB <= tokens.length - onA + 1, `B computed ${cB} of ${tokens.length} prompt tokens (${onA} were on A)`);
  assert.equal((await metric('B', 'kvc_p2p_fetches_total', { outcome: 'hit' })) - hits0, 1);
  // Every chunk A holds that B may load (all but the last prompt token is loadable) came over P2P:
  // no silent 0 % hit rate.
  assert.equal((await metric('B', 'kvc_p2p_chunks_total')) - chunks0, Math.ceil((Math.min(onA, tokens.length - 1)) / CHUNK), 'chunks fetched over P2P');
  assert.ok((await metric('B', 'kvc_p2p_bytes_total')) > 0);
  // Key agreement: B promoted what it fetched; the controller finds it under the keys it computes itself.
  await waitUntil('prompt indexed on B', async () => (await matched(tokens, 'engine-B')) >= onA);
  // A second request on B is a local hit: no new fetch.
  const f1 = await metric('B', 'kvc_p2p_fetches_total');
  assert.equal(await complete('B', p), outA);
  assert.equal(await metric('B', 'kvc_p2p_fetches_total'), f1);
});

/** A hostile holder: registered with the controller for `keys`, answers FETCH with `serve`. */
async function hostileHolder(keys: string[], serve: (sock: net.Socket, asked: string[]) => void): Promise<{ close(): Promise<void> }> {
  const server = net.createServer((sock) => {
    const reader = new FrameReader(PEER_FRAMES, {
      sink: (_t, _m, len) => new Uint8Array(len),
      onFrame: (type, _m, body) => {
        if (type !== PeerFrame.Fetch) return void sock.destroy();
        const r = decodePeerControl(peerFetchSchema, 'FETCH', body!);
        if (!r.ok) return void sock.destroy();
        serve(sock, r.msg.keys);
      },
    });
    sock.on('data', (d) => reader.push(d));
    sock.on('error', () => {});
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  const session = randomBytes(8).toString('hex');
  const dealer = new Dealer({ routingId: session, linger: 0 });
  dealer.connect(`tcp://127.0.0.1:${d.monitorPort}`);
  await dealer.send(encodeMsg(seal(SECRET, 'monitor', {
    t: 'register', v: MONITOR_PROTOCOL_VERSION, instance_id: 'engine-hostile', worker_id: 0, session, ip: '127.0.0.1', worker_port: 1,
    distributed_url: `127.0.0.1:${port}`, chunk_size: CHUNK, model_id: modelId, seed: '0', kv_dtype: 'f16', locations: ['LocalCPUBackend'], pid: process.pid,
  })));
  const [welcome] = await dealer.receive();
  assert.equal(decodeMsg(welcome!)?.t, 'welcome');
  await dealer.send(encodeMsg({ t: 'sync', location: 'LocalCPUBackend', keys: packKeys(keys), reset: true, last: true }));
  const hb = setInterval(() => void dealer.send(encodeMsg({ t: 'hb' })).catch(() => {}), 500);
  return {
    async close() {
      clearInterval(hb);
      await dealer.send(encodeMsg({ t: 'bye' })).catch(() => {});
      dealer.close();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** A FETCH frame as an instance sends it: sealed with the right or a wrong secret, or not at all; `ts` to backdate it. */
function fetchMsg(keys: string[], auth: 'right' | 'wrong' | 'none', ts = Date.now()): PeerFetch {
  const msg: PeerFetch = { v: 1, from: 'test', keys, ...stamp(ts) };
  return auth === 'none' ? msg : { ...msg, auth: sealTag(auth === 'right' ? SECRET : SECRET + 'x', 'p2p-fetch', msg) };
}

/** A raw FETCH (the test's own frame handling): the chunk bytes that come back and the FETCH_END. */
async function rawFetch(peer: string, keys: string[], auth: 'right' | 'wrong' | 'none', frame: PeerFetch = fetchMsg(keys, auth)): Promise<{ chunks: Map<string, Uint8Array>; end: { ok: boolean; sent: number; error?: string } }> {
  const [host, port] = [peer.slice(0, peer.lastIndexOf(':')), Number(peer.slice(peer.lastIndexOf(':') + 1))];
  return new Promise((resolve, reject) => {
    const chunks = new Map<string, Uint8Array>();
    const sock = net.connect({ host, port });
    const timer = setTimeout(() => (sock.destroy(), reject(new Error('raw fetch timed out'))), 30_000);
    const reader = new FrameReader(PEER_FRAMES, {
      sink: (_t, _m, len) => new Uint8Array(len),
      onFrame: (type, _m, body) => {
        if (type === PeerFrame.Chunk) {
          const key = Buffer.from(body!.subarray(0, 16)).toString('latin1');
          chunks.set(key, body!.slice(16));
        } else if (type === PeerFrame.FetchEnd) {
          clearTimeout(timer);
          sock.destroy();
          const r = decodePeerControl(peerFetchEndSchema, 'FETCH_END', body!);
          if (r.ok) resolve({ chunks, end: r.msg });
          else reject(new Error(r.error));
        }
      },
    });
    sock.on('connect', () => sock.write(peerControlFrame(PeerFrame.Fetch, frame)));
    sock.on('data', (d) => reader.push(d));
    sock.on('error', reject);
  });
}

test('the peer port serves a FETCH only with the deployment secret', async () => {
  const p = prompt('auth', 20);
  const t = await tokenize(p);
  await complete('A', p);
  const keys = chunkKeys(t, { modelId, chunkSize: CHUNK, seed: 0n, kvDtype: DType.f16 }).map((s) => s.key);
  await waitUntil('indexed on A', async () => (await matched(t, 'engine-A')) === t.length);
  for (const bad of ['none', 'wrong'] as const) {
    const r = await rawFetch(d.peerUrl.A, keys, bad);
    assert.equal(r.end.ok, false, `${bad} secret`);
    assert.match(r.end.error ?? '', /deployment secret/);
    assert.equal(r.chunks.size, 0);
  }
  const frame = fetchMsg(keys, 'right');
  const ok = await rawFetch(d.peerUrl.A, keys, 'right', frame);
  assert.equal(ok.end.ok, true);
  assert.equal(ok.end.sent, keys.length);
  assert.deepEqual([...ok.chunks.keys()], keys);
  // The same frame again (a captured FETCH replayed) is refused by its nonce; one whose
  // timestamp is older than the replay window, by its timestamp; one with other keys under a
  // captured tag, by the tag.
  const replayed = await rawFetch(d.peerUrl.A, keys, 'right', frame);
  assert.deepEqual([replayed.end.ok, replayed.chunks.size], [false, 0]);
  assert.match(replayed.end.error ?? '', /replayed_nonce/);
  const old = await rawFetch(d.peerUrl.A, keys, 'right', fetchMsg(keys, 'right', Date.now() - 120_000));
  assert.deepEqual([old.end.ok, old.chunks.size], [false, 0]);
  assert.match(old.end.error ?? '', /stale_timestamp/);
  const altered = await rawFetch(d.peerUrl.A, keys, 'right', { ...fetchMsg(keys, 'right'), keys: keys.slice(1) });
  assert.deepEqual([altered.end.ok, altered.chunks.size], [false, 0]);
  assert.match(altered.end.error ?? '', /invalid_deployment_secret/);
  // A key A does not hold ends the run there.
  const part = await rawFetch(d.peerUrl.A, [keys[0]!, '0123456789abcdef', keys[1]!], 'right');
  assert.deepEqual([part.end.ok, part.end.sent], [true, 1]);
});

test('a corrupt or short reply from the holder falls back to computing: verified chunks before it are used, output unchanged', async () => {
  const p1 = prompt('corrupt');
  const p2 = prompt('short');
  const t1 = await tokenize(p1);
  const t2 = await tokenize(p2);
  const out1 = await complete('A', p1);
  const out2 = await complete('A', p2);
  const keys1 = chunkKeys(t1, { modelId, chunkSize: CHUNK, seed: 0n, kvDtype: DType.f16 }).map((s) => s.key);
  const keys2 = chunkKeys(t2, { modelId, chunkSize: CHUNK, seed: 0n, kvDtype: DType.f16 }).map((s) => s.key);
  await waitUntil('both prompts indexed on A', async () => (await matched(t1, 'engine-A')) === t1.length && (await matched(t2, 'engine-A')) === t2.length);
  // A's real chunk bytes, then A forgets everything: the hostile holder is the only one.
  const real = new Map([...(await rawFetch(d.peerUrl.A, keys1, 'right')).chunks, ...(await rawFetch(d.peerUrl.A, keys2, 'right')).chunks]);
  assert.equal(real.size, keys1.length + keys2.length);
  const clr = await postJson(`${d.ctlUrl}/clear`, { instance_id: 'engine-A', location: 'LocalCPUBackend' }, 30_000, AUTH);
  assert.equal(clr.status, 200, JSON.stringify(clr.json));
  await waitUntil('A cleared', async () => (await matched(t1, 'engine-A')) === 0 && (await matched(t2, 'engine-A')) === 0);

  let mode: 'corrupt' | 'short' = 'corrupt';
  const holder = await hostileHolder([...keys1, ...keys2], (sock, asked) => {
    const first = real.get(asked[0]!)!;
    if (mode === 'short') {
      // The head of a chunk frame, half its bytes, then the connection ends.
      sock.write(peerChunkHead(asked[0]!, first.byteLength));
      sock.end(first.subarray(0, first.byteLength >> 1));
      return;
    }
    // One good chunk, then one whose payload has a flipped byte (the header still says the old checksum).
    sock.write(peerChunkHead(asked[0]!, first.byteLength));
    sock.write(first);
    const bad = Buffer.from(real.get(asked[1]!)!);
    bad[bad.length - 5] ^= 0xff;
    sock.write(peerChunkHead(asked[1]!, bad.byteLength));
    sock.write(bad);
    sock.end(peerControlFrame(PeerFrame.FetchEnd, { ok: true, sent: 2 }));
  });
  try {
    const corrupt0 = await metric('B', 'kvc_p2p_failures_total', { reason: 'corrupt' });
    const partial0 = await metric('B', 'kvc_p2p_fetches_total', { outcome: 'partial' });
    const c0 = await computed('B');
    assert.equal(await complete('B', p1), out1, 'output after a corrupt peer chunk');
    assert.equal((await metric('B', 'kvc_p2p_failures_total', { reason: 'corrupt' })) - corrupt0, 1);
    assert.equal((await metric('B', 'kvc_p2p_fetches_total', { outcome: 'partial' })) - partial0, 1, 'the good first chunk was used');
    const c1 = await computed('B');
    assert.equal(c1 - c0, t1.length - CHUNK, 'only the first (verified) chunk was loaded');

    mode = 'short';
    const closed0 = await metric('B', 'kvc_p2p_failures_total', { reason: 'closed' });
    const failed0 = await metric('B', 'kvc_p2p_fetches_total', { outcome: 'failed' });
    assert.equal(await complete('B', p2), out2, 'output after a short peer reply');
    assert.equal((await metric('B', 'kvc_p2p_failures_total', { reason: 'closed' })) - closed0, 1);
    assert.equal((await metric('B', 'kvc_p2p_fetches_total', { outcome: 'failed' })) - failed0, 1);
    assert.equal((await computed('B')) - c1, t2.length, 'nothing was loaded from the short reply');
  } finally {
    await holder.close();
  }
});

test('the holder SIGKILLed while B fetches from it: B answers, output identical', async () => {
  const p = prompt('killed');
  const t = await tokenize(p);
  const outA = await complete('A', p);
  await waitUntil('indexed on A', async () => (await matched(t, 'engine-A')) === t.length);
  const a = d.engines.A!;
  const pid = a.child.pid!;
  const failed0 = await metric('B', 'kvc_p2p_fetches_total', { outcome: 'failed' });
  // Frozen, A's kernel still accepts B's connection and FETCH, but nothing is answered.
  process.kill(pid, 'SIGSTOP');
  let killed = false;
  try {
    const pending = completion('B', p);
    await waitUntil('B fetching from A', async () => (await metric('B', 'kvc_p2p_fetches_in_flight')) >= 1, 60_000);
    // Let B's FETCH reach A's socket (the fetch is in flight, waiting for A's answer).
    process.kill(pid, 'SIGKILL');
    killed = true;
    const r = await pending;
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.choices[0].text, outA);
    assert.equal((await metric('B', 'kvc_p2p_fetches_total', { outcome: 'failed' })) - failed0, 1);
    assert.ok((await metric('B', 'kvc_p2p_failures_total', { reason: 'closed' })) + (await metric('B', 'kvc_p2p_failures_total', { reason: 'connect' })) >= 1);
  } finally {
    if (!killed) process.kill(pid, 'SIGCONT');
  }
  await a.kill();
  d.engines.A = null;
  // B keeps serving.
  assert.equal(await complete('B', p), outA);
});

test('the controller gone: B computes without waiting for the time bound, counted as a controller failure', async () => {
  const p = prompt('no-controller');
  await d.ctl.kill('SIGKILL');
  const failed0 = await metric('B', 'kvc_p2p_failures_total', { reason: 'controller' });
  const r = await completion('B', p);
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.equal((await metric('B', 'kvc_p2p_failures_total', { reason: 'controller' })) - failed0, 1);
  // Computed locally: a second request is a local hit with the same greedy output.
  assert.equal(await complete('B', p), r.json.choices[0].text);
});

// Credentials (docs/security.md): the client API key on the engine and the proxy (which sends it
// on to the engines), and the deployment secret on every internal channel: controller mutations,
// monitor registration, xfer handshakes, transfer notices. Each refusal is a 401 in the OpenAI
// shape (HTTP) or a refused/dropped message (binary channels); reads and health stay open.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { Push } from 'zeromq';
import { setDeploymentSecret } from '../../src/common/auth.js';
import { seal, signedHeaders } from '../../src/common/replay.js';
import { DType, type KvLayout } from '../../src/common/chunk.js';
import { freePortRange } from '../../harness/ports.js';
import { startController } from '../../src/controller/server.js';
import { Registry } from '../../src/controller/registry.js';
import { startEngine } from '../../src/engine/server.js';
import { MONITOR_PROTOCOL_VERSION } from '../../src/protocol/monitor.js';
import { FrameParser, FrameType, PROTOCOL_VERSION, writeFrame } from '../../src/protocol/xfer_frames.js';
import { encodeNotice } from '../../src/protocol/xfer_notice.js';
import { NotifyReceiver, type XferNotice } from '../../src/proxy/notify.js';
import { ProxyServer } from '../../src/proxy/server.js';
import { XferReceiver } from '../../src/xfer/index.js';
import { startStubEngine } from '../../harness/proxy_stub.js';

const SECRET = 'test-deployment-secret-0123456789';
const closers: (() => unknown)[] = [];
after(async () => {
  setDeploymentSecret(null);
  for (const c of closers.reverse()) await c();
});

const post = async (url: string, body: unknown, headers: Record<string, string> = {}) => {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body), signal: AbortSignal.timeout(30_000) });
  return { status: r.status, json: (await r.json()) as any };
};

test('engine: the OpenAI endpoints need the API key; health and metrics stay open', async () => {
  const e = await startEngine({ apiKey: 'sk-engine', maxNumSeqs: 2, maxNumBatchedTokens: 64 });
  closers.push(() => e.close());
  const body = { model: e.modelName, prompt: 'hi', max_tokens: 1 };
  const none = await post(`${e.url}/v1/completions`, body);
  assert.equal(none.status, 401);
  assert.deepEqual(Object.keys(none.json.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(none.json.error.code, 'invalid_api_key');
  assert.equal((await post(`${e.url}/v1/completions`, body, { authorization: 'Bearer wrong' })).status, 401);
  assert.equal((await post(`${e.url}/tokenize`, { prompt: 'x' })).status, 401);
  assert.equal((await post(`${e.url}/v1/completions`, body, { authorization: 'Bearer sk-engine' })).status, 200);
  assert.equal((await fetch(`${e.url}/health`)).status, 200);
  assert.equal((await fetch(`${e.url}/metrics`)).status, 200);
});

test('proxy: needs the API key and sends it to the engines', async () => {
  const p = await startStubEngine('p');
  const d = await startStubEngine('d');
  closers.push(() => p.close(), () => d.close());
  const port = await freePortRange(1);
  const proxy = new ProxyServer({
    host: '127.0.0.1',
    port,
    topology: { prefillers: [{ host: '127.0.0.1', port: p.port }], decoders: [{ host: '127.0.0.1', port: d.port, initPort: 7300, allocPort: 7400 }] },
    notify: null,
    timeouts: { tokenizeMs: 5_000, prefillMs: 5_000, decodeMs: 5_000, idleMs: 5_000 },
    healthIntervalMs: 60_000,
    statsIntervalMs: 60_000,
    statsSink: () => undefined,
    apiKey: 'sk-proxy',
  });
  await proxy.start();
  closers.push(() => proxy.stop());
  const url = `http://127.0.0.1:${proxy.port}/v1/completions`;
  const none = await post(url, { prompt: 'hello', max_tokens: 2 });
  assert.equal(none.status, 401);
  assert.equal(none.json.error.code, 'invalid_api_key');
  assert.equal(p.requests.length + d.requests.length, 0, 'nothing reached an engine');
  assert.equal((await post(url, { prompt: 'hello', max_tokens: 2 }, { authorization: 'Bearer sk-proxy' })).status, 200);
  for (const r of [...p.requests, ...d.requests]) assert.equal(r.authorization, 'Bearer sk-proxy', `${r.path} carried the key`);
  assert.equal((await fetch(`http://127.0.0.1:${proxy.port}/health`)).status, 200, 'health stays open');
});

test('deployment secret: controller mutations, monitor registration, xfer handshake and notices', async () => {
  setDeploymentSecret(SECRET);
  // Controller HTTP: mutations need the secret, reads do not.
  const port = await freePortRange(2);
  const ctl = await startController({ host: '127.0.0.1', port, monitorPort: port + 1 });
  closers.push(() => ctl.close());
  const pin = { tokens: [1, 2, 3], instance_id: 'ghost', location: 'LocalCPUBackend' };
  for (const path of ['/pin', '/unpin', '/clear', '/move']) {
    const r = await post(`${ctl.url}${path}`, pin);
    assert.equal(r.status, 401, path);
    assert.equal(r.json.error.code, 'invalid_deployment_secret');
  }
  assert.equal((await post(`${ctl.url}/pin`, pin, { authorization: `Bearer ${SECRET}` })).status, 404, 'past the guard: the instance is unknown');
  assert.equal((await post(`${ctl.url}/pin`, pin, signedHeaders(SECRET, 'POST', '/pin', pin))).status, 404, 'a signed call passes the guard too');
  const wrongSig = await post(`${ctl.url}/pin`, pin, signedHeaders('another-secret-0123456789', 'POST', '/pin', pin));
  assert.deepEqual([wrongSig.status, wrongSig.json.error.code], [401, 'invalid_deployment_secret'], 'signed with another secret');
  assert.equal((await post(`${ctl.url}/lookup`, { tokens: [1, 2] })).status, 200, 'lookups stay open');

  // Monitor registration.
  const reg = new Registry({ heartbeatTimeoutMs: 10_000, seed: 0n });
  const msg = { t: 'register', v: MONITOR_PROTOCOL_VERSION, instance_id: 'fake', worker_id: 0, session: 's1', ip: '127.0.0.1', worker_port: 1, distributed_url: null, chunk_size: 256, model_id: 'm', seed: '0', locations: [], pid: 1 };
  assert.equal(reg.handle('s1', msg)?.t, 'error', 'no tag: refused');
  assert.equal(reg.handle('s1', seal('another-secret-0123456789', 'monitor', msg))?.t, 'error', 'wrong secret: refused');
  assert.equal(reg.instances.size, 0);
  assert.equal(reg.handle('s1', seal(SECRET, 'monitor', msg))?.t, 'welcome');

  // xfer handshake.
  const layout: KvLayout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 8 };
  const xp = await freePortRange(2);
  const rx = await XferReceiver.start({ host: '127.0.0.1', initPort: xp, allocPort: xp + 1, bufferBytes: 1 << 20, layout, chunkSize: 16, modelId: 'm' });
  closers.push(() => rx.close());
  const hello = async (extra: Record<string, unknown>) => {
    const s = net.connect({ host: '127.0.0.1', port: xp });
    await new Promise((r) => s.once('connect', r));
    closers.push(() => s.destroy());
    return new Promise<any>((resolve) => {
      const p = new FrameParser(0, () => null, (_t, meta) => resolve(meta));
      s.on('data', (d) => p.push(d));
      writeFrame(s, FrameType.Hello, { version: PROTOCOL_VERSION, sender_id: 'x', model_id: 'm', chunk_size: 16, dtype: layout.dtype, num_layers: 2, num_kv_heads: 2, head_dim: 8, ...extra });
    });
  };
  const refused = await hello({});
  assert.equal(refused.ok, false);
  assert.match(refused.error, /deployment secret/);
  const base = { version: PROTOCOL_VERSION, sender_id: 'x', model_id: 'm', chunk_size: 16, dtype: layout.dtype, num_layers: 2, num_kv_heads: 2, head_dim: 8 };
  assert.equal((await hello(seal(SECRET, 'xfer-hello', base))).ok, true);

  // Transfer notices.
  const np = await freePortRange(1);
  const got: XferNotice[] = [];
  const rxn = new NotifyReceiver((n) => got.push(n));
  await rxn.bind('127.0.0.1', np);
  closers.push(() => rxn.close());
  const push = new Push({ linger: 0 });
  push.connect(`tcp://127.0.0.1:${np}`);
  closers.push(() => push.close());
  const notice = { req_id: 'r1', prefiller: 'p', num_chunks: 1, num_tokens: 16, ok: true };
  await push.send(encodeNotice(notice));
  await push.send(encodeNotice(seal(SECRET, 'notice', { ...notice, req_id: 'r2' })));
  const end = Date.now() + 5_000;
  while (got.length < 1 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
  await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual(got.map((n) => n.req_id), ['r2'], 'only the signed notice is taken');
  assert.equal(rxn.droppedCount, 1);
});

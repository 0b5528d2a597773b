// Replay protection on a live 1P1D deployment (`kvc up`, deployment secret, docs/security.md
// "Replay"): for each channel the deployment secret authenticates — the controller's signed
// mutations, the instance worker's commands, monitor registration, transfer notices, the xfer
// handshake — a message is taken once, the same message again is refused by its nonce, one with
// a timestamp outside the window by its timestamp, and each refusal is a 4xx (or a refusal reply)
// naming the reason and counted in kvc_auth_refused_total. A burst of legitimate signed calls is
// all accepted. After a controller restart its nonce memory is gone: a message captured before
// it is taken once more, while its timestamp is within the window, and never after.
// The deployment runs with --replay-window 600 so that "within the window" holds however slowly a
// loaded machine restarts the controller; "outside" uses timestamps 700 s away.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Dealer, Push } from 'zeromq';
import { startDeployment, alive, type Deployment } from '../../harness/deployment.js';
import { eventually, processImage, respawn, signal } from '../../harness/faults.js';
import { seal, signedHeaders } from '../../src/common/replay.js';
import { decodeMsg, encodeMsg, MONITOR_PROTOCOL_VERSION } from '../../src/protocol/monitor.js';
import { encodeNotice } from '../../src/protocol/xfer_notice.js';
import { FrameParser, FrameType, PROTOCOL_VERSION, writeFrame } from '../../src/protocol/xfer_frames.js';

const WINDOW_S = 600;
const FAR_MS = 700_000;

interface Answer {
  status: number;
  code: string | null;
  message: string;
}

async function post(url: string, body: unknown, headers: Record<string, string>): Promise<Answer> {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body), signal: AbortSignal.timeout(60_000) });
  const j = (await r.json()) as { error?: { code: string | null; message: string } };
  return { status: r.status, code: j.error?.code ?? null, message: j.error?.message ?? '' };
}

/** kvc_auth_refused_total{channel, reason} from a /metrics page (0 when absent). */
async function refused(metricsUrl: string, channel: string, reason: string): Promise<number> {
  const text = await (await fetch(metricsUrl, { signal: AbortSignal.timeout(30_000) })).text();
  const m = new RegExp(`^kvc_auth_refused_total\\{channel="${channel}",reason="${reason}"[^}]*\\} (\\d+)`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

describe('replay protection of the internal channels (1P1D, deployment secret)', () => {
  let dep: Deployment;
  const children: ChildProcess[] = [];

  before(async () => {
    // No automatic restarts: the test restarts the controller itself.
    dep = await startDeployment({ prefillers: 1, decoders: 1, args: ['--replay-window', String(WINDOW_S), '--max-restarts', '0'] });
  });
  after(async () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    await dep?.stop();
  });

  const clearBody = { instance_id: 'decoder-0', location: 'LocalCPUBackend' };

  test('controller /clear: a signed call is taken once; replayed, backdated, post-dated or altered it is refused', async () => {
    const ctl = `${dep.controller}/clear`;
    const h = signedHeaders(dep.secret, 'POST', '/clear', clearBody);
    const first = await post(ctl, clearBody, h);
    assert.equal(first.status, 200, first.message);
    const again = await post(ctl, clearBody, h);
    assert.deepEqual([again.status, again.code], [401, 'replayed_nonce'], again.message);
    const old = await post(ctl, clearBody, signedHeaders(dep.secret, 'POST', '/clear', clearBody, Date.now() - FAR_MS));
    assert.deepEqual([old.status, old.code], [401, 'stale_timestamp'], old.message);
    assert.match(old.message, /outside the replay window of 600 s/);
    const future = await post(ctl, clearBody, signedHeaders(dep.secret, 'POST', '/clear', clearBody, Date.now() + FAR_MS));
    assert.deepEqual([future.status, future.code], [401, 'stale_timestamp'], future.message);
    const altered = await post(ctl, { ...clearBody, instance_id: 'prefiller-0' }, signedHeaders(dep.secret, 'POST', '/clear', clearBody));
    assert.deepEqual([altered.status, altered.code], [401, 'invalid_deployment_secret'], 'a captured signature on another body');
    const m = `${dep.controller}/metrics`;
    assert.equal(await refused(m, 'controller-http', 'replayed_nonce'), 1);
    assert.equal(await refused(m, 'controller-http', 'stale_timestamp'), 2);
    assert.equal(await refused(m, 'controller-http', 'invalid_deployment_secret'), 1);
    // The operator's bearer path (dashboard, LMCache-style scripts) still works; it has no replay protection.
    assert.equal((await post(ctl, clearBody, { authorization: `Bearer ${dep.secret}` })).status, 200);
  });

  test('proxy: completions are answered beside the guarded POST /routing/reset, which refuses a replay', async () => {
    // The guard's signature check runs only on the guarded route: the OpenAI endpoints are untouched.
    const r = await fetch(`${dep.proxy}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'builtin:tiny', prompt: 'Replay', max_tokens: 2, temperature: 0 }), signal: AbortSignal.timeout(120_000) });
    assert.equal(r.status, 200);
    assert.equal(((await r.json()) as { choices: unknown[] }).choices.length, 1);
    const h = signedHeaders(dep.secret, 'POST', '/routing/reset', {});
    assert.equal((await post(`${dep.proxy}/routing/reset`, {}, h)).status, 200);
    const again = await post(`${dep.proxy}/routing/reset`, {}, h);
    assert.deepEqual([again.status, again.code], [401, 'replayed_nonce'], again.message);
    assert.equal(await refused(`${dep.proxy}/metrics`, 'proxy-http', 'replayed_nonce'), 1);
  });

  test('a burst of legitimate signed calls is all accepted', async () => {
    const before0 = await refused(`${dep.controller}/metrics`, 'controller-http', 'replayed_nonce');
    const answers = await Promise.all(Array.from({ length: 48 }, () => post(`${dep.controller}/clear`, clearBody, signedHeaders(dep.secret, 'POST', '/clear', clearBody))));
    assert.deepEqual(answers.filter((a) => a.status !== 200), [], 'every call of the burst answered 200');
    assert.equal(await refused(`${dep.controller}/metrics`, 'controller-http', 'replayed_nonce'), before0);
  });

  test('instance worker commands: signed only; a replayed command is refused', async () => {
    const dec = dep.engines.find((e) => e.role === 'decoder')!;
    const url = `http://127.0.0.1:${dec.worker}/lookup`;
    const body = { keys: ['0123456789abcdef'], location: 'LocalCPUBackend' };
    const h = signedHeaders(dep.secret, 'POST', '/lookup', body);
    assert.equal((await post(url, body, h)).status, 200);
    const again = await post(url, body, h);
    assert.deepEqual([again.status, again.code], [401, 'replayed_nonce'], again.message);
    const bearer = await post(url, body, { authorization: `Bearer ${dep.secret}` });
    assert.deepEqual([bearer.status, bearer.code], [401, 'invalid_deployment_secret'], 'the worker port takes signed calls only');
    assert.equal(await refused(dec.http + '/metrics', 'worker-http', 'replayed_nonce'), 1);
  });

  test('monitor registration: a captured register is refused when replayed, and when its timestamp is old', async () => {
    type Worker = { model_id: string; chunk_size: number; kv_dtype: string };
    const listed = (await (await fetch(`${dep.controller}/instances`)).json()) as { instances: { instance_id: string; workers: Worker[] }[] };
    const inst = listed.instances.find((i) => i.instance_id === 'decoder-0')!.workers[0]!;
    const register = (ts: number) =>
      seal(dep.secret, 'monitor', {
        t: 'register', v: MONITOR_PROTOCOL_VERSION, instance_id: 'replay-probe', worker_id: 0, session: 'replay-probe-session', ip: '127.0.0.1', worker_port: 1,
        distributed_url: null, chunk_size: inst.chunk_size, model_id: inst.model_id, seed: '0', kv_dtype: inst.kv_dtype, locations: ['LocalCPUBackend'], pid: process.pid,
      }, ts);
    const exchange = async (msg: Uint8Array) => {
      const d = new Dealer({ linger: 0, receiveTimeout: 30_000 });
      d.connect(`tcp://127.0.0.1:${dep.monitorPort}`);
      try {
        await d.send(msg);
        const [reply] = await d.receive();
        return decodeMsg(reply!) as { t: string; message?: string };
      } finally {
        d.close();
      }
    };
    const captured = encodeMsg(register(Date.now()) as never);
    const welcome = await exchange(captured);
    assert.equal(welcome.t, 'welcome', welcome.message);
    const again = await exchange(captured);
    assert.equal(again.t, 'error');
    assert.match(again.message ?? '', /replayed_nonce/);
    const old = await exchange(encodeMsg(register(Date.now() - FAR_MS) as never));
    assert.equal(old.t, 'error');
    assert.match(old.message ?? '', /stale_timestamp/);
    assert.equal(await refused(`${dep.controller}/metrics`, 'monitor', 'replayed_nonce'), 1);
  });

  test('transfer notices: a replayed or stale notice is dropped and counted by the proxy', async () => {
    // The socket stays open until the proxy counted them: a PUSH closed with linger 0 drops what it still queues.
    const push = new Push({ linger: 0 });
    push.connect(`tcp://127.0.0.1:${dep.notifyPort}`);
    try {
      const notice = seal(dep.secret, 'notice', { req_id: 'replay-probe', prefiller: 'prefiller-0', num_chunks: 1, num_tokens: 4, ok: true });
      await push.send(encodeNotice(notice));
      await push.send(encodeNotice(notice));
      await push.send(encodeNotice(seal(dep.secret, 'notice', { req_id: 'replay-probe-old', prefiller: 'prefiller-0', num_chunks: 1, num_tokens: 4, ok: true }, Date.now() - FAR_MS)));
      const m = `${dep.proxy}/metrics`;
      assert.ok(await eventually(async () => (await refused(m, 'notice', 'replayed_nonce')) === 1 && (await refused(m, 'notice', 'stale_timestamp')) === 1, 60_000), 'one replayed and one stale notice counted');
    } finally {
      push.close();
    }
  });

  test('xfer handshake: a captured HELLO replayed is refused by its nonce', async () => {
    const dec = dep.engines.find((e) => e.role === 'decoder')!;
    const hello = async (meta: Record<string, unknown>) => {
      const s = net.connect({ host: '127.0.0.1', port: dec.xferInit! });
      try {
        await new Promise((r, j) => s.once('connect', r).once('error', j));
        return await new Promise<{ ok: boolean; error?: string }>((resolve) => {
          const p = new FrameParser(0, () => null, (_t, m) => resolve(m as { ok: boolean; error?: string }));
          s.on('data', (d) => p.push(d));
          writeFrame(s, FrameType.Hello, meta);
        });
      } finally {
        s.destroy();
      }
    };
    // A layout the decoder does not have: the first HELLO passes the seal and is refused for its
    // layout (the nonce is spent either way); the same HELLO again is refused as a replay.
    const captured = seal(dep.secret, 'xfer-hello', { version: PROTOCOL_VERSION, sender_id: 'replay-probe', model_id: 'm', chunk_size: 16, dtype: 0, num_layers: 1, num_kv_heads: 1, head_dim: 1 });
    const first = await hello(captured);
    assert.equal(first.ok, false);
    assert.match(first.error ?? '', /incompatible sender/);
    const again = await hello(captured);
    assert.equal(again.ok, false);
    assert.match(again.error ?? '', /replayed_nonce/);
    assert.equal(await refused(dec.http + '/metrics', 'xfer-hello', 'replayed_nonce'), 1);
  });

  test('across a controller restart the nonce memory is lost: the window still bounds a replay', async () => {
    const body = clearBody;
    const captured = signedHeaders(dep.secret, 'POST', '/clear', body);
    const staleCapture = signedHeaders(dep.secret, 'POST', '/clear', body, Date.now() - FAR_MS);
    assert.equal((await post(`${dep.controller}/clear`, body, captured)).status, 200);
    const pid = dep.pids.get('controller')!;
    const image = processImage(pid);
    signal(pid, 'SIGKILL');
    assert.ok(await eventually(() => !alive(pid), 10_000, 20));
    const child = respawn(image, join(dep.logDir, 'controller.restarted.log'));
    children.push(child);
    assert.ok(await eventually(async () => (await fetch(`${dep.controller}/healthz`).catch(() => null))?.status === 200, 60_000), 'the controller is back');
    // A fresh process remembers no nonce: the captured call is taken once more (it is within
    // the window: docs/security.md says so), then refused again; a capture older than the
    // window stays refused.
    const replayed = await post(`${dep.controller}/clear`, body, captured);
    assert.ok(![401, 429].includes(replayed.status), `taken by the restarted controller (${replayed.status} ${replayed.code}: ${replayed.message})`);
    const twice = await post(`${dep.controller}/clear`, body, captured);
    assert.deepEqual([twice.status, twice.code], [401, 'replayed_nonce']);
    const stale = await post(`${dep.controller}/clear`, body, staleCapture);
    assert.deepEqual([stale.status, stale.code], [401, 'stale_timestamp']);
  });
});

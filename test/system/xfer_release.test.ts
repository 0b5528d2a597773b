// Reservations are released in every terminal state (docs/disaggregation.md "Every transfer
// ends"), on a live 1P1D deployment (`kvc up`, built-in model): a client that leaves after its
// prompt's KV reached the decoder but before the decode, one that leaves during the prefill, one
// that leaves during the decode, a proxy killed during the prefill, and a prefiller killed during
// it. Each time the decoder's kvc_xfer_reservations and kvc_xfer_reserved_bytes return to 0 far
// sooner than the reservation TTL (120 s; waited for with a bound of 30 s, never timed: the one
// case no request ends, the killed proxy's, is freed by the 10 s claim window), and the counters
// by outcome say how each ended. Processes are held at the stage wanted with SIGSTOP, so
// no step depends on how fast the machine is.
import { test, before, after, afterEach, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { alive, startDeployment, type Deployment } from '../../harness/deployment.js';
import { eventually, signal } from '../../harness/faults.js';
import { RESERVATION_TTL_MS } from '../../src/xfer/receiver.js';

/** Far below the TTL: a reservation still held this long after its request ended was not released by it. */
const RELEASED_WITHIN_MS = 30_000;
assert.ok(RELEASED_WITHIN_MS * 3 < RESERVATION_TTL_MS);

type Metrics = (name: string, labels?: string) => number;
async function metricsOf(url: string): Promise<Metrics> {
  const text = await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(10_000) })).text();
  return (name, labels = '') => {
    let sum = 0;
    for (const line of text.split('\n')) {
      if (!line.startsWith(name)) continue;
      const rest = line.slice(name.length);
      if (!(rest.startsWith(' ') || rest.startsWith('{'))) continue;
      if (labels && !rest.includes(labels)) continue;
      sum += Number(line.split(' ').pop());
    }
    return sum;
  };
}

/**
 * Bytes received and not yet read by sockets bound to local `port` (/proc/net/tcp's rx_queue):
 * a stopped process's request is known to have arrived when its socket holds them.
 */
function unreadBytes(port: number): number {
  let n = 0;
  for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 5 || parseInt(f[1]!.split(':')[1]!, 16) !== port) continue;
    n += parseInt(f[4]!.split(':')[1]!, 16);
  }
  return n;
}

/** A prompt of token ids (no tokenize call), different per `seed` so no cache serves it. */
const prompt = (seed: number, n = 400) => Array.from({ length: n }, (_, i) => 1 + ((i * 7 + seed * 131) % 250));

describe('reservations released at every terminal state (1P1D)', () => {
  let dep: Deployment;
  let decoder = '';
  const pid = (name: string) => dep.pids.get(name)!;

  before(async () => {
    // kvc up restarts what is killed (the proxy's restart is the case tested).
    dep = await startDeployment({ prefillers: 1, decoders: 1 });
    decoder = dep.engines.find((e) => e.role === 'decoder')!.http;
  });
  // A test that failed half way must not leave a process stopped for the next one.
  afterEach(() => {
    for (const name of ['prefiller-0', 'proxy']) if (dep?.pids.get(name)) signal(pid(name), 'SIGCONT');
  });
  after(async () => {
    await dep?.stop();
  });

  /** The decoder's reservation gauges and counters. */
  const decoderState = async () => {
    const m = await metricsOf(decoder);
    return {
      reservations: m('kvc_xfer_reservations'),
      reservedBytes: m('kvc_xfer_reserved_bytes'),
      transfers: ['done', 'failed', 'abandoned'].map((o) => m('kvc_xfer_transfers_total', `outcome="${o}"`)),
      ended: ['taken', 'released', 'expired'].map((h) => m('kvc_xfer_reservations_ended_total', `how="${h}"`)),
    };
  };
  const transfersEnded = (s: Awaited<ReturnType<typeof decoderState>>) => s.transfers.reduce((a, b) => a + b, 0);
  /** Waits (bounded, far below the TTL) until the decoder holds no reservation and no reserved byte. */
  const releasedSoon = async (what: string) => {
    const ok = await eventually(async () => {
      const s = await decoderState();
      return s.reservations === 0 && s.reservedBytes === 0;
    }, RELEASED_WITHIN_MS);
    assert.ok(ok, `${what}: the decoder still holds ${JSON.stringify(await decoderState())} ${RELEASED_WITHIN_MS} ms later (TTL ${RESERVATION_TTL_MS} ms)`);
    return decoderState();
  };
  /** Completion requests the prefiller ended, whatever the outcome (ok, cancelled, error). */
  const prefillerAnswered = async () => (await metricsOf(dep.engines.find((e) => e.role === 'prefiller')!.http))('kvc_engine_requests_total', 'endpoint="/v1/completions"');
  const prefillInFlight = async () => (await metricsOf(dep.proxy))('kvc_proxy_prefill_in_flight');
  const send = (p: number[], ac: AbortController, maxTokens = 8) =>
    fetch(`${dep.proxy}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'builtin:tiny', prompt: p, max_tokens: maxTokens, temperature: 0, stream: true }),
      signal: ac.signal,
    });
  const text = async (res: Response) => {
    const out: string[] = [];
    for (const line of (await res.text()).split('\n')) {
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      out.push(JSON.parse(line.slice(6)).choices?.[0]?.text ?? '');
    }
    return out.join('');
  };
  /** Sends `p` with the prefiller stopped and returns once the proxy's prefill call to it is out. */
  const sendToStoppedPrefiller = async (p: number[], ac: AbortController) => {
    signal(pid('prefiller-0'), 'SIGSTOP');
    const res = send(p, ac).catch((e: Error) => e);
    const port = Number(new URL(dep.engines.find((e) => e.role === 'prefiller')!.http).port);
    assert.ok(await eventually(async () => (await prefillInFlight()) === 1 && unreadBytes(port) > 0, 30_000, 20), 'the proxy called the prefiller');
    return { res };
  };

  test('a whole request: its transfer done, taken by its decode, nothing left reserved', async () => {
    const s0 = await decoderState();
    const res = await send(prompt(1), new AbortController());
    assert.equal(res.status, 200);
    assert.ok((await text(res)).length > 0);
    const s1 = await releasedSoon('after a whole request');
    assert.equal(s1.transfers[0]! - s0.transfers[0]!, 1, 'one transfer done');
    assert.equal(s1.ended[0]! - s0.ended[0]!, 1, 'its reservation freed by the request that took it');
  });

  test('client gone after its KV reached the decoder, before the decode: released at once, not at the TTL', async () => {
    const s0 = await decoderState();
    const ac = new AbortController();
    const { res } = await sendToStoppedPrefiller(prompt(2), ac);
    // The proxy stopped too: the prefiller computes, the KV goes to the decoder and the answer
    // waits in the proxy's socket; the client leaves before the proxy can call the decoder.
    signal(pid('proxy'), 'SIGSTOP');
    signal(pid('prefiller-0'), 'SIGCONT');
    const ended = await eventually(async () => transfersEnded(await decoderState()) > transfersEnded(s0), 30_000, 20);
    const prefiller = dep.engines.find((e) => e.role === 'prefiller')!.http;
    assert.ok(ended, `the transfer ended: ${JSON.stringify({ s0, now: await decoderState(), prefiller: (await metricsOf(prefiller))('kvc_engine_requests_total', '/v1/completions') })} ${dep.logDir}`);
    const held = await decoderState();
    assert.equal(held.reservations, 1, 'the transfer holds its reservation until a request takes it');
    ac.abort();
    await res;
    signal(pid('proxy'), 'SIGCONT');
    const s1 = await releasedSoon('client gone before the decode');
    // Released by the proxy (the client left first) or taken by a decode the abort then cut.
    assert.equal(s1.ended[0]! + s1.ended[1]! - (s0.ended[0]! + s0.ended[1]!), 1, `freed as taken or released: ${JSON.stringify({ s0, s1 })}`);
    assert.equal(s1.ended[2], s0.ended[2], 'not by expiry');
    const p = await metricsOf(dep.proxy);
    assert.ok(p('kvc_proxy_xfer_releases_total', 'result="failed"') === 0, 'the decoder answered the release');
  });

  test('client gone during the prefill: no reservation is left (a transfer arriving after the release is refused)', async () => {
    const s0 = await decoderState();
    const ac = new AbortController();
    const answered0 = await prefillerAnswered();
    const { res } = await sendToStoppedPrefiller(prompt(3), ac);
    const cancelled0 = (await metricsOf(dep.proxy))('kvc_proxy_client_disconnects_total');
    ac.abort();
    await res;
    // The proxy saw the client go (and released the transfer on the decoder) before the prefiller resumes.
    assert.ok(await eventually(async () => (await metricsOf(dep.proxy))('kvc_proxy_client_disconnects_total') > cancelled0 && (await prefillInFlight()) === 0, 30_000, 20));
    assert.ok(await eventually(async () => (await metricsOf(dep.proxy))('kvc_proxy_xfer_releases_total') >= 1, 30_000, 20), 'the proxy released the transfer');
    signal(pid('prefiller-0'), 'SIGCONT');
    // Whatever the prefiller does with the abandoned request (cancel it, or finish it and try to
    // send), it is done with it within the bound, and nothing stays reserved.
    assert.ok(await eventually(async () => (await prefillerAnswered()) > answered0, 30_000), 'the prefiller ended the request');
    const s1 = await releasedSoon('client gone during the prefill');
    assert.equal(s1.ended[2], s0.ended[2], 'not by expiry');
    assert.equal(s1.ended[0], s0.ended[0], 'no request took a reservation');
  });

  test('client gone during the decode: the reservation was freed by the decode itself', async () => {
    const s0 = await decoderState();
    const ac = new AbortController();
    const res = await send(prompt(4), ac, 400);
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    await reader.read(); // the first piece of the stream: the decode is running
    ac.abort();
    await reader.cancel().catch(() => undefined);
    const s1 = await releasedSoon('client gone during the decode');
    assert.equal(s1.transfers[0]! - s0.transfers[0]!, 1, 'its transfer done');
    assert.equal(s1.ended[0]! - s0.ended[0]!, 1, 'freed by the request that took it');
  });

  test('proxy killed during the prefill: restarted by kvc up, it serves, and nothing stays reserved', async () => {
    const s0 = await decoderState();
    const { res } = await sendToStoppedPrefiller(prompt(5), new AbortController());
    const old = pid('proxy');
    signal(old, 'SIGKILL');
    await eventually(() => !alive(old), 10_000, 20);
    await res;
    signal(pid('prefiller-0'), 'SIGCONT');
    assert.ok(await eventually(async () => dep.refreshPids().get('proxy') !== old && (await fetch(`${dep.proxy}/health`).catch(() => null))?.status === 200, 120_000), 'kvc up restarted the proxy');
    // A request through the restarted proxy: the prefiller takes requests in order, so by its end
    // the orphaned one has been computed and any transfer of it has asked the decoder for room.
    const again = await send(prompt(7), new AbortController());
    assert.equal(again.status, 200);
    assert.ok((await text(again)).length > 0);
    // Its transfer ended with no request to claim it (the proxy that would have called the
    // decoder died): freed by the claim window after the transfer ended, not by the TTL.
    const s1 = await releasedSoon('proxy killed during the prefill');
    assert.equal(s1.ended[0]! - s0.ended[0]!, 1, 'only the later request took a reservation');
    assert.ok(s1.transfers[0]! - s0.transfers[0]! <= 2);
  });

  test('prefiller killed during the prefill: the decoder computes the prompt, same tokens, nothing reserved', async () => {
    const reference = await text(await send(prompt(6), new AbortController()));
    await releasedSoon('the reference request');
    const s0 = await decoderState();
    const { res } = await sendToStoppedPrefiller(prompt(6), new AbortController());
    signal(pid('prefiller-0'), 'SIGKILL');
    const r = await res;
    assert.ok(r instanceof Response && r.status === 200, `answered: ${r instanceof Response ? r.status : r.message}`);
    const got = await text(r);
    const s1 = await releasedSoon('prefiller killed during the prefill');
    assert.equal(s1.ended[2], s0.ended[2], 'not by expiry');
    assert.equal(got, reference, 'the greedy tokens of the request served with the prefiller');
  });
});

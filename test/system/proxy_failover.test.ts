// Failure classes of the proxy against in-test upstreams (harness/proxy_stub.ts): a request that an
// engine answers with 500 while it is healthy does not take that engine out of rotation; a refused
// decoder connection (nothing sent yet) is retried on another decoder, token-id prompts included;
// a hung decoder is found by the health loop and the calls stalled on it fail over; a busy backend
// whose health answer is slow but which keeps streaming is not marked down.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { freePortRange } from '../../harness/ports.js';
import { ProxyServer } from '../../src/proxy/server.js';
import { startStubEngine, type StubEngine } from '../../harness/proxy_stub.js';

describe('proxy failure classes', () => {
  let P: StubEngine[] = [];
  let D: StubEngine[] = [];
  let proxy: ProxyServer;
  let base = '';

  const post = async (path: string, body: unknown, timeoutMs = 20_000) => {
    const r = await fetch(base + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs) });
    return { status: r.status, text: await r.text() };
  };
  const reset = async () => {
    for (const s of [...P, ...D]) {
      s.requests.length = 0;
      s.mode = 'ok';
      s.delayMs = 0;
      s.streamDelayMs = 0;
      s.healthDelayMs = 0;
    }
    const end = Date.now() + 10_000;
    while (![...proxy.prefillers, ...proxy.decoders].every((b) => b.up)) {
      assert.ok(Date.now() < end, 'every backend back up');
      await new Promise((r) => setTimeout(r, 50));
    }
  };
  const waitUntil = async (cond: () => boolean, ms: number, what: string) => {
    const end = Date.now() + ms;
    while (!cond()) {
      assert.ok(Date.now() < end, `timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 25));
    }
  };

  before(async () => {
    P = [await startStubEngine('p0'), await startStubEngine('p1')];
    D = [await startStubEngine('d0'), await startStubEngine('d1')];
    const port = await freePortRange(1);
    proxy = new ProxyServer({
      host: '127.0.0.1',
      port,
      topology: {
        prefillers: P.map((s) => ({ host: '127.0.0.1', port: s.port })),
        decoders: D.map((s, i) => ({ host: '127.0.0.1', port: s.port, initPort: 7300 + i, allocPort: 7400 + i })),
      },
      notify: null,
      timeouts: { tokenizeMs: 5_000, prefillMs: 10_000, decodeMs: 10_000, idleMs: 10_000 },
      healthIntervalMs: 200,
      healthTimeoutMs: 400,
      statsIntervalMs: 60_000,
      statsSink: () => undefined,
    });
    await proxy.start();
    base = `http://127.0.0.1:${proxy.port}`;
  });
  after(async () => {
    await proxy?.stop();
    for (const s of [...P, ...D]) await s.close().catch(() => undefined);
  });

  test('a 500 answered by a healthy engine does not mark it down (the request may be at fault)', async () => {
    await reset();
    P[0]!.mode = 'reject';
    P[1]!.mode = 'reject';
    D[0]!.mode = 'reject';
    D[1]!.mode = 'reject';
    const all = [...proxy.prefillers, ...proxy.decoders];
    const changed = all.map((b) => b.lastChange);
    for (let i = 0; i < 4; i++) {
      const r = await post('/v1/completions', { prompt: [1, 2, i], max_tokens: 2 });
      assert.equal(r.status, 502, r.text);
      assert.equal(JSON.parse(r.text).error.type, 'upstream_error');
    }
    // Let the health probes the 500s asked for run: they find every engine healthy.
    await new Promise((r) => setTimeout(r, 600));
    assert.deepEqual(all.map((b) => b.up), [true, true, true, true], 'no backend marked down by a request it answered');
    assert.deepEqual(all.map((b) => b.lastChange), changed, 'not even for a moment');
    const h = (await (await fetch(base + '/health')).json()) as { status: string };
    assert.equal(h.status, 'ok');
  });

  test('a refused decoder is retried on the other decoder (text and token-id prompts, streamed or not)', async () => {
    await reset();
    const closed = await freePortRange(1); // nothing listens there: connections are refused
    for (const body of [
      { prompt: [5, 6, 7], max_tokens: 2 },
      { prompt: [5, 6, 8], max_tokens: 2, stream: true },
      { prompt: 'text prompt', max_tokens: 2 },
      { messages: [{ role: 'user', content: 'chat' }], max_tokens: 2, stream: true },
    ]) {
      // A proxy whose first decoder (first in the round-robin, still believed up) refuses.
      const port = await freePortRange(1);
      const px = new ProxyServer({
        host: '127.0.0.1',
        port,
        topology: {
          prefillers: P.map((s) => ({ host: '127.0.0.1', port: s.port })),
          decoders: [
            { host: '127.0.0.1', port: closed, initPort: 7300, allocPort: 7400 },
            { host: '127.0.0.1', port: D[1]!.port, initPort: 7301, allocPort: 7401 },
          ],
        },
        notify: null,
        timeouts: { tokenizeMs: 5_000, prefillMs: 10_000, decodeMs: 10_000, idleMs: 10_000 },
        healthIntervalMs: 600_000,
        statsIntervalMs: 600_000,
        statsSink: () => undefined,
      });
      await px.start();
      try {
        const path = 'messages' in body ? '/v1/chat/completions' : '/v1/completions';
        const r = await fetch(`http://127.0.0.1:${px.port}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: AbortSignal.timeout(20_000) });
        const text = await r.text();
        assert.equal(r.status, 200, `${JSON.stringify(body)}: ${text}`);
        assert.doesNotMatch(text, /"error"/);
        assert.equal(px.decoders[0]!.up, false, 'the refusing decoder is marked down');
      } finally {
        await px.stop();
      }
    }
  });

  test('a hung decoder is marked down by the health loop and its stalled request fails over', async () => {
    await reset();
    D[0]!.mode = 'hang'; // completions never answer
    D[1]!.mode = 'ok';
    D[0]!.healthDelayMs = 600_000; // and neither does /health: hung, not busy
    const rs = await Promise.all([0, 1, 2, 3].map((i) => post('/v1/completions', { prompt: [9, 9, i], max_tokens: 2 }, 15_000)));
    assert.deepEqual(rs.map((r) => r.status), [200, 200, 200, 200], rs.map((r) => r.text).join('\n'));
    assert.equal(proxy.decoders[0]!.up, false, 'the hung decoder is down');
    D[0]!.healthDelayMs = 0;
    D[0]!.mode = 'ok';
  });

  test('a busy backend (slow health answer, streaming data) is not marked down', async () => {
    await reset();
    D[0]!.healthDelayMs = 1_500; // slower than the 400 ms health timeout
    D[1]!.healthDelayMs = 1_500;
    D[0]!.streamDelayMs = 100;
    D[1]!.streamDelayMs = 100;
    const rs = await Promise.all([0, 1, 2, 3].map((i) => post('/v1/completions', { prompt: [3, 3, i], max_tokens: 25, stream: true }, 20_000)));
    assert.deepEqual(rs.map((r) => r.status), [200, 200, 200, 200]);
    for (const r of rs) assert.doesNotMatch(r.text, /"error"/, 'no stream was cut');
    assert.deepEqual(proxy.decoders.map((d) => d.up), [true, true], 'busy decoders stayed up');
  });
});

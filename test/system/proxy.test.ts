// The proxy against in-test upstreams (harness/proxy_stub.ts): routing and the request rewrite,
// round-robin, prefiller failover (error, refused, timeout) and recovery, all-prefillers-down
// fallback, decoder failure → 502, client disconnect, the notify port, metrics and the statistics
// lines. Its parts that need no server (topology flags, round-robin order, SSE scan, TTFT
// statistics) are tested in test/unit/proxy_parts.test.ts.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { Push } from 'zeromq';
import { encode } from '@msgpack/msgpack';
import { spawn } from 'node:child_process';
import { freePortRange } from '../../harness/ports.js';
import { ProxyServer } from '../../src/proxy/server.js';
import { LONG_TEXT_CHARS } from '../../src/proxy/flow.js';
import { CLI } from '../../harness/proc.js';
import { STUB_CONTEXT, startStubEngine, stubWords, type StubEngine } from '../../harness/proxy_stub.js';

describe('proxy against stub engines', () => {
  let P: StubEngine[] = [];
  let D: StubEngine[] = [];
  let proxy: ProxyServer;
  let base = '';
  let notifyPort = 0;
  const statsLines: string[] = [];

  const post = async (path: string, body: unknown, signal?: AbortSignal) => {
    const r = await fetch(base + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: signal ?? AbortSignal.timeout(10_000) });
    return { status: r.status, text: await r.text(), type: r.headers.get('content-type') ?? '' };
  };
  const completions = (stub: StubEngine) => stub.requests.filter((r) => r.path !== '/tokenize');
  const reset = () => {
    for (const s of [...P, ...D]) {
      s.requests.length = 0;
      s.mode = 'ok';
      s.delayMs = 0;
      s.streamDelayMs = 0;
      s.aborted = 0;
      s.maxModelLen = STUB_CONTEXT;
    }
  };
  const metricValue = async (re: RegExp) => Number((await (await fetch(base + '/metrics')).text()).match(re)?.[1] ?? NaN);
  const waitUntil = async (cond: () => boolean | Promise<boolean>, ms: number, what: string) => {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      if (await cond()) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.fail(`timed out after ${ms} ms waiting for ${what}`);
  };

  before(async () => {
    P = [await startStubEngine('p0'), await startStubEngine('p1')];
    D = [await startStubEngine('d0'), await startStubEngine('d1')];
    const ports = await freePortRange(2);
    notifyPort = ports + 1;
    proxy = new ProxyServer({
      host: '127.0.0.1',
      port: ports,
      topology: {
        prefillers: P.map((s) => ({ host: '127.0.0.1', port: s.port })),
        decoders: D.map((s, i) => ({ host: '127.0.0.1', port: s.port, initPort: 7300 + i, allocPort: 7400 + i })),
      },
      notify: { host: '127.0.0.1', port: notifyPort },
      timeouts: { tokenizeMs: 2_000, prefillMs: 800, decodeMs: 2_000, idleMs: 2_000 },
      healthIntervalMs: 150,
      statsIntervalMs: 300,
      statsSink: (l) => statsLines.push(l),
    });
    await proxy.start();
    base = `http://127.0.0.1:${proxy.port}`;
  });
  after(async () => {
    await proxy?.stop();
    for (const s of [...P, ...D]) await s.close().catch(() => undefined);
  });

  test('non-streamed completion: prefiller gets max_tokens=1/stream=false/disagg_spec, decoder the original request', async () => {
    reset();
    const r = await post('/v1/completions', { model: 'stub', prompt: 'hello there world', max_tokens: 5, stream_options: { include_usage: true } });
    assert.equal(r.status, 200, r.text);
    const j = JSON.parse(r.text);
    assert.equal(j.choices[0].text, stubWords('hello there world', 5).join(''));
    assert.equal(j.usage.completion_tokens, 5);
    const all = [...P, ...D];
    const pre = all.flatMap((s) => completions(s).filter((q) => q.body.max_tokens === 1).map((q) => ({ s, q })));
    assert.equal(pre.length, 1);
    const pb = pre[0]!.q.body;
    assert.equal(pb.stream, false);
    assert.equal(pb.stream_options, undefined);
    const spec = (pb.kv_transfer_params as any).disagg_spec;
    assert.match(spec.req_id, /^kvc-/);
    assert.equal(spec.receiver_host, '127.0.0.1');
    const dec = D.find((d) => completions(d).length === 1)!;
    assert.ok(dec, 'one decoder got the request');
    const di = D.indexOf(dec);
    assert.equal(spec.receiver_init_port, 7300 + di);
    assert.equal(spec.receiver_alloc_port, 7400 + di);
    const db = completions(dec)[0]!.body;
    assert.equal(db.max_tokens, 5);
    assert.deepEqual((db.kv_transfer_params as any).disagg_spec, spec, 'decoder gets the same disagg_spec');
    assert.equal(dec.requests.filter((q) => q.path === '/tokenize').length, 1, 'a short text is tokenized on its decoder');
    // The ids go to the prefiller and the decoder, which do not tokenize the text again.
    assert.deepEqual((pb.kv_transfer_params as any).kvc_prompt_token_ids, [1, 2, 3]);
    assert.deepEqual((db.kv_transfer_params as any).kvc_prompt_token_ids, [1, 2, 3]);
  });

  test('a long text is tokenized on a prefiller, in turns, never on a decoder', async () => {
    reset();
    const text = Array.from({ length: 400 }, (_, i) => `w${i}`).join(' ');
    assert.ok(text.length >= LONG_TEXT_CHARS);
    for (let i = 0; i < 4; i++) {
      const r = await post('/v1/completions', { model: 'stub', prompt: text, max_tokens: 2 });
      assert.equal(r.status, 200, r.text);
    }
    assert.deepEqual(D.map((d) => d.requests.filter((q) => q.path === '/tokenize').length), [0, 0]);
    assert.deepEqual(P.map((p) => p.requests.filter((q) => q.path === '/tokenize').length), [2, 2]);
    // The prefills still take turns over both prefillers, and every decoder got its ids.
    assert.deepEqual(P.map((p) => completions(p).length), [2, 2]);
    for (const q of D.flatMap(completions)) assert.equal((q.body.kv_transfer_params as any).kvc_prompt_token_ids.length, 400);
  });

  test('streamed completion and chat relay the SSE unchanged', async () => {
    reset();
    const r = await post('/v1/completions', { model: 'stub', prompt: 'abc', max_tokens: 3, stream: true });
    assert.equal(r.status, 200);
    assert.match(r.type, /text\/event-stream/);
    const events = r.text.split('\n\n').filter(Boolean);
    assert.equal(events.at(-1), 'data: [DONE]');
    const text = events.slice(0, 3).map((e) => JSON.parse(e.slice(6)).choices[0].text).join('');
    assert.equal(text, stubWords('abc', 3).join(''));
    const msgs = [{ role: 'user', content: 'hi' }];
    const c = await post('/v1/chat/completions', { model: 'stub', messages: msgs, max_tokens: 2, stream: true });
    assert.equal(c.status, 200);
    const ev = c.text.split('\n\n').filter(Boolean);
    assert.equal(ev.at(-1), 'data: [DONE]');
    assert.equal(JSON.parse(ev[0]!.slice(6)).object, 'chat.completion.chunk');
    const nc = await post('/v1/chat/completions', { model: 'stub', messages: msgs, max_tokens: 2 });
    assert.equal(JSON.parse(nc.text).choices[0].message.content, stubWords(JSON.stringify(msgs), 2).join(''));
  });

  test('the relayed stream is byte for byte the decoder\'s, whether its events come in one burst or one by one', async () => {
    // Only the id (it names the stub and counts its requests) and the creation second differ
    // between two answers of a stub to the same body.
    const norm = (t: string) => t.replace(/"id":"[^"]*"/g, '"id":"-"').replace(/"created":\d+/g, '"created":0');
    for (const streamDelayMs of [0, 5]) {
      reset();
      for (const s of D) s.streamDelayMs = streamDelayMs;
      for (const body of [
        { model: 'stub', prompt: 'same bytes', max_tokens: 12, stream: true },
        { model: 'stub', messages: [{ role: 'user', content: 'same bytes' }], max_tokens: 12, stream: true },
      ]) {
        const path = 'messages' in body ? '/v1/chat/completions' : '/v1/completions';
        const viaProxy = await post(path, body);
        assert.equal(viaProxy.status, 200, viaProxy.text);
        const direct = await fetch(`http://127.0.0.1:${D[0]!.port}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
        const directText = await direct.text();
        assert.ok(directText.split('\n\n').length > 12, 'the decoder streamed one event per token');
        assert.equal(norm(viaProxy.text), norm(directText), `stream relayed unchanged (stream delay ${streamDelayMs} ms)`);
      }
    }
    reset();
  });

  test('round-robin over prefillers and decoders', async () => {
    reset();
    for (let i = 0; i < 4; i++) assert.equal((await post('/v1/completions', { prompt: `p ${i}`, max_tokens: 2 })).status, 200);
    assert.deepEqual(P.map((p) => completions(p).length), [2, 2]);
    assert.deepEqual(D.map((d) => completions(d).length), [2, 2]);
    // Consecutive requests alternate.
    const firstP = completions(P[0]!).map((q) => q.body.prompt);
    assert.ok(firstP[0] === 'p 0' ? firstP[1] === 'p 2' : firstP[0] === 'p 1' && firstP[1] === 'p 3', `p0 got ${firstP}`);
  });

  test('a failing prefiller is skipped, marked down and probed back', async () => {
    reset();
    P[0]!.mode = 'error';
    for (let i = 0; i < 4; i++) assert.equal((await post('/v1/completions', { prompt: `f ${i}`, max_tokens: 2 })).status, 200);
    const h = await (await fetch(base + '/health')).json() as any;
    assert.equal(h.prefillers[0].up, false);
    assert.equal(h.status, 'degraded');
    assert.match(h.prefillers[0].last_error, /HTTP 50[03]/);
    assert.equal(P[1]!.requests.length, 4, 'every request prefilled on the healthy one');
    P[0]!.mode = 'ok';
    await waitUntil(() => proxy.prefillers[0]!.up, 3_000, 'prefiller-0 back up');
    P[0]!.requests.length = 0;
    for (let i = 0; i < 2; i++) assert.equal((await post('/v1/completions', { prompt: `g ${i}`, max_tokens: 2 })).status, 200);
    assert.equal(completions(P[0]!).length, 1, 'recovered prefiller used again');
  });

  test('a prefiller that hangs times out and the next one serves', async () => {
    reset();
    P[0]!.mode = 'hang';
    P[1]!.mode = 'ok';
    const t = Date.now();
    const rs = await Promise.all([0, 1].map((i) => post('/v1/completions', { prompt: `h ${i}`, max_tokens: 2 })));
    assert.deepEqual(rs.map((r) => r.status), [200, 200]);
    assert.ok(Date.now() - t < 5_000);
    const m = await (await fetch(base + '/metrics')).text();
    assert.match(m, /kvc_proxy_prefill_failures_total\{prefiller="prefiller-0\([^)]*\)"\} [1-9]/);
    P[0]!.mode = 'ok';
    await waitUntil(() => proxy.prefillers[0]!.up, 3_000, 'prefiller-0 back up');
  });

  test('no prefiller left: the decoder prefills alone and the request succeeds', async () => {
    reset();
    P[0]!.mode = 'error';
    P[1]!.mode = 'error';
    const r = await post('/v1/completions', { prompt: 'alone', max_tokens: 3 });
    assert.equal(r.status, 200, r.text);
    assert.equal(JSON.parse(r.text).choices[0].text, stubWords('alone', 3).join(''));
    const dreq = D.flatMap(completions);
    assert.equal(dreq.length, 1);
    const params = dreq[0]!.body.kv_transfer_params as Record<string, unknown>;
    assert.equal(params.disagg_spec, undefined, 'no transfer announced to the decoder');
    assert.deepEqual(params.kvc_prompt_token_ids, [1], 'the ids its /tokenize gave go with the request');
    const m = await (await fetch(base + '/metrics')).text();
    assert.match(m, /kvc_proxy_decoder_only_total [1-9]/);
    P[0]!.mode = 'ok';
    P[1]!.mode = 'ok';
    await waitUntil(() => proxy.prefillers.every((p) => p.up), 3_000, 'prefillers back up');
  });

  test('a failed decoder gives a 502 JSON error', async () => {
    reset();
    D[0]!.mode = 'error';
    D[1]!.mode = 'error';
    const r = await post('/v1/completions', { prompt: 'x', max_tokens: 2 });
    assert.equal(r.status, 502);
    const j = JSON.parse(r.text);
    assert.equal(j.error.type, 'upstream_error');
    assert.match(j.error.message, /decoder-\d.*HTTP 500/);
    const s = await post('/v1/completions', { prompt: 'x', max_tokens: 2, stream: true });
    assert.equal(s.status, 502);
    assert.match(s.type, /application\/json/);
    D[0]!.mode = 'ok';
    D[1]!.mode = 'ok';
    await waitUntil(() => proxy.decoders.every((d) => d.up), 3_000, 'decoders back up');
  });

  test('a decoder stream that breaks off ends the client stream with an error event', async () => {
    reset();
    D[0]!.mode = 'cut';
    D[1]!.mode = 'cut';
    const r = await post('/v1/completions', { prompt: 'cut me', max_tokens: 4, stream: true });
    assert.equal(r.status, 200);
    const events = r.text.split('\n\n').filter(Boolean);
    assert.equal(JSON.parse(events[0]!.slice(6)).choices[0].text, stubWords('cut me', 4)[0]);
    const last = JSON.parse(events.at(-1)!.slice(6));
    assert.equal(last.error.type, 'upstream_error');
    assert.match(last.error.message, /stream broken/);
    assert.ok(!r.text.includes('[DONE]'));
    D[0]!.mode = 'ok';
    D[1]!.mode = 'ok';
  });

  test('a closed decoder port (refused) is skipped at tokenize time', async () => {
    reset();
    const spare = await startStubEngine('spare');
    const port = spare.port;
    await spare.close();
    const lone = new ProxyServer({
      host: '127.0.0.1', port: 0,
      topology: { prefillers: [{ host: '127.0.0.1', port: P[0]!.port }], decoders: [{ host: '127.0.0.1', port, initPort: 1, allocPort: 2 }] },
      notify: null, timeouts: { tokenizeMs: 1_000, prefillMs: 1_000, decodeMs: 1_000, idleMs: 1_000 }, healthIntervalMs: 10_000, statsIntervalMs: 10_000,
    });
    await lone.start();
    try {
      const r = await fetch(`http://127.0.0.1:${lone.port}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'x' }) });
      assert.equal(r.status, 502);
      const j = await r.json() as any;
      assert.match(j.error.message, /no decoder answered.*ECONNREFUSED/);
      const h = await fetch(`http://127.0.0.1:${lone.port}/health`);
      assert.equal(h.status, 503);
    } finally {
      await lone.stop();
    }
  });

  test('bad requests are 400 naming the field; upstream 4xx pass through', async () => {
    reset();
    let r = await post('/v1/completions', { max_tokens: 2 });
    assert.equal(r.status, 400);
    assert.match(JSON.parse(r.text).error.message, /`prompt`/);
    r = await post('/v1/chat/completions', { messages: 'hi' });
    assert.equal(r.status, 400);
    assert.match(JSON.parse(r.text).error.message, /`messages`/);
    r = await post('/v1/completions', { prompt: 'a', stream: 'yes' });
    assert.match(JSON.parse(r.text).error.message, /`stream`/);
    // The proxy writes kv_transfer_params itself: a client's is refused by name, never dropped.
    r = await post('/v1/completions', { prompt: 'a', kv_transfer_params: { disagg_spec: { req_id: 'x' } } });
    assert.equal(r.status, 400);
    assert.match(JSON.parse(r.text).error.message, /`kv_transfer_params`/);
    assert.equal([...P, ...D].flatMap(completions).length, 0, 'nothing reached an engine');
    const raw = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"prompt": ' });
    assert.equal(raw.status, 400);
    assert.equal((await fetch(base + '/nope')).status, 404);
    // Requests that cannot fit the context are refused before any prefill, with the engine's
    // own code and message (src/protocol/context_limit.ts).
    // (Every engine of a deployment serves the same context; a long text is tokenized by a prefiller.)
    for (const d of [...P, ...D]) d.maxModelLen = 2048;
    const long = Array.from({ length: 3000 }, () => 'w').join(' ');
    r = await post('/v1/completions', { prompt: long });
    assert.equal(r.status, 400);
    assert.equal(JSON.parse(r.text).error.code, 'context_length_exceeded');
    assert.match(JSON.parse(r.text).error.message, /field `prompt`: the prompt has 3000 tokens; this model's maximum context length is 2048 tokens/);
    r = await post('/v1/completions', { prompt: Array.from({ length: 2000 }, () => 'w').join(' '), max_tokens: 100 });
    assert.equal(JSON.parse(r.text).error.code, 'context_length_exceeded');
    assert.match(JSON.parse(r.text).error.message, /field `max_tokens`: 100 tokens requested with a 2000-token prompt/);
    r = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'a b' }], max_tokens: 10, max_completion_tokens: 2047 });
    assert.match(JSON.parse(r.text).error.message, /field `max_completion_tokens`: 2047 tokens requested/);
    for (const s of [...P, ...D]) s.maxModelLen = STUB_CONTEXT;
    assert.equal(P.flatMap(completions).length, 0, 'nothing reached a prefiller');
    // The engine's own 400 (here from the prefiller) reaches the client unchanged.
    r = await post('/v1/completions', { prompt: 'a', max_tokens: -1 });
    assert.equal(r.status, 400);
    assert.match(JSON.parse(r.text).error.message, /`max_tokens`/);
    r = await post('/v1/completions', { prompt: 'a', temperature: -1 });
    assert.equal(r.status, 400);
    assert.match(JSON.parse(r.text).error.message, /`temperature`: expected a number >= 0/);
    assert.equal(D.flatMap(completions).length, 0, 'the decoder was not asked');
  });

  test('a client that disconnects cancels the upstream call', async () => {
    reset();
    for (const p of P) p.aborted = 0;
    P[0]!.delayMs = 600;
    P[1]!.delayMs = 600;
    const ac = new AbortController();
    const pending = post('/v1/completions', { prompt: 'bye', max_tokens: 2 }, ac.signal).catch((e) => e);
    await waitUntil(() => P.some((p) => completions(p).length > 0), 2_000, 'prefill started');
    ac.abort();
    await pending;
    await waitUntil(() => P[0]!.aborted + P[1]!.aborted === 1, 2_000, 'prefiller saw the cancel');
    await new Promise((r) => setTimeout(r, 800));
    assert.equal(D.flatMap(completions).length, 0, 'decoder never called');
    const m = await (await fetch(base + '/metrics')).text();
    assert.match(m, /kvc_proxy_client_disconnects_total [1-9]/);
  });

  test('end-to-end TTFT of a stream is taken at the first event with text, not the role-only chat chunk', async () => {
    reset();
    for (const d of D) d.streamDelayMs = 300;
    const re = /kvc_proxy_ttft_seconds_sum\{endpoint="\/v1\/chat\/completions"\} ([\d.e+-]+)/;
    const cnt = /kvc_proxy_ttft_seconds_count\{endpoint="\/v1\/chat\/completions"\} (\d+)/;
    const sum0 = (await metricValue(re)) || 0;
    const n0 = (await metricValue(cnt)) || 0;
    const r = await post('/v1/chat/completions', { model: 'stub', messages: [{ role: 'user', content: 'slow' }], max_tokens: 1, stream: true });
    assert.equal(r.status, 200);
    const first = JSON.parse(r.text.split('\n\n')[0]!.slice(6));
    assert.deepEqual(first.choices[0].delta, { role: 'assistant', content: '' }, 'the stream opens with a role-only chunk');
    assert.equal(await metricValue(cnt), n0 + 1);
    // The role chunk leaves at once, the first word 300 ms later (the stub's delay).
    const ttft = (await metricValue(re)) - sum0;
    assert.ok(ttft >= 0.29, `TTFT ${ttft} s counts from the first content event`);
  });

  test('decoder-only requests: statistics line with the decoder\'s real time to first token', async () => {
    reset();
    P[0]!.mode = 'error';
    P[1]!.mode = 'error';
    for (const d of D) d.delayMs = 300;
    statsLines.length = 0;
    const s = await post('/v1/completions', { prompt: 'alone streamed', max_tokens: 2, stream: true });
    const j = await post('/v1/completions', { prompt: 'alone whole', max_tokens: 2 });
    assert.deepEqual([s.status, j.status], [200, 200]);
    const lineRe = /^\d{4}-\d\d-\d\dT[\d:.]+Z TTFT decoder-only: (\d+) requests in last [\d.]+s \(total \d+\), avg ([\d.]+) ms, median ([\d.]+) ms, p99 ([\d.]+) ms \(decoder's time to first token; no prefiller was available, the decoder prefilled\)$/;
    const seen = () => statsLines.map((l) => l.match(lineRe)).filter((m): m is RegExpMatchArray => !!m && m[1] !== '0');
    // Only the streamed one: a non-streamed answer arrives whole, its first token is not seen here.
    await waitUntil(() => seen().reduce((a, m) => a + Number(m[1]), 0) >= 1, 3_000, 'decoder-only statistics lines');
    assert.equal(seen().reduce((a, m) => a + Number(m[1]), 0), 1, 'the non-streamed request is not in the TTFT statistics');
    for (const m of seen()) {
      // Each decoder took >= 300 ms to its first token; a made-up 0 would pull these down.
      for (const v of [m[2], m[3], m[4]]) assert.ok(Number(v) >= 290, `decoder-only TTFT ${v} ms in: ${m[0]}`);
    }
    P[0]!.mode = 'ok';
    P[1]!.mode = 'ok';
    await waitUntil(() => proxy.prefillers.every((p) => p.up), 3_000, 'prefillers back up');
  });

  test('a client that disconnects during a streamed decode cancels the decoder call', async () => {
    reset();
    for (const d of D) d.streamDelayMs = 100;
    const ac = new AbortController();
    const res = await fetch(base + '/v1/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'leave early', max_tokens: 40, stream: true }), signal: ac.signal,
    });
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    let got = '';
    while (!got.includes('\n\n')) {
      const { value, done } = await reader.read();
      assert.ok(!done, 'stream ended before its first event');
      got += Buffer.from(value).toString();
    }
    assert.equal(JSON.parse(got.split('\n\n')[0]!.slice(6)).choices[0].text, stubWords('leave early', 40)[0]);
    const before = await metricValue(/kvc_proxy_client_disconnects_total (\d+)/);
    ac.abort();
    // The stream would run 4 s; the decoder must see its request closed long before.
    await waitUntil(() => D[0]!.aborted + D[1]!.aborted === 1, 2_000, 'the decoder saw the abort');
    assert.equal(P[0]!.aborted + P[1]!.aborted, 0, 'the prefill had completed normally');
    assert.equal(await metricValue(/kvc_proxy_client_disconnects_total (\d+)/), before + 1);
  });

  test('a slow client: the relay pauses the decoder and the whole stream still arrives intact', { timeout: 20_000 }, async () => {
    reset();
    const n = 20_000; // ~2.5 MB of SSE: far more than the sockets buffer
    const { request } = await import('node:http');
    const text = await new Promise<string>((resolve, reject) => {
      const req = request(base + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
        res.pause();
        // Nothing read for 500 ms: the proxy's socket to the client fills up first.
        setTimeout(() => {
          let t = '';
          res.setEncoding('utf8');
          res.on('data', (d: string) => (t += d));
          res.on('end', () => resolve(t));
          res.resume();
        }, 500);
      });
      req.on('error', reject);
      req.end(JSON.stringify({ prompt: 'a long one', max_tokens: n, stream: true }));
    });
    const events = text.split('\n\n').filter(Boolean);
    assert.equal(events.length, n + 2);
    assert.equal(events.at(-1), 'data: [DONE]');
    assert.equal(events.slice(0, n).map((e) => JSON.parse(e.slice(6)).choices[0].text).join(''), stubWords('a long one', n).join(''));
  });

  test('a client that stops reading for longer than the idle timeout: its decode is cancelled, the connection freed', { timeout: 30_000 }, async () => {
    reset();
    const metric = async (name: string) => Number(new RegExp(`^${name} (\\d+)`, 'm').exec(await (await fetch(base + '/metrics')).text())?.[1] ?? NaN);
    const disconnects = await metric('kvc_proxy_client_disconnects_total');
    const { request } = await import('node:http');
    const req = request(base + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' } }, (r) => {
      r.pause(); // and never resumed: the sockets fill up and the relay pauses the decoder
      r.on('error', () => {});
    });
    req.on('error', () => {});
    // ~54 MB of events: more than the client's receive buffer (tcp_rmem's maximum, 32 MiB here)
    // plus the proxy's send buffer can ever hold, so the stream cannot complete unread.
    req.end(JSON.stringify({ prompt: 'never read', max_tokens: 300_000, stream: true }));
    // idleMs is 2 s in this suite, and nothing else bounds a paused stream: without the stall
    // bound this request would stay in flight, holding a decoder connection, for ever. (The
    // client itself cannot tell: the proxy's close is queued behind the bytes it never reads.)
    await waitUntil(async () => (await metric('kvc_proxy_client_disconnects_total')) === disconnects + 1, 20_000, 'the proxy to give up on the client');
    await waitUntil(async () => (await metric('kvc_proxy_requests_in_flight')) === 0, 5_000, 'nothing left in flight');
    req.destroy();
  });

  test('models, health, metrics with end-to-end TTFT, stats lines, xfer notices', async () => {
    reset();
    const models = await (await fetch(base + '/v1/models')).json() as any;
    assert.equal(models.data[0].id, 'stub');
    const h = await fetch(base + '/health');
    assert.equal(h.status, 200);
    const hj = await h.json() as any;
    assert.equal(hj.prefillers.length, 2);
    assert.equal(hj.decoders.length, 2);
    const push = new Push();
    push.connect(`tcp://127.0.0.1:${notifyPort}`);
    await push.send(encode({ req_id: 'kvc-x', prefiller: 'p0', num_chunks: 2, num_tokens: 300, ok: true }));
    await push.send(encode({ req_id: 'kvc-y', prefiller: 'p0', num_chunks: 0, num_tokens: 0, ok: false, error: 'buffer full' }));
    await push.send(Buffer.from('not msgpack at all \xff'));
    await waitUntil(() => proxy.notices.ok === 1 && proxy.notices.failed === 1, 3_000, 'notices received');
    push.close();
    const m = await (await fetch(base + '/metrics')).text();
    assert.match(m, /kvc_proxy_ttft_seconds_count\{endpoint="\/v1\/completions"\} [1-9]/);
    assert.match(m, /kvc_proxy_xfer_tokens_total 300/);
    assert.match(m, /kvc_proxy_backend_up\{role="prefiller",backend="prefiller-0/);
    statsLines.length = 0;
    await post('/v1/completions', { prompt: 'stats', max_tokens: 1 });
    await waitUntil(() => statsLines.some((l) => /requests in last 0.3s/.test(l) && / 1 requests/.test(l)), 3_000, 'stats line');
    assert.ok(statsLines.some((l) => /^\d{4}-\d\d-\d\dT[\d:.]+Z TTFT prefiller-\d\(127\.0\.0\.1:\d+\): 1 requests in last 0\.3s \(total \d+\), avg [\d.]+ ms, median [\d.]+ ms, p99 [\d.]+ ms \(prefill node's time, KV transfer included; end-to-end TTFT is in \/metrics\)$/.test(l)), statsLines.join('\n'));
  });
});

describe('kvc proxy process', () => {
  test('statistics lines go to stdout even with KVC_LOG_LEVEL=warn', async () => {
    const p = await startStubEngine('p');
    const d = await startStubEngine('d');
    const port = await freePortRange(2);
    const child = spawn(process.execPath, [CLI, 'proxy', '--port', String(port), '--proxy-port', String(port + 1),
      '--prefiller-port', String(p.port), '--decoder-port', String(d.port), '--stats-interval', '0.2'], {
      env: { ...process.env, KVC_LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout!.on('data', (b) => (out += b));
    child.stderr!.resume();
    try {
      const until = async (cond: () => boolean | Promise<boolean>, what: string) => {
        const end = Date.now() + 20_000;
        while (!(await cond())) {
          if (Date.now() > end || child.exitCode !== null) assert.fail(`waiting for ${what}; stdout:\n${out}`);
          await new Promise((r) => setTimeout(r, 50));
        }
      };
      await until(async () => (await fetch(`http://127.0.0.1:${port}/health`).catch(() => null))?.ok === true, 'the proxy to answer');
      const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }) });
      assert.equal(r.status, 200);
      await until(() => /^\S+Z TTFT prefiller-0\(127\.0\.0\.1:\d+\): 1 requests in last 0\.2s \(total 1\), avg [\d.]+ ms/m.test(out), 'a statistics line on stdout');
      assert.doesNotMatch(out, /INFO/, 'info log lines are still filtered');
    } finally {
      child.kill('SIGTERM');
      await new Promise((r) => (child.exitCode !== null ? r(null) : child.once('exit', r)));
      await p.close();
      await d.close();
    }
  });
});

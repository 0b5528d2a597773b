// The sampling fields go through the disaggregated-prefill proxy unchanged: a request with n,
// seed, logprobs, penalties, logit_bias and stop settings answers the same through the proxy
// (prefiller + decoder, two real in-process engines) as from an engine directly, and a bad
// field is still a 400 naming it.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { freePortRange } from '../../harness/ports.js';
import { startEngine, type Engine } from '../../src/engine/server.js';
import { ProxyServer } from '../../src/proxy/server.js';

describe('sampling fields through the proxy', () => {
  let pre: Engine;
  let dec: Engine;
  let proxy: ProxyServer;
  let proxyUrl = '';
  const post = async (url: string, body: Record<string, unknown>) => {
    const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: AbortSignal.timeout(60_000) });
    const text = await r.text();
    return { status: r.status, text, json: r.headers.get('content-type')?.includes('json') ? JSON.parse(text) : null };
  };
  const sans = (j: { id?: string; created?: number; kv_transfer_params?: unknown }) => ({ ...j, id: undefined, created: undefined, kv_transfer_params: undefined });

  before(async () => {
    pre = await startEngine({ model: 'builtin:tiny', maxModelLen: 256 });
    dec = await startEngine({ model: 'builtin:tiny', maxModelLen: 256 });
    const port = await freePortRange(1);
    proxy = new ProxyServer({
      host: '127.0.0.1',
      port,
      topology: { prefillers: [{ host: '127.0.0.1', port: pre.port }], decoders: [{ host: '127.0.0.1', port: dec.port, initPort: 1, allocPort: 2 }] },
      notify: null,
      timeouts: { tokenizeMs: 30_000, prefillMs: 30_000, decodeMs: 30_000, idleMs: 30_000 },
      healthIntervalMs: 60_000,
      statsIntervalMs: 60_000,
      statsSink: () => {},
    });
    await proxy.start();
    proxyUrl = `http://127.0.0.1:${port}`;
  });
  after(async () => {
    await proxy?.stop();
    await pre?.close();
    await dec?.close();
  });

  it('completions: n, seed, logprobs, penalties, bias, min_tokens and stop answer as from the engine', async () => {
    const body = {
      model: 'builtin:tiny', prompt: 'Once upon a time there', max_tokens: 8, temperature: 0.9, seed: 77, n: 2, logprobs: 2, top_k: 50, top_p: 0.95, min_p: 0.01,
      presence_penalty: 0.5, frequency_penalty: 0.5, repetition_penalty: 1.2, logit_bias: { '100': 2 }, min_tokens: 2, stop: ['zzzz'], include_stop_str_in_output: false,
    };
    const direct = await post(`${dec.url}/v1/completions`, body);
    const via = await post(`${proxyUrl}/v1/completions`, body);
    assert.equal(via.status, 200, via.text);
    assert.equal(via.json.choices.length, 2);
    assert.deepEqual(sans(via.json), sans(direct.json));
    assert.equal(pre.scheduler.steps > 0, true, 'the prefiller ran the prompt');
  });

  it('chat: logprobs and top_logprobs streamed through the proxy', async () => {
    const body = { model: 'builtin:tiny', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3, n: 2, stream: true, ignore_eos: true };
    const r = await post(`${proxyUrl}/v1/chat/completions`, body);
    assert.equal(r.status, 200, r.text);
    const evs = r.text.split('\n\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)));
    const content = [0, 1].map((i) => evs.flatMap((e) => e.choices.filter((c: { index: number }) => c.index === i).flatMap((c: { logprobs: { content: unknown[] } | null }) => c.logprobs?.content ?? [])));
    assert.equal(content[0]!.length, 4);
    assert.deepEqual(content[0], content[1]);
    const direct = await post(`${dec.url}/v1/chat/completions`, { ...body, stream: false });
    assert.deepEqual(content[0], direct.json.choices[0].logprobs.content);
  });

  it('a bad or unknown field is still a 400 naming it', async () => {
    const a = await post(`${proxyUrl}/v1/completions`, { prompt: 'hi', max_tokens: 2, frequency_penalty: 9 });
    assert.equal(a.status, 400, a.text);
    assert.match(a.json.error.message, /`frequency_penalty`/);
    const b = await post(`${proxyUrl}/v1/chat/completions`, { messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'function' }] });
    assert.equal(b.status, 400, b.text);
    assert.match(b.json.error.message, /`tools`/);
    const c = await post(`${proxyUrl}/v1/completions`, { prompt: 'hi', max_tokens: 2, top_logprob: 1 });
    assert.equal(c.status, 400, c.text);
    assert.match(c.json.error.message, /`top_logprob`/);
  });
});

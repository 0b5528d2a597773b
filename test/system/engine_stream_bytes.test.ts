// The streamed answer is byte for byte what the engine sent before its per-token fast path
// (prebuilt event prefix/suffix, one framed write per event straight to the socket): for fixed
// greedy requests, the raw HTTP body read off the socket is compared with the reference built
// the way the engine used to build it — one JSON.stringify of the whole chunk object per token,
// ServerResponse's chunk framing (`<hex length>\r\n<data>\r\n`, `0\r\n\r\n` at the end) — from
// the same tokens (taken from a non-streamed run of the same request) through the same
// incremental decoder and stop-string matcher.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { startEngine, type Engine } from '../../src/engine/server.js';
import { StopMatcher } from '../../src/engine/stop.js';

const MODEL = 'builtin:tiny';

/**
 * Streamed requests one after the other on ONE keep-alive connection, over a raw socket: for
 * each, the status line/headers and the still-chunked body bytes.
 */
async function rawPosts(url: string, path: string, reqs: { body: unknown; requestId: string }[]): Promise<{ head: string; body: string }[]> {
  const u = new URL(url);
  const s = connect(Number(u.port), u.hostname);
  const out: { head: string; body: string }[] = [];
  try {
    for (const { body, requestId } of reqs) {
      const payload = JSON.stringify(body);
      out.push(
        await new Promise((resolve, reject) => {
          const parts: Buffer[] = [];
          const timer = setTimeout(() => reject(new Error('no complete answer in 60 s')), 60_000);
          const onData = (d: Buffer) => {
            parts.push(d);
            const all = Buffer.concat(parts).toString('utf8');
            if (all.endsWith('\r\n0\r\n\r\n')) {
              clearTimeout(timer);
              s.off('data', onData);
              const at = all.indexOf('\r\n\r\n');
              resolve({ head: all.slice(0, at), body: all.slice(at + 4) });
            }
          };
          s.on('data', onData);
          s.once('error', reject);
          s.write(`POST ${path} HTTP/1.1\r\nHost: ${u.host}\r\nContent-Type: application/json\r\nX-Request-Id: ${requestId}\r\nContent-Length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`);
        }),
      );
    }
    return out;
  } finally {
    s.destroy();
  }
}
const rawPost = async (url: string, path: string, body: unknown, requestId: string) => (await rawPosts(url, path, [{ body, requestId }]))[0]!;

/** ServerResponse.write's framing of one chunk. */
const frame = (s: string) => `${Buffer.byteLength(s).toString(16)}\r\n${s}\r\n`;

describe('engine streaming: bytes on the wire', () => {
  let e: Engine;
  before(async () => {
    e = await startEngine({ model: MODEL, maxNumSeqs: 4, logRequests: false, logStats: false });
  });
  after(async () => {
    await e?.close();
  });

  /** The ids a greedy request generates (return_tokens_as_token_ids names each token by id). */
  async function greedyIds(path: string, body: Record<string, unknown>): Promise<number[]> {
    const extra = path === '/v1/completions' ? { logprobs: 0 } : { logprobs: true, top_logprobs: 0 };
    const r = await fetch(`${e.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, ...extra, return_tokens_as_token_ids: true }) });
    const j = (await r.json()) as { choices: { logprobs: { tokens?: string[]; content?: { token: string }[] } }[] };
    assert.equal(r.status, 200);
    const names = j.choices[0]!.logprobs.tokens ?? j.choices[0]!.logprobs.content!.map((c) => c.token);
    return names.map((n) => Number(/^token_id:(\d+)$/.exec(n)![1]));
  }

  /** The body the engine built before: JSON.stringify per event, ServerResponse framing. */
  function reference(kind: 'completion' | 'chat', prompt: number[], ids: number[], stop: string[], requestId: string, created: number): string {
    const tok = e.model.tokenizer;
    const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${requestId}`;
    const object = kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
    const choice = (delta: string, finish: string | null) =>
      kind === 'chat' ? { index: 0, delta: finish === null ? { content: delta } : delta ? { content: delta } : {}, logprobs: null, finish_reason: finish } : { index: 0, text: delta, logprobs: null, finish_reason: finish };
    const ev = (body: unknown) => frame(`data: ${JSON.stringify(body)}\n\n`);
    let out = '';
    if (kind === 'chat') out += ev({ id, object, created, model: MODEL, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] });
    const dec = tok.streamDecoder(prompt);
    const stops = new StopMatcher(stop, false);
    let text = '';
    let sent = 0;
    for (const t of ids) {
      const visible = stops.add(dec.push(t));
      if (visible) {
        text += visible;
        sent += visible.length;
        out += ev({ id, object, created, model: MODEL, choices: [choice(visible, null)] });
      }
    }
    text += stops.add(dec.flush());
    text += stops.finish();
    out += ev({ id, object, created, model: MODEL, choices: [choice(text.slice(sent), 'length')] });
    out += frame('data: [DONE]\n\n');
    return out + '0\r\n\r\n';
  }

  const createdOf = (body: string) => Number(/"created":(\d+)/.exec(body)![1]);

  it('completions: a fixed greedy stream (with a stop string that holds text back) is byte-identical', async () => {
    const prompt = e.model.tokenizer.encode('Streaming bytes: "quotes", \\ backslash, tabs\t, é, 日本, emoji 🎉 —');
    // A stop string that never matches but makes the matcher hold characters back.
    const body = { model: MODEL, prompt, max_tokens: 40, temperature: 0, ignore_eos: true, stop: ['\u0007never\u0007'] };
    const ids = await greedyIds('/v1/completions', body);
    assert.equal(ids.length, 40);
    const r = await rawPost(e.url, '/v1/completions', { ...body, stream: true }, 'bytes-cmpl-1');
    assert.match(r.head, /^HTTP\/1\.1 200 OK\r\n/);
    assert.match(r.head, /\r\ntransfer-encoding: chunked/i);
    assert.equal(r.body, reference('completion', prompt, ids, body.stop, 'bytes-cmpl-1', createdOf(r.body)));
  });

  it('chat: a fixed greedy stream is byte-identical', async () => {
    const body = { model: MODEL, messages: [{ role: 'user', content: 'Say something with "quotes" and\nnewlines.' }], max_tokens: 32, temperature: 0, ignore_eos: true };
    const ids = await greedyIds('/v1/chat/completions', body);
    assert.equal(ids.length, 32);
    const tok = await fetch(`${e.url}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: body.messages }) });
    const prompt = ((await tok.json()) as { tokens: number[] }).tokens;
    const r = await rawPost(e.url, '/v1/chat/completions', { ...body, stream: true }, 'bytes-chat-1');
    assert.equal(r.body, reference('chat', prompt, ids, [], 'bytes-chat-1', createdOf(r.body)));
  });

  it('two streams one after the other on one keep-alive connection: each starts with its headers', async () => {
    const bodies = [0, 1].map((i) => ({ model: MODEL, prompt: e.model.tokenizer.encode(`Keep-alive stream ${i}`), max_tokens: 12, temperature: 0, ignore_eos: true }));
    const ids = await Promise.all(bodies.map((b) => greedyIds('/v1/completions', b)));
    const raws = await rawPosts(e.url, '/v1/completions', bodies.map((b, i) => ({ body: { ...b, stream: true }, requestId: `bytes-ka-${i}` })));
    raws.forEach((r, i) => {
      assert.match(r.head, /^HTTP\/1\.1 200 OK\r\n/);
      assert.equal(r.body, reference('completion', bodies[i]!.prompt, ids[i]!, [], `bytes-ka-${i}`, createdOf(r.body)));
    });
  });

  it('eight concurrent streams each get their own events, framed, in order', async () => {
    const bodies = Array.from({ length: 8 }, (_, i) => ({ model: MODEL, prompt: e.model.tokenizer.encode(`Stream number ${i} of eight:`), max_tokens: 24, temperature: 0, ignore_eos: true }));
    const ids = await Promise.all(bodies.map((b) => greedyIds('/v1/completions', b)));
    const raws = await Promise.all(bodies.map((b, i) => rawPost(e.url, '/v1/completions', { ...b, stream: true }, `bytes-many-${i}`)));
    raws.forEach((r, i) => assert.equal(r.body, reference('completion', bodies[i]!.prompt, ids[i]!, [], `bytes-many-${i}`, createdOf(r.body))));
  });
});

// The engine's OpenAI-compatible API on a real `kvc engine` process with the built-in model:
// completions and chat through the `openai` npm client (streaming and not), tokenize /
// detokenize, models, health, metrics, and the error contract (400 naming the field, 404).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { freePortRange } from '../../harness/ports.js';
import { postJson, startKvc, type Proc } from '../../harness/proc.js';

const MODEL = 'builtin:tiny';
const MAX_LEN = 256;

describe('engine API (real process)', () => {
  let proc: Proc;
  let url: string;
  let client: OpenAI;

  before(async () => {
    const port = await freePortRange(1);
    proc = startKvc(['engine', '--port', String(port), '--model', MODEL, '--max-model-len', String(MAX_LEN), '--enforce-eager', '--no-enable-prefix-caching', '--disable-log-requests']);
    const m = await proc.waitFor(/engine listening on (http:\/\/\S+)/, 120_000);
    url = m[1]!;
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
  });

  after(async () => {
    await proc?.kill();
  });

  it('GET /health and /v1/models', async () => {
    const h = await fetch(`${url}/health`);
    assert.equal(h.status, 200);
    const models = await client.models.list();
    assert.equal(models.data.length, 1);
    assert.equal(models.data[0]!.id, MODEL);
    assert.equal((models.data[0] as unknown as { max_model_len: number }).max_model_len, MAX_LEN);
  });

  it('completions: non-streaming with usage, deterministic greedy', async () => {
    const req = { model: MODEL, prompt: 'The capital of France is', max_tokens: 8, temperature: 0 };
    const a = await client.completions.create(req);
    const b = await client.completions.create(req);
    assert.equal(a.object, 'text_completion');
    assert.equal(a.choices.length, 1);
    assert.equal(a.choices[0]!.text, b.choices[0]!.text);
    assert.ok(['length', 'stop'].includes(a.choices[0]!.finish_reason));
    const tok = await postJson(`${url}/tokenize`, { model: MODEL, prompt: req.prompt });
    assert.equal(a.usage!.prompt_tokens, tok.json.count);
    assert.ok(a.usage!.completion_tokens >= 1 && a.usage!.completion_tokens <= 8);
    assert.equal(a.usage!.total_tokens, a.usage!.prompt_tokens + a.usage!.completion_tokens);
  });

  it('completions: streaming text equals the non-streaming text, ends with [DONE]', async () => {
    const req = { model: MODEL, prompt: 'Once upon a time', max_tokens: 10, temperature: 0, ignore_eos: true } as const;
    const whole = await client.completions.create(req as OpenAI.CompletionCreateParamsNonStreaming);
    const stream = await client.completions.create({ ...(req as OpenAI.CompletionCreateParamsNonStreaming), stream: true, stream_options: { include_usage: true } });
    let text = '';
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, whole.choices[0]!.text);
    assert.equal(finish, 'length');
    assert.equal(usage?.completion_tokens, 10);
    // Raw SSE framing: the last event is [DONE].
    const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...req, stream: true }) });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type') ?? '', /text\/event-stream/);
    const body = await r.text();
    assert.ok(body.trimEnd().endsWith('data: [DONE]'), body.slice(-200));
  });

  it('completions: prompt as token ids gives the same output as the text', async () => {
    const prompt = 'A quick brown fox';
    const tok = await postJson(`${url}/tokenize`, { prompt });
    const a = await client.completions.create({ model: MODEL, prompt, max_tokens: 6, temperature: 0 });
    const b = await client.completions.create({ model: MODEL, prompt: tok.json.tokens, max_tokens: 6, temperature: 0 });
    assert.equal(a.choices[0]!.text, b.choices[0]!.text);
  });

  it('completions: seed makes sampling reproducible; stop strings cut the text', async () => {
    const req = { model: MODEL, prompt: 'Numbers:', max_tokens: 12, temperature: 1, top_p: 0.9, seed: 1234, ignore_eos: true };
    const a = await client.completions.create(req as OpenAI.CompletionCreateParamsNonStreaming);
    const b = await client.completions.create(req as OpenAI.CompletionCreateParamsNonStreaming);
    assert.equal(a.choices[0]!.text, b.choices[0]!.text);
    const text = a.choices[0]!.text;
    // Use a piece of the generated text as a stop string: output must end right before its
    // first occurrence (the seed makes the text before it identical). Always checked: the first
    // two non-blank characters after the first quarter (any two characters make a valid stop).
    assert.ok(text.trim().length >= 4, `12 sampled tokens give some text (got ${JSON.stringify(text)})`);
    let cut = Math.floor(text.length / 4);
    while (cut < text.length - 2 && text[cut]!.trim() === '') cut++;
    const stop = text.slice(cut, cut + 2);
    assert.equal(stop.length, 2);
    const c = await client.completions.create({ ...(req as OpenAI.CompletionCreateParamsNonStreaming), stop: [stop] });
    assert.equal(c.choices[0]!.finish_reason, 'stop');
    assert.equal(c.choices[0]!.text, text.slice(0, text.indexOf(stop)));
    assert.ok(c.usage!.completion_tokens < 12, 'generation ended at the stop string');
    // Streaming stops at the same place.
    let streamed = '';
    for await (const ch of await client.completions.create({ ...(req as OpenAI.CompletionCreateParamsNonStreaming), stop: [stop], stream: true })) streamed += ch.choices[0]?.text ?? '';
    assert.equal(streamed, c.choices[0]!.text);
  });

  it('chat: non-streaming and streaming agree', async () => {
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: 'Say something.' },
    ];
    const a = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0 });
    assert.equal(a.object, 'chat.completion');
    assert.equal(a.choices[0]!.message.role, 'assistant');
    const tok = await postJson(`${url}/tokenize`, { model: MODEL, messages });
    assert.equal(a.usage!.prompt_tokens, tok.json.count);
    const s = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0, stream: true });
    let text = '';
    let role: string | undefined;
    let finish: string | null = null;
    for await (const chunk of s) {
      const c = chunk.choices[0];
      if (!c) continue;
      role ??= c.delta.role;
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(role, 'assistant');
    assert.equal(text, a.choices[0]!.message.content);
    assert.equal(finish, a.choices[0]!.finish_reason);
  });

  it('tokenize / detokenize round trip', async () => {
    const t = await postJson(`${url}/tokenize`, { model: MODEL, prompt: 'hello world' });
    assert.equal(t.status, 200);
    assert.ok(Array.isArray(t.json.tokens) && t.json.tokens.length > 0);
    assert.equal(t.json.count, t.json.tokens.length);
    assert.equal(t.json.max_model_len, MAX_LEN);
    const d = await postJson(`${url}/detokenize`, { model: MODEL, tokens: t.json.tokens });
    assert.equal(d.status, 200);
    assert.equal(d.json.prompt.trim(), 'hello world');
  });

  it('errors: 400 naming the field, 404 for an unknown model, malformed JSON', async () => {
    const cases: [unknown, RegExp][] = [
      [{ prompt: 'x', max_tokens: -1 }, /max_tokens/],
      [{ prompt: 'x', max_tokens: 'ten' }, /max_tokens/],
      [{ prompt: 'x', temperature: 'hot' }, /temperature/],
      [{ prompt: 42 }, /prompt/],
      [{ prompt: 'x', stream: 'yes' }, /stream/],
      [{ prompt: 'x', kv_transfer_params: 'nope' }, /kv_transfer_params/],
      [{ prompt: [1, -2, 3] }, /prompt/],
      [{ prompt: [1, 99999999] }, /prompt\[1\]/],
      [{ prompt: 'word '.repeat(400) }, /prompt/],
      [{ prompt: 'hello', max_tokens: MAX_LEN }, /max_tokens/],
    ];
    for (const [body, re] of cases) {
      const r = await postJson(`${url}/v1/completions`, body);
      assert.equal(r.status, 400, JSON.stringify(body).slice(0, 80));
      assert.equal(r.json.error.type, 'invalid_request_error');
      assert.match(r.json.error.message, re);
    }
    const chatBad = await postJson(`${url}/v1/chat/completions`, { messages: [{ role: 'wizard', content: 'x' }] });
    assert.equal(chatBad.status, 400);
    assert.match(chatBad.json.error.message, /messages\[0\]\.role/);
    const malformed = await postJson(`${url}/v1/completions`, '{"prompt": "x",');
    assert.equal(malformed.status, 400);
    assert.match(malformed.json.error.message, /JSON/i);
    const unknown = await postJson(`${url}/v1/completions`, { model: 'gpt-9', prompt: 'x' });
    assert.equal(unknown.status, 404);
    assert.match(unknown.json.error.message, /gpt-9/);
    const tokBad = await postJson(`${url}/tokenize`, { prompt: 7 });
    assert.equal(tokBad.status, 400);
    assert.match(tokBad.json.error.message, /prompt/);
    const detokBad = await postJson(`${url}/detokenize`, { tokens: ['a'] });
    assert.equal(detokBad.status, 400);
    assert.match(detokBad.json.error.message, /tokens\[0\]/);
    // The openai client surfaces the same errors.
    await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }), (e: unknown) => (e as { status?: number }).status === 404);
    // The server is still healthy and holds no sequence: nothing running or waiting, no KV in use.
    const h = await fetch(`${url}/health`);
    assert.equal(h.status, 200);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    const gauge = (name: string) => Number(new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, 'm').exec(metrics)?.[1]);
    assert.equal(gauge('kvc_engine_num_requests_running'), 0);
    assert.equal(gauge('kvc_engine_num_requests_waiting'), 0);
    assert.equal(gauge('kvc_engine_kv_cache_usage_ratio'), 0);
    assert.equal(Number(/^kvc_engine_kv_cache_blocks\{[^}]*state="used"[^}]*\} (\d+)$/m.exec(metrics)?.[1]), 0);
  });

  it('/metrics exposes request, token, latency and KV figures', async () => {
    const r = await fetch(`${url}/metrics`);
    assert.equal(r.status, 200);
    const text = await r.text();
    for (const name of [
      'kvc_engine_requests_total',
      'kvc_engine_prompt_tokens_total',
      'kvc_engine_generation_tokens_total',
      'kvc_engine_time_to_first_token_seconds_bucket',
      'kvc_engine_inter_token_latency_seconds_bucket',
      'kvc_engine_kv_cache_usage_ratio',
      'kvc_engine_tokens_loaded_total',
      'kvc_engine_prefill_requests_total',
    ]) {
      assert.ok(text.includes(name), `missing ${name}`);
    }
    const gen = Number(/^kvc_engine_generation_tokens_total\{[^}]*\} (\d+)/m.exec(text)?.[1]);
    assert.ok(gen > 0);
    assert.match(text, /kvc_engine_num_requests_running\{[^}]*\} 0/);
  });
});

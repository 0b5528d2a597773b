// Every sampling field of /v1/completions and /v1/chat/completions on an in-process engine with
// the built-in model: each one honoured (with an effect a client can observe) or refused with a
// 400 that names it. Greedy output stays the same alone and among concurrent requests.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { startEngine, type Engine } from '../../src/engine/server.js';

const MODEL = 'builtin:tiny';

describe('sampling fields (in-process engine)', () => {
  let e: Engine;
  const post = async (path: string, body: Record<string, unknown>) => {
    const r = await fetch(e.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: AbortSignal.timeout(60_000) });
    const text = await r.text();
    return { status: r.status, text, json: r.headers.get('content-type')?.includes('json') ? JSON.parse(text) : null };
  };
  const complete = async (body: Record<string, unknown>) => {
    const r = await post('/v1/completions', { model: MODEL, prompt: 'Once upon a time there', max_tokens: 12, temperature: 0, ignore_eos: true, ...body });
    assert.equal(r.status, 200, r.text);
    return r.json;
  };
  /** SSE events of a streamed request (the JSON objects, without [DONE]). */
  const events = async (path: string, body: Record<string, unknown>) => {
    const r = await post(path, { ...body, stream: true });
    assert.equal(r.status, 200, r.text);
    return r.text
      .split('\n\n')
      .filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
      .map((l) => JSON.parse(l.slice(6)));
  };
  const refused = async (body: Record<string, unknown>, field: string, path = '/v1/completions') => {
    const base = path === '/v1/completions' ? { prompt: 'hi', max_tokens: 2 } : { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
    const r = await post(path, { ...base, ...body });
    assert.equal(r.status, 400, `${JSON.stringify(body)} → ${r.status} ${r.text}`);
    assert.ok(r.json.error.message.includes(`\`${field}`), `the message names ${field}: ${r.json.error.message}`);
    assert.equal(r.json.error.type, 'invalid_request_error');
    return r.json.error as { message: string; code: string };
  };

  before(async () => {
    e = await startEngine({ model: MODEL, maxModelLen: 256 });
  });
  after(async () => {
    await e?.close();
  });

  it('an unknown field is a 400 naming it, with a did-you-mean for a typo', async () => {
    const err = await refused({ temprature: 0.5 }, 'temprature');
    assert.equal(err.code, 'unknown_field');
    assert.match(err.message, /did you mean `temperature`/);
    await refused({ whatever: 1 }, 'whatever');
    await refused({ stream: true, stream_options: { include_usage: true, continuous_usage: true } }, 'stream_options.continuous_usage');
    await refused({ stream: true, stream_options: { continuous_usage_stats: true } }, 'stream_options.continuous_usage_stats');
  });

  it('known OpenAI features this engine does not implement are refused with their reason', async () => {
    const chat = '/v1/chat/completions';
    assert.match((await refused({ tools: [{ type: 'function', function: { name: 'f' } }] }, 'tools', chat)).message, /not supported/);
    await refused({ tool_choice: 'auto' }, 'tool_choice', chat);
    await refused({ functions: [{ name: 'f' }] }, 'functions', chat);
    await refused({ parallel_tool_calls: true }, 'parallel_tool_calls', chat);
    await refused({ response_format: { type: 'json_object' } }, 'response_format', chat);
    await refused({ store: true }, 'store', chat);
    await refused({ suffix: 'x' }, 'suffix');
    assert.equal((await refused({ use_beam_search: true }, 'use_beam_search')).code, 'unsupported_field');
    // message fields: name is passed to the template; tool calls and unknown fields are refused
    await refused({ messages: [{ role: 'assistant', content: 'x', tool_calls: [{ id: 'c1' }] }] }, 'messages[0].tool_calls', chat);
    await refused({ messages: [{ role: 'user', content: 'x', audio: {} }] }, 'messages[0]', chat);
    await refused({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x' } }] }] }, 'messages[0].content', chat);
    assert.equal((await post(chat, { messages: [{ role: 'user', content: 'hi', name: 'ann' }], max_tokens: 2 })).status, 200);
    const tok = await post('/tokenize', { prompt: 'hi', add_special_token: false });
    assert.equal(tok.status, 400);
    assert.match(tok.json.error.message, /add_special_token/);
    // the accepted forms of the same fields
    const ok = await post(chat, { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, tools: [], tool_choice: 'none', response_format: { type: 'text' }, store: false, user: 'u1' });
    assert.equal(ok.status, 200, ok.text);
  });

  it('out-of-range values are 400s naming the field', async () => {
    await refused({ n: 0 }, 'n');
    await refused({ n: 17 }, 'n');
    await refused({ logprobs: 21 }, 'logprobs');
    await refused({ presence_penalty: 3 }, 'presence_penalty');
    await refused({ frequency_penalty: -2.5 }, 'frequency_penalty');
    await refused({ repetition_penalty: 0 }, 'repetition_penalty');
    await refused({ min_p: 1.5 }, 'min_p');
    await refused({ top_k: -2 }, 'top_k');
    await refused({ seed: 1.5 }, 'seed');
    await refused({ logit_bias: { '5': 101 } }, 'logit_bias');
    await refused({ logit_bias: { abc: 1 } }, 'logit_bias');
    await refused({ logit_bias: { '99999999': 1 } }, 'logit_bias');
    await refused({ stop_token_ids: [99999999] }, 'stop_token_ids[0]');
    await refused({ min_tokens: 5, max_tokens: 2 }, 'min_tokens');
    await refused({ best_of: 1, n: 2 }, 'best_of');
    await refused({ best_of: 3, stream: true }, 'best_of');
    await refused({ echo: true, logprobs: 1 }, 'echo');
    await refused({ stream_options: { include_usage: true } }, 'stream_options');
    await refused({ top_logprobs: 2 }, 'top_logprobs', '/v1/chat/completions');
    await refused({ logprobs: true, top_logprobs: 21 }, 'top_logprobs', '/v1/chat/completions');
  });

  it('n: that many choices; greedy ones are equal, seeded ones reproducible and different', async () => {
    const g = await complete({ n: 3 });
    assert.deepEqual(g.choices.map((c: { index: number }) => c.index), [0, 1, 2]);
    assert.equal(new Set(g.choices.map((c: { text: string }) => c.text)).size, 1, 'greedy choices are all the greedy answer');
    assert.equal(g.usage.completion_tokens, 36);
    const s1 = await complete({ n: 3, temperature: 1, seed: 11 });
    const s2 = await complete({ n: 3, temperature: 1, seed: 11 });
    assert.deepEqual(s1.choices, s2.choices, 'same seed, same choices');
    assert.ok(new Set(s1.choices.map((c: { text: string }) => c.text)).size > 1, 'the choices of one seeded request differ from each other');
    // chat, streamed: every index gets its text and its own finish chunk
    const ev = await events('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 1, seed: 3, n: 2, ignore_eos: true });
    const text = ['', ''];
    const finish: (string | null)[] = [null, null];
    for (const x of ev) for (const c of x.choices) {
      text[c.index] += c.delta.content ?? '';
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
    assert.deepEqual(finish, ['length', 'length']);
    const whole = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 1, seed: 3, n: 2, ignore_eos: true });
    assert.deepEqual(text, whole.json.choices.map((c: { message: { content: string } }) => c.message.content), 'streamed choices equal the non-streamed ones');
  });

  it('best_of: the n most likely of best_of candidates, all counted in usage', async () => {
    const r = await complete({ best_of: 3, n: 1, temperature: 1, seed: 5, logprobs: 0 });
    assert.equal(r.choices.length, 1);
    assert.equal(r.usage.completion_tokens, 36);
    const all = await complete({ n: 3, temperature: 1, seed: 5, logprobs: 0 });
    const sum = (c: { logprobs: { token_logprobs: number[] } }) => c.logprobs.token_logprobs.reduce((a, b) => a + b, 0);
    const best = all.choices.reduce((m: { logprobs: { token_logprobs: number[] } }, c: { logprobs: { token_logprobs: number[] } }) => (sum(c) > sum(m) ? c : m));
    assert.equal(r.choices[0].text, best.text, 'the candidate with the highest cumulative logprob');
  });

  it('seed: same seed same text, another seed another text; greedy ignores the seed', async () => {
    const a = await complete({ temperature: 1, seed: 1234 });
    const b = await complete({ temperature: 1, seed: 1234 });
    const c = await complete({ temperature: 1, seed: 4321 });
    assert.equal(a.choices[0].text, b.choices[0].text);
    assert.notEqual(a.choices[0].text, c.choices[0].text);
  });

  it('completions logprobs: per token, matching the text, streamed the same', async () => {
    const r = await complete({ logprobs: 3 });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, 12);
    assert.equal(lp.tokens.join(''), r.choices[0].text);
    for (let i = 0; i < 12; i++) {
      assert.ok(lp.token_logprobs[i] <= 0);
      const alts = Object.values(lp.top_logprobs[i]) as number[];
      assert.ok(alts.length >= 3);
      // greedy: the sampled token is the most likely one
      assert.equal(lp.token_logprobs[i], Math.max(...alts));
      assert.equal(lp.text_offset[i], lp.tokens.slice(0, i).join('').length);
    }
    const ev = await events('/v1/completions', { model: MODEL, prompt: 'Once upon a time there', max_tokens: 12, temperature: 0, ignore_eos: true, logprobs: 3 });
    const streamed = { tokens: [] as string[], token_logprobs: [] as number[], top_logprobs: [] as unknown[], text_offset: [] as number[] };
    for (const x of ev) for (const c of x.choices) if (c.logprobs) for (const k of Object.keys(streamed) as (keyof typeof streamed)[]) (streamed[k] as unknown[]).push(...c.logprobs[k]);
    assert.deepEqual(streamed, lp);
    // without logprobs the field is null
    assert.equal((await complete({})).choices[0].logprobs, null);
  });

  it('chat logprobs/top_logprobs: content entries with bytes, streamed the same', async () => {
    const body = { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 2 };
    const r = await post('/v1/chat/completions', body);
    assert.equal(r.status, 200, r.text);
    const content = r.json.choices[0].logprobs.content as { token: string; logprob: number; bytes: number[]; top_logprobs: { token: string; logprob: number }[] }[];
    assert.equal(content.length, 5);
    assert.equal(content.map((c) => c.token).join(''), r.json.choices[0].message.content);
    for (const c of content) {
      assert.equal(c.top_logprobs.length, 2);
      assert.deepEqual(c.bytes, [...Buffer.from(c.token)]);
      assert.equal(c.logprob, c.top_logprobs[0]!.logprob);
    }
    const ev = await events('/v1/chat/completions', body);
    const streamed = ev.flatMap((x) => x.choices.flatMap((c: { logprobs: { content: unknown[] } | null }) => c.logprobs?.content ?? []));
    assert.deepEqual(streamed, content);
    const none = await post('/v1/chat/completions', { ...body, logprobs: true, top_logprobs: undefined });
    assert.deepEqual(none.json.choices[0].logprobs.content[0].top_logprobs, []);
  });

  it('logit_bias, frequency/presence/repetition penalties change what greedy picks', async () => {
    const idsOf = (r: { choices: { logprobs: { tokens: string[] } }[] }) => r.choices[0]!.logprobs.tokens.map((t) => Number(t.replace('token_id:', '')));
    const asIds = { logprobs: 0, return_tokens_as_token_ids: true };
    const x = idsOf(await complete(asIds))[0]!;
    const count = async (body: Record<string, unknown>) => idsOf(await complete({ ...asIds, ...body })).filter((t) => t === x).length;
    assert.equal(await count({ logit_bias: { [x]: 100 } }), 12, 'a large bias makes one token win every step');
    assert.equal(await count({ logit_bias: { [x]: -100 }, max_tokens: 1 }), 0, 'a negative one keeps it out');
    // With a moderate bias the token keeps coming back; each penalty takes it back down.
    const biased = await count({ logit_bias: { [x]: 8 } });
    assert.ok(biased >= 8, `bias alone: ${biased} of 12`);
    for (const pen of [{ frequency_penalty: 2 }, { presence_penalty: 2 }, { repetition_penalty: 3 }]) {
      const c = await count({ logit_bias: { [x]: 8 }, ...pen });
      assert.ok(c < biased && c >= 1, `${JSON.stringify(pen)}: ${c} of 12 (without: ${biased})`);
    }
    // chat takes the same fields
    const chat = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, temperature: 0, logit_bias: { [x]: 100 }, ignore_eos: true, logprobs: true, return_tokens_as_token_ids: true });
    assert.equal(chat.status, 200, chat.text);
    assert.deepEqual(chat.json.choices[0].logprobs.content.map((c: { token: string }) => c.token), Array(3).fill(`token_id:${x}`));
  });

  it('top_k 1 and min_p 1 sample the greedy answer; temperature 1 alone does not', async () => {
    const greedy = (await complete({})).choices[0].text;
    assert.equal((await complete({ temperature: 1, seed: 9, top_k: 1 })).choices[0].text, greedy);
    assert.equal((await complete({ temperature: 1, seed: 9, min_p: 1 })).choices[0].text, greedy);
    assert.notEqual((await complete({ temperature: 1, seed: 9 })).choices[0].text, greedy);
  });

  it('stop token ids, min_tokens, stop strings with include_stop_str_in_output, echo', async () => {
    const r = await complete({ logprobs: 0 });
    const toks = r.choices[0].logprobs.tokens as string[];
    const tokIds = (await complete({ logprobs: 0, return_tokens_as_token_ids: true })).choices[0].logprobs.tokens.map((t: string) => Number(t.slice('token_id:'.length)));
    const third = tokIds[2]!;
    const first = tokIds[0]!;
    const stopped = await complete({ stop_token_ids: [third], ignore_eos: false });
    assert.equal(stopped.choices[0].finish_reason, 'stop');
    assert.equal(stopped.usage.completion_tokens, 3, 'the stop token is generated and counted, not shown');
    assert.equal(stopped.choices[0].text, toks.slice(0, 2).join(''));
    const early = await complete({ stop_token_ids: [first], ignore_eos: false, max_tokens: 4 });
    assert.equal(early.usage.completion_tokens, 1);
    const held = await complete({ stop_token_ids: [first], ignore_eos: false, min_tokens: 3, max_tokens: 4 });
    assert.ok(held.usage.completion_tokens >= 3, 'min_tokens keeps the stop id away for 3 tokens');
    const stop = toks[3]!.trim() || toks[3]!;
    const cut = await complete({ stop: [stop] });
    assert.equal(cut.choices[0].finish_reason, 'stop');
    assert.ok(!cut.choices[0].text.includes(stop));
    const kept = await complete({ stop: [stop], include_stop_str_in_output: true });
    assert.ok(kept.choices[0].text.endsWith(stop));
    assert.equal(kept.choices[0].text, cut.choices[0].text + stop);
    const echo = await complete({ echo: true });
    assert.equal(echo.choices[0].text, 'Once upon a time there' + r.choices[0].text);
  });

  it('greedy output with penalties and bias is the same alone and among concurrent requests', async () => {
    const body = { prompt: 'The weather today', max_tokens: 10, frequency_penalty: 1, repetition_penalty: 1.3, logit_bias: { '100': 3 }, logprobs: 1 };
    const alone = await complete(body);
    const crowd = await Promise.all([
      complete(body),
      complete({ prompt: 'Something else entirely', max_tokens: 20 }),
      complete({ prompt: 'A third prompt', temperature: 1, seed: 2, n: 2 }),
      complete(body),
    ]);
    assert.deepEqual(crowd[0].choices, alone.choices);
    assert.deepEqual(crowd[3].choices, alone.choices);
  });
});

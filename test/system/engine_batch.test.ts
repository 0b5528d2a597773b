// Continuous batching on a real `kvc engine` process: output is the same whether a request
// runs alone or among 8 concurrent ones (greedy and seeded sampling, completions and chat,
// streaming and not, through the `openai` client); requests beyond --max-num-seqs wait and
// all succeed; a full queue answers 503; a client that disconnects frees its sequence.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { freePortRange } from '../../harness/ports.js';
import { postJson, startKvc, type Proc } from '../../harness/proc.js';

const MODEL = 'builtin:tiny';

const PROMPTS = [
  'The history of the city begins',
  'In a distant galaxy',
  'Recipe: take two eggs and',
  'def fibonacci(n):',
  'Dear Sir or Madam, I am writing',
  'The weather today is',
  'Once there was a little robot who',
  'List of prime numbers: 2, 3, 5,',
];

async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

async function until(what: string, fn: () => Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await fn()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
}

async function completionText(client: OpenAI, prompt: string, stream: boolean, extra: Record<string, unknown> = {}): Promise<string> {
  const base = { model: MODEL, prompt, max_tokens: 12, temperature: 0, ignore_eos: true, ...extra } as OpenAI.CompletionCreateParamsNonStreaming;
  if (!stream) return (await client.completions.create(base)).choices[0]!.text;
  let text = '';
  for await (const c of await client.completions.create({ ...base, stream: true })) text += c.choices[0]?.text ?? '';
  return text;
}

async function chatText(client: OpenAI, prompt: string, stream: boolean): Promise<string> {
  const base = { model: MODEL, messages: [{ role: 'user' as const, content: prompt }], max_tokens: 10, temperature: 0 };
  if (!stream) return (await client.chat.completions.create(base)).choices[0]!.message.content ?? '';
  let text = '';
  for await (const c of await client.chat.completions.create({ ...base, stream: true })) text += c.choices[0]?.delta.content ?? '';
  return text;
}

describe('engine batching (real process)', () => {
  let proc: Proc;
  let url: string;
  let client: OpenAI;

  before(async () => {
    const port = await freePortRange(1);
    // A small step budget forces prompts to be split across steps and mixed with decode rows.
    proc = startKvc(['engine', '--port', String(port), '--model', MODEL, '--max-model-len', '512', '--max-num-seqs', '8', '--max-num-batched-tokens', '24']);
    url = (await proc.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
  });

  after(async () => {
    await proc?.kill();
  });

  it('greedy completions: alone == among 8 concurrent (streaming and not)', async () => {
    const alone: string[] = [];
    for (const p of PROMPTS) alone.push(await completionText(client, p, false));
    assert.ok(new Set(alone).size > 1, 'different prompts should give different outputs');
    const together = await Promise.all(PROMPTS.map((p, i) => completionText(client, p, i % 2 === 0)));
    assert.deepEqual(together, alone);
  });

  it('seeded sampling: alone == among 8 concurrent', async () => {
    const extra = { temperature: 0.8, top_p: 0.95, seed: 7 };
    const alone: string[] = [];
    for (const p of PROMPTS) alone.push(await completionText(client, p, false, extra));
    const together = await Promise.all(PROMPTS.map((p, i) => completionText(client, p, i % 2 === 1, extra)));
    assert.deepEqual(together, alone);
  });

  it('greedy chat: alone == among 8 concurrent (streaming and not)', async () => {
    const alone: string[] = [];
    for (const p of PROMPTS) alone.push(await chatText(client, p, true));
    const together = await Promise.all(PROMPTS.map((p, i) => chatText(client, p, i % 2 === 0)));
    assert.deepEqual(together, alone);
  });

  it('a client that disconnects frees its sequence', async () => {
    const ac = new AbortController();
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'Tell me a very long story', max_tokens: 400, ignore_eos: true, temperature: 0, stream: true }),
      signal: ac.signal,
    });
    const reader = r.body!.getReader();
    await reader.read(); // first event arrived: the sequence is running
    assert.equal(await metric(url, 'kvc_engine_num_requests_running'), 1);
    ac.abort();
    await until('the sequence to be released', async () => (await metric(url, 'kvc_engine_num_requests_running')) === 0);
    await until('KV blocks to be free', async () => (await metric(url, 'kvc_engine_kv_cache_usage_ratio')) === 0);
    // Same for a non-streaming request whose client gives up.
    const ac2 = new AbortController();
    const pending = fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'Another very long story', max_tokens: 400, ignore_eos: true, temperature: 0 }),
      signal: ac2.signal,
    }).catch(() => null);
    await until('the request to run', async () => (await metric(url, 'kvc_engine_num_requests_running')) === 1);
    ac2.abort();
    await pending;
    await until('the second sequence to be released', async () => (await metric(url, 'kvc_engine_num_requests_running')) === 0);
    await until('KV blocks to be free again', async () => (await metric(url, 'kvc_engine_kv_cache_usage_ratio')) === 0);
    const text = await (await fetch(`${url}/metrics`)).text();
    const cancelled = /^kvc_engine_requests_total\{endpoint="\/v1\/completions",outcome="cancelled"[^}]*\} (\d+)$/m.exec(text);
    assert.equal(Number(cancelled?.[1]), 2, 'both disconnected requests are counted as cancelled');
    // The engine keeps serving.
    assert.ok((await completionText(client, 'still alive?', false)).length > 0);
  });
});

describe('engine admission limits (real process)', () => {
  let proc: Proc;
  let url: string;

  before(async () => {
    const port = await freePortRange(1);
    proc = startKvc(['engine', '--port', String(port), '--model', MODEL, '--max-model-len', '256', '--max-num-seqs', '2', '--max-queue-len', '2']);
    url = (await proc.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
  });

  after(async () => {
    await proc?.kill();
  });

  it('requests beyond --max-num-seqs wait and all succeed; a full queue answers 503', async () => {
    // 4 requests: 2 run, 2 wait; all complete with the output they would have alone.
    const body = (p: string) => ({ model: MODEL, prompt: p, max_tokens: 6, temperature: 0, ignore_eos: true });
    const alone = [];
    for (const p of PROMPTS.slice(0, 4)) alone.push((await postJson(`${url}/v1/completions`, body(p))).json.choices[0].text);
    const together = await Promise.all(PROMPTS.slice(0, 4).map((p) => postJson(`${url}/v1/completions`, body(p))));
    assert.deepEqual(together.map((r) => r.status), [200, 200, 200, 200]);
    assert.deepEqual(together.map((r) => r.json.choices[0].text), alone);

    // Fill both slots and the queue with long requests, then one more is refused with 503.
    const ac = new AbortController();
    const long = (p: string) =>
      fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body(p), max_tokens: 200, stream: true }), signal: ac.signal }).catch(() => null);
    const held = PROMPTS.slice(0, 4).map(long);
    await until('2 running and 2 waiting', async () => (await metric(url, 'kvc_engine_num_requests_running')) === 2 && (await metric(url, 'kvc_engine_num_requests_waiting')) === 2);
    const refused = await postJson(`${url}/v1/completions`, body('one too many'));
    assert.equal(refused.status, 503);
    assert.equal(refused.json.error.type, 'unavailable_error');
    ac.abort();
    await Promise.all(held);
    await until('everything released', async () => (await metric(url, 'kvc_engine_num_requests_running')) === 0 && (await metric(url, 'kvc_engine_num_requests_waiting')) === 0);
    assert.equal(await metric(url, 'kvc_engine_kv_cache_usage_ratio'), 0);
  });
});

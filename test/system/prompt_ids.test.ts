// kv_transfer_params.kvc_prompt_token_ids (src/protocol/prompt_ids.ts), on a real engine in
// process: ids given with a text prompt are the prompt (the text is not tokenized again, so the
// answer follows the ids; the text still serves echo), for completions and chat; a malformed value
// is refused naming the field, and ids outside the vocabulary too.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { startEngine, type Engine } from '../../src/engine/server.js';
import { postJson } from '../../harness/proc.js';

const MODEL = 'builtin:tiny';

describe('kvc_prompt_token_ids on an engine', () => {
  let e: Engine;
  let url: string;
  const complete = (body: Record<string, unknown>) => postJson(`${url}/v1/completions`, { model: MODEL, max_tokens: 6, temperature: 0, ...body }, 60_000);
  const tokenize = async (body: Record<string, unknown>) => ((await postJson(`${url}/tokenize`, { model: MODEL, ...body }, 30_000)).json as { tokens: number[] }).tokens;

  before(async () => {
    e = await startEngine({ model: MODEL, port: 0, maxModelLen: 512, maxNumSeqs: 4 });
    url = e.url;
  });

  after(async () => {
    await e.close();
  });

  it('completions: the ids given are the prompt; the text serves echo', async () => {
    const a = 'the cache moves between engines';
    const b = 'a quite different prompt about the weather today';
    const idsB = await tokenize({ prompt: b });
    const plainA = await complete({ prompt: a });
    const plainB = await complete({ prompt: b });
    assert.equal(plainA.status, 200);
    const given = await complete({ prompt: a, kv_transfer_params: { kvc_prompt_token_ids: idsB } });
    assert.equal(given.status, 200, JSON.stringify(given.json));
    const text = (r: typeof given) => (r.json as { choices: { text: string }[] }).choices[0]!.text;
    assert.equal(text(given), text(plainB), 'the answer follows the ids, not the text');
    assert.equal((given.json as { usage: { prompt_tokens: number } }).usage.prompt_tokens, idsB.length);
    const echoed = await complete({ prompt: a, echo: true, kv_transfer_params: { kvc_prompt_token_ids: await tokenize({ prompt: a }) } });
    assert.equal(text(echoed), a + text(plainA), 'echo gives the text, the answer is the same as tokenizing it');
  });

  it('chat: the ids of the rendered messages give the same answer as the messages', async () => {
    const messages = [{ role: 'user', content: 'where does the KV cache go?' }];
    const ids = await tokenize({ messages });
    const plain = await postJson(`${url}/v1/chat/completions`, { model: MODEL, messages, max_tokens: 6, temperature: 0 }, 60_000);
    const given = await postJson(`${url}/v1/chat/completions`, { model: MODEL, messages, max_tokens: 6, temperature: 0, kv_transfer_params: { kvc_prompt_token_ids: ids } }, 60_000);
    assert.equal(given.status, 200, JSON.stringify(given.json));
    const content = (r: typeof plain) => (r.json as { choices: { message: { content: string } }[] }).choices[0]!.message.content;
    assert.equal(content(given), content(plain));
  });

  it('a malformed value or an id outside the vocabulary is refused naming the field', async () => {
    for (const bad of [[], [1, -2], [1, 2.5], 'ids', [1, '2']]) {
      const r = await complete({ prompt: 'x', kv_transfer_params: { kvc_prompt_token_ids: bad } });
      assert.equal(r.status, 400, JSON.stringify(bad));
      assert.match(JSON.stringify(r.json), /kv_transfer_params\.kvc_prompt_token_ids/, JSON.stringify(r.json));
    }
    const r = await complete({ prompt: 'x', kv_transfer_params: { kvc_prompt_token_ids: [1, 10_000_000] } });
    assert.equal(r.status, 400);
    assert.match(JSON.stringify(r.json), /kv_transfer_params\.kvc_prompt_token_ids\[1\]`: token id 10000000 is out of range/);
  });
});

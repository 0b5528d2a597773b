// Serving a checkpoint directory end to end through a real `kvc engine --model DIR` process:
// the test writes a small Hugging Face directory (config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json with its own chat template), serves it under --served-model-name, and
// checks the name rules (404 for any other name, /v1/models), that greedy output is the model's
// own greedy continuation computed in process from the same files, and that chat prompts go
// through the checkpoint's template.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { freePortRange } from '../../harness/ports.js';
import { BUILTIN_MODELS, writeBuiltinModel, type BuiltinSpec } from '../../src/engine/model/formats/builtin.js';
import { LlamaModel, argmax } from '../../src/engine/model/model.js';
import { Tokenizer } from '../../src/engine/model/tokenizer.js';
import { postJson, startKvc, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

const SERVED = 'my-checkpoint';
const CHATML = "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";

describe('kvc engine --model <checkpoint dir> (real process)', () => {
  let root: string;
  let dir: string;
  let proc: Proc;
  let url: string;

  before(async () => {
    root = tempDir('kvc-ckpt-');
    dir = join(root, 'tiny-llama-test');
    // A smaller sibling of the built-in model, written the same way (random weights, the
    // Llama-2 tokenizer files), then given a chat template of its own.
    const spec: BuiltinSpec = { ...BUILTIN_MODELS.tiny!, name: 'ckpt-test', seed: 4242, dim: 64, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 16, hiddenDim: 128, maxPositionEmbeddings: 512 };
    await writeBuiltinModel(spec, dir);
    const tc = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ ...tc, chat_template: CHATML }));
    const port = await freePortRange(1);
    proc = startKvc(['engine', '--port', String(port), '--model', dir, '--served-model-name', SERVED, '--max-model-len', '256']);
    url = (await proc.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
  });

  after(async () => {
    await proc?.kill();
    rmSync(root, { recursive: true, force: true });
  });

  it('--served-model-name: /v1/models lists it; any other name (the path, builtin:tiny) is a 404', async () => {
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
    const models = await client.models.list();
    assert.deepEqual(models.data.map((m) => m.id), [SERVED]);
    const m0 = models.data[0] as unknown as { root: string; max_model_len: number };
    assert.equal(m0.root, dir);
    assert.equal(m0.max_model_len, 256);
    const ok = await postJson(`${url}/v1/completions`, { model: SERVED, prompt: 'Hello', max_tokens: 2 });
    assert.equal(ok.status, 200);
    assert.equal(ok.json.model, SERVED);
    for (const other of [dir, 'builtin:tiny', 'tiny-llama-test']) {
      const r = await postJson(`${url}/v1/completions`, { model: other, prompt: 'Hello', max_tokens: 2 });
      assert.equal(r.status, 404, other);
      assert.equal(r.json.error.code, 'model_not_found');
      assert.match(r.json.error.message, new RegExp(`serves \`${SERVED}\``));
    }
    const chat404 = await postJson(`${url}/v1/chat/completions`, { model: 'builtin:tiny', messages: [{ role: 'user', content: 'x' }] });
    assert.equal(chat404.status, 404);
    // No model field at all is accepted (the one served model).
    assert.equal((await postJson(`${url}/v1/completions`, { prompt: 'Hello', max_tokens: 1 })).status, 200);
  });

  it("greedy output is the checkpoint's own greedy continuation (computed in process from the files)", async () => {
    const tok = await Tokenizer.load(dir);
    const model = await LlamaModel.load(dir);
    try {
      const prompt = tok.encode('The quick brown fox jumps over');
      const kv = model.createKvCache(8 * 1024 * 1024);
      let logits = model.forward([{ seqId: 0, tokens: prompt, startPos: 0, wantLogits: true }], kv)[0]!;
      const gen: number[] = [];
      for (let i = 0; i < 10; i++) {
        const t = argmax(logits);
        gen.push(t);
        logits = model.forward([{ seqId: 0, tokens: [t], startPos: prompt.length + i, wantLogits: true }], kv)[0]!;
      }
      const dec = tok.streamDecoder(prompt);
      const expected = gen.map((t) => dec.push(t)).join('') + dec.flush();
      const r = await postJson(`${url}/v1/completions`, { model: SERVED, prompt: 'The quick brown fox jumps over', max_tokens: 10, temperature: 0, ignore_eos: true });
      assert.equal(r.status, 200);
      assert.equal(r.json.usage.prompt_tokens, prompt.length);
      assert.equal(r.json.usage.completion_tokens, 10);
      assert.equal(r.json.choices[0].text, expected);
    } finally {
      model.close();
    }
  });

  it("chat goes through the checkpoint's chat template (openai client, streaming and not)", async () => {
    const tok = await Tokenizer.load(dir);
    const messages = [
      { role: 'system' as const, content: 'Be brief.' },
      { role: 'user' as const, content: 'Hi there' },
    ];
    const rendered = '<|system|>\nBe brief.\n<|user|>\nHi there\n<|assistant|>\n';
    const expectedIds = tok.encode(rendered); // BOS added once: the template has none
    const t = await postJson(`${url}/tokenize`, { model: SERVED, messages });
    assert.equal(t.status, 200);
    assert.deepEqual(t.json.tokens, expectedIds);
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
    const a = await client.chat.completions.create({ model: SERVED, messages, max_tokens: 6, temperature: 0 });
    assert.equal(a.usage!.prompt_tokens, expectedIds.length);
    // The same prompt as raw ids through /v1/completions gives the same greedy text.
    const c = await postJson(`${url}/v1/completions`, { model: SERVED, prompt: expectedIds, max_tokens: 6, temperature: 0 });
    assert.equal(a.choices[0]!.message.content, c.json.choices[0].text);
    let streamed = '';
    for await (const ch of await client.chat.completions.create({ model: SERVED, messages, max_tokens: 6, temperature: 0, stream: true })) streamed += ch.choices[0]?.delta.content ?? '';
    assert.equal(streamed, a.choices[0]!.message.content);
  });
});

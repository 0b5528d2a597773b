// Model I/O: config.json validation, safetensors (f32/f16/bf16, shards, errors), the tokenizer
// (streaming decode, chat template) and race-free generation of the built-in model by several
// processes at once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readFileSync, readdirSync, utimesSync, writeFileSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseModelConfig, loadModelConfig, ModelConfigError } from '../../src/engine/model/config.js';
import { SafetensorsCollection, writeSafetensors } from '../../src/engine/model/formats/safetensors.js';
import { f32ToBf16, f32ToF16, f16ToF32 } from '../../src/common/half.js';
import { Tokenizer, maxCharsPerToken, LLAMA2_CHAT_TEMPLATE } from '../../src/engine/model/tokenizer.js';
import { ensureBuiltinModel, BUILTIN_MODELS, builtinDirName, cleanStaleBuiltinTemps, STALE_TMP_MS } from '../../src/engine/model/formats/builtin.js';
import { tempDir } from '../../harness/temp_dir.js';

const here = dirname(fileURLToPath(import.meta.url));

const goodConfig = {
  architectures: ['LlamaForCausalLM'],
  vocab_size: 100,
  hidden_size: 64,
  intermediate_size: 128,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  rms_norm_eps: 1e-5,
  rope_theta: 10000,
  tie_word_embeddings: true,
  max_position_embeddings: 512,
  bos_token_id: 1,
  eos_token_id: 2,
};

test('config: parses Llama keys and derives head_dim', () => {
  const c = parseModelConfig(goodConfig);
  assert.equal(c.dim, 64);
  assert.equal(c.headDim, 16);
  assert.equal(c.numKvHeads, 2);
  assert.equal(c.hiddenDim, 128);
  assert.equal(c.tieWordEmbeddings, true);
  assert.equal(c.eosTokenId, 2);
  assert.deepEqual(parseModelConfig({ ...goodConfig, eos_token_id: [2, 3] }).eosTokenIds, [2, 3]);
  assert.equal(parseModelConfig({ ...goodConfig, num_key_value_heads: undefined }).numKvHeads, 4);
});

test('config: errors name the file and the key', async () => {
  const cases: [Record<string, unknown>, RegExp][] = [
    [{ ...goodConfig, hidden_size: undefined }, /cfg\.json: missing required key "hidden_size"/],
    [{ ...goodConfig, num_hidden_layers: 'two' }, /"num_hidden_layers" must be a positive integer/],
    [{ ...goodConfig, num_attention_heads: 3 }, /"num_attention_heads" \(3\) must be a multiple of "num_key_value_heads"/],
    [{ ...goodConfig, eos_token_id: 100 }, /"eos_token_id" must be a token id in \[0, 100\)/],
    [{ ...goodConfig, rope_theta: -1 }, /"rope_theta" must be a positive number/],
    [{ ...goodConfig, architectures: ['GPT2LMHeadModel'] }, /"architectures"/],
    [{ ...goodConfig, tie_word_embeddings: 'yes' }, /"tie_word_embeddings" must be a boolean/],
  ];
  for (const [raw, re] of cases) assert.throws(() => parseModelConfig(raw, 'cfg.json'), (e: Error) => e instanceof ModelConfigError && re.test(e.message), re.source);
  const dir = tempDir();
  writeFileSync(join(dir, 'config.json'), '{not json');
  await assert.rejects(loadModelConfig(dir), /config\.json: not valid JSON/);
  await assert.rejects(loadModelConfig(join(dir, 'nope')), /config\.json: cannot read/);
});

test('safetensors: f32/f16/bf16 round trip, shards, clear errors', async () => {
  const dir = tempDir();
  const vals = new Float32Array([0, 1, -2.5, 0.333333, 65504, 1e-6, -0.1, 3.14159]);
  await writeSafetensors(join(dir, 'a.safetensors'), [
    { name: 'x.f32', shape: [2, 4], data: vals, dtype: 'F32' },
    { name: 'x.f16', shape: [8], data: vals, dtype: 'F16' },
  ]);
  await writeSafetensors(join(dir, 'b.safetensors'), [{ name: 'x.bf16', shape: [4, 2], data: vals, dtype: 'BF16' }]);
  const st = await SafetensorsCollection.openDir(dir);
  assert.deepEqual(st.names().sort(), ['x.bf16', 'x.f16', 'x.f32']);
  assert.deepEqual((await st.get('x.f32', [2, 4])).data, vals);
  const f16 = (await st.get('x.f16')).data;
  const bf16 = (await st.get('x.bf16')).data;
  for (let i = 0; i < vals.length; i++) {
    assert.equal(f16[i], f16ToF32(f32ToF16(vals[i]!)));
    const b = new Float32Array(new Uint32Array([f32ToBf16(vals[i]!) << 16]).buffer)[0]!;
    assert.equal(bf16[i], b);
    // half precision keeps ~3 significant digits (f16 subnormals aside)
    if (Math.abs(vals[i]!) > 1e-4) assert.ok(Math.abs(f16[i]! - vals[i]!) <= Math.abs(vals[i]!) * 1e-3);
    assert.ok(Math.abs(bf16[i]! - vals[i]!) <= Math.abs(vals[i]!) * 8e-3);
  }
  assert.equal(f16[0], 0);
  assert.equal(f16[4], 65504);
  await assert.rejects(st.get('missing.weight'), /missing tensor "missing.weight"/);
  await assert.rejects(st.get('x.f32', [4, 2]), /tensor "x.f32" has shape \[2,4\], expected \[4,2\]/);

  // An index file restricts the shards to the ones it names.
  const d2 = tempDir();
  await writeSafetensors(join(d2, 'model-00001-of-00002.safetensors'), [{ name: 'a', shape: [2], data: new Float32Array([1, 2]), dtype: 'F32' }]);
  await writeSafetensors(join(d2, 'model-00002-of-00002.safetensors'), [{ name: 'b', shape: [1], data: new Float32Array([3]), dtype: 'BF16' }]);
  writeFileSync(join(d2, 'model.safetensors.index.json'), JSON.stringify({ weight_map: { a: 'model-00001-of-00002.safetensors', b: 'model-00002-of-00002.safetensors' } }));
  const st2 = await SafetensorsCollection.openDir(d2);
  assert.deepEqual([...(await st2.get('b')).data], [3]);

  // Corrupt files give errors naming the file.
  const d3 = tempDir();
  writeFileSync(join(d3, 'bad.safetensors'), Buffer.from([1, 2, 3]));
  await assert.rejects(SafetensorsCollection.openDir(d3), /bad\.safetensors: truncated/);
  const d4 = tempDir();
  await assert.rejects(SafetensorsCollection.openDir(d4), /no \*\.safetensors files found/);
});

test('tokenizer: encode/decode, streaming decode of multi-byte characters, chat template', async () => {
  const dir = await ensureBuiltinModel('tiny');
  const tok = await Tokenizer.load(dir);
  assert.equal(tok.bosTokenId, 1);
  assert.equal(tok.eosTokenId, 2);
  const text = 'Hello world — naïve café 日本語 🙂 done.';
  const ids = tok.encode(text);
  assert.equal(ids[0], 1);
  assert.equal(tok.decode(ids), text);
  assert.notEqual(tok.encode(text, { addBos: false })[0], 1);
  // Streaming: deltas concatenate to the full decode and never contain a broken character.
  const gen = tok.encode('🙂 日本語 ok', { addBos: false });
  const ctx = tok.encode('Prompt:');
  assert.ok(gen.length > 6, 'emoji and CJK go through byte-fallback tokens');
  const dec = tok.streamDecoder(ctx);
  let streamed = '';
  for (const id of gen) {
    const d = dec.push(id);
    assert.ok(!d.includes('\uFFFD'), `delta ${JSON.stringify(d)} has a replacement character`);
    streamed += d;
  }
  streamed += dec.flush();
  assert.equal(streamed, ' 🙂 日本語 ok');
  assert.equal(streamed, tok.decode([...ctx, ...gen]).slice(tok.decode(ctx).length));
  // decodeWindow remembers windows of one or two ids: a remembered window gives decode()'s text,
  // byte-fallback pieces and special ids included, on first sight and again.
  const wins = [...ctx, ...gen, 1, 2, 0, 29871, 13, 31999, ...gen.slice(0, 3)];
  for (let pass = 0; pass < 2; pass++) {
    for (let i = 0; i < wins.length; i++) {
      for (const n of [1, 2, 3]) {
        if (i + n > wins.length) continue;
        assert.equal(tok.decodeWindow(wins, i, i + n), tok.decode(wins.slice(i, i + n)), `window ${wins.slice(i, i + n).join(',')} (pass ${pass})`);
      }
    }
  }
  // Chat template: the package's tokenizer_config.json has none, so the tokenizer has none (a chat
  // request would be a 400); the engine gives the built-in model Llama-2's (runtime.ts).
  assert.equal(tok.chatTemplateSource, null);
  assert.throws(() => tok.applyChatTemplate([{ role: 'user', content: 'Hi' }]), /this model has no chat template/);
  tok.useChatTemplate(LLAMA2_CHAT_TEMPLATE, "the built-in model's chat template");
  const chat = tok.applyChatTemplate([
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Hi' },
  ]);
  assert.equal(chat, '<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]');
  const cids = tok.encodeChat([{ role: 'user', content: 'Hi' }]);
  assert.equal(cids[0], 1);
  assert.equal(cids.filter((x) => x === 1).length, 1);
  assert.throws(() => tok.applyChatTemplate([{ role: 'assistant', content: 'x' }]), /messages: chat template failed: .*alternate/);
});

test('builtin model: several processes generating at once agree on one complete directory', async () => {
  const cache = tempDir();
  const mod = join(here, '..', '..', 'src', 'engine', 'model', 'formats', 'builtin.js');
  const script = `import(${JSON.stringify(mod)}).then(async (m) => { process.stdout.write(await m.ensureBuiltinModel('tiny')); })`;
  const runs = await Promise.all(
    [0, 1, 2].map(
      () =>
        new Promise<string>((resolve, reject) => {
          const p = spawn(process.execPath, ['-e', script], { env: { ...process.env, KVC_CACHE_DIR: cache }, stdio: ['ignore', 'pipe', 'pipe'] });
          let out = '';
          let err = '';
          const timer = setTimeout(() => {
            p.kill('SIGKILL');
            reject(new Error('builtin generation timed out'));
          }, 60_000);
          p.stdout.on('data', (d) => (out += d));
          p.stderr.on('data', (d) => (err += d));
          p.on('exit', (code) => {
            clearTimeout(timer);
            if (code === 0) resolve(out);
            else reject(new Error(`exit ${code}: ${err}`));
          });
        }),
    ),
  );
  const expected = join(cache, 'models', builtinDirName(BUILTIN_MODELS.tiny!));
  for (const r of runs) assert.equal(r, expected);
  // Only the final directory remains (temp dirs cleaned up), with all four files.
  assert.deepEqual(readdirSync(join(cache, 'models')), [builtinDirName(BUILTIN_MODELS.tiny!)]);
  assert.deepEqual(readdirSync(expected).sort(), ['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']);
  // Deterministic: a second cache directory generated in-process has identical weights.
  const other = tempDir();
  mkdirSync(other, { recursive: true });
  const prev = process.env.KVC_CACHE_DIR;
  process.env.KVC_CACHE_DIR = other;
  try {
    const d2 = await ensureBuiltinModel('tiny');
    const h = (f: string) => createHash('sha256').update(readFileSync(f)).digest('hex');
    assert.equal(h(join(d2, 'model.safetensors')), h(join(expected, 'model.safetensors')));
  } finally {
    if (prev === undefined) delete process.env.KVC_CACHE_DIR;
    else process.env.KVC_CACHE_DIR = prev;
  }
  await assert.rejects(ensureBuiltinModel('huge'), /unknown built-in model "huge"/);
});

test('tokenizer: chat template from tokenizer_config.json, as a string and as a list of named templates', async () => {
  const src = await ensureBuiltinModel('tiny');
  const base = JSON.parse(readFileSync(join(src, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
  const msgs = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Hi' },
  ];
  const withConfig = async (cfg: Record<string, unknown>) => {
    const dir = tempDir('kvc-tok-');
    copyFileSync(join(src, 'tokenizer.json'), join(dir, 'tokenizer.json'));
    writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ ...base, ...cfg }));
    return Tokenizer.load(dir);
  };
  // ChatML-style string template.
  const chatml =
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";
  const t1 = await withConfig({ chat_template: chatml });
  assert.equal(t1.chatTemplateSource, chatml);
  assert.equal(t1.applyChatTemplate(msgs), '<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n');
  assert.equal(t1.applyChatTemplate(msgs, { addGenerationPrompt: false }), '<|system|>\nBe brief.\n<|user|>\nHi\n');
  // No BOS in the rendered text: encodeChat adds it (add_bos_token), exactly once.
  const ids = t1.encodeChat(msgs);
  assert.equal(ids[0], 1);
  assert.deepEqual(ids, t1.encode('<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n'));
  // A template that emits bos_token itself gets no second BOS.
  const t2 = await withConfig({ chat_template: "{{ bos_token }}{% for m in messages %}{{ m['content'] }};{% endfor %}" });
  const ids2 = t2.encodeChat(msgs);
  assert.equal(ids2.filter((x) => x === 1).length, 1);
  assert.deepEqual(ids2, t2.encode('Be brief.;Hi;', {}));
  // List of named templates (transformers' format): "default" is the one used.
  const t3 = await withConfig({
    chat_template: [
      { name: 'tool_use', template: 'TOOLS {{ messages[0].content }}' },
      { name: 'default', template: "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}" },
    ],
  });
  assert.equal(t3.applyChatTemplate(msgs), '[system] Be brief. [user] Hi ');
  // A template that does not parse is a load error naming chat_template.
  await assert.rejects(withConfig({ chat_template: '{% for m in messages %}' }), /chat_template does not parse/);
});

test('tokenizer: a sound characters-per-token bound only for pipelines that never shrink the text', async () => {
  const dir = await ensureBuiltinModel('tiny');
  const tj = JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')) as Record<string, unknown>;
  const max = maxCharsPerToken(tj);
  assert.equal(max, 16, 'the longest Llama-2 piece is 16 characters (a run of ▁)');
  const tok = await Tokenizer.load(dir);
  assert.equal(tok.maxCharsPerToken, 16);
  // The bound holds for texts built to be as cheap as possible in tokens.
  for (const text of [' '.repeat(1000), 'the '.repeat(300), 'a'.repeat(500), '<s>'.repeat(50), 'x', '🙂'.repeat(40)]) {
    const n = tok.encode(text, { addBos: false }).length;
    assert.ok(tok.minTokens(text) <= n, `minTokens(${JSON.stringify(text.slice(0, 12))}…) = ${tok.minTokens(text)} > ${n}`);
  }
  assert.equal(tok.minTokens('a'.repeat(161)), 11);
  // Pipelines that may drop or merge characters give no bound.
  const withNorm = (n: unknown) => maxCharsPerToken({ ...tj, normalizer: n });
  assert.equal(withNorm({ type: 'Strip', strip_left: true, strip_right: true }), null);
  assert.equal(withNorm({ type: 'NFKC' }), null);
  assert.equal(withNorm({ type: 'Replace', pattern: { String: '  ' }, content: ' ' }), null);
  assert.equal(withNorm({ type: 'Replace', pattern: { Regex: '\\s+' }, content: ' ' }), null);
  assert.equal(withNorm(null), 16);
  assert.equal(maxCharsPerToken({ ...tj, pre_tokenizer: { type: 'Whitespace' } }), null);
  assert.equal(maxCharsPerToken({ ...tj, pre_tokenizer: { type: 'Split', pattern: { String: ' ' }, behavior: 'Removed' } }), null);
  assert.equal(maxCharsPerToken({ ...tj, pre_tokenizer: { type: 'Metaspace', replacement: '▁' } }), 16);
  const model = tj.model as Record<string, unknown>;
  assert.equal(maxCharsPerToken({ ...tj, model: { ...model, byte_fallback: false } }), null, 'fuse_unk without byte fallback: one <unk> may cover any run');
  assert.equal(maxCharsPerToken({ ...tj, model: { ...model, type: 'Unigram' } }), null);
});

test('builtin model: KVC_CACHE_DIR comes from the env passed in; stale temp folders of dead processes are removed', async () => {
  const cache = tempDir();
  const root = join(cache, 'models');
  const spec = BUILTIN_MODELS.tiny!;
  // A finished model (only its config.json matters for the "already there" check).
  mkdirSync(join(root, builtinDirName(spec)), { recursive: true });
  writeFileSync(join(root, builtinDirName(spec), 'config.json'), '{}');
  const old = (Date.now() - STALE_TMP_MS - 60_000) / 1000;
  const mk = (name: string, age: number | null) => {
    const d = join(root, name);
    mkdirSync(d);
    writeFileSync(join(d, 'model.safetensors'), 'partial');
    if (age !== null) {
      utimesSync(join(d, 'model.safetensors'), age, age);
      utimesSync(d, age, age);
    }
    return d;
  };
  const deadPid = 2 ** 22 + 12345; // above Linux's pid_max: no such process
  const staleDead = mk(`.${builtinDirName(spec)}.tmp-${deadPid}-abc123`, old);
  const freshDead = mk(`.${builtinDirName(spec)}.tmp-${deadPid}-def456`, null);
  const oldButAlive = mk(`.${builtinDirName(spec)}.tmp-${process.pid}-ghi789`, old);
  const unrelated = mk('.something-else.tmp-1-x', old);
  const prev = process.env.KVC_CACHE_DIR;
  process.env.KVC_CACHE_DIR = tempDir(); // must NOT be used
  try {
    const dir = await ensureBuiltinModel('tiny', { KVC_CACHE_DIR: cache });
    assert.equal(dir, join(root, builtinDirName(spec)));
    assert.deepEqual(readdirSync(process.env.KVC_CACHE_DIR), [], 'process.env.KVC_CACHE_DIR untouched');
  } finally {
    if (prev === undefined) delete process.env.KVC_CACHE_DIR;
    else process.env.KVC_CACHE_DIR = prev;
  }
  assert.equal(existsSync(staleDead), false, 'old temp dir of a dead process removed');
  assert.equal(existsSync(freshDead), true, 'a recently written temp dir is kept (it may belong to another host)');
  assert.equal(existsSync(oldButAlive), true, 'a temp dir whose process is alive is kept');
  assert.equal(existsSync(unrelated), true, 'other names are never touched');
  assert.deepEqual(await cleanStaleBuiltinTemps(root, Date.now() + 2 * STALE_TMP_MS), [`.${builtinDirName(spec)}.tmp-${deadPid}-def456`]);
});

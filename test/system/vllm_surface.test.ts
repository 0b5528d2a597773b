// vLLM's command surface on kvc engines, through real processes where the command line matters:
// `kvc serve MODEL`, VLLM_API_KEY closing the engine like KVC_API_KEY, prefix caching on by
// default (a repeated prompt is served from the cache), cache keys from LMCACHE_* variables, an
// unsupported vLLM flag refused by name; and the chat template rules (no silent fallback).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { symlinkSync, writeFileSync, copyFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePortRange } from '../../harness/ports.js';
import { ensureBuiltinModel } from '../../src/engine/model/formats/builtin.js';
import { startEngine, type Engine } from '../../src/engine/server.js';
import { CLI, postJson, startKvc, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

const kvc = (args: string[], env: NodeJS.ProcessEnv = {}) => spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 30_000, env: { ...process.env, ...env } });
const chat = { messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 2, temperature: 0 };

describe('kvc serve MODEL with VLLM_API_KEY and LMCACHE_CHUNK_SIZE', () => {
  let p: Proc;
  let url: string;
  before(async () => {
    const port = await freePortRange(1);
    p = startKvc(['serve', 'builtin:tiny', '--port', String(port)], { VLLM_API_KEY: 'vllm-secret-key', LMCACHE_CHUNK_SIZE: '16' });
    url = (await p.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
  });
  after(async () => p?.kill());

  it('VLLM_API_KEY closes the engine: no key 401, the key 200 (chat with the built-in model\'s template)', async () => {
    assert.equal((await postJson(`${url}/v1/chat/completions`, chat)).status, 401);
    const ok = await postJson(`${url}/v1/chat/completions`, chat, 60_000, { authorization: 'Bearer vllm-secret-key' });
    assert.equal(ok.status, 200, JSON.stringify(ok.json));
  });

  it('prefix caching is on by default; the chunk size came from LMCACHE_CHUNK_SIZE (logged once)', async () => {
    const body = { prompt: Array.from({ length: 40 }, (_, i) => 10 + i * 7), max_tokens: 1, temperature: 0 };
    const auth = { authorization: 'Bearer vllm-secret-key' };
    const a = await postJson(`${url}/v1/completions`, body, 60_000, auth);
    assert.equal(a.status, 200, JSON.stringify(a.json));
    let cached = 0;
    // The first answer may come before its chunks are stored; they are within a moment.
    for (let i = 0; i < 50 && cached === 0; i++) {
      const b = await postJson(`${url}/v1/completions`, body, 60_000, auth);
      cached = b.json.usage.prompt_tokens_details.cached_tokens;
      if (cached === 0) await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(cached, 39, 'every chunk loaded (the last prompt token is always computed)');
    assert.equal(p.output().match(/LMCACHE_CHUNK_SIZE read as cache key "chunk_size"/g)?.length, 1, p.output());
  });
});

describe('the command line refuses what it cannot honour, by name', () => {
  it('an unsupported vLLM flag, before anything starts', () => {
    const r = kvc(['serve', 'builtin:tiny', '--tensor-parallel-size', '2']);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /^kvc serve: not supported by kvc \(CPU engine\): --tensor-parallel-size/m);
    const v = kvc(['engine', '--revision', 'main']);
    assert.match(v.stderr, /not supported by kvc \(CPU engine\): --revision/);
    assert.ok(!/did you mean/i.test(v.stderr), v.stderr);
  });

  it('KVC_API_KEY and VLLM_API_KEY set to different keys, an empty key, a variable set against the file', () => {
    assert.match(kvc(['serve', '--port', '1'], { KVC_API_KEY: 'a-key', VLLM_API_KEY: 'b-key' }).stderr, /KVC_API_KEY and VLLM_API_KEY are set to different values/);
    assert.match(kvc(['serve', '--port', '1'], { VLLM_API_KEY: ' ' }).stderr, /VLLM_API_KEY: expected a non-empty value/);
    const yaml = join(tempDir('kvc-vllm-env-'), 'cache.yaml');
    writeFileSync(yaml, 'chunk_size: 32\n');
    const r = kvc(['serve', '--port', '1'], { KVC_CONFIG_FILE: yaml, LMCACHE_CHUNK_SIZE: '16' });
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /LMCACHE_CHUNK_SIZE=16 and key "chunk_size" of .*cache\.yaml \(32\) set "chunk_size" differently/);
  });
});

describe('chat templates: the checkpoint\'s, chat_template.jinja, --chat-template; none is a 400', () => {
  let bare: Engine;
  let given: Engine;
  let jinja: Engine;
  before(async () => {
    const src = await ensureBuiltinModel('tiny');
    // A checkpoint directory with the built-in weights and a tokenizer_config.json without a template.
    const checkpoint = (name: string) => {
      const dir = join(tempDir('kvc-chat-tpl-'), name);
      spawnSync('mkdir', ['-p', dir]);
      for (const f of ['config.json', 'model.safetensors', 'tokenizer.json']) symlinkSync(join(src, f), join(dir, f));
      copyFileSync(join(src, 'tokenizer_config.json'), join(dir, 'tokenizer_config.json'));
      return dir;
    };
    const withJinja = checkpoint('with-jinja');
    writeFileSync(join(withJinja, 'chat_template.jinja'), "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}");
    [bare, given, jinja] = await Promise.all([
      startEngine({ model: checkpoint('bare') }),
      startEngine({ model: checkpoint('given'), chatTemplate: "{% for m in messages %}[{{ m['content'] }}]{% endfor %}" }),
      startEngine({ model: withJinja }),
    ]);
  });
  after(async () => {
    await Promise.all([bare?.close(), given?.close(), jinja?.close()]);
  });

  it('without a template, chat is a 400 that says how to give one; completions still work', async () => {
    const r = await postJson(`${bare.url}/v1/chat/completions`, chat);
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /this model has no chat template .*--chat-template <file or template>/);
    assert.equal((await postJson(`${bare.url}/v1/completions`, { prompt: 'Hello', max_tokens: 1 })).status, 200);
  });

  it('--chat-template and chat_template.jinja are used', async () => {
    const tok = (e: Engine) => e.model.tokenizer;
    assert.equal(tok(given).applyChatTemplate([{ role: 'user', content: 'hi' }]), '[hi]');
    assert.equal(tok(jinja).applyChatTemplate([{ role: 'user', content: 'hi' }]), 'user: hi\n');
    assert.equal((await postJson(`${given.url}/v1/chat/completions`, chat)).status, 200);
    assert.equal((await postJson(`${jinja.url}/v1/chat/completions`, chat)).status, 200);
  });
});

// `kvc engine` flags as vLLM users type them, and `kvc keys` keying with the engine's model id:
// --port defaults to 8000, the model may be positional, --dtype, --enable-prefix-caching /
// --no-enable-prefix-caching, --disable-log-requests, a one-line error for an unknown flag, and
// a hint when --model is a Hugging Face id rather than a local directory.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawnSync } from 'node:child_process';
import { promisify } from 'node:util';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { chunkKeys } from '../../src/common/keys.js';
import { freePortRange, isPortFree } from '../../harness/ports.js';
import { startEngine, type Engine } from '../../src/engine/server.js';
import { resolveEngineSettings } from '../../src/engine/settings.js';
import { CLI, postJson, startKvc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

// The engines of the second group run in this process: their CLI clients must not block it.
const kvcAsync = async (args: string[]) => {
  try {
    const r = await promisify(execFile)(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 30_000, env: { ...process.env, PYTHONHASHSEED: '0' } });
    return { status: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (e) {
    const x = e as { code?: number; stdout?: string; stderr?: string };
    return { status: x.code ?? 1, stdout: x.stdout ?? '', stderr: x.stderr ?? '' };
  }
};
const kvc = (args: string[], env: NodeJS.ProcessEnv = {}) => spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 30_000, env: { ...process.env, PYTHONHASHSEED: '0', ...env } });

describe('kvc engine flags', () => {
  it('an unknown flag is one short error with a did-you-mean, not the whole help', () => {
    const r = kvc(['engine', '--prot', '9000']);
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /unknown option '--prot'/);
    assert.match(r.stderr, /Did you mean --port\?/);
    assert.ok(!/Usage:/.test(r.stderr), r.stderr);
    assert.ok(r.stderr.trim().split('\n').length <= 3, r.stderr);
  });

  it('a Hugging Face id gets a hint that models are local directories', () => {
    const r = kvc(['engine', '--model', 'meta-llama/Llama-3.2-1B-Instruct']);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /--model meta-llama\/Llama-3\.2-1B-Instruct: not a local directory/);
    assert.match(r.stderr, /huggingface-cli download meta-llama\/Llama-3\.2-1B-Instruct --local-dir/);
    const d = tempDir('kvc-flags-empty-');
    assert.match(kvc(['engine', d]).stderr, /has no config\.json/);
    assert.match(kvc(['engine', '--model', 'builtin:huge']).stderr, /no such built-in model; built-in models: builtin:tiny/);
  });

  it('--dtype: float32 family accepted, half precision refused with the reason', () => {
    assert.equal(resolveEngineSettings({ dtype: 'float32' }).modelSpec, 'builtin:tiny');
    assert.throws(() => resolveEngineSettings({ dtype: 'bfloat16' }), /--dtype: expected one of auto, float32, float, found "bfloat16" \(this CPU engine computes in float32/);
    assert.match(kvc(['engine', '--dtype', 'half']).stderr, /--dtype/);
  });

  it('--disable-log-requests turns the request log setting off', () => {
    assert.equal(resolveEngineSettings({}).logRequests, true);
    assert.equal(resolveEngineSettings({ logRequests: false }).logRequests, false);
  });

  it('--port defaults to 8000 (help), and the model may be given positionally', async () => {
    const help = kvc(['engine', '--help']).stdout;
    assert.match(help, /--port <port>\s+HTTP port \(default: 8000\)/);
    assert.match(help, /--enable-prefix-caching/);
    assert.match(help, /--no-enable-prefix-caching/);
    assert.match(kvc(['engine', 'builtin:tiny', '--model', './other']).stderr, /the model is given twice/);
    const port = await freePortRange(1);
    const p = startKvc(['engine', 'builtin:tiny', '--port', String(port), '--served-model-name', 'tiny', '--dtype', 'auto', '--disable-log-requests', '--no-enable-prefix-caching']);
    try {
      const m = await p.waitFor(/engine listening on (http:\/\/\S+)/, 120_000);
      const models = await (await fetch(`${m[1]}/v1/models`)).json();
      assert.equal(models.data[0].id, 'tiny');
      assert.equal(models.data[0].kvc_model_id, 'builtin-tiny-v2');
    } finally {
      await p.kill();
    }
  });

  it('without --port the engine listens on 8000 (when 8000 is free on this machine)', async (t) => {
    if (!(await isPortFree(8000, '127.0.0.1'))) {
      t.skip('port 8000 is in use on this machine');
      return;
    }
    const p = startKvc(['engine']);
    try {
      await p.waitFor(/engine listening on http:\/\/127\.0\.0\.1:8000/, 120_000);
    } finally {
      await p.kill();
    }
  });
});

describe('--enable-prefix-caching and kvc keys', () => {
  let e: Engine;
  let plain: Engine;
  const dir = tempDir('kvc-flags-pc-');
  const yaml = join(dir, 'cache.yaml');
  const prompt = Array.from({ length: 40 }, (_, i) => 10 + i * 7);

  before(async () => {
    writeFileSync(yaml, 'chunk_size: 16\nmax_local_cpu_size: 0.05\n');
    e = await startEngine({ model: 'builtin:tiny', servedModelName: 'served-tiny', enablePrefixCaching: true, env: { ...process.env, KVC_CONFIG_FILE: yaml, PYTHONHASHSEED: '0' } });
    plain = await startEngine({ model: 'builtin:tiny', enablePrefixCaching: false });
  });
  after(async () => {
    await e?.close();
    await plain?.close();
  });

  it('attaches a kv_both cache instance: a repeated prompt is served from it', async () => {
    assert.equal(e.connectorConfig?.kv_role, 'kv_both');
    assert.equal(plain.connector, null, 'without the flag there is no cache instance');
    const body = { prompt, max_tokens: 2, temperature: 0, ignore_eos: true };
    const a = await postJson(`${e.url}/v1/completions`, body);
    assert.equal(a.status, 200, JSON.stringify(a.json));
    assert.equal(a.json.usage.prompt_tokens_details.cached_tokens, 0);
    let b = await postJson(`${e.url}/v1/completions`, body);
    // the first answer may come before its chunks are stored; they are within a moment
    for (let i = 0; i < 50 && b.json.usage.prompt_tokens_details.cached_tokens === 0; i++) {
      await new Promise((r) => setTimeout(r, 100));
      b = await postJson(`${e.url}/v1/completions`, body);
    }
    assert.equal(b.json.usage.prompt_tokens_details.cached_tokens, 39, 'every chunk loaded (the last prompt token is always computed)');
    assert.equal(b.json.choices[0].text, a.json.choices[0].text);
  });

  it('kvc keys --model builtin:tiny and --engine <url> give the keys the engine stored', async () => {
    await postJson(`${e.url}/v1/completions`, { prompt, max_tokens: 1 });
    const expected = chunkKeys(prompt, { modelId: 'builtin-tiny-v2', chunkSize: 16, seed: 0n }).map((s) => s.key);
    for (const args of [['--model', 'builtin:tiny'], ['--engine', e.url, '--model', 'served-tiny'], ['--engine', e.url]]) {
      const r = await kvcAsync(['keys', ...args, '--chunk-size', '16', ...prompt.map(String)]);
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stderr, /model id "builtin-tiny-v2"/);
      const keys = r.stdout.trim().split('\n').map((l) => l.split('\t')[2]);
      assert.deepEqual(keys, expected);
    }
    assert.ok(e.store!.has(expected[0]!), 'the first chunk is stored under the key kvc keys prints');
    assert.match((await kvcAsync(['keys', '--engine', e.url, '--model', 'nope', '1'])).stderr, /serves "served-tiny", not "nope"/);
  });
});

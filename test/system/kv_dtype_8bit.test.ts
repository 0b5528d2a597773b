// 8-bit engine KV on real processes, one `kvc up` 1P1D deployment per dtype (int8, fp8_e4m3,
// fp8_e5m2; kvc up passes --kv-cache-dtype to both engines) and a lone engine of the same dtype
// computing everything itself: greedy output through the proxy equals the lone engine's (the
// prefiller's 8-bit chunks crossed xfer and the decoder attended over them exactly as held);
// the decoder really loaded transferred KV; the controller's /lookup finds the prompt's chunks
// (its keys derived with the dtype the engines registered); the same prompt again is served from the cache (store + lookup
// reuse) with the same text; the engines say their KV dtype.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { DTYPE_NAMES } from '../../src/common/dtype.js';
import { KV_CACHE_DTYPE_OF } from '../../src/common/flags.js';
import { freePortRange } from '../../harness/ports.js';
import { startDeployment, type Deployment } from '../../harness/deployment.js';
import { onFreePorts, postJson, startKvc, type Proc } from '../../harness/proc.js';

const prompt = 'An eight-bit cache holds four times the prompts of a float32 one, and the decoder reads it as it is stored.';

for (const name of ['int8', 'fp8_e4m3', 'fp8_e5m2'] as const) {
  const dtype = KV_CACHE_DTYPE_OF[name];
  describe(`--kv-cache-dtype ${name}: kvc up 1P1D`, () => {
    let dep: Deployment;
    let ref: Proc;
    let proxyUrl = '';
    let refUrl = '';

    before(async () => {
      dep = await startDeployment({ prefillers: 1, decoders: 1, args: ['--kv-cache-dtype', name] });
      proxyUrl = dep.proxy;
      // A free port picked once the deployment holds its own; another one if it is taken first.
      ref = await onFreePorts(
        () => freePortRange(1),
        async (port) => {
          const p = startKvc(['engine', '--port', String(port), '--kv-cache-dtype', name]);
          try {
            refUrl = (await p.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
            return p;
          } catch (e) {
            await p.kill('SIGTERM');
            throw e;
          }
        },
      );
    });
    after(async () => {
      await dep?.stop();
      await ref?.kill('SIGTERM');
    });

    test('greedy tokens through xfer equal a fresh compute; the repeat is a cache read', async () => {
      const models = (await (await fetch(`${refUrl}/v1/models`)).json()) as { data: { kvc_kv_dtype: string; kvc_model_id: string }[] };
      assert.equal(models.data[0]!.kvc_kv_dtype, DTYPE_NAMES[dtype]);
      const decoderModels = (await (await fetch(`${dep.engines.find((e) => e.role === 'decoder')!.http}/v1/models`)).json()) as typeof models;
      assert.equal(decoderModels.data[0]!.kvc_kv_dtype, DTYPE_NAMES[dtype], 'kvc up passed --kv-cache-dtype to the decoder');

      const req = { model: 'builtin:tiny', prompt, max_tokens: 16, temperature: 0 };
      const want = await postJson(`${refUrl}/v1/completions`, req, 120_000);
      assert.equal(want.status, 200, JSON.stringify(want.json));
      const got = await postJson(`${proxyUrl}/v1/completions`, req, 120_000);
      assert.equal(got.status, 200, JSON.stringify(got.json));
      assert.equal(got.json.choices[0].text, want.json.choices[0].text);
      const first = got.json.usage.prompt_tokens_details as { cached_tokens: number; kv_transfer_tokens: number };
      assert.equal(first.cached_tokens, 0, JSON.stringify(first));
      assert.ok(first.kv_transfer_tokens > 0, `the decoder loaded the prefiller's ${name} KV: ${JSON.stringify(first)}`);

      // The controller indexes the prompt's chunks under the keys of this dtype.
      const tokens = (await postJson(`${refUrl}/tokenize`, { model: 'builtin:tiny', prompt })).json.tokens as number[];
      const look = await postJson(`${dep.controller}/lookup`, { tokens });
      assert.equal(look.status, 200, JSON.stringify(look.json));
      const matched = Math.max(0, ...Object.values(look.json.layout_detail as Record<string, { matched_tokens: number }>).map((d) => d.matched_tokens));
      assert.ok(matched > 0, `lookup finds the ${name} chunks: ${JSON.stringify(look.json)}`);

      const again = await postJson(`${proxyUrl}/v1/completions`, req, 120_000);
      assert.equal(again.status, 200, JSON.stringify(again.json));
      assert.equal(again.json.choices[0].text, want.json.choices[0].text);
      assert.ok(again.json.usage.prompt_tokens_details.cached_tokens > 0, `the repeat reuses the stored ${name} KV: ${JSON.stringify(again.json.usage)}`);
    });
  });
}

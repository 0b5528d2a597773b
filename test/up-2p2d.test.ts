// `kvc up --prefillers 2 --decoders 2` on the built-in model with real processes: round-robin
// order checked from the prefillers' own /metrics, the same greedy output from both decoders
// through the proxy, and `kill -9` of one prefiller during a burst of concurrent requests:
// every request still succeeds, the proxy marks the prefiller down and `kvc up` reports it.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { startKvc, tempDir, type Proc } from './helpers/proc.js';
import { makePlan, type PlanOptions } from '../src/proxy/deployment.js';
import { takenPorts } from '../src/proxy/up.js';

async function freeOffset(o: Omit<PlanOptions, 'portOffset'>): Promise<number> {
  for (let i = 0; i < 50; i++) {
    const off = 12000 + Math.floor(Math.random() * 400) * 100;
    if ((await takenPorts(makePlan({ ...o, portOffset: off }))).length === 0) return off;
  }
  throw new Error('no free port offset found');
}

async function prefillCount(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
  const m = text.match(/^kvc_engine_prefill_requests_total(?:\{[^}]*\})? (\d+(?:\.\d+)?)$/m);
  assert.ok(m, `kvc_engine_prefill_requests_total in ${url}/metrics`);
  return Number(m[1]);
}

describe('kvc up 2P2D (built-in model)', () => {
  let up: Proc;
  let offset = 0;
  let logDir = '';
  let proxyUrl = '';
  let client: OpenAI;
  const prefillerUrl = (i: number) => `http://127.0.0.1:${7100 + i + offset}`;
  const decoderUrl = (i: number) => `http://127.0.0.1:${7200 + i + offset}`;

  before(async () => {
    offset = await freeOffset({ prefillers: 2, decoders: 2, model: 'builtin:tiny', controller: true, host: '127.0.0.1' });
    logDir = tempDir('kvc-up2p2d-');
    up = startKvc(['up', '--prefillers', '2', '--decoders', '2', '--port-offset', String(offset), '--log-dir', logDir, '--startup-timeout', '150']);
    await up.waitFor(/kvc up: ready/, 170_000);
    proxyUrl = `http://127.0.0.1:${9100 + offset}`;
    client = new OpenAI({ baseURL: `${proxyUrl}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
  });
  after(async () => {
    await up?.kill('SIGTERM');
  });

  test('prefillers are used in round-robin order (their own metrics)', async () => {
    for (let i = 0; i < 4; i++) {
      const before = [await prefillCount(prefillerUrl(0)), await prefillCount(prefillerUrl(1))];
      await client.completions.create({ model: 'builtin:tiny', prompt: `round robin request number ${i}`, max_tokens: 3, temperature: 0 });
      const afterCounts = [await prefillCount(prefillerUrl(0)), await prefillCount(prefillerUrl(1))];
      const delta = afterCounts.map((a, k) => a - before[k]!);
      // Request i lands on prefiller (i mod 2): strict alternation.
      assert.deepEqual(delta, i % 2 === 0 ? [1, 0] : [0, 1], `request ${i}: prefill deltas ${delta}`);
    }
  });

  test('both decoders give the same greedy output as a decoder computing alone', async () => {
    const prompt = 'Disaggregated prefill moves the KV cache from the prefiller to the decoder over xfer.';
    const req = { model: 'builtin:tiny', prompt, max_tokens: 10, temperature: 0 };
    // Direct to a decoder without kv_transfer_params: it computes the prompt itself.
    const direct = (await (await fetch(`${decoderUrl(0)}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(req),
    })).json()) as { choices: { text: string }[] };
    const a = await client.completions.create(req);
    const b = await client.completions.create(req);
    assert.equal(a.choices[0]!.text, direct.choices[0]!.text);
    assert.equal(b.choices[0]!.text, direct.choices[0]!.text);
    let streamed = '';
    for await (const ev of await client.chat.completions.create({ model: 'builtin:tiny', messages: [{ role: 'user', content: prompt }], max_tokens: 6, temperature: 0, stream: true })) {
      streamed += ev.choices[0]?.delta?.content ?? '';
    }
    assert.ok(streamed.length > 0);
  });

  test('kill -9 of one prefiller during a burst: no request fails', async () => {
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number }[] };
    const victim = dep.processes.find((p) => p.name === 'prefiller-1')!;
    const filler = Array.from({ length: 60 }, (_, k) => `word${k}`).join(' ');
    const burst = Array.from({ length: 16 }, (_, i) =>
      client.completions.create({ model: 'builtin:tiny', prompt: `burst ${i}: ${filler}`, max_tokens: 6, temperature: 0 }),
    );
    await new Promise((r) => setTimeout(r, 150));
    process.kill(victim.pid, 'SIGKILL');
    const results = await Promise.allSettled(burst);
    const failed = results.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason));
    assert.deepEqual(failed, [], 'every request of the burst succeeded');
    for (const r of results) assert.equal((r as PromiseFulfilledResult<OpenAI.Completion>).value.choices[0]!.finish_reason, 'length');
    // Later requests keep working on the remaining prefiller.
    for (let i = 0; i < 3; i++) await client.completions.create({ model: 'builtin:tiny', prompt: `after ${i}`, max_tokens: 2 });
    const h = (await (await fetch(`${proxyUrl}/health`)).json()) as { status: string; prefillers: { up: boolean }[] };
    assert.equal(h.status, 'degraded');
    const m = await (await fetch(`${proxyUrl}/metrics`)).text();
    const retried = Number(m.match(/kvc_proxy_prefill_failures_total\{prefiller="prefiller-1[^}]*\} (\d+)/)?.[1] ?? 0);
    assert.ok(retried >= 1, `requests in flight on the killed prefiller were retried (${retried})`);
    assert.deepEqual(h.prefillers.map((p) => p.up), [true, false]);
    await up.waitFor(new RegExp(`prefiller-1 \\(pid ${victim.pid}\\) killed by SIGKILL; see its log: ${logDir}/prefiller-1\\.log`), 5_000);
    assert.doesNotMatch(up.output(), /stopping the deployment/);
  });
});

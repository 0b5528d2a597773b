// `kvc up --prefillers 2 --decoders 2` on the built-in model with real processes: every child
// runs with PYTHONHASHSEED=0 whatever `kvc up` itself was given, round-robin order checked from
// the prefillers' own /metrics, the same greedy output from both decoders through the proxy
// (completions and chat, streamed and not), and `kill -9` of one prefiller while it has prefills
// in flight during a burst of concurrent requests: those are retried, every request succeeds,
// the proxy marks the prefiller down and `kvc up` reports it.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import type { Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';
import { upOnFreeOffset } from '../../harness/deployment.js';

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
    // A seed other than 0 in kvc up's own environment: the children must still get 0.
    // Restarts off: the kill test checks the proxy's view of a dead prefiller (degraded), which a
    // restart could hide on a slow machine; restarting is covered by up_restart.test.ts.
    const plan = { prefillers: 2, decoders: 2, model: 'builtin:tiny', controller: true, host: '127.0.0.1' };
    ({ up, offset } = await upOnFreeOffset(plan, (off) => {
      logDir = tempDir('kvc-up2p2d-');
      return ['up', '--prefillers', '2', '--decoders', '2', '--port-offset', String(off), '--log-dir', logDir, '--startup-timeout', '150', '--max-restarts', '0'];
    }, 170_000, { PYTHONHASHSEED: '7' }));
    proxyUrl = `http://127.0.0.1:${9100 + offset}`;
    client = new OpenAI({ baseURL: `${proxyUrl}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
  });
  after(async () => {
    await up?.kill('SIGTERM');
  });

  test('every process runs with PYTHONHASHSEED=0 although kvc up was started with 7', () => {
    const environ = (pid: number) => new Map(readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0').filter(Boolean).map((kv) => {
      const i = kv.indexOf('=');
      return [kv.slice(0, i), kv.slice(i + 1)] as [string, string];
    }));
    assert.equal(environ(up.child.pid!).get('PYTHONHASHSEED'), '7', 'kvc up itself has the other seed');
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number }[] };
    assert.deepEqual(dep.processes.map((p) => p.name).sort(), ['controller', 'decoder-0', 'decoder-1', 'prefiller-0', 'prefiller-1', 'proxy']);
    for (const p of dep.processes) assert.equal(environ(p.pid).get('PYTHONHASHSEED'), '0', `${p.name} (pid ${p.pid})`);
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
    // Chat, streamed and not, against the same decoder called directly.
    const chat = { model: 'builtin:tiny', messages: [{ role: 'user' as const, content: prompt }], max_tokens: 6, temperature: 0 };
    const directChat = (await (await fetch(`${decoderUrl(1)}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(chat),
    })).json()) as { choices: { message: { content: string } }[] };
    const want = directChat.choices[0]!.message.content;
    assert.ok(want.length > 0);
    const c = await client.chat.completions.create(chat);
    assert.equal(c.object, 'chat.completion');
    assert.equal(c.choices[0]!.message.content, want);
    let streamed = '';
    for await (const ev of await client.chat.completions.create({ ...chat, stream: true })) {
      streamed += ev.choices[0]?.delta?.content ?? '';
    }
    assert.equal(streamed, want);
  });

  test('kill -9 of one prefiller during a burst: no request fails', async (t) => {
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number }[] };
    const victim = dep.processes.find((p) => p.name === 'prefiller-1')!;
    const filler = Array.from({ length: 100 }, (_, k) => `word${k}`).join(' ');
    const proxyMetric = async (re: RegExp) => Number((await (await fetch(`${proxyUrl}/metrics`)).text()).match(re)?.[1] ?? 0);
    const victimLabel = `prefiller-1\\(127\\.0\\.0\\.1:${7101 + offset}\\)`;
    const inFlightRe = new RegExp(`^kvc_proxy_prefill_in_flight\\{prefiller="${victimLabel}"\\} (\\d+)$`, 'm');
    const failuresRe = new RegExp(`^kvc_proxy_prefill_failures_total\\{prefiller="${victimLabel}"\\} (\\d+)$`, 'm');
    const failures0 = await proxyMetric(failuresRe);
    const burst = Array.from({ length: 16 }, (_, i) =>
      client.completions.create({ model: 'builtin:tiny', prompt: `burst ${i}: ${filler}`, max_tokens: 6, temperature: 0 }),
    );
    // Kill only once the proxy is waiting on the victim for at least two prefills.
    let inFlight = 0;
    const deadline = Date.now() + 30_000;
    while ((inFlight = await proxyMetric(inFlightRe)) < 2) {
      assert.ok(Date.now() < deadline, 'prefiller-1 never had 2 prefills in flight');
      await new Promise((r) => setTimeout(r, 10));
    }
    process.kill(victim.pid, 'SIGKILL');
    const results = await Promise.allSettled(burst);
    const failed = results.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason));
    assert.deepEqual(failed, [], 'every request of the burst succeeded');
    for (const r of results) assert.equal((r as PromiseFulfilledResult<OpenAI.Completion>).value.choices[0]!.finish_reason, 'length');
    // Read before any other request: only burst requests can have failed on the victim.
    const retried = (await proxyMetric(failuresRe)) - failures0;
    assert.ok(retried >= 1, `burst requests in flight on the killed prefiller (${inFlight} at the kill) were retried (${retried})`);
    t.diagnostic(`prefills in flight on prefiller-1 at the kill: ${inFlight}; retried on prefiller-0: ${retried}`);
    // Later requests keep working on the remaining prefiller.
    for (let i = 0; i < 3; i++) await client.completions.create({ model: 'builtin:tiny', prompt: `after ${i}`, max_tokens: 2 });
    const h = (await (await fetch(`${proxyUrl}/health`)).json()) as { status: string; prefillers: { up: boolean }[] };
    await up.waitFor(new RegExp(`prefiller-1 \\(pid ${victim.pid}\\) killed by SIGKILL; see its log: ${logDir}/prefiller-1\\.log`), 5_000);
    // Restarts are off in this deployment (above), so the proxy must see prefiller-1 down.
    assert.equal(h.status, 'degraded');
    assert.deepEqual(h.prefillers.map((p) => p.up), [true, false]);
    assert.doesNotMatch(up.output(), /stopping the deployment/);
  });
});

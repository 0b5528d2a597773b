// End to end: a real `kvc controller` and two real `kvc engine` processes
// (role kv_both, built-in model) with cache instances attached to the controller. A prompt
// served by A shows up in /lookup on A; /move to B → only B, and B serves the prompt as a
// cache hit with the same greedy output (the engines hold float16 KV: 16-bit chunks move); /pin on B survives filling B's CPU tier past
// capacity; after /unpin the chunks can be evicted again.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePortRange } from '../../src/common/ports.js';
import { postJson, startKvc, waitHttp, waitUntil as waitFor, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

const CHUNK = 32;
const CONNECTOR = JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both' });

let ctl: Proc;
const engines: Proc[] = [];
let ctlUrl = '';
const engineUrl: Record<'A' | 'B', string> = { A: '', B: '' };

const waitUntil = <T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 20_000) => waitFor(what, fn, timeoutMs, 100);

const complete = async (who: 'A' | 'B', prompt: string, max_tokens = 8) => {
  const r = await postJson(`${engineUrl[who]}/v1/completions`, { model: 'builtin:tiny', prompt, max_tokens, temperature: 0 }, 120_000);
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json.choices[0].text as string;
};
const tokenize = async (prompt: string) => {
  const r = await postJson(`${engineUrl.A}/tokenize`, { model: 'builtin:tiny', prompt });
  assert.equal(r.status, 200);
  return r.json.tokens as number[];
};
const lookup = async (tokens: number[]) => (await postJson(`${ctlUrl}/lookup`, { tokens })).json as { layout_detail: Record<string, { matched_tokens: number }> };
const matched = async (tokens: number[], id: string) => (await lookup(tokens)).layout_detail[id]?.matched_tokens ?? 0;
const loadedTokens = async (who: 'A' | 'B') => {
  const m = await (await fetch(`${engineUrl[who]}/metrics`)).text();
  return Number(m.match(/^kvc_engine_tokens_loaded_total(?:\{[^}]*\})? (\d+(?:\.\d+)?)/m)?.[1] ?? 'NaN');
};
const finished = async (event_id: string) =>
  waitUntil(`event ${event_id}`, async () => {
    const r = await postJson(`${ctlUrl}/check_finish`, { event_id });
    return r.json.status === 'finished' || r.json.status === 'failed' ? r.json : undefined;
  });
// Distinct filler prompts: each ~200 tokens.
const filler = (i: number) => Array.from({ length: 60 }, (_, j) => `item${i}x${j}`).join(' ');

before(async () => {
  const base = await freePortRange(8);
  ctlUrl = `http://127.0.0.1:${base}`;
  ctl = startKvc(['controller', '--port', String(base), '--monitor-port', String(base + 1)]);
  await ctl.waitFor(/kvc controller ready/, 20_000);
  const dir = tempDir('kvc-ctl-e2e-');
  for (const [i, who] of (['A', 'B'] as const).entries()) {
    const yaml = join(dir, `${who}.yaml`);
    writeFileSync(
      yaml,
      [
        `chunk_size: ${CHUNK}`,
        'local_cpu: true',
        'max_local_cpu_size: 0.002', // ~2 MiB: about 30 chunks of the built-in model
        'max_local_disk_size: 0',
        'enable_controller: true',
        `kvc_instance_id: engine-${who}`,
        `controller_url: 127.0.0.1:${base + 1}`,
        `kvc_worker_port: ${base + 2 + 3 * i}`,
        `distributed_url: 127.0.0.1:${base + 3 + 3 * i}`,
      ].join('\n'),
    );
    const port = base + 4 + 3 * i;
    engineUrl[who] = `http://127.0.0.1:${port}`;
    engines.push(startKvc(['engine', '--port', String(port), '--kv-transfer-config', CONNECTOR, '--kv-cache-dtype', 'float16'], { KVC_CONFIG_FILE: yaml }));
  }
  await Promise.all(Object.values(engineUrl).map((u) => waitHttp(`${u}/health`, 120_000)));
  await waitUntil('both engines registered', async () => {
    const r = await (await fetch(`${ctlUrl}/instances`)).json();
    return r.instances.length === 2;
  });
});

after(async () => {
  for (const e of engines) await e.kill();
  await ctl?.kill();
});

test('lookup → move → cache hit on B with identical output → pin survives pressure → unpin lets it go', async () => {
  const prompt = 'The controller moves KV cache between engines. ' + Array.from({ length: 40 }, (_, i) => `token${i}`).join(' ');
  const outA = await complete('A', prompt);
  const tokens = await tokenize(prompt);
  assert.ok(tokens.length > 2 * CHUNK, `prompt of ${tokens.length} tokens`);

  const onA = await waitUntil('prompt indexed on A', async () => (await matched(tokens, 'engine-A')) || undefined);
  assert.ok(onA >= CHUNK, `A holds ${onA} tokens`);
  assert.equal(await matched(tokens, 'engine-B'), 0);

  const mv = await postJson(`${ctlUrl}/move`, { old_position: ['engine-A', 'LocalCPUBackend'], new_position: ['engine-B', 'LocalCPUBackend'], tokens, copy: false });
  assert.equal(mv.status, 200, JSON.stringify(mv.json));
  assert.equal(mv.json.num_tokens, onA);
  assert.equal((await finished(mv.json.event_id)).status, 'finished');
  await waitUntil('lookup shows only B', async () => (await matched(tokens, 'engine-A')) === 0 && (await matched(tokens, 'engine-B')) === onA);

  const before = await loadedTokens('B');
  const outB = await complete('B', prompt);
  assert.equal(outB, outA, 'greedy output from moved KV must be identical');
  const afterLoad = await loadedTokens('B');
  assert.ok(afterLoad - before >= CHUNK, `B served the prompt from the moved cache (tokens loaded ${before} → ${afterLoad})`);

  const pin = await postJson(`${ctlUrl}/pin`, { tokens, instance_id: 'engine-B', location: 'LocalCPUBackend' });
  assert.equal(pin.json.num_tokens, onA);
  assert.equal((await finished(pin.json.event_id)).status, 'finished');
  const first = await tokenize(filler(0));
  for (let i = 0; i < 8; i++) await complete('B', filler(i), 1);
  await waitUntil('first filler evicted (capacity exceeded)', async () => (await matched(first, 'engine-B')) < first.length - CHUNK);
  assert.equal(await matched(tokens, 'engine-B'), onA, 'pinned chunks must survive');

  const unpin = await postJson(`${ctlUrl}/unpin`, { tokens, instance_id: 'engine-B', location: 'LocalCPUBackend' });
  assert.equal((await finished(unpin.json.event_id)).status, 'finished');
  for (let i = 8; i < 16; i++) await complete('B', filler(i), 1);
  await waitUntil('unpinned chunks evicted', async () => (await matched(tokens, 'engine-B')) < onA);
});

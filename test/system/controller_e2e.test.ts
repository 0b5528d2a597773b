// End to end: a real `kvc controller` and two real `kvc engine` processes
// (role kv_both, built-in model) with cache instances attached to the controller. A prompt
// served by A shows up in /lookup on A; /move to B → only B, and B serves the prompt as a
// cache hit with the same greedy output (the engines hold float16 KV: 16-bit chunks move); /pin on B survives filling B's CPU tier past
// capacity; after /unpin the chunks can be evicted again.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { postJson, waitUntil as waitFor } from '../../harness/proc.js';
import { completeText, eventDone, matchedOn, metricValue, startControllerEngines, tokenizeOn, type ControllerEngines, type Who } from '../../harness/controller_engines.js';

const CHUNK = 32;

let d: ControllerEngines;

const waitUntil = <T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 20_000) => waitFor(what, fn, timeoutMs, 50);
const complete = (who: Who, prompt: string, max_tokens = 8) => completeText(d.url[who], prompt, max_tokens);
const tokenize = (prompt: string) => tokenizeOn(d.url.A, prompt);
const matched = (tokens: number[], id: string) => matchedOn(d.ctlUrl, tokens, id);
const loadedTokens = (who: Who) => metricValue(d.url[who], 'kvc_engine_tokens_loaded_total');
const finished = (event_id: string) => eventDone(d.ctlUrl, event_id, 20_000);
// Distinct filler prompts: each ~200 tokens.
const filler = (i: number) => Array.from({ length: 60 }, (_, j) => `item${i}x${j}`).join(' ');

before(async () => {
  d = await startControllerEngines({
    chunkSize: CHUNK,
    instanceId: (who) => `engine-${who}`,
    yaml: () => [
      'max_local_cpu_size: 0.002', // ~2 MiB: about 30 chunks of the built-in model
      'max_local_disk_size: 0',
    ],
    engineArgs: ['--kv-cache-dtype', 'float16'],
  });
});

after(async () => {
  await d?.stop();
});

test('lookup → move → cache hit on B with identical output → pin survives pressure → unpin lets it go', async () => {
  const prompt = 'The controller moves KV cache between engines. ' + Array.from({ length: 40 }, (_, i) => `token${i}`).join(' ');
  const outA = await complete('A', prompt);
  const tokens = await tokenize(prompt);
  assert.ok(tokens.length > 2 * CHUNK, `prompt of ${tokens.length} tokens`);

  const onA = await waitUntil('prompt indexed on A', async () => (await matched(tokens, 'engine-A')) || undefined);
  assert.ok(onA >= CHUNK, `A holds ${onA} tokens`);
  assert.equal(await matched(tokens, 'engine-B'), 0);

  const mv = await postJson(`${d.ctlUrl}/move`, { old_position: ['engine-A', 'LocalCPUBackend'], new_position: ['engine-B', 'LocalCPUBackend'], tokens, copy: false });
  assert.equal(mv.status, 200, JSON.stringify(mv.json));
  assert.equal(mv.json.num_tokens, onA);
  assert.equal((await finished(mv.json.event_id)).status, 'finished');
  await waitUntil('lookup shows only B', async () => (await matched(tokens, 'engine-A')) === 0 && (await matched(tokens, 'engine-B')) === onA);

  const before = await loadedTokens('B');
  const outB = await complete('B', prompt);
  assert.equal(outB, outA, 'greedy output from moved KV must be identical');
  const afterLoad = await loadedTokens('B');
  assert.ok(afterLoad - before >= CHUNK, `B served the prompt from the moved cache (tokens loaded ${before} → ${afterLoad})`);

  const pin = await postJson(`${d.ctlUrl}/pin`, { tokens, instance_id: 'engine-B', location: 'LocalCPUBackend' });
  assert.equal(pin.json.num_tokens, onA);
  assert.equal((await finished(pin.json.event_id)).status, 'finished');
  const first = await tokenize(filler(0));
  for (let i = 0; i < 8; i++) await complete('B', filler(i), 1);
  await waitUntil('first filler evicted (capacity exceeded)', async () => (await matched(first, 'engine-B')) < first.length - CHUNK);
  assert.equal(await matched(tokens, 'engine-B'), onA, 'pinned chunks must survive');

  const unpin = await postJson(`${d.ctlUrl}/unpin`, { tokens, instance_id: 'engine-B', location: 'LocalCPUBackend' });
  assert.equal((await finished(unpin.json.event_id)).status, 'finished');
  for (let i = 8; i < 16; i++) await complete('B', filler(i), 1);
  await waitUntil('unpinned chunks evicted', async () => (await matched(tokens, 'engine-B')) < onA);
});

// Who keeps a disaggregated prompt's chunks, on real processes (docs/storage.md "Who keeps a
// transferred chunk"): `kvc up` 1P1D on the built-in model, every engine with a CPU tier of
// about ten chunks. While the prefiller's tier has room, it keeps what it computes and the
// decoder's received copies are evict-first; once its tier is full of chunks in use and the
// decoder's is not, the proxy names the decoder the keeper: the prefiller sends the prompt and
// does not store it, the decoder keeps it as its own, the index says so, and the next request
// for it reuses the decoder's copy with the same greedy output. A bad kvc_keeper is refused.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { postJson, waitUntil, type Proc } from '../../harness/proc.js';
import { upOnFreeOffset } from '../../harness/deployment.js';
import { completeIds, heldBy, metricTotal, upUrls } from '../../harness/cache_calls.js';
import { tempDir } from '../../harness/temp_dir.js';

/** Two full 256-token chunks of prefix `seed`, then a 24-token question (a partial chunk). */
function prompt(seed: number): number[] {
  const prefix = Array.from({ length: 512 }, (_, i) => 100 + ((i * 7919 + seed * 104729) % 30000));
  return [...prefix, ...Array.from({ length: 24 }, (_, i) => 200 + ((seed * 13 + i * 17) % 20000))];
}

describe('the keeper of a transferred prompt, 1P1D (built-in model)', () => {
  let up: Proc;
  let u = upUrls(0);
  const complete = (url: string, ids: number[]) => completeIds(url, ids);
  const held = (ids: number[]) => heldBy(u.controller, ids);
  const metric = metricTotal;
  /** The proxy's view of a backend's room (its last health probe), or null when it has none. */
  async function proxyRoom(backend: string): Promise<number | null> {
    const text = await (await fetch(`${u.proxy}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
    // (The proxy names a backend by its role, index and address: "prefiller-0(127.0.0.1:7100)".)
    const m = new RegExp(`^kvc_proxy_backend_room_free_tokens\\{backend="${backend}\\([^"]*"\\} (\\S+)$`, 'm').exec(text);
    return m ? Number(m[1]) : null;
  }

  before(async () => {
    // 0.005 GiB: ten 256-token chunks of the tiny model (and a few partial ones) per engine.
    const plan = { prefillers: 1, decoders: 1, model: 'builtin:tiny', controller: true, host: '127.0.0.1' };
    let offset: number;
    ({ up, offset } = await upOnFreeOffset(plan, (off) => ['up', '--prefillers', '1', '--decoders', '1', '--max-local-cpu-size', '0.005', '--port-offset', String(off), '--log-dir', tempDir('kvc-keeper-'), '--startup-timeout', '150'], 170_000));
    u = upUrls(offset);
  });
  after(async () => {
    await up?.kill('SIGTERM');
  });

  test('the prefiller keeps while it has room; a full prefiller hands the prompt to the decoder, which keeps and reuses it', async () => {
    // 1. With room on the prefiller (the proxy has seen both rooms), it keeps what it computes.
    await waitUntil('the proxy knows both rooms', async () => ((await proxyRoom('prefiller-0')) !== null && (await proxyRoom('decoder-0')) !== null ? true : undefined), 30_000, 100);
    const first = prompt(1);
    await complete(u.proxy, first);
    await waitUntil('the first prompt on both engines', async () => {
      const m = await held(first);
      return (m['prefiller-0'] ?? 0) >= 512 && (m['decoder-0'] ?? 0) >= 512 ? true : undefined;
    }, 15_000, 100);
    assert.equal(await metric(u.proxy, 'kvc_proxy_keepers_total', 'keeper="decoder"'), 0);
    assert.equal(await metric(u.prefiller, 'kvc_engine_keeper_skipped_chunks_total'), 0);
    // 2. Fill the prefiller's tier with prefixes it computed itself (asked directly: no decoder
    //    gets them), until it has no room for another prompt without evicting a chunk in use.
    for (let s = 2; s <= 6; s++) await complete(u.prefiller, prompt(s));
    const x = prompt(9);
    await waitUntil('the proxy sees the prefiller full and the decoder with room', async () =>
      ((await proxyRoom('prefiller-0')) ?? Infinity) < x.length && ((await proxyRoom('decoder-0')) ?? 0) >= x.length ? true : undefined, 30_000, 100,
    ).catch(async (e: Error) => assert.fail(`${e.message}: prefiller ${await proxyRoom('prefiller-0')}, decoder ${await proxyRoom('decoder-0')}`));
    // 3. A new prompt through the proxy: the decoder is named the keeper.
    const skipped0 = await metric(u.prefiller, 'kvc_engine_keeper_skipped_chunks_total');
    const out = await complete(u.proxy, x);
    assert.equal(await metric(u.proxy, 'kvc_proxy_keepers_total', 'keeper="decoder"'), 1);
    await waitUntil('the prefiller counted the chunks it did not keep', async () => ((await metric(u.prefiller, 'kvc_engine_keeper_skipped_chunks_total')) - skipped0 >= 2 ? true : undefined), 15_000, 100);
    const m = await waitUntil('x on the decoder', async () => {
      const h = await held(x);
      return (h['decoder-0'] ?? 0) >= 512 ? h : undefined;
    }, 15_000, 100);
    assert.equal(m['prefiller-0'] ?? 0, 0, `the prefiller keeps no copy of x: ${JSON.stringify(m)}`);
    // Kept as the decoder's own: its copy of x is not at the cold end (only the partial chunk is).
    // 4. The next request for x reuses the decoder's copy, with the same greedy output.
    const again = await complete(u.decoder, x);
    assert.ok(again.cached >= 512, `the decoder reuses its copy of x (cached_tokens ${again.cached})`);
    assert.equal(again.text, out.text, 'greedy output identical from the kept copy');
  });

  test('a kvc_keeper other than prefiller or decoder is refused naming the field, and nothing is computed', async () => {
    const computed0 = await metric(u.prefiller, 'kvc_engine_prompt_tokens_computed_total');
    const r = await postJson(`${u.prefiller}/v1/completions`, { model: 'builtin:tiny', prompt: prompt(20), max_tokens: 1, kv_transfer_params: { kvc_keeper: 'both' } }, 30_000);
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.match(JSON.stringify(r.json), /kv_transfer_params\.kvc_keeper/);
    assert.match(JSON.stringify(r.json), /expected one of prefiller, decoder/);
    assert.equal(await metric(u.prefiller, 'kvc_engine_prompt_tokens_computed_total'), computed0);
  });
});

// Who keeps a disaggregated prompt's chunks, on real processes (docs/storage.md "Who keeps a
// transferred chunk"): `kvc up` 1P1D on the built-in model, every engine with a CPU tier of
// about ten chunks. While the prefiller's tier has room, it keeps what it computes and the
// decoder's received copies are evict-first; once its tier is full of chunks in use and the
// decoder's is not, the proxy names the decoder the keeper: the prefiller sends the prompt and
// does not store it, the decoder keeps it as its own, the index says so, and the next request
// for it reuses the decoder's copy with the same greedy output. A prompt longer than the keeper's
// tier is split (kvc_keeper_split): the keeper keeps its tier's worth of the head, the other side
// the rest, and the prompt is reused from both (the tail by P2P). A bad kvc_keeper is refused.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { postJson, waitUntil, type Proc } from '../../harness/proc.js';
import { clearTiers, upOnFreeOffset } from '../../harness/deployment.js';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
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
  let logDir = '';
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
    logDir = tempDir('kvc-keeper-');
    ({ up, offset } = await upOnFreeOffset(plan, (off) => ['up', '--prefillers', '1', '--decoders', '1', '--max-local-cpu-size', '0.005', '--port-offset', String(off), '--log-dir', logDir, '--startup-timeout', '150'], 170_000));
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

  test('a prompt longer than the keeper\'s tier is split: the keeper keeps its head, the other side its tail, and both parts are reused', async () => {
    /** The prompt tokens an engine's whole CPU tier holds (its /health kvc_room). */
    const capacity = async (url: string): Promise<number> => {
      const h = (await (await fetch(`${url}/health`, { signal: AbortSignal.timeout(5_000) })).json()) as { kvc_room?: { capacity_tokens?: number } };
      assert.ok(typeof h.kvc_room?.capacity_tokens === 'number' && h.kvc_room.capacity_tokens > 0, `${url}/health: kvc_room.capacity_tokens ${JSON.stringify(h.kvc_room)}`);
      return h.kvc_room.capacity_tokens;
    };
    const tier = await capacity(u.prefiller);
    assert.equal(await capacity(u.decoder), tier);
    // Two chunks and a partial one longer than either tier (and within the model's context).
    const y = Array.from({ length: tier + 512 + 24 }, (_, i) => 300 + ((i * 104723 + 77) % 29000));
    const splits0 = await metric(u.proxy, 'kvc_proxy_keeper_splits_total');
    const byKeeper0 = { prefiller: await metric(u.proxy, 'kvc_proxy_keepers_total', 'keeper="prefiller"'), decoder: await metric(u.proxy, 'kvc_proxy_keepers_total', 'keeper="decoder"') };
    const skipped0 = await metric(u.prefiller, 'kvc_engine_keeper_skipped_chunks_total');
    const out = await complete(u.proxy, y);
    assert.equal(await metric(u.proxy, 'kvc_proxy_keeper_splits_total'), splits0 + 1);
    const keeper = (await metric(u.proxy, 'kvc_proxy_keepers_total', 'keeper="decoder"')) > byKeeper0.decoder ? 'decoder' : 'prefiller';
    assert.equal(await metric(u.proxy, 'kvc_proxy_keepers_total', `keeper="${keeper}"`), byKeeper0[keeper] + 1);
    const [mine, other] = keeper === 'decoder' ? ['decoder-0', 'prefiller-0'] : ['prefiller-0', 'decoder-0'];
    // The keeper holds the leading tier's worth; the other side none of the head (it stores only its part).
    const m = await waitUntil('the head of y on its keeper', async () => {
      const h = await held(y);
      return (h[mine] ?? 0) >= tier ? h : undefined;
    }, 15_000, 100);
    assert.equal(m[mine], tier, `the keeper holds exactly its tier's worth of y: ${JSON.stringify(m)}`);
    assert.equal(m[other] ?? 0, 0, `the other side keeps no copy of y's head: ${JSON.stringify(m)}`);
    // The prefiller did not store the part it does not keep (past the split when it keeps the head; the head when the decoder does).
    await waitUntil('the prefiller counted the chunks it did not keep', async () => ((await metric(u.prefiller, 'kvc_engine_keeper_skipped_chunks_total')) - skipped0 >= 2 ? true : undefined), 15_000, 100);
    // The keeper serves y again: its head from its own tier, the tail fetched from the other side
    // by P2P (not recomputed), with the same greedy output.
    const keeperUrl = keeper === 'decoder' ? u.decoder : u.prefiller;
    const p2p0 = await metric(keeperUrl, 'kvc_p2p_bytes_total');
    const again = await complete(keeperUrl, y);
    assert.ok(again.cached >= tier + 512, `the head and the tail's two full chunks reused (cached_tokens ${again.cached} of ${y.length})`);
    assert.ok((await metric(keeperUrl, 'kvc_p2p_bytes_total')) > p2p0, 'the tail came from the other side by P2P');
    assert.equal(again.text, out.text, 'greedy output identical from the split copies');
  });

  test('chunks an engine computes take the room of the same prompt\'s fetched copies rather than being declined', async () => {
    await clearTiers(u.controller, readFileSync(join(logDir, 'deployment.secret'), 'utf8').trim(), ['prefiller-0', 'decoder-0']);
    const h = (await (await fetch(`${u.prefiller}/health`, { signal: AbortSignal.timeout(5_000) })).json()) as { kvc_room: { capacity_tokens: number } };
    const tier = h.kvc_room.capacity_tokens;
    // z: a head of one chunk less than a tier, two more chunks and a partial one.
    const z = Array.from({ length: tier - 256 + 512 + 24 }, (_, i) => 500 + ((i * 7907 + 13) % 28000));
    const head = tier - 256;
    // 1. The decoder computes the head (asked directly) and keeps it.
    await complete(u.decoder, z.slice(0, head + 24));
    await waitUntil('the head on the decoder', async () => ((await held(z))['decoder-0'] ?? 0) >= head ? true : undefined, 15_000, 100);
    // 2. The prefiller, asked directly for z, fetches the head by P2P (copies admitted evict-first,
    //    the decoder keeps the original) and computes the two chunks after it: its tier cannot hold
    //    the copies and both, so the second computed chunk takes a copy's room (it was declined
    //    before, and stored nowhere).
    const admitted0 = await metric(u.controller, 'kvc_controller_admitted_keys_total');
    const p2p0 = await metric(u.prefiller, 'kvc_p2p_bytes_total');
    const out = await complete(u.prefiller, z);
    assert.ok((await metric(u.prefiller, 'kvc_p2p_bytes_total')) > p2p0, 'the prefiller fetched the head by P2P');
    const copies = head / 256;
    await waitUntil('the fetched copies and both computed chunks indexed', async () =>
      (await metric(u.controller, 'kvc_controller_admitted_keys_total')) - admitted0 >= copies + 2 ? true : undefined, 15_000, 100,
    ).catch(async (e: Error) => assert.fail(`${e.message}: ${(await metric(u.controller, 'kvc_controller_admitted_keys_total')) - admitted0} admitted, expected ${copies + 2}`));
    // 3. The decoder serves z: its head from its tier, both later chunks fetched from the prefiller.
    const again = await complete(u.decoder, z);
    assert.ok(again.cached >= head + 512, `the head and both computed chunks reused (cached_tokens ${again.cached}, head ${head})`);
    assert.equal(again.text, out.text, 'greedy output identical');
  });

  test('a kvc_keeper other than prefiller or decoder, or a kvc_keeper_split that is not a token position, is refused naming the field, and nothing is computed', async () => {
    const computed0 = await metric(u.prefiller, 'kvc_engine_prompt_tokens_computed_total');
    const r = await postJson(`${u.prefiller}/v1/completions`, { model: 'builtin:tiny', prompt: prompt(20), max_tokens: 1, kv_transfer_params: { kvc_keeper: 'both' } }, 30_000);
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.match(JSON.stringify(r.json), /kv_transfer_params\.kvc_keeper/);
    assert.match(JSON.stringify(r.json), /expected one of prefiller, decoder/);
    const r2 = await postJson(`${u.prefiller}/v1/completions`, { model: 'builtin:tiny', prompt: prompt(20), max_tokens: 1, kv_transfer_params: { kvc_keeper: 'decoder', kvc_keeper_split: -256 } }, 30_000);
    assert.equal(r2.status, 400, JSON.stringify(r2.json));
    assert.match(JSON.stringify(r2.json), /kv_transfer_params\.kvc_keeper_split/);
    assert.match(JSON.stringify(r2.json), /expected a token position/);
    assert.equal(await metric(u.prefiller, 'kvc_engine_prompt_tokens_computed_total'), computed0);
  });
});

// Evict-first admission on real processes (docs/storage.md "Admission"): `kvc up` 1P1D on the
// built-in model (P2P on, round-robin routing), every engine with a CPU tier of about 10 chunks.
// A decoder stores what it received by xfer and what it fetched by P2P (copies of chunks the
// prefiller keeps) and every partial last chunk at the cold end of its eviction order, so when
// its tier fills up those copies go before a prefix it computed itself, even an older one; the
// prefiller's copies stay, the index follows every eviction, and a request whose copy the
// decoder dropped is still served correctly (identical greedy output).
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { waitUntil, type Proc } from '../../harness/proc.js';
import { completeIds, heldBy, metricTotal } from '../../harness/cache_calls.js';
import { tempDir } from '../../harness/temp_dir.js';
import { upOnFreeOffset } from '../../harness/deployment.js';

/** Two full 256-token chunks of prefix `seed`, then a 24-token question (a partial chunk). */
function prompt(seed: number, question = 0): number[] {
  const prefix = Array.from({ length: 512 }, (_, i) => 100 + ((i * 7919 + seed * 104729) % 30000));
  return [...prefix, ...Array.from({ length: 24 }, (_, i) => 200 + ((question * 331 + seed * 13 + i * 17) % 20000))];
}
const prefixOf = (p: number[]) => p.slice(0, 512);

describe('evict-first admission of copies and partial chunks, 1P1D (built-in model)', () => {
  let up: Proc;
  let offset = 0;
  const prefiller = () => `http://127.0.0.1:${7100 + offset}`;
  const decoder = () => `http://127.0.0.1:${7200 + offset}`;
  const proxy = () => `http://127.0.0.1:${9100 + offset}`;
  const ctl = () => `http://127.0.0.1:${9000 + offset}`;
  const base = { prefillers: 1, decoders: 1, model: 'builtin:tiny', controller: true, host: '127.0.0.1' };

  const complete = (url: string, ids: number[]) => completeIds(url, ids);
  const held = (ids: number[]) => heldBy(ctl(), ids);
  /** Waits until the controller's index satisfies `ok` for `ids` (events arrive in batches). */
  const heldUntil = (ids: number[], ok: (m: Record<string, number>) => boolean, what: string) =>
    waitUntil(what, async () => {
      const m = await held(ids);
      return ok(m) ? m : undefined;
    }, 15_000, 100).catch(async (e: Error) => assert.fail(`${e.message}: index says ${JSON.stringify(await held(ids))}`));
  const metric = (url: string, name: string) => metricTotal(url, name);

  before(async () => {
    // 0.005 GiB: ten 256-token chunks of the tiny model (and a few partial ones) per engine.
    ({ up, offset } = await upOnFreeOffset(base, (off) => ['up', '--prefillers', '1', '--decoders', '1', '--max-local-cpu-size', '0.005', '--port-offset', String(off), '--log-dir', tempDir('kvc-admission-'), '--startup-timeout', '150'], 170_000));
  });
  after(async () => {
    await up?.kill('SIGTERM');
  });

  test('copies received by xfer and fetched by P2P are evicted before an older prefix the decoder computed, the newest duplicate first; the prefiller keeps its own', async () => {
    const own = prompt(1);
    const received = prompt(2);
    const fetchedFirst = prompt(3, 0);
    const fetchedAgain = prompt(3, 1);
    // 1. The decoder computes `own` itself (a request sent to it directly): recent.
    const ownFirst = await complete(decoder(), own);
    await heldUntil(own, (m) => (m['decoder-0'] ?? 0) >= 512, 'own prefix on decoder-0');
    // 2. Through the proxy: the prefiller computes `received`, the decoder receives it by xfer.
    const receivedFirst = await complete(proxy(), received);
    await heldUntil(received, (m) => (m['decoder-0'] ?? 0) >= 512 && (m['prefiller-0'] ?? 0) >= 512, 'received prefix on both engines');
    // The decoder's received chunks duplicate the prefiller's: the controller's hint makes them
    // replicas there, which its metrics show.
    await waitUntil('the received chunks counted as replicas on decoder-0', async () => ((await metric(decoder(), 'kvc_cache_replica_chunks')) >= 2 ? true : undefined), 15_000, 100);
    // 3. The prefiller computes `fetched`; the decoder, asked directly for another question after
    //    the same prefix, fetches its two chunks from the prefiller by P2P.
    await complete(prefiller(), fetchedFirst);
    await heldUntil(fetchedFirst, (m) => (m['prefiller-0'] ?? 0) >= 512, 'fetched prefix on prefiller-0');
    const p2p0 = await metric(decoder(), 'kvc_p2p_chunks_total');
    const fetchedOut = await complete(decoder(), fetchedAgain);
    assert.equal((await metric(decoder(), 'kvc_p2p_chunks_total')) - p2p0, 2, 'the decoder fetched the prefix by P2P');
    assert.ok(fetchedOut.cached >= 512, `the fetched prefix was used (cached_tokens ${fetchedOut.cached})`);
    await heldUntil(fetchedAgain, (m) => (m['decoder-0'] ?? 0) >= 512, 'fetched prefix on decoder-0');
    // 4. The decoder computes three more prompts of its own: its tier must evict about three
    //    chunks. Plain LRU would take the oldest, `own`'s; evict-first takes the copies first.
    const evicted0 = await metric(decoder(), 'kvc_cache_evicted_chunks_total');
    for (const s of [4, 5, 6]) await complete(decoder(), prompt(s));
    assert.ok((await metric(decoder(), 'kvc_cache_evicted_chunks_total')) - evicted0 >= 3, 'the decoder\'s tier evicted chunks');
    // Both copies are duplicates of the prefiller's (the controller's replica hints): they go
    // before `own`, the newest duplicate (the P2P copy) first, tail first.
    const fetchedHeld = await heldUntil(fetchedFirst, (m) => (m['decoder-0'] ?? 0) < 512, 'the P2P copy losing chunks on decoder-0').then(() => held(prefixOf(fetchedFirst)));
    const ownHeld = await held(prefixOf(own));
    assert.equal(ownHeld['decoder-0'], 512, `the decoder's own older prefix is whole: ${JSON.stringify(ownHeld)}`);
    // The senders keep their copies: the prefiller still holds both prefixes.
    assert.equal((await held(prefixOf(received)))['prefiller-0'], 512, 'prefiller-0 keeps the prefix it sent');
    assert.equal(fetchedHeld['prefiller-0'], 512, 'prefiller-0 keeps the prefix it served by P2P');
    // What the index says is what the decoder really has: `own` loads from its cache.
    const ownAgain = await complete(decoder(), own);
    assert.ok(ownAgain.cached >= 512, `decoder-0 loads its own prefix (cached_tokens ${ownAgain.cached})`);
    assert.equal(ownAgain.text, ownFirst.text, 'greedy output identical from the cache');
    // Routing after the eviction: the request whose copy the decoder dropped is served right
    // (the prefiller has it, the decoder receives it again).
    const receivedAgain = await complete(proxy(), received);
    assert.equal(receivedAgain.text, receivedFirst.text, 'greedy output identical after the copy was evicted');
    await heldUntil(received, (m) => (m['decoder-0'] ?? 0) >= 512, 'the received prefix back on decoder-0');
  });

  test('a copy never displaces a chunk the decoder computed: with its tier full of its own prefixes, P2P copies are declined (counted), its prefixes stay, the output is the same', async () => {
    // Five prompts of its own (ten full chunks): the decoder's tier holds only chunks it computed;
    // whatever the previous test left there (copies, older prefixes) made room for them.
    const own = [10, 11, 12, 13, 14].map((s) => prompt(s));
    for (const p of own) await complete(decoder(), p);
    await heldUntil(own[4]!, (m) => (m['decoder-0'] ?? 0) >= 512, 'the last own prefix on decoder-0');
    const before = await Promise.all(own.map(async (p) => (await held(prefixOf(p)))['decoder-0'] ?? 0));
    assert.ok(before.reduce((a, b) => a + b, 0) >= 4 * 512, `the decoder holds its own prefixes: ${before}`);
    // The prefiller computes another prefix; the decoder, asked for it with another question,
    // fetches it by P2P and uses it, but may not keep it at its own chunks' expense.
    await complete(prefiller(), prompt(20, 0));
    await heldUntil(prompt(20, 0), (m) => (m['prefiller-0'] ?? 0) >= 512, 'the new prefix on prefiller-0');
    const declined0 = await metric(decoder(), 'kvc_cache_declined_copies_total');
    const evicted0 = await metric(decoder(), 'kvc_cache_evicted_chunks_total');
    const p2p0 = await metric(decoder(), 'kvc_p2p_chunks_total');
    const viaDecoder = await complete(decoder(), prompt(20, 1));
    assert.equal((await metric(decoder(), 'kvc_p2p_chunks_total')) - p2p0, 2, 'the decoder fetched the prefix by P2P');
    assert.ok(viaDecoder.cached >= 512, `the fetched prefix was used (cached_tokens ${viaDecoder.cached})`);
    const viaPrefiller = await complete(prefiller(), prompt(20, 1));
    assert.equal(viaDecoder.text, viaPrefiller.text, 'greedy output identical, fetched or computed');
    assert.ok((await metric(decoder(), 'kvc_cache_declined_copies_total')) - declined0 >= 2, 'the two fetched chunks were declined');
    // Only evict-first chunks (its partial chunks) may have made room; its prefixes are all there.
    await new Promise((r) => setTimeout(r, 500)); // let the index take the events in
    const after = await Promise.all(own.map(async (p) => (await held(prefixOf(p)))['decoder-0'] ?? 0));
    assert.deepEqual(after, before, 'every chunk the decoder computed is still held');
    assert.equal((await held(prefixOf(prompt(20))))['decoder-0'] ?? 0, 0, 'the copy was not kept');
    const evictedNow = (await metric(decoder(), 'kvc_cache_evicted_chunks_total')) - evicted0;
    assert.ok(evictedNow <= 2, `at most the cold partial chunks were evicted (${evictedNow})`);
  });

  test('a bad admission setting is refused naming the key', async () => {
    const { parseConnectorConfig } = await import('../../src/common/config.js');
    assert.throws(
      () => parseConnectorConfig(JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both', kv_connector_extra_config: { peer_copy_admission: 'first' } })),
      /kv_connector_extra_config\.peer_copy_admission/,
    );
    assert.throws(
      () => parseConnectorConfig(JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both', kv_connector_extra_config: { partial_chunk_admission: true } })),
      /kv_connector_extra_config\.partial_chunk_admission/,
    );
  });
});

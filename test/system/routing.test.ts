// KV-aware routing on real processes: `kvc up --prefillers 2 --decoders 2 --routing kv-aware` on
// the built-in model, every engine with a small CPU tier (about 10 chunks), and a plain engine
// (no connector) as the reference of greedy output. Checks:
//   - key agreement across processes: a prefix computed by one engine is found by the controller's
//     /prefix_lookup (keys computed by the controller from the decoder's token ids) on the engines
//     that stored it, and the proxy routes the next request with that prefix to a holder
//     (prefix_hit, prefilled locally on the decoder since only the question is uncached);
//   - a popular prefix spreads to the other decoder once its holder is busy, which fetches it by
//     P2P (the proxy prices that as a fetch, learnt from the engines' /health kvc_p2p);
//   - chat requests are routed on the templated tokens the engine sees;
//   - the index the router reads agrees with what the decoders really hold (their own
//     cached_tokens when asked directly) after moves, /clear and evictions;
//   - greedy output is identical whichever path served the request;
//   - bad routing flags are refused naming the flag.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CLI, postJson, startKvc, waitHttp, waitUntil, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';
import { freePortRange } from '../../harness/ports.js';
import { chunkKeys } from '../../src/common/keys.js';
import { signedHeaders } from '../../src/common/replay.js';
import { upOnFreeOffset } from '../../harness/deployment.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A ~700-token text (2 full 256-token chunks and a partial one) distinct per `seed`. */
function prefixText(seed: string): string {
  const words: string[] = [];
  for (let i = 0; i < 100; i++) words.push(`${seed}${i % 17} river ${i}`);
  return words.join(' ');
}

describe('kv-aware routing, 2P2D (built-in model)', () => {
  let up: Proc;
  let ref: Proc;
  let offset = 0;
  let proxy = '';
  let ctl = '';
  let refUrl = '';
  const decoderUrl = (i: number) => `http://127.0.0.1:${7200 + i + offset}`;
  const base = { prefillers: 2, decoders: 2, model: 'builtin:tiny', controller: true, host: '127.0.0.1' };

  async function metrics(): Promise<string> {
    return (await fetch(`${proxy}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
  }
  /** Sum of the series of `name` carrying every label of `labels` ('a="x",b="y"'). */
  function metric(text: string, name: string, labels: string): number {
    const want = labels.split(/,(?=\w+=")/);
    let sum = 0;
    for (const l of text.split('\n')) {
      if (!l.startsWith(`${name}{`)) continue;
      const set = l.slice(name.length + 1, l.lastIndexOf('}'));
      if (want.every((w) => set.split(/,(?=\w+=")/).includes(w))) sum += Number(l.split(' ').pop());
    }
    return sum;
  }
  async function tokens(body: Record<string, unknown>): Promise<number[]> {
    const r = await postJson(`${decoderUrl(0)}/tokenize`, { model: 'builtin:tiny', ...body });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return r.json.tokens as number[];
  }
  async function lookup(toks: number[]): Promise<Record<string, number>> {
    const r = await postJson(`${ctl}/prefix_lookup`, { tokens: toks });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return r.json.instances as Record<string, number>;
  }
  /** Polls the index until `ok` holds for the lookup of `toks` (stores and evictions reach the controller asynchronously). */
  async function lookupUntil(toks: number[], ok: (m: Record<string, number>) => boolean, what: string): Promise<Record<string, number>> {
    const deadline = Date.now() + 15_000;
    let m = await lookup(toks);
    while (!ok(m)) {
      if (Date.now() > deadline) assert.fail(`${what}: index says ${JSON.stringify(m)}`);
      await sleep(100);
      m = await lookup(toks);
    }
    return m;
  }
  async function complete(url: string, prompt: string): Promise<{ text: string; cached: number }> {
    const r = await postJson(`${url}/v1/completions`, { model: 'builtin:tiny', prompt, max_tokens: 8, temperature: 0 }, 120_000);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return { text: r.json.choices[0].text, cached: r.json.usage.prompt_tokens_details?.cached_tokens ?? 0 };
  }
  async function chat(url: string, messages: unknown[]): Promise<string> {
    const r = await postJson(`${url}/v1/chat/completions`, { model: 'builtin:tiny', messages, max_tokens: 8, temperature: 0 }, 120_000);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return r.json.choices[0].message.content;
  }
  async function waitEvent(eventId: string): Promise<void> {
    const deadline = Date.now() + 30_000;
    for (;;) {
      const r = await postJson(`${ctl}/check_finish`, { event_id: eventId });
      if (r.json.status === 'finished') return;
      if (r.json.status === 'failed') assert.fail(`event ${eventId} failed: ${r.json.error}`);
      if (Date.now() > deadline) assert.fail(`event ${eventId} not finished: ${JSON.stringify(r.json)}`);
      await sleep(100);
    }
  }
  /**
   * For decoder i and `prompt`: the leading prefix the controller's index says it holds, and the
   * leading prefix its CPU tier really holds, asked of its own worker API (`POST /lookup` on its
   * kvc_worker_port, a call signed with the deployment secret, as the controller asks it), both in tokens of
   * full chunks. A decoder may also hold later chunks of a prefix without its head (its copy of
   * the head, held elsewhere too, was evicted first): those count in neither.
   */
  async function indexAndReal(i: number, prompt: string): Promise<[number, number]> {
    const ids = await tokens({ prompt });
    const indexSays = (await lookup(ids))[`decoder-${i}`] ?? 0;
    const worker = `http://127.0.0.1:${7750 + i + offset}`;
    const health = (await (await fetch(`${worker}/health`, { signal: AbortSignal.timeout(5_000) })).json()) as { model_id: string; chunk_size: number };
    const keys = chunkKeys(ids, { modelId: health.model_id, chunkSize: health.chunk_size, seed: 0n })
      .filter((s) => s.end - s.start === health.chunk_size)
      .map((s) => s.key);
    // The worker port takes signed calls only (docs/security.md), as the controller's commands are.
    const body = { keys, location: 'LocalCPUBackend' };
    const r = await postJson(`${worker}/lookup`, body, 10_000, signedHeaders(secret(), 'POST', '/lookup', body));
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return [Math.min(indexSays, keys.length * health.chunk_size), r.json.count * health.chunk_size];
  }

  // kvc up generates the deployment secret that guards the controller's mutations (/move, /clear).
  let logDir = '';
  const secret = () => readFileSync(join(logDir, 'deployment.secret'), 'utf8').trim();
  const secretHeader = () => ({ authorization: `Bearer ${secret()}` });
  const INSTANCES = ['prefiller-0', 'prefiller-1', 'decoder-0', 'decoder-1'];
  /** The proxy's share window from its /metrics: instance → decisions of the last 32 it computed. */
  async function recentDecisions(): Promise<Record<string, number>> {
    const out: Record<string, number> = {};
    for (const m of (await metrics()).matchAll(/^kvc_proxy_routing_recent_decisions\{instance="([^"]+)"\} (\S+)$/gm)) out[m[1]!] = Number(m[2]);
    return out;
  }
  /**
   * The explicit starting state of a subtest whose expectations depend on what the ~10-chunk tiers
   * hold or on the proxy's routing memory (otherwise on what earlier subtests left there, the order
   * of their evictions, and which instance took most of their requests): every instance's CPU tier
   * emptied, the index empty, and the proxy's routing memory (share window, rotation) forgotten.
   */
  async function startingState(): Promise<void> {
    await clearAll();
    const r = await postJson(`${proxy}/routing/reset`, {}, 10_000, secretHeader());
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.deepEqual(await recentDecisions(), {}, 'the share window after POST /routing/reset');
  }
  /** Empties every instance's CPU tier and waits until the index is empty. */
  async function clearAll(): Promise<void> {
    for (const id of INSTANCES) {
      const c = await postJson(`${ctl}/clear`, { instance_id: id, location: 'LocalCPUBackend' }, 60_000, secretHeader());
      assert.equal(c.status, 200, JSON.stringify(c.json));
      await waitEvent(c.json.event_id);
    }
    const deadline = Date.now() + 15_000;
    for (;;) {
      const h = (await (await fetch(`${ctl}/healthz`, { signal: AbortSignal.timeout(5_000) })).json()) as { index_keys: number };
      if (h.index_keys === 0) return;
      if (Date.now() > deadline) assert.fail(`index after clearing every instance: ${h.index_keys} keys left`);
      await sleep(100);
    }
  }

  before(async () => {
    const refPort = await freePortRange(1, 40000, 50000);
    ref = startKvc(['engine', '--port', String(refPort)]);
    refUrl = `http://127.0.0.1:${refPort}`;
    // 0.005 GiB: about 10 chunks of 256 tokens of the tiny model per engine.
    ({ up, offset } = await upOnFreeOffset(base, (off) => {
      logDir = tempDir('kvc-routing-');
      return ['up', '--prefillers', '2', '--decoders', '2', '--routing', 'kv-aware', '--max-local-cpu-size', '0.005', '--port-offset', String(off), '--log-dir', logDir, '--startup-timeout', '150'];
    }, 170_000));
    await waitHttp(`${refUrl}/health`, 120_000);
    proxy = `http://127.0.0.1:${9100 + offset}`;
    ctl = `http://127.0.0.1:${9000 + offset}`;
  });
  after(async () => {
    await Promise.all([up?.kill('SIGTERM'), ref?.kill('SIGTERM')]);
  });

  test('a prefix stored by one engine is found by the controller and routes the next request to its holder; output identical', async () => {
    await startingState();
    const A = prefixText('alpha');
    const p1 = `${A} Question one: what is the river?`;
    const p2 = `${A} Question two: where does it flow?`;
    const before = await metrics();
    const r1 = await complete(proxy, p1);
    assert.equal(r1.text, (await complete(refUrl, p1)).text, 'first request (disaggregated) equals the plain engine');
    // The prefiller computed it and the decoder received it: both stored the two full chunks, under
    // the keys the controller computes from the decoder's token ids.
    const t1 = await tokens({ prompt: p1 });
    const held = await lookupUntil(t1, (m) => Object.keys(m).filter((id) => m[id]! >= 512).length >= 2, 'prefix of the first request on a prefiller and a decoder');
    assert.ok(Object.keys(held).some((id) => id.startsWith('prefiller-')), `a prefiller holds it: ${JSON.stringify(held)}`);
    const holderDecoder = Object.keys(held).find((id) => id.startsWith('decoder-'));
    assert.ok(holderDecoder, `a decoder holds it: ${JSON.stringify(held)}`);
    const r2 = await complete(proxy, p2);
    assert.equal(r2.text, (await complete(refUrl, p2)).text, 'second request (local prefill from the cache) equals the plain engine');
    const after = await metrics();
    assert.equal(metric(after, 'kvc_proxy_routing_decisions_total', 'reason="prefix_hit"') - metric(before, 'kvc_proxy_routing_decisions_total', 'reason="prefix_hit"'), 1);
    assert.equal(metric(after, 'kvc_proxy_prefills_total', 'where="local_short_uncached"') - metric(before, 'kvc_proxy_prefills_total', 'where="local_short_uncached"'), 1, 'only the question was uncached: prefilled on the decoder');
    const dname = `decoder-${holderDecoder!.split('-')[1]}(127.0.0.1:${7200 + Number(holderDecoder!.split('-')[1]) + offset})`;
    assert.ok(metric(after, 'kvc_proxy_prompt_tokens_total', `instance="${dname}",kind="cached"`) >= 512, 'cached tokens counted on the holder decoder');
    assert.ok(r2.cached >= 512, `the decoder loaded the prefix from its cache (cached_tokens ${r2.cached})`);
  });

  test('a popular prefix spreads to the other decoder once its holder is busy, fetched by P2P instead of recomputed; output identical', async () => {
    await startingState();
    // Token-id prompts: a 1,024-token prefix (4 full chunks; a new one per attempt) and 24-token questions.
    let prefix: number[] = [];
    const prompt = (k: number) => [...prefix, ...Array.from({ length: 24 }, (_, i) => 200 + ((k * 331 + i * 17) % 20000))];
    const ask = async (url: string, ids: number[], maxTokens = 8) => {
      const r = await postJson(`${url}/v1/completions`, { model: 'builtin:tiny', prompt: ids, max_tokens: maxTokens, temperature: 0, ignore_eos: true }, 120_000);
      assert.equal(r.status, 200, JSON.stringify(r.json));
      return r.json.choices[0].text as string;
    };
    const engineSum = async (name: string) => {
      let s = 0;
      for (const port of [7100, 7101, 7200, 7201]) {
        const text = await (await fetch(`http://127.0.0.1:${port + offset}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
        for (const m of text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'gm'))) s += Number(m[1]);
      }
      return s;
    };
    // Every engine says it fetches by P2P (kvc up turns it on): the proxy prices a prefix held elsewhere as a fetch.
    for (const port of [7100, 7101, 7200, 7201]) {
      const h = (await (await fetch(`http://127.0.0.1:${port + offset}/health`, { signal: AbortSignal.timeout(5_000) })).json()) as { kvc_p2p?: boolean };
      assert.equal(h.kvc_p2p, true, `engine on port ${port + offset}: /health kvc_p2p`);
    }
    // One attempt: a new prefix placed on a decoder, then a burst. Under a loaded machine (the full
    // suite beside it) a P2P fetch can fail or miss its 1 s time bound and fall back to computing,
    // which is correct behaviour but not what this test is about: up to three attempts, each with its
    // own prefix (after a fallback the other decoder holds the old one itself).
    const attempt = async (tag: number) => {
      prefix = Array.from({ length: 1024 }, (_, i) => 100 + ((i * 7919 + 13 + tag * 104729) % 30000));
      assert.equal(await ask(proxy, prompt(0)), await ask(refUrl, prompt(0)));
      const held = await lookupUntil(prefix, (m) => Object.keys(m).some((id) => id.startsWith('decoder-') && m[id]! >= 1024), 'the prefix on a decoder');
      const holder = Object.keys(held).find((id) => id.startsWith('decoder-') && held[id]! >= 1024)!;
      const other = holder === 'decoder-0' ? 'decoder-1' : 'decoder-0';
      const before = await metrics();
      const [computed0, p2p0] = [await engineSum('kvc_engine_prompt_tokens_computed_total'), await engineSum('kvc_p2p_chunks_total')];
      // The holder made busy, explicitly: a long request with the prefix (routed to the idle
      // holder) running there, then a second one. With k requests in flight the holder costs
      // 24 + k x 128 (REQUEST_WEIGHT) tokens of work plus what it still has queued, the other decoder
      // a P2P fetch of the prefix, 24 + 0.15 x 1024: the second long request or the burst goes
      // there. (Relying on the burst's own requests overlapping made the outcome depend on how fast
      // the machine finished each one.)
      const running = async (id: string) => {
        const text = await (await fetch(`${decoderUrl(Number(id.split('-')[1]))}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
        return Number(/^kvc_engine_num_requests_running(?:\{[^}]*\})? (\S+)$/m.exec(text)?.[1] ?? 0);
      };
      const runningUntil = async (ok: () => Promise<boolean>, what: string) => {
        const deadline = Date.now() + 30_000;
        while (!(await ok())) {
          if (Date.now() > deadline) assert.fail(`${what} (running: ${holder} ${await running(holder)}, ${other} ${await running(other)})`);
          await sleep(20);
        }
      };
      const busy = [ask(proxy, prompt(100), 400)];
      await runningUntil(async () => (await running(holder)) >= 1, `the first long request runs on the holder ${holder}`);
      busy.push(ask(proxy, prompt(101), 400));
      await runningUntil(async () => (await running(holder)) + (await running(other)) >= 2, 'the second long request runs');
      // Then six requests 30 ms apart.
      const n = 6;
      const texts = await Promise.all(
        Array.from({ length: n }, async (_, k) => {
          await sleep(30 * k);
          return ask(proxy, prompt(k + 1));
        }),
      );
      for (let k = 0; k < n; k++) assert.equal(texts[k], await ask(refUrl, prompt(k + 1)), `request ${k + 1}: greedy output equals the plain engine`);
      const busyTexts = await Promise.all(busy);
      for (const [k, t] of busyTexts.entries()) assert.equal(t, await ask(refUrl, prompt(100 + k), 400), `long request ${k + 1}: greedy output equals the plain engine`);
      const after = await metrics();
      const computedOn = (id: string) => {
        const i = Number(id.split('-')[1]);
        const name = `instance="${id}(127.0.0.1:${7200 + i + offset})"`;
        return metric(after, 'kvc_proxy_prefills_total', name) - metric(before, 'kvc_proxy_prefills_total', name);
      };
      const fetched = (await engineSum('kvc_p2p_chunks_total')) - p2p0;
      const computed = (await engineSum('kvc_engine_prompt_tokens_computed_total')) - computed0;
      const spreadReasons = ['p2p_fetch', 'share_cap', 'load_spread'].reduce((a, r) => a + metric(after, 'kvc_proxy_routing_decisions_total', `reason="${r}"`) - metric(before, 'kvc_proxy_routing_decisions_total', `reason="${r}"`), 0);
      const failures = [...(await Promise.all([7100, 7101, 7200, 7201].map(async (port) => (await fetch(`http://127.0.0.1:${port + offset}/metrics`, { signal: AbortSignal.timeout(5_000) })).text())))
        .join('\n')
        .matchAll(/^kvc_p2p_failures_total\{reason="([a-z]+)"\} (\S+)$/gm)].map((m) => `${m[1]} ${m[2]}`);
      return { holder, other, fromHolder: computedOn(holder), fromOther: computedOn(other), fetched, computed, spreadReasons, failures };
    };
    let r = await attempt(0);
    for (let tag = 1; tag < 3 && r.fetched < 4; tag++) {
      console.log(`attempt ${tag}: no P2P fetch in the last burst (P2P failures so far: ${r.failures.join(', ') || 'none'}); again with a new prefix`);
      r = await attempt(tag);
    }
    const n = 6;
    // The holder computed the first long request's question, and maybe more.
    assert.ok(r.fromHolder >= 1, `the holder ${r.holder} took the first long request`);
    assert.ok(n + 2 - r.fromHolder >= 1, `the burst spread beyond the holder ${r.holder} (it computed ${r.fromHolder} of ${n + 2}; ${r.other} ${r.fromOther})`);
    assert.ok(r.fetched >= 4, `the prefix reached another instance by P2P (${r.fetched} chunks; P2P failures: ${r.failures.join(', ') || 'none'})`);
    assert.ok(r.computed < (n * 1024) / 2, `the prefix was fetched, not recomputed for every request (${r.computed} prompt tokens computed for ${n} requests)`);
    assert.ok(r.spreadReasons >= 1, 'the spread decisions are counted by reason');
  });

  test('chat requests are routed on the templated tokens the engine sees', async () => {
    await startingState();
    const system = prefixText('sys');
    const m1 = [{ role: 'system', content: system }, { role: 'user', content: 'Hello, who are you?' }];
    const m2 = [{ role: 'system', content: system }, { role: 'user', content: 'Tell me about the river.' }];
    const before = await metrics();
    assert.equal(await chat(proxy, m1), await chat(refUrl, m1));
    const templated = await tokens({ messages: m1 });
    await lookupUntil(templated, (m) => Object.keys(m).some((id) => id.startsWith('decoder-') && m[id]! >= 512), 'templated chat prefix on a decoder');
    // The raw system text alone is not what the engine saw: its keys are not in the index.
    const raw = await tokens({ prompt: system });
    assert.deepEqual(await lookup(raw), {}, 'the untemplated text matches nothing');
    assert.equal(await chat(proxy, m2), await chat(refUrl, m2));
    const after = await metrics();
    assert.equal(metric(after, 'kvc_proxy_routing_decisions_total', 'reason="prefix_hit"') - metric(before, 'kvc_proxy_routing_decisions_total', 'reason="prefix_hit"'), 1);
    assert.equal(metric(after, 'kvc_proxy_prefills_total', 'where="local_short_uncached"') - metric(before, 'kvc_proxy_prefills_total', 'where="local_short_uncached"'), 1);
  });

  test('after a move the index and the route follow the chunks; after /clear nothing is routed on them', async () => {
    await startingState();
    const B = prefixText('beta');
    const p1 = `${B} First question about the beta river?`;
    await complete(proxy, p1);
    const t1 = await tokens({ prompt: p1 });
    const held = await lookupUntil(t1, (m) => Object.keys(m).some((id) => id.startsWith('decoder-') && m[id]! >= 512), 'beta prefix on a decoder');
    const from = Object.keys(held).find((id) => id.startsWith('decoder-'))!;
    const to = from === 'decoder-0' ? 'decoder-1' : 'decoder-0';
    const toIdx = Number(to.split('-')[1]);
    const mv = await postJson(`${ctl}/move`, { old_position: [from, 'LocalCPUBackend'], new_position: [to, 'LocalCPUBackend'], tokens: t1.slice(0, 512) }, 60_000, secretHeader());
    assert.equal(mv.status, 200, JSON.stringify(mv.json));
    await waitEvent(mv.json.event_id);
    const moved = await lookupUntil(t1, (m) => (m[to] ?? 0) >= 512 && (m[from] ?? 0) === 0, 'index after the move');
    assert.equal(moved[from], undefined);
    // The index agrees with the decoders themselves.
    const p2 = `${B} Second question, another one?`;
    const [says, real] = await indexAndReal(toIdx, `${B} probe`);
    assert.equal(real, says);
    const before = await metrics();
    const r2 = await complete(proxy, p2);
    assert.equal(r2.text, (await complete(refUrl, p2)).text);
    const after = await metrics();
    const toName = `decoder-${toIdx}(127.0.0.1:${7200 + toIdx + offset})`;
    assert.ok(metric(after, 'kvc_proxy_prompt_tokens_total', `instance="${toName}",kind="cached"`) - metric(before, 'kvc_proxy_prompt_tokens_total', `instance="${toName}",kind="cached"`) >= 512, 'routed to the decoder the chunks moved to');

    // /clear every instance: the index forgets them and the next request is routed as a miss.
    await clearAll();
    await lookupUntil(t1, (m) => Object.keys(m).length === 0, 'index after /clear');
    const b2 = await metrics();
    const p3 = `${B} Third question after the clear?`;
    assert.equal((await complete(proxy, p3)).text, (await complete(refUrl, p3)).text);
    const a2 = await metrics();
    assert.equal(metric(a2, 'kvc_proxy_routing_decisions_total', 'reason="no_prefix"') - metric(b2, 'kvc_proxy_routing_decisions_total', 'reason="no_prefix"'), 1);
    assert.equal(metric(a2, 'kvc_proxy_prefills_total', 'where="remote"') - metric(b2, 'kvc_proxy_prefills_total', 'where="remote"'), 1, 'a miss is disaggregated');
  });

  test('after evictions the index still agrees with what each decoder holds, and routing follows it', async () => {
    await startingState();
    // Ten ~700-token prompts (3 chunks each) through the proxy overflow the ~10-chunk tiers.
    const prompts = Array.from({ length: 10 }, (_, i) => `${prefixText(`evict${i}x`)} Question ${i}?`);
    for (const p of prompts) await complete(proxy, p);
    await sleep(500); // evictions reach the controller in the next ops batch
    let evicted = 0;
    for (const p of prompts) {
      const probe = p.replace(/ Question \d+\?$/, ' probe');
      for (const i of [0, 1]) {
        // What the decoder's tier holds, asked of the decoder itself; the index must say the same.
        // (The probe's own partial last chunk is new, so only full chunks can match.)
        const [indexSays, real] = await indexAndReal(i, probe);
        assert.equal(real, indexSays, `decoder-${i} on "${probe.slice(0, 12)}…": holds ${real}, index says ${indexSays}`);
        if (indexSays === 0) evicted++;
        // And what it holds, it loads: a request sent to it directly finds at least that much
        // cached (more when it fetches the rest from a peer).
        if (real > 0) {
          const cached = (await complete(decoderUrl(i), probe)).cached;
          assert.ok(cached >= real, `decoder-${i} on "${probe.slice(0, 12)}…": holds ${real} tokens but loaded only ${cached}`);
          await sleep(300); // that request's own admissions and evictions reach the index
        }
      }
    }
    assert.ok(evicted > 0, 'the small tiers evicted something');
    const last = prompts[prompts.length - 1]!;
    assert.equal((await complete(proxy, last)).text, (await complete(refUrl, last)).text, 'greedy output identical after evictions');
  });

  test('POST /routing/reset forgets the share window (deployment secret required, no fields); /metrics shows the window', async () => {
    await startingState();
    const p = `${prefixText('gamma')} A question about the reset?`;
    await complete(proxy, p);
    const window = await recentDecisions();
    assert.equal(Object.values(window).reduce((a, n) => a + n, 0), 1, `one kv-aware decision in the window: ${JSON.stringify(window)}`);
    const none = await postJson(`${proxy}/routing/reset`, {}, 10_000);
    assert.equal(none.status, 401, JSON.stringify(none.json));
    assert.match(none.json.error.message, /deployment secret/);
    const field = await postJson(`${proxy}/routing/reset`, { instance: 'decoder-0' }, 10_000, secretHeader());
    assert.equal(field.status, 400, JSON.stringify(field.json));
    assert.match(field.json.error.message, /takes no fields, found "instance"/);
    assert.deepEqual(await recentDecisions(), window, 'a refused reset changes nothing');
    const ok = await postJson(`${proxy}/routing/reset`, {}, 10_000, secretHeader());
    assert.equal(ok.status, 200, JSON.stringify(ok.json));
    assert.deepEqual(ok.json, { forgotten_decisions: 1 });
    assert.deepEqual(await recentDecisions(), {});
    // The proxy's log reaches its file through kvc up's pipe, a moment later.
    const line = /routing memory reset by 127\.0\.0\.1: 1 recent decisions forgotten/;
    await waitUntil('the reset in proxy.log', async () => line.test(readFileSync(join(logDir, 'proxy.log'), 'utf8')), 10_000, 100);
  });

  test('bad routing flags are refused naming the flag', () => {
    const run = (args: string[]) => spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 30_000 });
    let r = run(['proxy', '--routing', 'fastest', '--port', '1']);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /--routing: expected one of round-robin, kv-aware, found "fastest"/);
    r = run(['proxy', '--routing', 'kv-aware', '--port', '1']);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /--routing kv-aware: needs --controller-url/);
    r = run(['proxy', '--max-local-prefill-tokens', '-3', '--port', '1']);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /--max-local-prefill-tokens: expected an integer >= 0, found "-3"/);
    r = run(['proxy', '--controller-url', 'redis://x:1', '--port', '1']);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /--controller-url: expected http:\/\/host:port/);
    r = run(['up', '--routing', 'kv-aware', '--no-controller', '--config-only', '--log-dir', tempDir('kvc-routing-cfg-')]);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /--routing kv-aware: needs the controller/);
  });
});

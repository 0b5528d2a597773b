// The kv_producer / kv_consumer seam of KvcConnectorV1 with an in-memory transfer plugin
// standing in for xfer: the producer hands over sealed chunks after prefill and answers only
// when the plugin is done (with the plugin's kv_transfer_params); the consumer imports the
// received chunks, recomputes the last skip_last_n_tokens tokens, releases the reservation
// once, and produces exactly the output of an engine that computed everything.
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { DType, verifyChunk } from '../../src/common/chunk.js';
import { parseConnectorConfig, validateCacheConfig } from '../../src/common/config.js';
import { KvcConnectorV1 } from '../../src/engine/connector.js';
import { EngineMetrics } from '../../src/engine/metrics.js';
import type { PagedKvCache } from '../../src/engine/model/kv_cache.js';
import type { KvcStore } from '../../src/kvc/store.js';
import { startEngine, type Engine } from '../../src/engine/server.js';
import type { KvTransferPlugin, ReceivedKv, SealedChunk, TransferRequest } from '../../src/common/transfer_seam.js';
import { postJson } from '../../harness/proc.js';

/** The ledger's reasons for a prompt of `n` distinct tokens computed from scratch, 16-token chunks. */
const computedChunks = (n: number): Record<string, number> => ({ ...(n >= 16 ? { cold: Math.floor(n / 16) } : {}), ...(n % 16 ? { partial: 1 } : {}) });

const MODEL = 'builtin:tiny';
const ids = (n: number, salt = 0) => Array.from({ length: n }, (_, i) => 2000 + ((i * 53 + salt * 7) % 15000));

describe('kv_producer / kv_consumer plugin seam (in process)', () => {
  const engines: Engine[] = [];
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
  });

  it('producer sends, consumer loads, output equals a single engine', async () => {
    const wire = new Map<string, Uint8Array>(); // key → sealed chunk, the "network"
    const sent: TransferRequest[] = [];
    let releases = 0;
    const producerPlugin: KvTransferPlugin = {
      async send(req, chunks: SealedChunk[]) {
        sent.push(req);
        for (const c of chunks) wire.set(c.key, c.chunk.slice());
        await new Promise((r) => setTimeout(r, 50)); // the answer must wait for this
        return { sent_chunks: chunks.length };
      },
      async close() {},
    };
    const consumerPlugin: KvTransferPlugin = {
      async received(req) {
        if (!req.spans.some((s) => wire.has(s.key))) return null;
        return { get: (k) => wire.get(k) ?? null, release: () => void releases++ };
      },
      async close() {},
    };
    const cache = (cpu: boolean) => validateCacheConfig({ chunk_size: 16, local_cpu: cpu, max_local_cpu_size: cpu ? 0.05 : 0, enable_xfer: true, xfer_role: cpu ? 'sender' : 'receiver', xfer_proxy_host: '127.0.0.1', xfer_proxy_port: 1, xfer_peer_host: '127.0.0.1', xfer_peer_init_port: 2, xfer_peer_alloc_port: 3 }).config;
    const single = await startEngine({ model: MODEL, maxModelLen: 256 });
    engines.push(single);
    const producer = await startEngine({
      model: MODEL,
      maxModelLen: 256,
      kvTransferConfig: { kv_connector: 'KvcConnectorV1', kv_role: 'kv_producer', kv_connector_extra_config: { discard_partial_chunks: false, skip_last_n_tokens: 0 } },
      cacheConfig: cache(true),
      transfer: async (ctx) => {
        assert.equal(ctx.role, 'kv_producer');
        assert.equal(ctx.chunkSize, 16);
        return producerPlugin;
      },
    });
    engines.push(producer);
    const consumer = await startEngine({
      model: MODEL,
      maxModelLen: 256,
      kvTransferConfig: { kv_connector: 'KvcConnectorV1', kv_role: 'kv_consumer', kv_connector_extra_config: { discard_partial_chunks: false, skip_last_n_tokens: 1 } },
      cacheConfig: cache(false),
      transfer: async () => consumerPlugin,
    });
    engines.push(consumer);

    for (const [n, salt] of [[10, 1], [16, 2], [37, 3]] as const) {
      const prompt = ids(n, salt);
      const truth = await postJson(`${single.url}/v1/completions`, { prompt, max_tokens: 10, temperature: 0, ignore_eos: true });
      const disaggSpec = { req_id: `r${n}`, receiver_host: '127.0.0.1', receiver_init_port: 2, receiver_alloc_port: 3 };
      const pre = await postJson(`${producer.url}/v1/completions`, { prompt, max_tokens: 1, temperature: 0, kv_transfer_params: { disagg_spec: disaggSpec } });
      assert.equal(pre.status, 200);
      // The plugin's params, what of the prompt the prefiller reused (nothing), and its hit-rate
      // ledger (docs/ledger.md): all n tokens computed, each full chunk cold (never stored before,
      // distinct prompts), the unfinished last one partial.
      assert.deepEqual(
        pre.json.kv_transfer_params,
        {
          sent_chunks: Math.ceil(n / 16),
          reused_tokens: 0,
          kvc_ledger: { predicted_cached_tokens: null, reused_tokens: 0, computed_tokens: n, computed_chunks: computedChunks(n), instance: null },
        },
        'the plugin\'s params, what the prefiller reused (nothing) and its ledger',
      );
      assert.deepEqual(sent.at(-1)!.kvTransferParams, { disagg_spec: disaggSpec });
      for (const s of sent.at(-1)!.spans) verifyChunk(wire.get(s.key)!, s.key);
      const dec = await postJson(`${consumer.url}/v1/completions`, { prompt, max_tokens: 10, temperature: 0, ignore_eos: true, kv_transfer_params: { disagg_spec: disaggSpec } });
      assert.equal(dec.status, 200);
      assert.equal(dec.json.choices[0].text, truth.json.choices[0].text, `prompt of ${n} tokens`);
      // This request's own transfer is not a cache read: it is counted apart.
      assert.deepEqual(dec.json.usage.prompt_tokens_details, { cached_tokens: 0, kv_transfer_tokens: n - 1 }, 'all but skip_last_n_tokens received');
    }
    assert.equal(releases, 3, 'each reservation released exactly once');
    const m = await (await fetch(`${consumer.url}/metrics`)).text();
    assert.match(m, /kvc_engine_tokens_loaded_by_source_total\{source="transfer"[^}]*\} 60/);
    // The consumer has no local location: it stored nothing.
    assert.equal(consumer.store!.locations().length, 0);
  });
});

describe('kv_consumer transfer lookup past its timeout', () => {
  it('chunks handed out after the timeout are released (the reservation is not left held)', async () => {
    let resolveLookup!: (v: ReceivedKv) => void;
    let releases = 0;
    const plugin: KvTransferPlugin = {
      received: () => new Promise<ReceivedKv>((r) => (resolveLookup = r)),
      async close() {},
    };
    const store = { cpu: () => null, has: () => false, locations: () => [], on: () => undefined } as unknown as KvcStore;
    const c = new KvcConnectorV1({
      config: parseConnectorConfig(JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_consumer', kv_connector_extra_config: { skip_last_n_tokens: 1 } })).config,
      cacheConfig: validateCacheConfig({ chunk_size: 16 }).config,
      store,
      modelId: 'm',
      layout: { dtype: DType.f32, numLayers: 1, numKvHeads: 1, headDim: 4 },
      seed: 0n,
      metrics: new EngineMetrics({ model: 'm' }),
      transfer: plugin,
      loadTimeoutMs: 50,
    });
    const { ledger, ...res } = await c.load({ seqId: 1, requestId: 'late-1', prompt: ids(40), kvTransferParams: undefined, cancelled: () => false }, null as unknown as PagedKvCache);
    assert.deepEqual(res, { tokens: 0, receivedTokens: 0, source: 'none' }, 'the prompt is computed');
    assert.deepEqual({ computed: ledger?.computed, reused: ledger?.reused, chunks: await ledger?.chunks }, { computed: 40, reused: 0, chunks: computedChunks(40) }, 'the ledger says so');
    assert.equal(releases, 0);
    // the plugin answers only now, long after the connector gave up: it must get its release
    resolveLookup({ get: () => null, release: () => void releases++ });
    await new Promise((r) => setImmediate(r)); // the release runs in the promise jobs before this
    assert.equal(releases, 1);
  });
});

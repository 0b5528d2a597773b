// KV imports are paced against the scheduler's steps for the whole engine (src/engine/import_pacer.ts):
// while a sequence decodes, two requests whose prefixes arrived by transfer are imported in
// slices, and between two decode steps there is at most one slice of import work, whichever
// request it belongs to, never one slice per import. A real KvcConnectorV1 (kv_consumer) imports
// sealed chunks handed out by a stand-in transfer plugin into a real paged KV; the import clock is
// a test clock that advances by one slice per chunk copied, so every slice is exactly one chunk.
// The assertions are about the order of steps and chunk copies, not about time.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { DType } from '../../src/common/dtype.js';
import { HEADER_BYTES, chunkBytes, sealChunk, type KvLayout } from '../../src/common/chunk.js';
import { parseConnectorConfig, validateCacheConfig } from '../../src/common/config.js';
import type { KvTransferPlugin, ReceivedKv, TransferRequest } from '../../src/common/transfer_seam.js';
import { KvcConnectorV1 } from '../../src/engine/connector.js';
import { EngineMetrics } from '../../src/engine/metrics.js';
import { PagedKvCache } from '../../src/engine/model/kv_cache.js';
import { Scheduler, type ForwardSegment } from '../../src/engine/scheduler.js';
import type { Sampler } from '../../src/engine/sampler.js';
import type { KvcStore } from '../../src/kvc/store.js';

const CHUNK = 16;
const layout: KvLayout = { dtype: DType.f32, numLayers: 1, numKvHeads: 1, headDim: 4 };
const greedy = { sample: () => 1 } as unknown as Sampler;
/** Prompts received by transfer: 4 full chunks each (the last token is recomputed). */
const LONG = 4 * CHUNK + 1;

describe('KV import pacing', () => {
  it('runs at most one slice of import work between two decode steps, across concurrent imports', async () => {
    const log: string[] = [];
    let clock = 0;
    const metrics = new EngineMetrics({ model: 'm' });
    const kv = new PagedKvCache(layout, 1 << 22);
    // Every chunk copied into the paged KV is logged with its request, and costs one slice.
    const owner = new Map<string | number, string>();
    const importRange = kv.importRange.bind(kv);
    kv.importRange = (seqId, start, payload, n) => {
      log.push(`import ${owner.get(seqId)}`);
      clock += 1;
      importRange(seqId, start, payload, n);
    };
    const plugin: KvTransferPlugin = {
      received: async (req: TransferRequest): Promise<ReceivedKv | null> => {
        if (req.promptTokens.length !== LONG) return null; // the decoding request has no transfer
        const byKey = new Map(
          req.spans.map((s) => {
            const n = s.end - s.start;
            const buf = new Uint8Array(chunkBytes(layout, n));
            buf.fill(7, HEADER_BYTES);
            return [s.key, sealChunk(buf, layout, n, s.key)];
          }),
        );
        return { get: (key) => byKey.get(key) ?? null, release: () => undefined };
      },
      async close() {},
    };
    const store = { cpu: () => null, has: () => false, locations: () => [], on: () => undefined, remote: null, touchPrefix: () => undefined } as unknown as KvcStore;
    const connector = new KvcConnectorV1({
      config: parseConnectorConfig(JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_consumer', kv_connector_extra_config: { skip_last_n_tokens: 1 } })).config,
      cacheConfig: validateCacheConfig({ chunk_size: CHUNK }).config,
      store,
      modelId: 'm',
      layout,
      seed: 0n,
      metrics,
      transfer: plugin,
    });
    const model = {
      forward(segs: ForwardSegment[], cache: PagedKvCache) {
        let decodeRows = 0;
        for (const s of segs) {
          cache.setLength(s.seqId, s.startPos + s.tokens.length);
          if (owner.get(s.seqId) === 'stream' && s.startPos >= 4) decodeRows++;
        }
        log.push(decodeRows ? 'decode step' : 'step');
        return segs.filter((s) => s.wantLogits).map(() => new Float32Array(4));
      },
    };
    const scheduler = new Scheduler({ model, kv, metrics, connector, maxNumSeqs: 4, maxNumBatchedTokens: 64, maxQueue: 8, importSliceMs: 1, importNow: () => clock });
    const submit = (id: string, prompt: number[], maxTokens: number, onToken: () => void = () => undefined) =>
      new Promise<void>((resolve, reject) => {
        const seq = scheduler.submit({
          requestId: id,
          prompt,
          maxTokens,
          sampler: greedy,
          stopTokenIds: new Set(),
          kvTransferParams: undefined,
          events: { onToken, onFinish: (reason, err) => (reason === 'length' ? resolve() : reject(err ?? new Error(reason))) },
        });
        owner.set(seq.id, id);
      });
    // A stream decodes for the whole test; once it has its first token, two long requests arrive together.
    let arrived: Promise<void>[] = [];
    let tokens = 0;
    const stream = submit('stream', [1, 2, 3, 4], 60, () => {
      if (++tokens !== 1) return;
      const prompt = (salt: number) => Array.from({ length: LONG }, (_, i) => 100 + ((i * 31 + salt) % 500));
      arrived = [submit('A', prompt(1), 1), submit('B', prompt(2), 1)];
    });
    await stream;
    await Promise.all(arrived);
    await scheduler.close();

    const imports = log.filter((e) => e.startsWith('import'));
    assert.deepEqual(
      [imports.filter((e) => e === 'import A').length, imports.filter((e) => e === 'import B').length],
      [4, 4],
      'every received chunk of both requests imported',
    );
    // Between two decode steps: at most one chunk (one slice), of one request or the other.
    const first = log.indexOf('import A');
    const last = log.lastIndexOf('import B');
    let run = 0;
    for (const e of log.slice(first, last + 1)) {
      run = e.startsWith('import') ? run + 1 : 0;
      assert.ok(run <= 1, `two slices between decode steps:\n${log.join('\n')}`);
    }
    // The older request's prefix is imported first, then the other's; a decode step ran between each.
    assert.deepEqual(imports, ['import A', 'import A', 'import A', 'import A', 'import B', 'import B', 'import B', 'import B']);
    assert.ok(log.slice(first, last + 1).filter((e) => e === 'decode step').length >= 7, log.join('\n'));
    assert.match(await metrics.registry.metrics(), /kvc_engine_kv_import_slices_total(\{[^}]*\})? [1-9]/);
  });
});

// Engine configuration and lifecycle, in process: bad options are refused before the model is
// loaded with an error naming the option; a start-up that fails half way (here: the controller
// worker port is taken) releases what it had already acquired (the xfer plugin) and leaves no
// port open; a started engine closes idempotently.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:net';
import { validateCacheConfig } from '../../src/common/config.js';
import { freePortRange } from '../../harness/ports.js';
import type { KvTransferPlugin } from '../../src/common/transfer_seam.js';
import { startEngine } from '../../src/engine/server.js';
import { resolveEngineSettings } from '../../src/engine/settings.js';

const MODEL = 'builtin:tiny';
const BOTH = { kv_connector: 'KvcConnectorV1', kv_role: 'kv_both', kv_connector_extra_config: { discard_partial_chunks: false, skip_last_n_tokens: 0 } } as const;

function listen(port: number): Promise<Server> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(port, '127.0.0.1', () => resolve(s));
  });
}

describe('engine settings', () => {
  it('every bad option is refused with an error naming it', () => {
    const cases: [Parameters<typeof resolveEngineSettings>[0], RegExp][] = [
      [{ maxNumSeqs: 0 }, /^--max-num-seqs: expected a positive integer, found 0$/],
      [{ maxNumBatchedTokens: 2.5 }, /^--max-num-batched-tokens: expected a positive integer, found 2.5$/],
      [{ maxNumSeqs: 8, maxNumBatchedTokens: 4 }, /--max-num-batched-tokens \(4\) must be >= --max-num-seqs \(8\)/],
      [{ maxQueue: 0 }, /^--max-queue-len: expected a positive integer, found 0$/],
      [{ stepTargetMs: -1 }, /^--step-target-ms: expected an integer number of milliseconds from 0 \(off\) to 60000, found -1$/],
      [{ stepTargetMs: 1.5 }, /^--step-target-ms: expected an integer number of milliseconds from 0 \(off\) to 60000, found 1.5$/],
      [{ maxModelLen: 1 }, /^--max-model-len: expected an integer >= 2, found 1$/],
      [{ port: 70000 }, /^--port: expected an integer between 0 and 65535, found 70000$/],
      [{ host: '' }, /^--host: expected a non-empty string/],
      [{ servedModelName: '' }, /^--served-model-name: expected a non-empty string/],
      [{ kvCacheBytes: -1 }, /^kvCacheBytes \(--kv-cache-memory in GiB\): expected a number of bytes > 0, found -1$/],
      [{ kvTransferConfig: '{' }, /^--kv-transfer-config: not valid JSON/],
      [{ kvTransferConfig: { ...BOTH, kv_role: 'kv_sideways' } as never }, /^--kv-transfer-config: key "kv_role"/],
      [{ kvTransferConfig: BOTH, cacheConfig: { chunk_size: 0 } as never }, /^cacheConfig: key "chunk_size"/],
      [{ cacheConfig: validateCacheConfig({}).config }, /^cacheConfig: given without kvTransferConfig/],
      [{ kvTransferConfig: BOTH, transfer: async () => ({ close: async () => {} }) }, /^transfer: a transfer plugin is used only with kv_role kv_producer or kv_consumer \(found kv_both\)/],
    ];
    // The message itself must match (assert.throws would test `Error: …` against a RegExp).
    for (const [opts, re] of cases) {
      assert.throws(() => resolveEngineSettings(opts), (e: unknown) => e instanceof Error && re.test(e.message), `${JSON.stringify(opts)} → ${re}`);
    }
  });

  it('defaults: 16 sequences, 512 tokens per step, a queue of 1024, no connector', () => {
    const s = resolveEngineSettings({ env: {} });
    assert.equal(s.modelSpec, 'builtin:tiny');
    assert.equal(s.modelName, 'builtin:tiny');
    assert.equal(s.host, '127.0.0.1');
    assert.equal(s.port, 0);
    assert.equal(s.maxNumSeqs, 16);
    assert.equal(s.maxNumBatchedTokens, 512);
    assert.equal(s.maxQueue, 1024);
    assert.equal(s.connectorConfig, null);
    assert.equal(s.cacheConfig, null);
  });

  it('a limit that needs the model is checked after loading it', async () => {
    await assert.rejects(startEngine({ model: MODEL, maxModelLen: 1 << 30 }), /--max-model-len 1073741824 exceeds the model's max_position_embeddings/);
  });
});

describe('engine lifecycle', () => {
  it('a start-up that fails half way releases what it acquired, then the ports are free', async () => {
    const [workerPort, controllerPort, enginePort] = await (async () => {
      const base = await freePortRange(3);
      return [base, base + 1, base + 2];
    })();
    const taken = await listen(workerPort);
    let created = 0;
    let closed = 0;
    const plugin: KvTransferPlugin = {
      async send() {},
      async close() {
        closed++;
      },
    };
    try {
      const cacheConfig = validateCacheConfig({
        chunk_size: 16,
        max_local_cpu_size: 0.01,
        enable_controller: true,
        controller_url: `127.0.0.1:${controllerPort}`,
        kvc_worker_port: workerPort,
        enable_xfer: true,
        xfer_role: 'sender',
        xfer_proxy_host: '127.0.0.1',
        xfer_proxy_port: 1,
      }).config;
      await assert.rejects(
        startEngine({
          model: MODEL,
          port: enginePort,
          maxModelLen: 256,
          kvTransferConfig: { ...BOTH, kv_role: 'kv_producer' as const },
          cacheConfig,
          transfer: async () => {
            created++;
            return plugin;
          },
        }),
        /cannot start the controller worker/,
      );
      assert.equal(created, 1);
      assert.equal(closed, 1, 'the xfer plugin acquired before the failure was closed');
    } finally {
      await new Promise<void>((r) => taken.close(() => r()));
    }
    // Nothing of the failed engine holds its port: a new engine binds it.
    const e = await startEngine({ model: MODEL, port: enginePort, maxModelLen: 256 });
    try {
      assert.equal(e.port, enginePort);
      assert.equal((await fetch(`${e.url}/health`)).status, 200);
    } finally {
      await Promise.all([e.close(), e.close()]);
    }
    await assert.rejects(fetch(`${e.url}/health`));
  });
});

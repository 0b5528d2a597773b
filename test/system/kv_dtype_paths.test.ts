// Every chunk path on real processes, once per engine KV dtype (every --kv-cache-dtype value but the
// aliases auto and fp8): a `kvc controller`, a redis-server, and two engines (built-in model) with
// that dtype, A writing through to Redis, both with P2P. Per dtype:
//   store   A computes a prompt: its CPU tier holds chunks of A's dtype (checked in Redis, which
//           holds them byte for byte: header dtype and codec);
//   Redis   A's CPU tier cleared, A serves the prompt again from Redis (tokens loaded);
//   P2P     B, which never saw the prompt, fetches it from A and generates A's tokens;
//   move    a copy of a second prompt from A to B through the controller; B serves it from its
//           CPU tier and generates A's tokens.
// The disk tier and /compress,/decompress per dtype are in codec_e2e.test.ts.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { Codec, verifyChunk } from '../../src/common/chunk.js';
import { freePortRange } from '../../src/common/ports.js';
import { postJson, startKvc, waitHttp, waitUntil as waitFor, type Proc } from '../../harness/proc.js';
import { headerDtypeOf, KV_DTYPE_FLAGS } from '../../harness/kv_dtype.js';
import { findRedisServer, REDIS_SKIP, startRedisServer, type RedisServer } from '../../harness/redis_server.js';
import { tempDir } from '../../harness/temp_dir.js';

const CHUNK = 16;
const CONNECTOR = JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both' });

for (const kvDtype of KV_DTYPE_FLAGS) {
  describe(`--kv-cache-dtype ${kvDtype}: store, Redis, P2P and move on real processes`, { skip: findRedisServer() ? false : REDIS_SKIP }, () => {
    let ctl: Proc;
    let srv: RedisServer;
    let raw: Redis;
    const engines: Proc[] = [];
    const url: Record<'A' | 'B', string> = { A: '', B: '' };
    let ctlUrl = '';

    const waitUntil = <T>(what: string, fn: () => Promise<T | undefined | false>) => waitFor(what, fn, 30_000, 100);
    const complete = async (who: 'A' | 'B', prompt: string) => {
      const r = await postJson(`${url[who]}/v1/completions`, { model: 'builtin:tiny', prompt, max_tokens: 6, temperature: 0 }, 120_000);
      assert.equal(r.status, 200, JSON.stringify(r.json));
      return r.json.choices[0].text as string;
    };
    const tokenize = async (prompt: string) => (await postJson(`${url.A}/tokenize`, { model: 'builtin:tiny', prompt })).json.tokens as number[];
    const metric = async (who: 'A' | 'B', name: string) => {
      const m = await (await fetch(`${url[who]}/metrics`)).text();
      return Number(m.match(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\d+(?:\\.\\d+)?)`, 'm'))?.[1] ?? 'NaN');
    };
    const held = async (tokens: number[], id: string) => (await postJson(`${ctlUrl}/lookup`, { tokens })).json.layout_detail[id] as { matched_tokens: number } | undefined;
    const finished = async (event_id: string) =>
      waitUntil(`event ${event_id}`, async () => {
        const r = await postJson(`${ctlUrl}/check_finish`, { event_id });
        return r.json.status === 'finished' || r.json.status === 'failed' ? r.json : undefined;
      });

    before(async () => {
      srv = await startRedisServer();
      raw = new Redis({ host: '127.0.0.1', port: srv.port, lazyConnect: true, maxRetriesPerRequest: 1 });
      raw.on('error', () => undefined);
      await raw.connect();
      const base = await freePortRange(8);
      ctlUrl = `http://127.0.0.1:${base}`;
      ctl = startKvc(['controller', '--port', String(base), '--monitor-port', String(base + 1)]);
      await ctl.waitFor(/kvc controller ready/, 30_000);
      const dir = tempDir('kvc-dtype-paths-');
      for (const [i, who] of (['A', 'B'] as const).entries()) {
        const yaml = join(dir, `${who}.yaml`);
        writeFileSync(
          yaml,
          [
            `chunk_size: ${CHUNK}`,
            'local_cpu: true',
            'max_local_cpu_size: 0.05',
            'enable_controller: true',
            `kvc_instance_id: ${kvDtype}-${who}`,
            `controller_url: 127.0.0.1:${base + 1}`,
            `kvc_worker_port: ${base + 2 + 3 * i}`,
            `distributed_url: 127.0.0.1:${base + 3 + 3 * i}`,
            'p2p_timeout_ms: 30000',
            // Only A writes through to Redis, so B's misses go to P2P.
            ...(who === 'A' ? [`remote_url: "${srv.url}"`] : []),
          ].join('\n'),
        );
        url[who] = `http://127.0.0.1:${base + 4 + 3 * i}`;
        engines.push(startKvc(['engine', '--port', String(base + 4 + 3 * i), '--kv-transfer-config', CONNECTOR, '--enable-p2p', '--kv-cache-dtype', kvDtype], { KVC_CONFIG_FILE: yaml }));
      }
      await Promise.all(Object.values(url).map((u) => waitHttp(`${u}/health`, 120_000)));
      await waitUntil('both engines registered', async () => (await (await fetch(`${ctlUrl}/instances`)).json()).instances.length === 2);
    });

    after(async () => {
      for (const e of engines) await e.kill();
      await ctl?.kill();
      raw?.disconnect();
      await srv?.stop();
    });

    test(`${kvDtype}: chunks of that dtype stored and in Redis; served back from Redis; P2P to B gives A's tokens`, async () => {
      const prompt = `KV in ${kvDtype} travels everywhere as it is held. ` + Array.from({ length: 40 }, (_, i) => `p${i}`).join(' ');
      const textA = await complete('A', prompt);
      const tokens = await tokenize(prompt);
      const full = Math.floor(tokens.length / CHUNK) * CHUNK;
      await waitUntil('A holds the prompt', async () => ((await held(tokens, `${kvDtype}-A`))?.matched_tokens ?? 0) >= full - CHUNK);
      const keys = await waitUntil('chunks written to Redis', async () => {
        const k = await raw.keys('kvc:*');
        return k.length >= 2 ? k : undefined;
      });
      for (const k of keys) {
        const v = (await raw.getBuffer(k))!;
        const h = verifyChunk(new Uint8Array(v.buffer, v.byteOffset, v.byteLength));
        assert.deepEqual([h.dtype, h.codec], [headerDtypeOf(kvDtype), Codec.naive], `${k}: held as ${kvDtype}, naive`);
      }

      // P2P: B has no copy and no remote tier; it fetches from A and continues exactly as A did.
      const p2p0 = await metric('B', 'kvc_p2p_chunks_total');
      assert.equal(await complete('B', prompt), textA, 'B (P2P) generates what A generated');
      assert.ok((await metric('B', 'kvc_p2p_chunks_total')) - p2p0 >= 2, 'B took the prompt over P2P');

      // Redis: A's CPU tier cleared; A loads the prompt back from Redis.
      const cl = await postJson(`${ctlUrl}/clear`, { instance_id: `${kvDtype}-A`, location: 'LocalCPUBackend' });
      assert.equal((await finished(cl.json.event_id)).status, 'finished');
      const loaded0 = await metric('A', 'kvc_engine_tokens_loaded_total');
      assert.equal(await complete('A', prompt), textA, 'A from Redis generates what it generated');
      assert.ok((await metric('A', 'kvc_engine_tokens_loaded_total')) - loaded0 >= full - CHUNK, 'A served the prompt from Redis');
    });

    test(`${kvDtype}: a copy A → B through the controller; B serves the prompt from it with A's tokens`, async () => {
      const prompt = `A copy of ${kvDtype} chunks between instances. ` + Array.from({ length: 40 }, (_, i) => `m${i}`).join(' ');
      const textA = await complete('A', prompt);
      const tokens = await tokenize(prompt);
      const full = Math.floor(tokens.length / CHUNK) * CHUNK;
      await waitUntil('A holds the prompt', async () => ((await held(tokens, `${kvDtype}-A`))?.matched_tokens ?? 0) >= full - CHUNK);
      const r = await postJson(`${ctlUrl}/move`, { old_position: [`${kvDtype}-A`, 'LocalCPUBackend'], new_position: [`${kvDtype}-B`, 'LocalCPUBackend'], tokens, copy: true });
      assert.equal(r.status, 200, JSON.stringify(r.json));
      assert.equal((await finished(r.json.event_id)).status, 'finished');
      assert.ok(((await held(tokens, `${kvDtype}-B`))?.matched_tokens ?? 0) >= full - CHUNK, 'B holds the copy');
      const loaded0 = await metric('B', 'kvc_engine_tokens_loaded_total');
      const p2p0 = await metric('B', 'kvc_p2p_chunks_total');
      assert.equal(await complete('B', prompt), textA, 'B from the copy generates what A generated');
      assert.ok((await metric('B', 'kvc_engine_tokens_loaded_total')) - loaded0 >= full - CHUNK, 'B served the prompt from its CPU tier');
      assert.equal(await metric('B', 'kvc_p2p_chunks_total'), p2p0, 'nothing over P2P: the copy was there');
    });
  });
}

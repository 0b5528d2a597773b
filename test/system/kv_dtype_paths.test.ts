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
import { Redis } from 'ioredis';
import { Codec, verifyChunk } from '../../src/common/chunk.js';
import { postJson, waitUntil as waitFor } from '../../harness/proc.js';
import { completeText, eventDone, matchedOn, metricValue, startControllerEngines, tokenizeOn, type ControllerEngines, type Who } from '../../harness/controller_engines.js';
import { headerDtypeOf, KV_DTYPE_FLAGS } from '../../harness/kv_dtype.js';
import { findRedisServer, REDIS_SKIP, startRedisServer, type RedisServer } from '../../harness/redis_server.js';

const CHUNK = 16;

for (const kvDtype of KV_DTYPE_FLAGS) {
  describe(`--kv-cache-dtype ${kvDtype}: store, Redis, P2P and move on real processes`, { skip: findRedisServer() ? false : REDIS_SKIP }, () => {
    let srv: RedisServer;
    let raw: Redis;
    let d: ControllerEngines;

    const waitUntil = <T>(what: string, fn: () => Promise<T | undefined | false>) => waitFor(what, fn, 30_000, 50);
    const complete = (who: Who, prompt: string) => completeText(d.url[who], prompt, 6);
    const tokenize = (prompt: string) => tokenizeOn(d.url.A, prompt);
    const metric = (who: Who, name: string) => metricValue(d.url[who], name);
    const held = (tokens: number[], id: string) => matchedOn(d.ctlUrl, tokens, id);
    const finished = (event_id: string) => eventDone(d.ctlUrl, event_id);

    before(async () => {
      srv = await startRedisServer();
      raw = new Redis({ host: '127.0.0.1', port: srv.port, lazyConnect: true, maxRetriesPerRequest: 1 });
      raw.on('error', () => undefined);
      await raw.connect();
      d = await startControllerEngines({
        chunkSize: CHUNK,
        instanceId: (who) => `${kvDtype}-${who}`,
        yaml: (who) => [
          'max_local_cpu_size: 0.05',
          'p2p_timeout_ms: 30000',
          // Only A writes through to Redis, so B's misses go to P2P.
          ...(who === 'A' ? [`remote_url: "${srv.url}"`] : []),
        ],
        engineArgs: ['--enable-p2p', '--kv-cache-dtype', kvDtype],
      });
    });

    after(async () => {
      await d?.stop();
      raw?.disconnect();
      await srv?.stop();
    });

    test(`${kvDtype}: chunks of that dtype stored and in Redis; served back from Redis; P2P to B gives A's tokens`, async () => {
      const prompt = `KV in ${kvDtype} travels everywhere as it is held. ` + Array.from({ length: 40 }, (_, i) => `p${i}`).join(' ');
      const textA = await complete('A', prompt);
      const tokens = await tokenize(prompt);
      const full = Math.floor(tokens.length / CHUNK) * CHUNK;
      await waitUntil('A holds the prompt', async () => (await held(tokens, `${kvDtype}-A`)) >= full - CHUNK);
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
      const cl = await postJson(`${d.ctlUrl}/clear`, { instance_id: `${kvDtype}-A`, location: 'LocalCPUBackend' });
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
      await waitUntil('A holds the prompt', async () => (await held(tokens, `${kvDtype}-A`)) >= full - CHUNK);
      const r = await postJson(`${d.ctlUrl}/move`, { old_position: [`${kvDtype}-A`, 'LocalCPUBackend'], new_position: [`${kvDtype}-B`, 'LocalCPUBackend'], tokens, copy: true });
      assert.equal(r.status, 200, JSON.stringify(r.json));
      assert.equal((await finished(r.json.event_id)).status, 'finished');
      // The controller indexes B's copy when B reports it, which can come after the event finished.
      await waitUntil('B holds the copy', async () => (await held(tokens, `${kvDtype}-B`)) >= full - CHUNK);
      const loaded0 = await metric('B', 'kvc_engine_tokens_loaded_total');
      const p2p0 = await metric('B', 'kvc_p2p_chunks_total');
      assert.equal(await complete('B', prompt), textA, 'B from the copy generates what A generated');
      assert.ok((await metric('B', 'kvc_engine_tokens_loaded_total')) - loaded0 >= full - CHUNK, 'B served the prompt from its CPU tier');
      assert.equal(await metric('B', 'kvc_p2p_chunks_total'), p2p0, 'nothing over P2P: the copy was there');
    });
  });
}

// The remote tier (remote_url) against a real redis-server started by this test on a free
// loopback port: background writes under `kvc:<model_id>:<key>`, verified read-through with
// promotion, a full write queue dropping (counted), a paused server costing one timeout, a
// killed server skipped at once and reconnected to after a restart. Skipped, naming the
// Debian package, where redis-server is not installed.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Redis } from 'ioredis';
import { Codec, DType, encodeChunk, payloadBytes, readHeader, verifyChunk } from '../../src/common/chunk.js';
import { freePortRange } from '../../harness/ports.js';
import { ConfigError, validateCacheConfig } from '../../src/common/config.js';
import { parseRemoteUrl } from '../../src/common/remote_url.js';
import { KvcStore } from '../../src/kvc/store.js';
import type { KeyEvent } from '../../src/kvc/types.js';
import { REDIS_SKIP, findRedisServer, startRedisServer, type RedisServer } from '../../harness/redis_server.js';
import { writeFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { postJson, startKvc, waitHttp, waitUntil } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

const layout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 64 };
const TOKENS = 16; // 32 KiB payload per chunk
const MODEL = 'test-model';
const keyOf = (i: number) => (0x1000 + i).toString(16).padStart(16, '0');
const chunk = (i: number) => encodeChunk(layout, TOKENS, keyOf(i), new Uint8Array(payloadBytes(layout, TOKENS)).map((_, j) => (i * 7 + j) & 0xff));
const GiB = 1024 ** 3;

describe('remote_url configuration', () => {
  it('accepts redis://, rediss://, valkey:// with user, password, port and db', () => {
    const a = parseRemoteUrl('redis://alice:s%40cret@cache.example:6380/3');
    assert.deepEqual([a.host, a.port, a.username, a.password, a.db, a.tls], ['cache.example', 6380, 'alice', 's@cret', 3, false]);
    assert.equal(a.display, 'redis://alice:***@cache.example:6380/3', 'the password never reaches a log line');
    const b = parseRemoteUrl('rediss://10.0.0.5');
    assert.deepEqual([b.host, b.port, b.db, b.tls], ['10.0.0.5', 6379, 0, true]);
    const c = parseRemoteUrl('valkey://[::1]:7000/1');
    assert.deepEqual([c.host, c.port, c.db, c.tls], ['::1', 7000, 1, false]);
    const { config } = validateCacheConfig({ remote_url: 'valkey://localhost:6379', remote_timeout_ms: 250, remote_write_queue_size: 0.5 });
    assert.equal(config.remote_timeout_ms, 250);
  });

  it('refuses unsupported schemes and malformed URLs at start-up, naming remote_url', () => {
    for (const [url, what] of [
      ['lm://localhost:65432', /unsupported scheme "lm:\/\/"/],
      ['s3://bucket/prefix', /unsupported scheme "s3:\/\/"/],
      ['redis-sentinel://h1:26379,h2:26379/mymaster', /unsupported scheme "redis-sentinel:\/\/"/],
      ['localhost:6379', /expected a URL like redis:\/\/host:6379/],
      ['redis://host:6379/cache', /not a database number/],
      ['redis://host:6379/0?timeout=1', /query parameters/],
      ['redis://host:99999', /port|valid URL/],
    ] as const) {
      assert.throws(() => validateCacheConfig({ remote_url: url }, 'cache.yaml'), (e: Error) => {
        assert.ok(e instanceof ConfigError);
        assert.match(e.message, /^cache\.yaml: key "remote_url": /);
        assert.match(e.message, what);
        return true;
      }, url);
    }
    assert.throws(() => validateCacheConfig({ remote_url: 'lm://u:topsecret@h:1' }), (e: Error) => !e.message.includes('topsecret'));
  });

  it('refuses remote settings without remote_url (they would do nothing)', () => {
    assert.throws(() => validateCacheConfig({ remote_timeout_ms: 100 }), /key "remote_timeout_ms": only meaningful with remote_url/);
    assert.throws(() => validateCacheConfig({ remote_url: 'redis://h', remote_write_queue_size: 0 }), /key "remote_write_queue_size"/);
  });

  it('kvc engine with an LMCache lm:// remote_url stops at start-up with a message naming remote_url', async () => {
    const dir = tempDir('kvc-remote-url-');
    try {
      const yaml = join(dir, 'cache.yaml');
      writeFileSync(yaml, 'chunk_size: 16\nremote_url: "lm://localhost:65432"\n');
      const p = startKvc(['engine', '--port', '1', '--kv-transfer-config', '{"kv_connector":"KvcConnectorV1","kv_role":"kv_both"}'], { KVC_CONFIG_FILE: yaml });
      const code = await new Promise<number | null>((r) => p.child.once('exit', (c) => r(c)));
      assert.notEqual(code, 0);
      assert.match(p.output(), /cache\.yaml: key "remote_url": unsupported scheme "lm:\/\/"/);
      assert.doesNotMatch(p.output(), /listening/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('KvcStore.create refuses an unsupported scheme instead of starting without the tier', async () => {
    await assert.rejects(
      KvcStore.create({ local_cpu: true, max_local_cpu_size: 0.01, max_local_disk_size: 0, local_disk: null, remote_url: 'lm://localhost:65432' }, { modelId: MODEL }),
      /key "remote_url": unsupported scheme "lm:\/\/"/,
    );
  });
});

const redisBin = findRedisServer();

describe('remote tier on a real redis-server', { skip: redisBin ? false : REDIS_SKIP }, () => {
  let srv: RedisServer;
  let raw: Redis;
  const stores: KvcStore[] = [];
  const open = async (o: { cpu?: number; queue?: number; timeoutMs?: number } = {}) => {
    const s = await KvcStore.create(
      {
        local_cpu: (o.cpu ?? 0.01) > 0,
        max_local_cpu_size: o.cpu ?? 0.01,
        max_local_disk_size: 0,
        local_disk: null,
        remote_url: srv.url,
        remote_timeout_ms: o.timeoutMs ?? 300,
        remote_write_queue_size: o.queue ?? 0.01,
      },
      { modelId: MODEL },
    );
    stores.push(s);
    return s;
  };

  before(async () => {
    srv = await startRedisServer();
    raw = new Redis({ host: '127.0.0.1', port: srv.port, lazyConnect: true, maxRetriesPerRequest: 1 });
    raw.on('error', () => undefined);
    await raw.connect();
  });

  after(async () => {
    for (const s of stores) await s.close().catch(() => undefined);
    raw?.disconnect();
    await srv?.stop();
  });

  it('float16 engines with remote_serde int8: int8 chunks of f16 KV in Redis, and a second engine serves the prompt from them', async () => {
    const dir = tempDir('kvc-remote-f16-');
    const yaml = join(dir, 'cache.yaml');
    writeFileSync(yaml, `chunk_size: 16\nlocal_cpu: true\nmax_local_cpu_size: 0.01\nremote_url: "${srv.url}"\nremote_serde: int8\n`);
    const ports = await freePortRange(2);
    const engine = (port: number) =>
      startKvc(['engine', '--port', String(port), '--kv-cache-dtype', 'float16', '--kv-transfer-config', '{"kv_connector":"KvcConnectorV1","kv_role":"kv_both"}'], { KVC_CONFIG_FILE: yaml });
    const complete = async (port: number, prompt: string) => {
      const r = await postJson(`http://127.0.0.1:${port}/v1/completions`, { model: 'builtin:tiny', prompt, max_tokens: 4, temperature: 0 }, 120_000);
      assert.equal(r.status, 200, JSON.stringify(r.json));
      return r.json.choices[0].text as string;
    };
    const loaded = async (port: number) => Number((await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()).match(/^kvc_engine_tokens_loaded_total(?:\{[^}]*\})? (\d+)/m)?.[1] ?? 'NaN');
    const prompt = 'Redis keeps int8 chunks of float16 KV. ' + Array.from({ length: 30 }, (_, i) => `w${i}`).join(' ');
    const a = engine(ports);
    let b: ReturnType<typeof engine> | null = null;
    try {
      await waitHttp(`http://127.0.0.1:${ports}/health`, 120_000);
      await complete(ports, prompt);
      const keys = await waitUntil('chunks written to Redis', async () => {
        const k = await raw.keys('kvc:*');
        return k.length >= 2 ? k : undefined;
      }, 20_000, 100);
      for (const k of keys) {
        const v = (await raw.getBuffer(k))!;
        const h = verifyChunk(new Uint8Array(v.buffer, v.byteOffset, v.byteLength));
        assert.deepEqual([h.dtype, h.codec], [DType.f16, Codec.int8], `${k}: f16 KV held as int8`);
      }
      await a.kill();
      b = engine(ports + 1);
      await waitHttp(`http://127.0.0.1:${ports + 1}/health`, 120_000);
      const before = await loaded(ports + 1);
      await complete(ports + 1, prompt);
      assert.ok((await loaded(ports + 1)) - before >= 16, 'B served the prompt from the int8 chunks in Redis');
      assert.equal(readHeader(new Uint8Array((await raw.getBuffer(keys[0]!))!)).headDim, 32);
    } finally {
      await a.kill();
      await b?.kill();
      await raw.flushdb();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('writes every stored chunk in the background under kvc:<model_id>:<key>, byte for byte', async () => {
    const a = await open();
    const results = [];
    for (let i = 0; i < 5; i++) results.push(await a.put(keyOf(i), chunk(i)));
    assert.deepEqual(results.map((r) => r.remote), ['queued', 'queued', 'queued', 'queued', 'queued']);
    assert.ok(await a.remote!.flush(5_000));
    for (let i = 0; i < 5; i++) {
      const v = await raw.getBuffer(`kvc:${MODEL}:${keyOf(i)}`);
      assert.ok(v && Buffer.compare(v, Buffer.from(chunk(i))) === 0, `chunk ${i} on the server`);
    }
    const st = a.remoteStats()!;
    assert.equal(st.putsWritten, 5);
    assert.equal(st.putBytes, 5 * chunk(0).byteLength);
    assert.equal((await a.put(keyOf(0), chunk(0))).remote, 'known', 'a chunk the server holds is not written again');
  });

  it('a second instance reads through on a local miss, verifies and promotes into its CPU tier', async () => {
    const b = await open();
    const admits: KeyEvent[] = [];
    b.on('admit', (e) => admits.push(e));
    assert.equal(b.has(keyOf(1)), false);
    const got = await b.get(keyOf(1));
    assert.ok(got && Buffer.compare(Buffer.from(got), Buffer.from(chunk(1))) === 0);
    assert.equal(b.has(keyOf(1), 'LocalCPUBackend'), true, 'promoted');
    assert.deepEqual(admits, [{ location: 'LocalCPUBackend', keys: [keyOf(1)] }]);
    // readThrough: leading chunks only; the first one the server lacks ends the prefix.
    const fetched = await b.readThrough([keyOf(1), keyOf(2), keyOf(3), keyOf(99), keyOf(4)]);
    assert.deepEqual([...fetched.keys()], [keyOf(2), keyOf(3)], 'key 1 was local; 99 is missing so 4 is not used');
    assert.equal(b.lookupPrefix([keyOf(1), keyOf(2), keyOf(3), keyOf(4)]), 3);
    const st = b.remoteStats()!;
    assert.ok(st.hits >= 3, 'reads run a few at a time, so one past the prefix may have been fetched');
    assert.ok(st.misses >= 1);
    // A destination buffer gets a copy.
    const dest = new Uint8Array(chunk(0).byteLength + 100);
    const into = await (await open()).get(keyOf(4), dest);
    assert.ok(into && into.buffer === dest.buffer && into.byteLength === chunk(4).byteLength);
  });

  it('an instance without local tiers still writes and reads the remote tier', async () => {
    const r = await open({ cpu: 0 });
    assert.deepEqual(r.locations(), []);
    const res = await r.put(keyOf(50), chunk(50));
    assert.deepEqual([res.stored, res.remote], [[], 'queued']);
    assert.ok(await r.remote!.flush(5_000));
    const fetched = await r.readThrough([keyOf(50)]);
    assert.equal(fetched.size, 1);
  });

  it('never serves a corrupt or mis-keyed value: it is counted and deleted from the server', async () => {
    const c = await open();
    const bad = Buffer.from(chunk(7));
    bad[bad.length - 1]! ^= 0xff; // payload byte flipped: checksum fails
    await raw.set(`kvc:${MODEL}:${keyOf(7)}`, bad);
    await raw.set(`kvc:${MODEL}:${keyOf(8)}`, Buffer.from(chunk(9))); // another prefix's chunk under key 8
    await raw.set(`kvc:${MODEL}:${keyOf(10)}`, Buffer.from('not a chunk'));
    for (const k of [7, 8, 10]) assert.equal(await c.get(keyOf(k)), null, `key ${k}`);
    assert.equal(c.remoteStats()!.corrupt, 3);
    assert.equal(c.has(keyOf(7)), false);
    for (let i = 0; i < 50 && (await raw.exists(`kvc:${MODEL}:${keyOf(7)}`)); i++) await new Promise((r) => setTimeout(r, 20));
    assert.equal(await raw.exists(`kvc:${MODEL}:${keyOf(7)}`, `kvc:${MODEL}:${keyOf(8)}`, `kvc:${MODEL}:${keyOf(10)}`), 0);
  });

  it('a full write queue drops chunks (counted) and put never waits for the server', async () => {
    const q = await open({ cpu: 0.01, queue: (2 * 36 * 1024) / GiB }); // room for two chunks
    const results = [];
    for (let i = 100; i < 110; i++) results.push((await q.put(keyOf(i), chunk(i))).remote);
    const st = q.remoteStats()!;
    assert.equal(results.filter((r) => r === 'queued').length + st.putsDroppedQueueFull, 10);
    assert.ok(st.putsDroppedQueueFull > 0, 'some were dropped');
    assert.equal(results.filter((r) => r === 'dropped').length, st.putsDroppedQueueFull);
    assert.ok(await q.remote!.flush(5_000));
    for (let i = 100; i < 110; i++) assert.ok(q.has(keyOf(i)), 'the local tier kept every chunk');
  });

  it('a paused server costs one timeout: reads give up, are counted, then skipped; puts return at once', async () => {
    const p = await open({ timeoutMs: 200 });
    await p.put(keyOf(200), chunk(200));
    assert.ok(await p.remote!.flush(5_000));
    srv.pause();
    try {
      const t0 = Date.now();
      const got = await p.readThrough([keyOf(1), keyOf(2), keyOf(3)]);
      const first = Date.now() - t0;
      assert.equal(got.size, 0);
      assert.ok(first < 5_000, `bounded by the command timeout (took ${first} ms)`);
      const st = p.remoteStats()!;
      assert.ok(st.getErrors >= 1, 'the timeout is counted');
      assert.equal(await p.get(keyOf(2)), null);
      assert.ok(p.remoteStats()!.getsSkipped >= 1, 'reads are skipped while paused after an error');
      const res = await p.put(keyOf(201), chunk(201));
      assert.deepEqual(res.stored, ['LocalCPUBackend']);
      assert.equal(await p.remote!.flush(3_000), true, 'the pending write ends (timed out) by itself');
      assert.ok(p.remoteStats()!.putErrors >= 1);
    } finally {
      srv.resume();
    }
    for (let i = 0; i < 50 && (await p.get(keyOf(3))) === null; i++) await new Promise((r) => setTimeout(r, 100));
    assert.ok(p.has(keyOf(3)), 'reads work again once the server answers');
  });

  it('a killed server is skipped at once; after a restart the client reconnects and writes resume', async () => {
    const k = await open({ timeoutMs: 300 });
    await srv.kill();
    for (let i = 0; i < 100 && k.remote!.connected; i++) await new Promise((r) => setTimeout(r, 20));
    assert.equal(k.remote!.connected, false);
    const t0 = Date.now();
    assert.equal(await k.get(keyOf(3)), null);
    assert.ok(Date.now() - t0 < 1_000, 'no wait while disconnected');
    assert.equal((await k.put(keyOf(300), chunk(300))).remote, 'dropped');
    assert.ok(k.remoteStats()!.putsDroppedUnavailable >= 1);
    assert.ok(k.has(keyOf(300)), 'the local tier has it');
    await srv.restart();
    raw.disconnect();
    raw = new Redis({ host: '127.0.0.1', port: srv.port, lazyConnect: true, maxRetriesPerRequest: 1 });
    raw.on('error', () => undefined);
    await raw.connect();
    for (let i = 0; i < 150 && !k.remote!.connected; i++) await new Promise((r) => setTimeout(r, 100));
    assert.equal(k.remote!.connected, true, 'reconnected within 15 s');
    assert.ok(k.remoteStats()!.reconnects >= 1);
    assert.equal((await k.put(keyOf(301), chunk(301))).remote, 'queued');
    assert.ok(await k.remote!.flush(5_000));
    assert.equal(await raw.exists(`kvc:${MODEL}:${keyOf(301)}`), 1);
  });
  it('a server that is down at start-up is a warning, not an error: the instance serves locally and connects once it is up', async () => {
    await srv.kill();
    const late = await open({ timeoutMs: 300 });
    assert.equal(late.remote!.connected, false);
    const res = await late.put(keyOf(400), chunk(400));
    assert.deepEqual([res.stored, res.remote], [['LocalCPUBackend'], 'dropped']);
    assert.equal(await late.get(keyOf(1)), null, 'a local miss with the server down is just a miss');
    await srv.restart();
    for (let i = 0; i < 150 && !late.remote!.connected; i++) await new Promise((r) => setTimeout(r, 100));
    assert.equal(late.remote!.connected, true, 'connected within 15 s of the server coming up');
    assert.equal((await late.put(keyOf(401), chunk(401))).remote, 'queued');
    assert.ok(await late.remote!.flush(5_000));
    assert.equal(late.remoteStats()!.putsWritten, 1);
  });
  it('uses the password and database of the URL; a wrong password leaves the instance serving locally', async () => {
    const secured = await startRedisServer({ extraArgs: ['--requirepass', 's3cr@t'] });
    try {
      const withAuth = (url: string) =>
        KvcStore.create({ local_cpu: true, max_local_cpu_size: 0.01, max_local_disk_size: 0, local_disk: null, remote_url: url, remote_timeout_ms: 300 }, { modelId: MODEL });
      const ok = await withAuth(`redis://:s3cr%40t@127.0.0.1:${secured.port}/2`);
      stores.push(ok);
      assert.equal(ok.remote!.connected, true);
      assert.equal((await ok.put(keyOf(500), chunk(500))).remote, 'queued');
      assert.ok(await ok.remote!.flush(5_000));
      const check = new Redis({ host: '127.0.0.1', port: secured.port, password: 's3cr@t', db: 2, lazyConnect: true, maxRetriesPerRequest: 1 });
      await check.connect();
      assert.equal(await check.exists(`kvc:${MODEL}:${keyOf(500)}`), 1, 'written into database 2');
      check.disconnect();
      const bad = await withAuth(`redis://:wrong@127.0.0.1:${secured.port}/0`);
      stores.push(bad);
      assert.equal(bad.remote!.connected, false);
      assert.ok(bad.remoteStats()!.connectionErrors >= 1);
      assert.deepEqual((await bad.put(keyOf(501), chunk(501))).stored, ['LocalCPUBackend']);
      assert.ok(!bad.remoteStats()!.url.includes('wrong'), 'the password is not shown');
    } finally {
      await secured.stop();
    }
  });
});

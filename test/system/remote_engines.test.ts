// Two engine processes sharing one remote tier (a real redis-server started here): a prompt
// computed by one is a cache hit for the other, with identical greedy output; the remote
// counters show on /metrics; with the server paused or killed both keep answering correctly
// from their local tiers within the command timeout. Skipped, naming the Debian package,
// where redis-server is not installed.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { freePortRange } from '../../harness/ports.js';
import { postJson, startKvc, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';
import { REDIS_SKIP, findRedisServer, startRedisServer, type RedisServer } from '../../harness/redis_server.js';

const MODEL = 'builtin:tiny';
const CONNECTOR = JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both' });
const ids = (n: number, salt = 0) => Array.from({ length: n }, (_, i) => 1000 + ((i * 37 + salt * 101) % 20000));

async function metric(url: string, name: string, labels = ''): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const esc = labels.replace(/[{}"]/g, (c) => `\\${c}`);
  const m = new RegExp(`^${name}\\{[^}]*${esc}[^}]*\\} ([0-9.e+-]+)$|^${name} ([0-9.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1] ?? m[2]) : NaN;
}

async function complete(url: string, prompt: number[]) {
  const t0 = Date.now();
  const r = await postJson(`${url}/v1/completions`, { model: MODEL, prompt, max_tokens: 8, temperature: 0, ignore_eos: true });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return { text: r.json.choices[0].text as string, cached: r.json.usage.prompt_tokens_details.cached_tokens as number, ms: Date.now() - t0 };
}

describe('two engines sharing a remote tier', { skip: findRedisServer() ? false : REDIS_SKIP }, () => {
  let dir: string;
  let srv: RedisServer;
  let raw: Redis;
  let a: Proc;
  let b: Proc;
  let urlA: string;
  let urlB: string;

  const connectRaw = async () => {
    raw?.disconnect();
    raw = new Redis({ host: '127.0.0.1', port: srv.port, lazyConnect: true, maxRetriesPerRequest: 1 });
    raw.on('error', () => undefined);
    await raw.connect();
  };
  const remoteKeys = async () => (await raw.keys('kvc:*')).sort();
  const waitFor = async (cond: () => Promise<boolean>, what: string, ms = 15_000) => {
    const deadline = Date.now() + ms;
    while (!(await cond())) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };

  before(async () => {
    dir = tempDir('kvc-remote-engines-');
    srv = await startRedisServer();
    await connectRaw();
    const yaml = join(dir, 'cache.yaml');
    writeFileSync(yaml, `chunk_size: 16\nlocal_cpu: true\nmax_local_cpu_size: 0.05\nremote_url: ${srv.url}\nremote_timeout_ms: 300\n`);
    const base = await freePortRange(2);
    const args = (port: number) => ['engine', '--port', String(port), '--model', MODEL, '--max-model-len', '256', '--kv-transfer-config', CONNECTOR];
    a = startKvc(args(base), { KVC_CONFIG_FILE: yaml });
    b = startKvc(args(base + 1), { KVC_CONFIG_FILE: yaml });
    urlA = (await a.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
    urlB = (await b.waitFor(/engine listening on (http:\/\/\S+)/, 120_000))[1]!;
  });

  after(async () => {
    await Promise.all([a?.kill(), b?.kill()]);
    raw?.disconnect();
    await srv?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('a prompt computed by one engine is a hit for the other, with identical greedy output', async () => {
    assert.match(a.output(), /remote tier redis:\/\/127\.0\.0\.1:\d+\/0: connected/);
    const prompt = ids(40); // chunks 16 + 16 + partial 8
    const first = await complete(urlA, prompt);
    assert.equal(first.cached, 0);
    await waitFor(async () => (await remoteKeys()).length === 3, 'three chunks on the server');
    for (const k of await remoteKeys()) assert.match(k, /^kvc:[^:]+:[0-9a-f]{16}$/, 'kvc:<model_id>:<16-hex chunk key>');
    assert.equal(await metric(urlA, 'kvc_remote_puts_total', 'outcome="written"'), 3);
    const second = await complete(urlB, prompt);
    assert.equal(second.cached, 39, 'everything but the last token came from the remote tier');
    assert.equal(second.text, first.text);
    assert.equal(await metric(urlB, 'kvc_remote_gets_total', 'outcome="hit"'), 3);
    assert.equal(await metric(urlB, 'kvc_remote_connected'), 1);
    // B promoted the chunks into its CPU tier: the next time they are local (no new remote reads).
    const third = await complete(urlB, prompt);
    assert.equal(third.cached, 39);
    assert.equal(third.text, first.text);
    assert.equal(await metric(urlB, 'kvc_remote_gets_total', 'outcome="hit"'), 3);
    // B does not write back what it read from the server.
    assert.equal(await metric(urlB, 'kvc_remote_puts_total', 'outcome="written"'), 0);
  });

  it('a shared prefix computed elsewhere is loaded and only the rest computed', async () => {
    const p = ids(32, 5);
    const onA = await complete(urlA, p);
    await waitFor(async () => (await remoteKeys()).length === 5, 'two more chunks');
    const longer = [...p, ...ids(9, 6)];
    const got = await complete(urlB, longer); // B reads 32 tokens through the remote tier, computes 9
    // A loads at least the same 32 (and B's tail chunk too if its background write has landed).
    const truth = await complete(urlA, longer);
    assert.equal(got.cached, 32);
    assert.ok(truth.cached >= 32);
    assert.equal(got.text, truth.text);
    assert.ok(onA.text.length > 0);
  });

  it('with the server paused, both engines answer correctly within the timeout, and count the errors', async () => {
    const q = ids(48, 9);
    srv.pause();
    try {
      const onA = await complete(urlA, q);
      const onB = await complete(urlB, q);
      assert.equal(onB.text, onA.text);
      assert.equal(onB.cached, 0);
      assert.ok(onB.ms < 30_000, `bounded (${onB.ms} ms)`);
      assert.ok((await metric(urlB, 'kvc_remote_gets_total', 'outcome="error"')) >= 1);
    } finally {
      srv.resume();
    }
  });

  it('with the server killed, requests are served locally; after a restart sharing works again', async () => {
    await srv.kill();
    const q = ids(33, 11);
    const onA = await complete(urlA, q);
    const onB = await complete(urlB, q);
    assert.equal(onB.text, onA.text);
    await srv.restart();
    await connectRaw();
    await waitFor(async () => (await metric(urlA, 'kvc_remote_connected')) === 1 && (await metric(urlB, 'kvc_remote_connected')) === 1, 'both clients reconnected');
    assert.ok((await metric(urlA, 'kvc_remote_reconnects_total')) >= 1);
    const r = ids(40, 13);
    const first = await complete(urlA, r);
    await waitFor(async () => (await remoteKeys()).length === 3, 'the new prompt on the fresh server');
    const second = await complete(urlB, r);
    assert.equal(second.cached, 39);
    assert.equal(second.text, first.text);
  });
});

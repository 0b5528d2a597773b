// run-tests: exclusive — its links are delayed, lossy and partitioned for set times, and the controller's 3 s heartbeat timeout must fire during the partition and not outside it.
// Bad networks between hosts. A 1P1D deployment started as over real machines (`kvc up
// --config-only --hosts`, each printed command run in its host's network namespace), the shared
// Redis tier on its own host, and two single engines sharing prefixes through it:
//   ctl   controller + proxy, a plain engine (the fault-free reference), the client
//   pre   prefiller-0, redis writer engine       dec   decoder-0, redis reader engine
//   redis redis-server
// The links of pre, dec and redis get, in turn: 50 ms added delay each way, 3 % loss each way, a
// 4 Mbit/s cap, and a silent partition (every packet dropped, links up) healed after 5 s, longer
// than the controller's heartbeat timeout (3 s here), so the controller reaps both instances and
// must take them back. Under each: prefill→decode transfers (xfer) through the proxy, a P2P fetch
// (the decoder pulls what the prefiller computed), the controller's monitor traffic (admits, the
// P2P holder query, heartbeats) and worker traffic (a move from the prefiller to the decoder), and
// a prefix shared through the Redis tier. Checks, on outcomes
// only: every request answered 200 within its bound with the greedy tokens of the plain engine;
// every transfer terminal (counted once in kvc_xfer_transfers_total by outcome, none in flight)
// and no reservation left; the controller's index equal to what each instance holds once the
// partition has healed. How delay, loss and partition are made: harness/netns.ts.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CLI } from '../../harness/proc.js';
import { createHosts, impairUnavailable, type Hosts, type Impairment } from '../../harness/netns.js';
import { startNsDeployment, type NsDeployment } from '../../harness/netns_deployment.js';
import { REDIS_SKIP, findRedisServer } from '../../harness/redis_server.js';
import { REDIS_SERVER_SETTINGS } from '../../src/common/remote_url.js';

const MODEL = 'builtin:tiny';
const CHUNK = 32;
/** Every request's bound: answered (200) before it, or the test fails. */
const REQUEST_BOUND_MS = 60_000;
const skip = impairUnavailable() ?? (findRedisServer() ? null : REDIS_SKIP);
const ids = (n: number, salt: number) => Array.from({ length: n }, (_, i) => 1000 + ((i * 37 + salt * 101) % 20000));

/** Sum of a metric's series whose labels contain `label`. */
function metricSum(text: string, name: string, label = ''): number {
  let sum = 0;
  for (const l of text.split('\n')) if (l.startsWith(`${name}{`) || l.startsWith(`${name} `)) if (l.includes(label)) sum += Number(l.slice(l.lastIndexOf(' ') + 1));
  return sum;
}

describe('bad networks between hosts (delay, loss, bandwidth cap, partition)', { skip: skip ?? false }, () => {
  let hosts: Hosts;
  let dep: NsDeployment;
  const extra: { name: string; child: ChildProcess; out: () => string }[] = [];
  const notes: string[] = [];
  let plain = '', writer = '', reader = '';
  let salt = 0;

  const req = (method: string, url: string, body?: unknown, timeoutMs = 10_000) => dep.client.request(method, url, body, timeoutMs);
  const metrics = async (url: string) => (await req('GET', `${url}/metrics`)).text;
  const logs = () => [...[...dep.procs.values()].map((p) => ({ name: p.name, out: p.out })), ...extra].map((p) => `--- ${p.name}\n${p.out().slice(-2000)}`).join('\n');
  const eventually = async (what: string, cond: () => Promise<boolean>, ms: number) => {
    const end = Date.now() + ms;
    while (!(await cond().catch(() => false))) {
      if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}\n${logs()}`);
      await new Promise((r) => setTimeout(r, 250));
    }
  };
  const completion = (prompt: number[], stream = false) => ({ model: MODEL, prompt, max_tokens: 8, temperature: 0, ignore_eos: true, stream });
  const textOf = (r: { text: string; json?: any }, stream: boolean) =>
    stream
      ? r.text.split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)).choices?.[0]?.text ?? '').join('')
      : r.json.choices[0].text;
  /** Sends `prompt` to `url`, asserts 200 within the bound and the plain engine's greedy text. */
  const expectTruth = async (url: string, prompt: number[], truth: string, what: string, stream = false) => {
    const r = await req('POST', `${url}/v1/completions`, completion(prompt, stream), REQUEST_BOUND_MS);
    assert.equal(r.status, 200, `${what}: ${r.text}\n${logs()}`);
    assert.ok(!/"error"\s*:/.test(r.text) || !stream, `${what}: the stream carries an error: ${r.text}`);
    assert.equal(textOf(r, stream), truth, `${what}: a wrong token`);
    return r.ms;
  };
  const truthOf = async (prompt: number[]) => {
    const r = await req('POST', `${plain}/v1/completions`, completion(prompt), REQUEST_BOUND_MS);
    assert.equal(r.status, 200, r.text);
    return r.json.choices[0].text as string;
  };

  /** The transfer contract on the decoder: nothing in flight, nothing reserved; returns outcomes. */
  const contract = async () => {
    const dec = dep.engines['decoder-0']!;
    await eventually('the decoder holds no transfer and no reservation', async () => {
      const t = await metrics(dec);
      return metricSum(t, 'kvc_xfer_transfers_in_flight') === 0 && metricSum(t, 'kvc_xfer_reservations') === 0 && metricSum(t, 'kvc_xfer_reserved_bytes') === 0;
    }, 20_000);
    const t = await metrics(dec);
    return Object.fromEntries(['done', 'failed', 'abandoned'].map((o) => [o, metricSum(t, 'kvc_xfer_transfers_total', `outcome="${o}"`)]));
  };

  /** The controller's index equals, per instance, the chunks its CPU tier holds. */
  const converged = async (ms: number) => {
    let last = '';
    await eventually('the controller index to equal what each instance holds', async () => {
      const inst = (await req('GET', `${dep.controller}/instances`)).json?.instances ?? [];
      const mismatch: string[] = [];
      for (const name of ['prefiller-0', 'decoder-0']) {
        const w = inst.find((i: any) => i.instance_id === name)?.workers?.[0];
        const indexed = w?.locations?.LocalCPUBackend?.chunks ?? -1;
        const held = metricSum(await metrics(dep.engines[name]!), 'kvc_cache_chunks', 'location="LocalCPUBackend"');
        if (indexed !== held) mismatch.push(`${name}: index ${indexed}, instance ${held}`);
      }
      last = mismatch.join('; ');
      return mismatch.length === 0;
    }, ms).catch((e) => {
      throw new Error(`${last}\n${(e as Error).message}`);
    });
  };

  /**
   * One round of every kind of traffic; returns when each request has its answer. On a clean
   * network every path must also be taken (2 transfers, Redis hits); on an impaired one a path may
   * give up within its bound (a Redis read past remote_timeout_ms, a prefiller marked down and the
   * prompt computed on the decoder), which the client must not see.
   */
  const round = async (label: string, clean: boolean) => {
    const t0 = Date.now();
    // xfer: two requests through the proxy at once (one streamed), each a fresh 5-chunk prompt.
    const a = ids(5 * CHUNK + 7, ++salt), b = ids(5 * CHUNK + 3, ++salt);
    // P2P: computed on the prefiller, then asked of the decoder, which pulls it from the prefiller.
    const p = ids(4 * CHUNK + 1, ++salt);
    // Redis: computed by the writer (pre), then read by the reader (dec) from the shared tier.
    const r = ids(4 * CHUNK + 1, ++salt);
    // The controller's worker traffic: a prompt computed on the prefiller, moved to the decoder.
    const mv = ids(4 * CHUNK + 1, ++salt);
    const [ta, tb, tp, tr, tm] = await Promise.all([a, b, p, r, mv].map(truthOf));
    const before = { dec: await metrics(dep.engines['decoder-0']!), reader: await metrics(reader), contract: await contract() };
    const viaProxy = Promise.all([expectTruth(dep.proxy, a, ta!, `${label}: 1P1D request`), expectTruth(dep.proxy, b, tb!, `${label}: 1P1D streamed request`, true)]);
    await expectTruth(dep.engines['prefiller-0']!, p, tp!, `${label}: prefiller computing the P2P prompt`);
    await eventually(`${label}: the prefiller's chunks in the controller's index`, async () =>
      (await req('POST', `${dep.controller}/lookup`, { tokens: p })).json?.layout_detail?.['prefiller-0']?.matched_tokens >= 4 * CHUNK, 30_000);
    await expectTruth(dep.engines['decoder-0']!, p, tp!, `${label}: decoder fetching the prefix by P2P`);
    const writerBefore = await metrics(writer);
    await expectTruth(writer, r, tr!, `${label}: writer engine`);
    // Its 5 chunks handed to the remote tier, each with an outcome (written, or dropped when Redis
    // cannot be reached: then the reader computes the prompt itself).
    await eventually(`${label}: the writer's chunks handed to Redis`, async () =>
      metricSum(await metrics(writer), 'kvc_remote_puts_total') - metricSum(writerBefore, 'kvc_remote_puts_total') >= 5 &&
      metricSum(await metrics(writer), 'kvc_remote_write_queue_bytes') === 0, 30_000);
    await expectTruth(reader, r, tr!, `${label}: reader engine through the Redis tier`);
    await expectTruth(dep.engines['prefiller-0']!, mv, tm!, `${label}: prefiller computing the prompt to move`);
    await eventually(`${label}: the prompt to move in the controller's index`, async () =>
      (await req('POST', `${dep.controller}/lookup`, { tokens: mv })).json?.layout_detail?.['prefiller-0']?.matched_tokens >= 4 * CHUNK, 30_000);
    const moved = await dep.client.request('POST', `${dep.controller}/move`, { old_position: ['prefiller-0', 'LocalCPUBackend'], new_position: ['decoder-0', 'LocalCPUBackend'], tokens: mv, copy: true }, 10_000, { authorization: `Bearer ${dep.secret}` });
    assert.equal(moved.status, 200, `${label}: move: ${moved.text}`);
    let ev: any;
    await eventually(`${label}: the move to end (finished or failed)`, async () => {
      ev = (await req('GET', `${dep.controller}/events/${moved.json.event_id}`)).json;
      return ev?.status === 'finished' || ev?.status === 'failed';
    }, 60_000);
    if (clean) assert.equal(ev.status, 'finished', `${label}: ${JSON.stringify(ev)}`);
    await expectTruth(dep.engines['decoder-0']!, mv, tm!, `${label}: decoder after the move`);
    await viaProxy;
    const after = { dec: await metrics(dep.engines['decoder-0']!), reader: await metrics(reader), contract: await contract() };
    const transfers = Object.values(after.contract).reduce((s, v) => s + v, 0) - Object.values(before.contract).reduce((s, v) => s + v, 0);
    const what = `${label}: each of the two disaggregated requests' transfers ended exactly once (${JSON.stringify(after.contract)})`;
    if (clean) assert.equal(transfers, 2, what);
    else assert.ok(transfers <= 2, what);
    const d = (name: string, text: string, was: string, label2 = '') => metricSum(text, name, label2) - metricSum(was, name, label2);
    const p2p = Object.fromEntries(['hit', 'partial', 'failed', 'no_holder'].map((o) => [o, d('kvc_p2p_fetches_total', after.dec, before.dec, `outcome="${o}"`)]));
    assert.ok(Object.values(p2p).reduce((s, v) => s + v, 0) >= 1, `${label}: the decoder tried a P2P fetch (${JSON.stringify(p2p)})`);
    const remote = { hit: d('kvc_remote_gets_total', after.reader, before.reader, 'outcome="hit"'), gets: d('kvc_remote_gets_total', after.reader, before.reader) };
    assert.ok(remote.gets >= 1, `${label}: the reader asked the Redis tier`);
    if (clean) assert.ok(remote.hit >= 4, `${label}: the reader loaded the writer's chunks from Redis (${remote.hit} hits)`);
    const outcomes = Object.fromEntries(Object.keys(after.contract).map((k) => [k, after.contract[k]! - before.contract[k]!]));
    notes.push(`${label}: ${Date.now() - t0} ms; transfers ${JSON.stringify(outcomes)}, P2P ${JSON.stringify(p2p)}, Redis reader hits ${remote.hit}, move ${ev.status}`);
  };

  const impairAll = async (spec: Impairment | null) => {
    for (const h of ['pre', 'dec', 'redis']) await hosts.impair(h, spec);
  };

  before(async () => {
    const t0 = Date.now();
    hosts = await createHosts(['ctl', 'pre', 'dec', 'redis'], 79, { impairable: ['pre', 'dec', 'redis'] });
    const A = hosts.addr;
    const spawn = (name: string, host: string, cmd: string, args: string[], env: NodeJS.ProcessEnv = {}) => {
      const child = hosts.spawnIn(host, cmd, args, { PYTHONHASHSEED: '0', ...env });
      let out = '';
      child.stdout!.on('data', (x: Buffer) => (out += x));
      child.stderr!.on('data', (x: Buffer) => (out += x));
      extra.push({ name, child, out: () => out });
    };
    spawn('redis', 'redis', findRedisServer()!, ['--bind', A.redis!, '--port', '6379', '--protected-mode', 'no', '--maxmemory', '128mb', ...REDIS_SERVER_SETTINGS]);
    dep = await startNsDeployment(hosts, {
      ctl: 'ctl',
      prefillers: ['pre'],
      decoders: ['dec'],
      upArgs: ['--chunk-size', String(CHUNK), '--max-local-cpu-size', '0.05'],
      // Shorter than the partition below, so the controller reaps the partitioned instances.
      extra: { controller: ['--heartbeat-timeout', '3'] },
    });
    const remote = `redis://${A.redis}:6379/0`;
    const cfg = join(dep.dir, 'redis-engines.yaml');
    writeFileSync(cfg, `chunk_size: ${CHUNK}\nlocal_cpu: true\nmax_local_cpu_size: 0.05\nremote_url: "${remote}"\n`);
    const engine = (host: string, port: number, connector: boolean) => [
      CLI, 'engine', '--host', A[host]!, '--port', String(port), '--model', MODEL,
      ...(connector ? ['--kv-transfer-config', JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both' })] : []),
    ];
    spawn('plain', 'ctl', process.execPath, engine('ctl', 7900, false));
    spawn('writer', 'pre', process.execPath, engine('pre', 7901, true), { KVC_CONFIG_FILE: cfg });
    spawn('reader', 'dec', process.execPath, engine('dec', 7902, true), { KVC_CONFIG_FILE: cfg });
    plain = `http://${A.ctl}:7900`;
    writer = `http://${A.pre}:7901`;
    reader = `http://${A.dec}:7902`;
    await dep.waitHealthy(180_000);
    for (const u of [plain, writer, reader]) await eventually(`${u} healthy`, async () => (await req('GET', `${u}/health`, undefined, 3_000)).status === 200, 180_000);
    await eventually('both instances registered', async () => ((await req('GET', `${dep.controller}/instances`)).json?.instances ?? []).length === 2, 60_000);
    notes.push(`started in ${Date.now() - t0} ms`);
  });

  after(async () => {
    await dep?.stop();
    for (const p of extra.reverse()) {
      if (p.child.exitCode === null && p.child.signalCode === null) {
        p.child.kill('SIGKILL');
        await new Promise((r) => p.child.once('exit', r));
      }
    }
    hosts?.teardown();
    if (notes.length) process.stdout.write(`# bad networks: ${notes.join('; ')}\n`);
  });

  it('a clean network: the reference round', async () => {
    await round('clean', true);
    await converged(30_000);
  });

  for (const [label, spec] of [
    ['50 ms delay each way', { delayMs: 50 }],
    ['3 % loss each way', { lossPct: 3 }],
    ['4 Mbit/s cap', { rateMbit: 4 }],
  ] as [string, Impairment][]) {
    it(`${label}: nothing lost, no wrong token, every transfer ended, the index follows`, async () => {
      await impairAll(spec);
      try {
        await round(label, false);
        await converged(30_000);
      } finally {
        await impairAll(null);
      }
    });
  }

  it('a partition healed after 5 s (past the heartbeat timeout): requests in flight answered, the index converges', async () => {
    const a = ids(5 * CHUNK + 5, ++salt), b = ids(5 * CHUNK + 9, ++salt);
    const [ta, tb] = await Promise.all([a, b].map(truthOf));
    const before = await contract();
    const inFlight = Promise.all([expectTruth(dep.proxy, a, ta!, 'partition: 1P1D request'), expectTruth(dep.proxy, b, tb!, 'partition: 1P1D streamed request', true)]);
    await new Promise((r) => setTimeout(r, 150));
    await impairAll({ partition: true });
    await new Promise((r) => setTimeout(r, 5_000));
    const dropped = await Promise.all(['pre', 'dec', 'redis'].map((h) => hosts.impair(h, null)));
    const ms = await inFlight;
    const afterC = await contract();
    const ended = Object.keys(afterC).reduce((s, k) => s + afterC[k]! - before[k]!, 0);
    assert.ok(ended <= 2, `at most one transfer per request (${JSON.stringify(afterC)})`);
    notes.push(`partition: requests answered after ${ms.map(Math.round).join(', ')} ms, transfers ended ${ended} (${JSON.stringify(afterC)}), packets dropped ${dropped.map((x) => x.dropped).join('/')}`);
    await converged(60_000);
    // And everything works again after the heal.
    await round('after the partition', true);
    await converged(30_000);
    for (const p of [...dep.procs.values(), ...extra]) assert.equal(p.child.exitCode, null, `${p.name} is still running`);
  });
});

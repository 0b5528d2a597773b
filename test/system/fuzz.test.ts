// Seeded fuzzing of every surface of a live 1P1D deployment (`kvc up`, built-in model) with
// fast-check: the proxy, both engines, the controller and both cache workers over HTTP, and the
// binary ports (xfer init/alloc, the instances' peer ports, the controller's ZeroMQ monitor port,
// the proxy's ZeroMQ notify port). Properties, for every case:
//   - no 5xx answer for anything a client sends (a malformed request is the client's fault),
//   - every error answer is JSON in the OpenAI shape {"error": {"message", "type", "code"}},
//   - no call hangs (each is bounded), no process dies,
// and afterwards: every backend still up in the proxy's health, the controller still knows both
// instances, and the greedy answer to a fixed prompt is unchanged.
// Each surface's slowest case is printed beside its bounds, so a hang can be told from a loaded
// machine's slow answer.
// KVC_FUZZ_SEED picks another seed (printed, so a failure can be replayed); KVC_FUZZ_SCALE
// multiplies the case counts.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import fc from 'fast-check';
import { Pool } from 'undici';
import { Dealer, Push } from 'zeromq';
import { encode } from '@msgpack/msgpack';
import { alive, startDeployment, type Deployment } from '../../harness/deployment.js';

const SEED = Number(process.env.KVC_FUZZ_SEED ?? 20261123);
const SCALE = Number(process.env.KVC_FUZZ_SCALE ?? 1);
const CONCURRENCY = 8;
// Bounds that turn a hang into a failure; generous, so a loaded machine (other tests, other
// sessions) is not taken for a hang.
const CALL_TIMEOUT_MS = 60_000;
const TCP_CLOSE_MS = 30_000;

interface HttpCase {
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: string | Uint8Array;
}

/** Per-surface tally: cases run and answers by status (or outcome for binary ports). */
class Tally {
  readonly counts = new Map<string, Map<string, number>>();
  readonly failures: string[] = [];
  /** The slowest case per surface (ms): how close the bounds above came to being hit. */
  readonly slowest = new Map<string, number>();
  time(surface: string, ms: number): void {
    if (ms > (this.slowest.get(surface) ?? 0)) this.slowest.set(surface, ms);
  }
  add(surface: string, outcome: string): void {
    let m = this.counts.get(surface);
    if (!m) this.counts.set(surface, (m = new Map()));
    m.set(outcome, (m.get(outcome) ?? 0) + 1);
  }
  fail(surface: string, what: string): void {
    if (this.failures.length < 20) this.failures.push(`${surface}: ${what}`);
  }
  total(): number {
    let n = 0;
    for (const m of this.counts.values()) for (const v of m.values()) n += v;
    return n;
  }
  lines(): string[] {
    return [...this.counts].map(([s, m]) => {
      const n = [...m.values()].reduce((a, b) => a + b, 0);
      const slow = this.slowest.get(s);
      return `${s}: ${n} cases; ${[...m].sort().map(([k, v]) => `${k}×${v}`).join(' ')}${slow === undefined ? '' : `; slowest ${slow} ms`}`;
    });
  }
}

// ---- generators ------------------------------------------------------------------------

const junkValue = fc.oneof(
  { weight: 3, arbitrary: fc.jsonValue({ maxDepth: 3 }) },
  { weight: 1, arbitrary: fc.constantFrom(null, true, false, 0, -1, 1.5, 1e308, -0, '', '\u0000', '𝔘', 'x'.repeat(3000)) },
);
const tokenArray = fc.array(fc.oneof(fc.integer({ min: 0, max: 40 }), fc.integer({ min: -5, max: 2 ** 33 }), fc.constantFrom(1, 2, 0)), { maxLength: 12 });
const shortText = fc.oneof(fc.string({ maxLength: 40 }), fc.string({ unit: 'grapheme', maxLength: 20 }), fc.constantFrom('<s>', '</s>', '<unk>', '{{ x }}', '{% for %}', '\ud800'));
const maxTokens = fc.oneof({ weight: 4, arbitrary: fc.integer({ min: 1, max: 3 }) }, { weight: 2, arbitrary: fc.constantFrom(0, -1, 1.5, '2', null, 1e9, 2 ** 31) });
const message = fc.record(
  {
    role: fc.oneof({ weight: 4, arbitrary: fc.constantFrom('system', 'user', 'assistant', 'developer', 'tool') }, { weight: 1, arbitrary: junkValue }),
    content: fc.oneof(shortText, fc.constant(null), fc.array(fc.record({ type: fc.constantFrom('text', 'image_url', 'x'), text: shortText }), { maxLength: 2 }), junkValue),
  },
  { requiredKeys: [] },
);
const sampling = {
  model: fc.oneof({ weight: 4, arbitrary: fc.constant('builtin:tiny') }, { weight: 1, arbitrary: junkValue }),
  max_tokens: maxTokens,
  temperature: fc.oneof(fc.constantFrom(0, 0.5, 2, 3, -1), junkValue),
  top_p: fc.oneof(fc.constantFrom(0, 0.5, 1, 2), junkValue),
  top_k: fc.oneof(fc.constantFrom(-1, 0, 1, 5, 1.5), junkValue),
  seed: fc.oneof(fc.integer(), junkValue),
  stop: fc.oneof(shortText, fc.array(shortText, { maxLength: 20 }), junkValue),
  stop_token_ids: fc.oneof(tokenArray, junkValue),
  stream: fc.oneof(fc.boolean(), junkValue),
  stream_options: fc.oneof(fc.record({ include_usage: fc.boolean() }), junkValue),
  n: fc.oneof(fc.constantFrom(1, 2), junkValue),
  logprobs: fc.oneof(fc.constantFrom(null, false, true, 1), junkValue),
  kv_transfer_params: fc.oneof(fc.record({ disagg_spec: fc.record({ req_id: shortText, receiver_host: fc.constantFrom('127.0.0.1', 'nowhere.invalid'), receiver_init_port: fc.integer({ min: 0, max: 70000 }) }) }), junkValue),
  ignore_eos: fc.boolean(),
};
const completionBody = fc.record(
  { ...sampling, prompt: fc.oneof(shortText, tokenArray, fc.tuple(shortText), fc.tuple(tokenArray), fc.constantFrom([1], [1, 2], [2], []), junkValue) },
  { requiredKeys: ['max_tokens'] },
);
const chatBody = fc.record(
  { ...sampling, messages: fc.oneof({ weight: 4, arbitrary: fc.array(message, { maxLength: 3 }) }, { weight: 1, arbitrary: fc.constant([{ role: 'system', content: 'only a system message' }]) }, { weight: 1, arbitrary: junkValue }), max_completion_tokens: maxTokens },
  { requiredKeys: ['max_tokens'] },
);
const hexKey = fc.stringMatching(/^[0-9a-f]{16}$/);
const controllerBodies: Record<string, fc.Arbitrary<unknown>> = {
  '/move': fc.record({ old_position: fc.oneof(fc.tuple(fc.constantFrom('decoder-0', 'prefiller-0', 'ghost'), fc.constantFrom('LocalCPUBackend', 'LocalDiskBackend', 'x')), junkValue), new_position: fc.oneof(fc.tuple(fc.constantFrom('decoder-0', 'ghost'), fc.constantFrom('LocalCPUBackend', 'y')), junkValue), tokens: fc.oneof(tokenArray, junkValue), copy: fc.oneof(fc.boolean(), junkValue) }, { requiredKeys: [] }),
  '/pin': fc.record({ tokens: fc.oneof(tokenArray, junkValue), instance_id: fc.oneof(fc.constantFrom('decoder-0', 'ghost'), junkValue), location: fc.oneof(fc.constantFrom('LocalCPUBackend', 'nowhere'), junkValue) }, { requiredKeys: [] }),
  '/unpin': fc.record({ tokens: fc.oneof(tokenArray, junkValue), instance_id: fc.oneof(fc.constantFrom('decoder-0', 'ghost'), junkValue), location: fc.oneof(fc.constantFrom('LocalCPUBackend'), junkValue) }, { requiredKeys: [] }),
  '/lookup': fc.record({ tokens: fc.oneof(tokenArray, fc.array(fc.integer({ min: 0, max: 100 }), { maxLength: 600 }), junkValue) }, { requiredKeys: [] }),
  '/clear': fc.record({ instance_id: fc.oneof(fc.constantFrom('ghost', 'nobody'), junkValue), location: fc.oneof(fc.constantFrom('LocalCPUBackend'), junkValue) }, { requiredKeys: [] }),
  '/health': fc.record({ instance_id: fc.oneof(fc.constantFrom('decoder-0', 'ghost'), junkValue) }, { requiredKeys: [] }),
  '/query_instance': fc.record({ ip: fc.oneof(fc.constantFrom('127.0.0.1', '::1', 'x'), junkValue) }, { requiredKeys: [] }),
  '/check_finish': fc.record({ event_id: fc.oneof(shortText, junkValue) }, { requiredKeys: [] }),
};
const workerBodies: Record<string, fc.Arbitrary<unknown>> = {
  '/lookup': fc.record({ keys: fc.oneof(fc.array(hexKey, { maxLength: 4 }), junkValue), location: fc.oneof(fc.constantFrom('LocalCPUBackend', 'LocalDiskBackend', 'x'), junkValue) }, { requiredKeys: [] }),
  '/pin': fc.record({ keys: fc.oneof(fc.array(hexKey, { maxLength: 4 }), junkValue), location: fc.oneof(fc.constantFrom('LocalCPUBackend'), junkValue) }, { requiredKeys: [] }),
  '/unpin': fc.record({ keys: fc.oneof(fc.array(hexKey, { maxLength: 4 }), junkValue), location: fc.oneof(fc.constantFrom('LocalCPUBackend'), junkValue) }, { requiredKeys: [] }),
  '/move': fc.record({ keys: fc.oneof(fc.array(hexKey, { maxLength: 2 }), junkValue), location: fc.oneof(fc.constantFrom('LocalCPUBackend'), junkValue), copy: fc.oneof(fc.boolean(), junkValue), target: fc.oneof(fc.record({ location: fc.constantFrom('LocalCPUBackend', 'x') }), junkValue), deadline_ms: fc.oneof(fc.integer({ min: -5, max: 2000 }), junkValue) }, { requiredKeys: [] }),
};
const deepJson = fc.integer({ min: 100, max: 8000 }).map((d) => `{"prompt":${'['.repeat(d)}${']'.repeat(d)},"x":${'{"a":'.repeat(10)}1${'}'.repeat(10)}}`);
const contentType = fc.oneof({ weight: 8, arbitrary: fc.constant('application/json') }, { weight: 1, arbitrary: fc.constantFrom('text/plain', 'application/x-www-form-urlencoded', 'application/json; charset=latin1', 'multipart/form-data; boundary=x', '') });
const randomPath = fc.oneof(fc.webPath().map((p) => (p.startsWith('/') ? p : `/${p}`)), fc.constantFrom('/%ff%fe', '/v1/%', '/v1/completions/../../etc', '/events/' + 'a'.repeat(500), '//', '/v1/models?x=%zz', '/*'));

/** An HTTP case for a surface: a known route with a fuzzed body (mostly), or a random path/method/body. */
function httpCases(routes: { method: string; path: string; body?: fc.Arbitrary<unknown> }[]): fc.Arbitrary<HttpCase> {
  const routed = fc.constantFrom(...routes).chain((r) =>
    fc
      .tuple(
        r.body ? fc.oneof({ weight: 6, arbitrary: r.body.map((b) => JSON.stringify(b)) }, { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v)) }, { weight: 1, arbitrary: fc.string({ maxLength: 200 }) }, { weight: 1, arbitrary: deepJson }) : fc.constant(undefined),
        contentType,
      )
      .map(([body, ct]): HttpCase => ({ method: r.method, path: r.path, headers: body === undefined ? {} : { 'content-type': ct }, body })),
  );
  const random = fc
    .tuple(fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'HEAD'), randomPath, fc.option(fc.uint8Array({ maxLength: 300 })), contentType)
    .map(([method, path, body, ct]): HttpCase => ({ method, path, headers: body && method !== 'GET' && method !== 'HEAD' ? { 'content-type': ct } : {}, body: body && method !== 'GET' && method !== 'HEAD' ? body : undefined }));
  return fc.oneof({ weight: 5, arbitrary: routed }, { weight: 1, arbitrary: random });
}

/** Runs `jobs` with at most `n` in flight. */
async function pooled<T>(items: T[], n: number, job: (t: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: n }, async () => {
      while (next < items.length) await job(items[next++]!);
    }),
  );
}

function isOpenAiError(v: unknown): boolean {
  const e = (v as { error?: { message?: unknown; type?: unknown; code?: unknown } } | null)?.error;
  return !!e && typeof e.message === 'string' && e.message.length > 0 && typeof e.type === 'string' && (e.code === null || typeof e.code === 'string');
}

async function fuzzHttp(tally: Tally, surface: string, base: string, arb: fc.Arbitrary<HttpCase>, runs: number, seed: number): Promise<void> {
  const t0 = Date.now();
  const cases = fc.sample(arb, { numRuns: Math.round(runs * SCALE), seed });
  if (process.env.KVC_TEST_VERBOSE) process.stderr.write(`${surface}: ${cases.length} cases generated in ${Date.now() - t0} ms\n`);
  const pool = new Pool(base, { connections: CONCURRENCY });
  try {
    await pooled(cases, CONCURRENCY, async (c) => {
      let status = 0;
      let text = '';
      const t1 = Date.now();
      try {
        const r = await pool.request({ method: c.method as 'GET', path: c.path, headers: c.headers, body: c.body, headersTimeout: CALL_TIMEOUT_MS, bodyTimeout: CALL_TIMEOUT_MS });
        status = r.statusCode;
        text = await r.body.text();
        tally.time(surface, Date.now() - t1);
      } catch (e) {
        tally.add(surface, 'no-answer');
        tally.fail(surface, `${c.method} ${c.path.slice(0, 80)} body ${String(c.body).slice(0, 120)}: ${(e as Error).message}`);
        return;
      }
      tally.add(surface, String(status));
      if (status >= 500) tally.fail(surface, `${status} for ${c.method} ${c.path.slice(0, 80)} body ${String(c.body).slice(0, 200)}: ${text.slice(0, 300)}`);
      if (status >= 400 && c.method !== 'HEAD') {
        let j: unknown = null;
        try {
          j = JSON.parse(text);
        } catch {
          /* checked below */
        }
        if (!isOpenAiError(j)) tally.fail(surface, `${status} not in the OpenAI error shape for ${c.method} ${c.path.slice(0, 80)}: ${text.slice(0, 200)}`);
      }
    });
  } finally {
    await pool.destroy();
  }
}

// ---- binary ports ----------------------------------------------------------------------

const xferFrame = fc
  .tuple(fc.constantFrom(0x5846, 0x5846, 0x5846, 0x1234), fc.constantFrom(1, 1, 1, 2, 0), fc.integer({ min: 0, max: 9 }), fc.jsonValue({ maxDepth: 3 }), fc.option(fc.uint8Array({ maxLength: 512 })), fc.option(fc.integer({ min: 0, max: 2 ** 32 - 1 })))
  .map(([magic, ver, type, meta, body, lieLen]) => {
    const m = encode(meta);
    const head = Buffer.alloc(12);
    head.writeUInt16LE(magic, 0);
    head.writeUInt8(ver, 2);
    head.writeUInt8(type, 3);
    head.writeUInt32LE(lieLen ?? m.byteLength, 4);
    head.writeUInt32LE(body?.byteLength ?? 0, 8);
    return Buffer.concat([head, m, body ?? Buffer.alloc(0)]);
  });
const rawBytes = fc.oneof({ weight: 2, arbitrary: fc.uint8Array({ minLength: 1, maxLength: 2048 }).map((u) => Buffer.from(u)) }, { weight: 3, arbitrary: xferFrame });

/** One TCP connection: write the bytes, end, and wait until the server closes (bounded). */
function tcpCase(port: number, bytes: Buffer): Promise<string> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    let got = 0;
    const timer = setTimeout(() => {
      s.destroy();
      resolve('hung');
    }, TCP_CLOSE_MS);
    s.on('data', (d) => (got += d.length));
    s.on('error', () => undefined);
    s.on('connect', () => s.end(bytes));
    s.on('close', () => {
      clearTimeout(timer);
      resolve(got ? 'closed-after-reply' : 'closed');
    });
  });
}

async function fuzzTcp(tally: Tally, surface: string, port: number, runs: number, seed: number): Promise<void> {
  const cases = fc.sample(rawBytes, { numRuns: Math.round(runs * SCALE), seed });
  await pooled(cases, CONCURRENCY, async (b) => {
    const t1 = Date.now();
    const outcome = await tcpCase(port, b);
    tally.time(surface, Date.now() - t1);
    tally.add(surface, outcome);
    if (outcome === 'hung') tally.fail(surface, `connection not closed ${TCP_CLOSE_MS / 1000} s after the client ended it (${b.length} bytes sent)`);
  });
}

const zmqMessage = fc.oneof(
  { weight: 2, arbitrary: fc.array(fc.uint8Array({ maxLength: 256 }).map((u) => Buffer.from(u)), { minLength: 1, maxLength: 3 }) },
  {
    weight: 3,
    arbitrary: fc
      .record({ t: fc.constantFrom('register', 'sync', 'ops', 'hb', 'bye', 'welcome', 'zzz'), v: fc.constantFrom(1, 2, 'x'), instance_id: fc.constantFrom('fuzz-a', '', 'x'.repeat(300)), worker_id: fc.integer({ min: -1, max: 3 }), location: fc.constantFrom('LocalCPUBackend', ''), keys: fc.uint8Array({ maxLength: 40 }), ops: fc.jsonValue({ maxDepth: 2 }), reset: fc.boolean(), last: fc.boolean(), req_id: fc.string({ maxLength: 20 }), ok: fc.jsonValue({ maxDepth: 1 }), num_tokens: fc.jsonValue({ maxDepth: 1 }) }, { requiredKeys: [] })
      .map((o) => [Buffer.from(encode(o))]),
  },
);

async function fuzzZmq(tally: Tally, surface: string, sock: Dealer | Push, runs: number, seed: number): Promise<void> {
  const cases = fc.sample(zmqMessage, { numRuns: Math.round(runs * SCALE), seed });
  for (const frames of cases) {
    await Promise.race([sock.send(frames), new Promise((r) => setTimeout(r, 2_000))]);
    tally.add(surface, 'sent');
  }
}

// ---- the test --------------------------------------------------------------------------

describe('fuzzing every surface of a 1P1D deployment', () => {
  let dep: Deployment;
  const tally = new Tally();
  const greedy = { model: 'builtin:tiny', prompt: 'The fuzzer checks that the answer does not change:', max_tokens: 8, temperature: 0 };
  let before0 = '';

  const complete = async () => {
    const r = await fetch(`${dep.proxy}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(greedy), signal: AbortSignal.timeout(120_000) });
    assert.equal(r.status, 200);
    return ((await r.json()) as { choices: { text: string }[] }).choices[0]!.text;
  };

  before(async () => {
    dep = await startDeployment({ prefillers: 1, decoders: 1 });
    before0 = await complete();
  });
  after(async () => {
    await dep?.stop();
  });

  test(`no 5xx, OpenAI-shaped errors, no crash, same greedy answer (seed ${SEED})`, async (t) => {
    const t0 = Date.now();
    const gen = [
      { method: 'POST', path: '/v1/completions', body: completionBody },
      { method: 'POST', path: '/v1/chat/completions', body: chatBody },
    ];
    const gets = ['/v1/models', '/health', '/metrics'].map((path) => ({ method: 'GET', path }));
    const engineRoutes = [
      ...gen,
      { method: 'POST', path: '/tokenize', body: fc.oneof(fc.record({ model: sampling.model, prompt: shortText, add_special_tokens: fc.oneof(fc.boolean(), junkValue) }, { requiredKeys: [] }), fc.record({ model: sampling.model, messages: fc.array(message, { maxLength: 3 }) }, { requiredKeys: [] })) },
      { method: 'POST', path: '/detokenize', body: fc.record({ model: sampling.model, tokens: fc.oneof(tokenArray, fc.constant([]), junkValue) }, { requiredKeys: [] }) },
      // internal (signed): an unsigned or malformed call is refused, never a 5xx
      { method: 'POST', path: '/xfer/release', body: fc.record({ req_id: fc.oneof(shortText, junkValue) }, { requiredKeys: [] }) },
      ...gets,
    ];
    const ctlRoutes = [
      ...Object.entries(controllerBodies).map(([path, body]) => ({ method: 'POST', path, body })),
      ...['/instances', '/healthz', '/metrics', '/events/nope', '/events/' + 'e'.repeat(150)].map((path) => ({ method: 'GET', path })),
    ];
    const workerRoutes = [...Object.entries(workerBodies).map(([path, body]) => ({ method: 'POST', path, body })), { method: 'GET', path: '/health' }];
    const pre = dep.engines.find((e) => e.role === 'prefiller')!;
    const dec = dep.engines.find((e) => e.role === 'decoder')!;

    await fuzzHttp(tally, 'proxy http', dep.proxy, httpCases([...gen, ...gets]), 2000, SEED);
    await fuzzHttp(tally, 'decoder http', dec.http, httpCases(engineRoutes), 1400, SEED + 1);
    await fuzzHttp(tally, 'prefiller http', pre.http, httpCases(engineRoutes), 1000, SEED + 2);
    await fuzzHttp(tally, 'controller http', dep.controller, httpCases(ctlRoutes), 1600, SEED + 3);
    await fuzzHttp(tally, 'decoder worker http', `http://127.0.0.1:${dec.worker}`, httpCases(workerRoutes), 600, SEED + 4);
    await fuzzHttp(tally, 'prefiller worker http', `http://127.0.0.1:${pre.worker}`, httpCases(workerRoutes), 400, SEED + 5);
    await fuzzTcp(tally, 'xfer init (tcp)', dec.xferInit!, 700, SEED + 6);
    await fuzzTcp(tally, 'xfer alloc (tcp)', dec.xferAlloc!, 700, SEED + 7);
    await fuzzTcp(tally, 'decoder peer (tcp)', dec.peer, 300, SEED + 8);
    await fuzzTcp(tally, 'prefiller peer (tcp)', pre.peer, 200, SEED + 9);
    const dealer = new Dealer({ linger: 0, sendTimeout: 1_000 });
    dealer.connect(`tcp://127.0.0.1:${dep.monitorPort}`);
    const push = new Push({ linger: 0, sendTimeout: 1_000 });
    push.connect(`tcp://127.0.0.1:${dep.notifyPort}`);
    try {
      await fuzzZmq(tally, 'controller monitor (zmq)', dealer, 600, SEED + 10);
      await fuzzZmq(tally, 'proxy notify (zmq)', push, 500, SEED + 11);
      // Give both receivers time to work through what was queued before checking on them.
      await new Promise((r) => setTimeout(r, 500));
    } finally {
      dealer.close();
      push.close();
    }

    for (const line of tally.lines()) t.diagnostic(line);
    t.diagnostic(`${tally.total()} cases in ${((Date.now() - t0) / 1000).toFixed(1)} s (seed ${SEED}, replay with KVC_FUZZ_SEED=${SEED})`);
    assert.deepEqual(tally.failures, [], 'no 5xx, no unshaped error, no hung call');
    assert.ok(tally.total() >= 10_000 * SCALE, `at least ${10_000 * SCALE} cases (${tally.total()})`);

    for (const [name, pid] of dep.pids) assert.ok(alive(pid), `${name} (pid ${pid}) still running`);
    const h = (await (await fetch(`${dep.proxy}/health`)).json()) as { status: string; prefillers: { up: boolean }[]; decoders: { up: boolean }[] };
    assert.equal(h.status, 'ok', `every backend still up after the fuzzing: ${JSON.stringify(h)}`);
    const inst = (await (await fetch(`${dep.controller}/instances`)).json()) as { instances: { instance_id: string }[] };
    const ids = inst.instances.map((i) => i.instance_id);
    assert.ok(ids.includes('decoder-0') && ids.includes('prefiller-0'), `controller still knows both instances: ${ids}`);
    assert.equal(await complete(), before0, 'the same greedy answer as before the fuzzing');
  });
});

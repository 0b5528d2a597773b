// The proxy's parts that need no server: topology flags (hosts × ports), round-robin over backends
// (fair when one is down), the SSE scan for the first event with content, the seconds flags'
// bounds, the prefill request's body, and the TTFT statistics lines. The proxy against upstreams
// is in test/system/proxy.test.ts.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Backend, RoundRobin } from '../../src/proxy/backend.js';
import { prefillBody } from '../../src/proxy/request_rules.js';
import { FirstContent } from '../../src/proxy/sse.js';
import { parseSeconds } from '../../src/common/parse_value.js';
import { parseTopology, pairEndpoints, TopologyError } from '../../src/proxy/topology.js';
import { formatStatsLine, percentile, summarize, TtftStats } from '../../src/proxy/stats.js';

const secondsFlag = (flag: string, v: string) => parseSeconds(flag, v);

describe('topology flags', () => {
  const f = { host: '--h', port: '--p', num: '--n' };
  test('one host + one port + count → consecutive ports', () => {
    assert.deepEqual(pairEndpoints('a', '7100', '3', f).map((e) => `${e.host}:${e.port}`), ['a:7100', 'a:7101', 'a:7102']);
  });
  test('one host, many ports; many hosts, one port; one to one', () => {
    assert.deepEqual(pairEndpoints('a', '1,5', undefined, f).map((e) => `${e.host}:${e.port}`), ['a:1', 'a:5']);
    assert.deepEqual(pairEndpoints('a,b', '9', undefined, f).map((e) => `${e.host}:${e.port}`), ['a:9', 'b:9']);
    assert.deepEqual(pairEndpoints('a,b', '1,2', 2, f).map((e) => `${e.host}:${e.port}`), ['a:1', 'b:2']);
  });
  test('mismatches are errors naming the flags', () => {
    assert.throws(() => pairEndpoints('a,b', '1,2,3', undefined, f), /--h lists 2 hosts and --p lists 3 ports/);
    assert.throws(() => pairEndpoints('a', '1,2', 3, f), /--n is 3 but/);
    assert.throws(() => pairEndpoints('a', 'x', undefined, f), TopologyError);
    assert.throws(() => pairEndpoints('a', '70000', undefined, f), /--p: expected an integer between 1 and 65535, found "70000"/);
    assert.throws(() => pairEndpoints('a,a', '1', undefined, f), /listed twice/);
    assert.throws(() => pairEndpoints('a', '1', '0', f), /--n: expected an integer/);
  });
  test('decoder init/alloc ports: one value expands per decoder, a list must match', () => {
    const t = parseTopology({
      prefillerHost: '127.0.0.1', prefillerPort: '7100', numPrefillers: 2,
      decoderHost: '127.0.0.1', decoderPort: '7200', numDecoders: 2,
      decoderInitPort: '7300', decoderAllocPort: '7400,7410',
    });
    assert.equal(t.prefillers.length, 2);
    assert.deepEqual(t.decoders.map((d) => [d.port, d.initPort, d.allocPort]), [[7200, 7300, 7400], [7201, 7301, 7410]]);
    assert.throws(
      () => parseTopology({ prefillerHost: 'a', prefillerPort: '1', decoderHost: 'a', decoderPort: '2', numDecoders: 2, decoderInitPort: '1,2,3', decoderAllocPort: '5' }),
      /--decoder-init-port lists 3 ports for 2 decoders/,
    );
  });
  test('decoder init/alloc ports follow the --decoder-port rule: one value is shared across hosts, consecutive on one host', () => {
    const spread = parseTopology({
      prefillerHost: 'p', prefillerPort: '7100',
      decoderHost: 'h1,h2,h3', decoderPort: '7200',
      decoderInitPort: '7300', decoderAllocPort: '7400',
    });
    assert.deepEqual(spread.decoders.map((d) => `${d.host}:${d.port}/${d.initPort}/${d.allocPort}`), ['h1:7200/7300/7400', 'h2:7200/7300/7400', 'h3:7200/7300/7400']);
    // Two decoders on h1 and one on h2: consecutive on h1, the value itself on h2.
    const mixed = parseTopology({
      prefillerHost: 'p', prefillerPort: '7100',
      decoderHost: 'h1,h1,h2', decoderPort: '7200,7201,7200',
      decoderInitPort: '7300', decoderAllocPort: '7400',
    });
    assert.deepEqual(mixed.decoders.map((d) => `${d.host}:${d.initPort}/${d.allocPort}`), ['h1:7300/7400', 'h1:7301/7401', 'h2:7300/7400']);
    assert.throws(
      () => parseTopology({ prefillerHost: 'p', prefillerPort: '1', decoderHost: 'h', decoderPort: '7200', numDecoders: 2, decoderInitPort: '7300', decoderAllocPort: '7301' }),
      /--decoder-init-port h:7301 is already used as --decoder-alloc-port of decoder h:7200/,
    );
  });
});

describe('round-robin', () => {
  const backends = (n: number) => Array.from({ length: n }, (_, i) => new Backend('prefiller', i, { host: '127.0.0.1', port: 1 + i }, 1));
  const firsts = (rr: RoundRobin, n: number) => Array.from({ length: n }, () => rr.order()[0]?.index ?? -1);

  test('strict rotation when all are up; each order lists every healthy backend from its turn', async () => {
    const b = backends(3);
    const rr = new RoundRobin(b);
    assert.deepEqual(rr.order().map((x) => x.index), [0, 1, 2]);
    assert.deepEqual(rr.order().map((x) => x.index), [1, 2, 0]);
    assert.deepEqual(firsts(rr, 4), [2, 0, 1, 2]);
    await Promise.all(b.map((x) => x.close()));
  });

  test('a backend that is down is skipped fairly: its share is spread over the healthy ones', async () => {
    const b = backends(3);
    const rr = new RoundRobin(b);
    b[0]!.markDown('test');
    // Advancing by one slot per request would give [1, 1, 2, 1, 1, 2]: backend 1 twice the load.
    assert.deepEqual(firsts(rr, 6), [1, 2, 1, 2, 1, 2]);
    b[0]!.markUp();
    b[2]!.markDown('test');
    const got = firsts(rr, 6);
    assert.deepEqual([got.filter((i) => i === 0).length, got.filter((i) => i === 1).length], [3, 3], `${got}`);
    b[0]!.markDown('test');
    b[1]!.markDown('test');
    assert.deepEqual(rr.order(), [], 'none healthy');
    assert.equal(rr.orderOrAny().length, 1, 'orderOrAny still names one to try');
    await Promise.all(b.map((x) => x.close()));
  });
});

describe('first content event', () => {
  const ev = (o: unknown) => Buffer.from(`data: ${JSON.stringify(o)}\n\n`);
  test('a role-only chat chunk is not a token; the first delta with content is', () => {
    const f = new FirstContent();
    assert.equal(f.feed(ev({ choices: [{ index: 0, delta: { role: 'assistant', content: '' } }] })), false);
    assert.equal(f.feed(ev({ choices: [{ index: 0, delta: { role: 'assistant' } }] })), false);
    const tok = ev({ choices: [{ index: 0, delta: { content: ' é' } }] });
    // Split inside the event (and inside the two-byte é): found only once the event is complete.
    assert.equal(f.feed(tok.subarray(0, tok.length - 5)), false);
    assert.equal(f.feed(tok.subarray(tok.length - 5)), true);
  });
  test('CRLF line ends are understood too', () => {
    const f = new FirstContent();
    assert.equal(f.feed(Buffer.from('data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\r\n\r\n')), false);
    assert.equal(f.feed(Buffer.from('data: {"choices":[{"delta":{"content":"hi"}}]}\r\n\r\n')), true);
  });
  test('completions: empty text and [DONE] are not tokens', () => {
    const f = new FirstContent();
    assert.equal(f.feed(Buffer.concat([ev({ choices: [{ text: '' }] }), Buffer.from('data: [DONE]\n\n')])), false);
    assert.equal(f.feed(ev({ choices: [{ text: 'x' }] })), true);
  });
});

describe('seconds flags', () => {
  test('a number of seconds longer than a timer can wait is refused, naming the flag (it would fire after 1 ms)', () => {
    assert.equal(secondsFlag('--health-interval', '2'), 2000);
    assert.equal(secondsFlag('--health-interval', '2147483'), 2_147_483_000);
    assert.throws(() => secondsFlag('--health-interval', '3600000'), /--health-interval: expected a number of seconds > 0 and <= 2147483, found "3600000"/);
    assert.throws(() => secondsFlag('--idle-timeout', '0'), /--idle-timeout/);
  });
});

describe('prefill body', () => {
  test("keeps the client's fields, leaves out the answer-shape ones, asks for one token, and leaves the client's body as it was", () => {
    const client = JSON.parse(
      '{"model":"m","prompt":"p","temperature":0.5,"max_tokens":9,"stream":true,"n":1,"stream_options":{"include_usage":true},"max_completion_tokens":9,' +
        '"best_of":2,"min_tokens":3,"echo":true,"logprobs":2,"top_logprobs":2,"kv_transfer_params":{"evil":true},"seed":7}',
    ) as Record<string, unknown>;
    const before = JSON.stringify(client);
    const pb = prefillBody(client);
    assert.deepEqual(pb, { model: 'm', prompt: 'p', temperature: 0.5, seed: 7, max_tokens: 1, stream: false, n: 1 });
    assert.equal(JSON.stringify(client), before);
    assert.notEqual(pb, client);
  });
});

describe('TTFT statistics', () => {
  test('percentile, median, average', () => {
    const s = summarize([5, 1, 3, 2, 4]);
    assert.deepEqual(s, { count: 5, avg: 3, median: 3, p99: 5 });
    assert.equal(summarize([1, 2, 3, 4]).median, 2.5);
    const hundred = Array.from({ length: 100 }, (_, i) => i + 1);
    assert.equal(percentile(hundred, 99), 99);
    assert.equal(percentile(hundred, 50), 50);
    assert.equal(summarize([]).count, 0);
  });
  test('one timestamped line per prefiller with count, avg, median, p99 in ms, saying which time it is; window resets; quiet when idle', () => {
    const st = new TtftStats(['prefiller-0', 'prefiller-1']);
    st.record('prefiller-0', 10);
    st.record('prefiller-0', 30);
    st.record('prefiller-1', 7.25);
    const now = new Date('2026-01-02T03:04:05.678Z');
    const lines = st.flush(5, now);
    const basis = "(prefill node's time, KV transfer included; end-to-end TTFT is in /metrics)";
    assert.deepEqual(lines, [
      `2026-01-02T03:04:05.678Z TTFT prefiller-0: 2 requests in last 5s (total 2), avg 20.0 ms, median 20.0 ms, p99 30.0 ms ${basis}`,
      `2026-01-02T03:04:05.678Z TTFT prefiller-1: 1 requests in last 5s (total 1), avg 7.3 ms, median 7.3 ms, p99 7.3 ms ${basis}`,
    ]);
    assert.deepEqual(st.flush(5, now), [], 'no request in the interval: no line at all');
    st.record('prefiller-1', 4);
    assert.deepEqual(st.flush(5, now), [`2026-01-02T03:04:05.678Z TTFT prefiller-1: 1 requests in last 5s (total 2), avg 4.0 ms, median 4.0 ms, p99 4.0 ms ${basis}`]);
    assert.equal(formatStatsLine('x', summarize([1]), 1, 5), `TTFT x: 1 requests in last 5s (total 1), avg 1.0 ms, median 1.0 ms, p99 1.0 ms ${basis}`);
    assert.match(formatStatsLine('decoder-only', summarize([1]), 1, 5), /\(decoder's time to first token; no prefiller was available, the decoder prefilled\)$/);
    assert.match(formatStatsLine('decoder-local', summarize([1]), 1, 5), /\(decoder's time to first token; routed to prefill on the decoder, no KV transfer\)$/);
  });
});

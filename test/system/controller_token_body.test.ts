// The binary token body of POST /lookup and POST /prefix_lookup (src/protocol/token_body.ts)
// against a real `kvc controller` process whose index is filled through the monitor protocol by
// two simulated instances: answers equal to the JSON path's (also after longer bodies reused the
// pooled memory, with concurrent and chunked bodies), every malformed body refused with a 4xx
// naming what was wrong, and the proxy's PrefixClient (which sends this body) agreeing.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { Dealer } from 'zeromq';
import { chunkKeys } from '../../src/common/keys.js';
import { freePortRange } from '../../harness/ports.js';
import { encodeMsg, packKeys, PROTOCOL_VERSION } from '../../src/protocol/monitor.js';
import { decodeTokenBody, encodeTokenBody, TOKEN_BODY_CONTENT_TYPE } from '../../src/protocol/token_body.js';
import { PrefixClient } from '../../src/proxy/prefix_client.js';
import { postJson, startKvc, type Proc } from '../../harness/proc.js';

const MODEL = 'tb-model';
const CHUNK = 16;
const range = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);
// A holds 8 chunks of P; B holds the first 3 chunks of P and all of Q (ids near the uint32 top).
const P = range(8 * CHUNK, 1000);
const Q = range(5 * CHUNK + 7, 0xffffffff - 200);

async function postBin(url: string, body: Uint8Array | Buffer, contentType = TOKEN_BODY_CONTENT_TYPE): Promise<{ status: number; json: any }> {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': contentType }, body: new Uint8Array(body), signal: AbortSignal.timeout(30_000) });
  const text = await r.text();
  try {
    return { status: r.status, json: JSON.parse(text) };
  } catch {
    return { status: r.status, json: text };
  }
}

/** A body sent with Transfer-Encoding: chunked (no Content-Length), in pieces of `piece` bytes. */
function postChunked(url: string, body: Uint8Array, piece: number): Promise<{ status: number; json: any }> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'POST', headers: { 'content-type': TOKEN_BODY_CONTENT_TYPE, 'transfer-encoding': 'chunked' } }, (res) => {
      let text = '';
      res.on('data', (d) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode!, json: JSON.parse(text) }));
    });
    req.on('error', reject);
    for (let o = 0; o < body.length; o += piece) req.write(body.subarray(o, o + piece));
    req.end();
  });
}

/** Writes `text` on a fresh connection and returns what comes back within 3 s (or until closed). */
function rawPost(url: string, text: string): Promise<string> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const s = net.connect({ host: hostname, port: Number(port) });
    let got = '';
    const t = setTimeout(() => {
      s.destroy();
      resolve(got);
    }, 3_000);
    s.on('data', (d) => {
      got += d.toString();
      if (/\r\n\r\n[\s\S]*\}\}/.test(got)) {
        clearTimeout(t);
        s.destroy();
        resolve(got);
      }
    });
    s.on('error', () => undefined);
    s.on('close', () => {
      clearTimeout(t);
      resolve(got);
    });
    s.on('connect', () => s.write(text));
  });
}

describe('controller: binary token body on /lookup and /prefix_lookup', () => {
  let ctl: Proc;
  let url: string;
  const dealers: Dealer[] = [];
  let hb: NodeJS.Timeout;

  before(async () => {
    const base = await freePortRange(2);
    ctl = startKvc(['controller', '--port', String(base), '--monitor-port', String(base + 1), '--heartbeat-timeout', '10']);
    await ctl.waitFor(/kvc controller ready/, 60_000);
    url = `http://127.0.0.1:${base}`;
    const keys = (t: number[]) => chunkKeys(t, { modelId: MODEL, chunkSize: CHUNK, seed: 0n }).map((s) => s.key);
    const hold: [string, string[]][] = [
      ['tb-A', keys(P)],
      ['tb-B', [...keys(P).slice(0, 3), ...keys(Q)]],
    ];
    for (const [id, ks] of hold) {
      const d = new Dealer({ routingId: `${id}-session`, linger: 0 });
      d.connect(`tcp://127.0.0.1:${base + 1}`);
      await d.send(encodeMsg({ t: 'register', v: PROTOCOL_VERSION, instance_id: id, worker_id: 0, session: `${id}-session`, ip: '127.0.0.1', worker_port: 1, distributed_url: null, chunk_size: CHUNK, model_id: MODEL, seed: '0', locations: ['LocalCPUBackend'], pid: 0 }));
      await d.receive();
      await d.send(encodeMsg({ t: 'ops', ops: [[1, 'LocalCPUBackend', packKeys(ks)]] }));
      dealers.push(d);
    }
    hb = setInterval(() => {
      for (const d of dealers) void d.send(encodeMsg({ t: 'hb' })).catch(() => undefined);
    }, 1000);
    // Both instances' chunks indexed.
    for (let i = 0; ; i++) {
      const j = (await (await fetch(`${url}/healthz`)).json()) as { index_keys: number };
      if (j.index_keys === 8 + 6) break; // B's first 3 keys are A's
      if (i > 200) throw new Error(`index never reached 14 keys: ${JSON.stringify(j)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  });

  after(async () => {
    clearInterval(hb);
    for (const d of dealers) d.close();
    await ctl?.kill('SIGTERM');
  });

  const prompts: [string, number[]][] = [
    ['P (A holds all, B 3 chunks)', P],
    ['P plus a partial chunk', [...P, 1, 2, 3]],
    ['P cut mid-chunk', P.slice(0, 3 * CHUNK + 5)],
    ['Q (B only, ids up to 4294967295)', Q],
    ['one token', [P[0]!]],
    ['nothing held', range(100, 7)],
  ];

  /** /lookup's answer without its event id (a new one each call). */
  const sansEvent = (j: Record<string, unknown>) => ({ ...j, event_id: typeof j.event_id });

  test('answers equal the JSON path, on both routes', async () => {
    for (const path of ['/lookup', '/prefix_lookup']) {
      for (const [what, tokens] of prompts) {
        const j = await postJson(`${url}${path}`, { tokens });
        const b = await postBin(`${url}${path}`, encodeTokenBody(tokens));
        assert.equal(j.status, 200, `${path} ${what}: ${JSON.stringify(j.json)}`);
        assert.equal(b.status, 200, `${path} ${what}: ${JSON.stringify(b.json)}`);
        assert.deepEqual(sansEvent(b.json), sansEvent(j.json), `${path} ${what}`);
      }
    }
    // The answers are the index's, not empty ones that happen to agree.
    const r = await postBin(`${url}/prefix_lookup`, encodeTokenBody(P));
    assert.deepEqual(r.json, { num_tokens: 8 * CHUNK, instances: { 'tb-A': 8 * CHUNK, 'tb-B': 3 * CHUNK } });
    const q = await postBin(`${url}/lookup`, encodeTokenBody(Q));
    assert.equal(q.json.layout_detail['tb-B'].matched_tokens, Q.length);
    assert.equal(q.json.layout_detail['tb-A'], undefined);
  });

  test('pooled memory: a short body after a long one, concurrent bodies, chunked bodies', async () => {
    const long = [...P, ...range(40_000, 5)]; // 160 KB: larger than the pool's first buffers
    const expectLong = (await postJson(`${url}/prefix_lookup`, { tokens: long })).json;
    assert.deepEqual((await postBin(`${url}/prefix_lookup`, encodeTokenBody(long))).json, expectLong);
    // The short prompt reuses the buffer that held the long one: its answer must not see those bytes.
    const short = P.slice(0, 2 * CHUNK);
    assert.deepEqual((await postBin(`${url}/prefix_lookup`, encodeTokenBody(short))).json, { num_tokens: 2 * CHUNK, instances: { 'tb-A': 2 * CHUNK, 'tb-B': 2 * CHUNK } });
    // Many bodies in flight at once, each with its own answer.
    const all = await Promise.all(
      range(24).map(async (i) => {
        const [, tokens] = prompts[i % prompts.length]!;
        const want = (await postJson(`${url}/lookup`, { tokens })).json;
        return { got: (await postBin(`${url}/lookup`, encodeTokenBody(tokens))).json, want, i };
      }),
    );
    for (const { got, want, i } of all) assert.deepEqual(sansEvent(got), sansEvent(want), `concurrent request ${i}`);
    // Above 1 MiB the buffer is not sized from Content-Length but grows as the bytes arrive.
    const huge = [...P, ...range(300_000, 9)];
    assert.deepEqual((await postBin(`${url}/prefix_lookup`, encodeTokenBody(huge))).json, (await postJson(`${url}/prefix_lookup`, { tokens: huge })).json);
    // No Content-Length: the body grows its buffer as it arrives (odd piece sizes split token ids).
    for (const tokens of [P, long]) {
      const r = await postChunked(`${url}/prefix_lookup`, encodeTokenBody(tokens), 4093);
      assert.equal(r.status, 200, JSON.stringify(r.json));
      assert.deepEqual(r.json, (await postJson(`${url}/prefix_lookup`, { tokens })).json);
    }
  });

  test('malformed binary bodies: 4xx naming what was wrong, nothing changed', async () => {
    const cases: [string, string, Uint8Array | Buffer, string, number, RegExp][] = [
      ['length not a multiple of 4', '/lookup', Buffer.alloc(10), TOKEN_BODY_CONTENT_TYPE, 400, /^body: 10 bytes is not a multiple of 4; expected token ids as uint32 little-endian/],
      ['empty', '/prefix_lookup', Buffer.alloc(0), TOKEN_BODY_CONTENT_TYPE, 400, /^body: empty; expected at least one token id/],
      ['wrong content type', '/lookup', encodeTokenBody(P), 'text/plain', 400, /unsupported Content-Type; send application\/json or application\/octet-stream/],
      ['binary to a JSON-only route', '/pin', encodeTokenBody(P), TOKEN_BODY_CONTENT_TYPE, 400, /content-type: application\/octet-stream \(binary token ids\) is accepted by \/lookup and \/prefix_lookup only; send \/pin a JSON body/],
    ];
    for (const [what, path, body, ct, status, re] of cases) {
      const r = await postBin(`${url}${path}`, body, ct);
      assert.equal(r.status, status, `${what}: ${JSON.stringify(r.json)}`);
      assert.match(r.json.error.message, re, what);
      assert.equal(typeof r.json.error.code, 'string', what);
      assert.equal(typeof r.json.error.type, 'string', what);
    }
    // A too-large body by its Content-Length: refused before any of it is read.
    const head = await rawPost(url, `POST /lookup HTTP/1.1\r\nhost: x\r\ncontent-type: ${TOKEN_BODY_CONTENT_TYPE}\r\ncontent-length: ${16 * 1024 * 1024 + 4}\r\n\r\n\u0001\u0000\u0000\u0000`);
    assert.match(head, /^HTTP\/1\.1 413 /, head);
    assert.match(head, /request body exceeds 16777216 bytes \(4194304 token ids\)/, head);
    // A too-large body refused while it arrives (no Content-Length).
    const big = await postChunked(`${url}/lookup`, new Uint8Array(16 * 1024 * 1024 + 8), 1 << 20).catch((e: Error) => ({ status: 0, json: e.message }));
    // The server answers 413 as soon as the limit is passed; the client may see the answer or a reset.
    if (big.status !== 0) assert.equal(big.status, 413, JSON.stringify(big.json));
    // The controller still serves, with the index unchanged.
    const r = await postBin(`${url}/prefix_lookup`, encodeTokenBody(P));
    assert.deepEqual(r.json, { num_tokens: 8 * CHUNK, instances: { 'tb-A': 8 * CHUNK, 'tb-B': 3 * CHUNK } });
  });

  test("the proxy's PrefixClient sends the binary body and gets the JSON path's answer", async () => {
    const client = new PrefixClient(url, 5_000);
    try {
      for (const [what, tokens] of prompts) {
        assert.deepEqual(await client.lookup(tokens), (await postJson(`${url}/prefix_lookup`, { tokens })).json, what);
      }
      assert.deepEqual(await client.lookup([]), { num_tokens: 0, instances: {} });
    } finally {
      await client.close();
    }
  });

  test('encode/decode: little-endian uint32, every id checked', () => {
    const b = encodeTokenBody([1, 0x01020304, 0xffffffff]);
    assert.deepEqual([...b], [1, 0, 0, 0, 4, 3, 2, 1, 255, 255, 255, 255]);
    assert.deepEqual([...decodeTokenBody(b)], [1, 0x01020304, 0xffffffff]);
    assert.throws(() => encodeTokenBody([1, -1]), /tokens\[1\]: expected a token id from 0 to 4294967295, found -1/);
    assert.throws(() => encodeTokenBody([2 ** 32]), /tokens\[0\]/);
    assert.throws(() => encodeTokenBody([1.5]), /tokens\[0\]/);
    assert.throws(() => decodeTokenBody(new Uint8Array(6)), /not a multiple of 4/);
    assert.throws(() => decodeTokenBody(new Uint8Array(0)), /empty/);
  });
});

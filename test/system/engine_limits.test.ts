// Engine limits, in process: a small paged-KV budget (requests wait for memory and all
// succeed; chat's default max_tokens fits the budget), prompts refused from their character
// count before tokenizing, --max-num-batched-tokens vs --max-num-seqs at start-up, and a client
// that is already gone when its request is submitted.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { freePortRange } from '../../harness/ports.js';
import { runGeneration, type GenerationRequest } from '../../src/engine/generate.js';
import { EngineMetrics } from '../../src/engine/metrics.js';
import { BUILTIN_MODELS, ensureBuiltinModel } from '../../src/engine/model/formats/builtin.js';
import { BLOCK_TOKENS, PagedKvCache } from '../../src/engine/model/kv_cache.js';
import { Tokenizer } from '../../src/engine/model/tokenizer.js';
import { Scheduler, type ForwardSegment } from '../../src/engine/scheduler.js';
import { startEngine, type Engine } from '../../src/engine/server.js';
import { postJson, startKvc } from '../../harness/proc.js';

const MODEL = 'builtin:tiny';
const tiny = BUILTIN_MODELS.tiny!;
/** Bytes of one paged-KV block of the built-in model. */
const BLOCK_BYTES = tiny.numLayers * 2 * BLOCK_TOKENS * tiny.numKvHeads * tiny.headDim * 4;

async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

describe('engine with a small KV budget (in process)', () => {
  const MAX_LEN = 256;
  const BLOCKS = 8; // 128 positions, half of max_model_len
  let e: Engine;

  before(async () => {
    e = await startEngine({ model: MODEL, maxModelLen: MAX_LEN, maxNumSeqs: 8, kvCacheBytes: BLOCKS * BLOCK_BYTES });
    assert.equal(e.kv.capacityTokens, BLOCKS * BLOCK_TOKENS);
  });

  after(async () => {
    await e?.close();
  });

  it('chat without max_tokens generates up to what the KV budget holds (not a 400 naming max_tokens)', async () => {
    const messages = [{ role: 'user', content: 'Tell me everything.' }];
    const r = await postJson(`${e.url}/v1/chat/completions`, { model: MODEL, messages, temperature: 0, ignore_eos: true });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    const p = r.json.usage.prompt_tokens as number;
    // prompt + max_tokens - 1 positions must fit the 128-position budget.
    assert.equal(r.json.usage.completion_tokens, e.kv.capacityTokens + 1 - p);
    assert.equal(r.json.choices[0].finish_reason, 'length');
    // An explicit max_tokens beyond the budget is still refused, naming it.
    const big = await postJson(`${e.url}/v1/chat/completions`, { model: MODEL, messages, max_tokens: MAX_LEN - p });
    assert.equal(big.status, 400);
    assert.match(big.json.error.message, /field `max_tokens`/);
    assert.equal(big.json.error.code, 'kv_capacity_exceeded');
    // A prompt that alone exceeds the budget (but not max_model_len) is refused naming the prompt.
    const long = await postJson(`${e.url}/v1/completions`, { model: MODEL, prompt: Array.from({ length: 200 }, (_, i) => 1000 + i) });
    assert.equal(long.status, 400);
    assert.match(long.json.error.message, /field `prompt`.*KV cache holds 128 tokens/);
    // Everything released.
    assert.equal(await metric(e.url, 'kvc_engine_num_requests_running'), 0);
    assert.equal(await metric(e.url, 'kvc_engine_kv_cache_usage_ratio'), 0);
  });

  it('requests beyond the KV budget wait for memory and all succeed with their alone output', async () => {
    const prompts = ['The history of the city begins', 'In a distant galaxy', 'Recipe: take two eggs and', 'def fibonacci(n):'];
    const body = (p: string) => ({ model: MODEL, prompt: p, max_tokens: 50, temperature: 0, ignore_eos: true });
    const alone: string[] = [];
    for (const p of prompts) alone.push((await postJson(`${e.url}/v1/completions`, body(p))).json.choices[0].text);
    // Each request reserves ceil((prompt + 49) / 16) = 4 of the 8 blocks: two run, the others wait.
    let peakWaiting = 0;
    let peakRunning = 0;
    const m = e.model;
    const forward = m.forward;
    m.forward = (segs: ForwardSegment[], kv: PagedKvCache) => {
      peakWaiting = Math.max(peakWaiting, e.scheduler.numWaiting);
      peakRunning = Math.max(peakRunning, e.scheduler.numActive);
      assert.ok(kv.usedBlocks <= kv.totalBlocks);
      return forward(segs, kv);
    };
    try {
      const together = await Promise.all(prompts.map((p) => postJson(`${e.url}/v1/completions`, body(p))));
      assert.deepEqual(together.map((r) => r.status), [200, 200, 200, 200]);
      assert.deepEqual(together.map((r) => r.json.choices[0].text), alone);
      assert.deepEqual(together.map((r) => r.json.usage.completion_tokens), [50, 50, 50, 50]);
    } finally {
      m.forward = forward;
    }
    assert.equal(peakRunning, 2, 'the KV budget admits two of these at a time');
    assert.ok(peakWaiting >= 1, 'later requests waited for KV memory');
    assert.equal(await metric(e.url, 'kvc_engine_num_requests_waiting'), 0);
    assert.equal(await metric(e.url, 'kvc_engine_kv_cache_usage_ratio'), 0);
  });

  it('a text prompt certainly longer than max_model_len is refused from its length, without tokenizing', async () => {
    const tok = e.model.tokenizer;
    const encode = tok.encode;
    let calls = 0;
    tok.encode = (text: string, opts?: { addBos?: boolean }) => {
      calls++;
      return encode.call(tok, text, opts);
    };
    try {
      const huge = 'word '.repeat(200_000); // 1 M characters
      const c = await postJson(`${e.url}/v1/completions`, { model: MODEL, prompt: huge, max_tokens: 1 });
      assert.equal(c.status, 400);
      assert.match(c.json.error.message, /field `prompt`: 1000000 characters are at least 62500 tokens/);
      assert.equal(c.json.error.code, 'context_length_exceeded');
      const chat = await postJson(`${e.url}/v1/chat/completions`, { model: MODEL, messages: [{ role: 'user', content: huge }] });
      assert.equal(chat.status, 400);
      assert.match(chat.json.error.message, /field `messages`: \d+ characters are at least \d+ tokens/);
      const t = await postJson(`${e.url}/tokenize`, { model: MODEL, prompt: huge });
      assert.equal(t.status, 400);
      assert.match(t.json.error.message, /field `prompt`/);
      const tc = await postJson(`${e.url}/tokenize`, { model: MODEL, messages: [{ role: 'user', content: huge }] });
      assert.equal(tc.status, 400);
      assert.match(tc.json.error.message, /field `messages`/);
      assert.equal(calls, 0, 'nothing was tokenized');
      // Below the bound the text is tokenized and the exact rules apply: /tokenize still counts a
      // prompt a little over max_model_len; generation refuses it naming the prompt.
      const over = 'a '.repeat(MAX_LEN + 10);
      const t2 = await postJson(`${e.url}/tokenize`, { model: MODEL, prompt: over });
      assert.equal(t2.status, 200);
      assert.ok(t2.json.count > MAX_LEN);
      const c2 = await postJson(`${e.url}/v1/completions`, { model: MODEL, prompt: over });
      assert.equal(c2.status, 400);
      assert.match(c2.json.error.message, /field `prompt`: the prompt has \d+ tokens/);
      assert.equal(calls, 2);
    } finally {
      tok.encode = encode;
    }
  });
});

describe('engine start-up validation', () => {
  it('--max-num-batched-tokens below --max-num-seqs is refused with a clear error (in process and CLI)', async () => {
    await assert.rejects(startEngine({ model: MODEL, maxNumSeqs: 8, maxNumBatchedTokens: 4 }), /--max-num-batched-tokens \(4\) must be >= --max-num-seqs \(8\)/);
    const port = await freePortRange(1);
    const p = startKvc(['engine', '--port', String(port), '--model', MODEL, '--max-num-seqs', '8', '--max-num-batched-tokens', '4']);
    const code = await new Promise<number | null>((r) => p.child.once('exit', (c) => r(c)));
    assert.equal(code, 1);
    assert.match(p.output(), /kvc: --max-num-batched-tokens \(4\) must be >= --max-num-seqs \(8\)/);
  });
});

describe('generation with a client already gone', () => {
  let tok: Tokenizer;
  before(async () => {
    tok = await Tokenizer.load(await ensureBuiltinModel('tiny'));
  });

  for (const stream of [false, true]) {
    it(`a socket closed before the close listener is attached cancels the sequence (${stream ? 'stream' : 'JSON'})`, async () => {
      const kv = new PagedKvCache({ numLayers: 1, numKvHeads: 1, headDim: 2 }, 64 * 1024);
      const metrics = new EngineMetrics({ model: 'm' });
      let forwards = 0;
      const model = {
        forward(segs: ForwardSegment[], cache: PagedKvCache) {
          forwards++;
          for (const s of segs) {
            cache.allocate(s.seqId, s.startPos + s.tokens.length);
            cache.setLength(s.seqId, s.startPos + s.tokens.length);
          }
          return segs.filter((s) => s.wantLogits).map(() => new Float32Array(tok.vocabSize).fill(0).fill(1, 500, 501));
        },
      };
      const scheduler = new Scheduler({ model, kv, metrics, connector: null, maxNumSeqs: 4, maxNumBatchedTokens: 64, maxQueue: 8 });
      // The socket closed while the body was read: 'close' already fired, nobody will emit it again.
      const raw = Object.assign(new EventEmitter(), { destroyed: true, writableFinished: false, socket: null, writeHead() {}, write() {}, end() {} });
      let sent: unknown = null;
      const reply = {
        raw,
        hijack() {},
        header() {
          return reply;
        },
        send(b: unknown) {
          sent = b;
          return reply;
        },
      };
      const g: GenerationRequest = {
        kind: 'completion',
        endpoint: '/v1/completions',
        requestId: 'gone',
        modelName: 'm',
        prompt: [1, 500, 600],
        maxTokens: 20,
        n: 1,
        bestOf: 1,
        sampling: { temperature: 0, topP: 1, topK: -1, seed: null },
        logprobs: null,
        tokensAsIds: false,
        stop: [],
        includeStopStr: false,
        echo: null,
        stopTokenIds: new Set(),
        kvTransferParams: undefined,
        stream,
        includeUsage: false,
        continuousUsage: false,
        priority: 0,
      };
      try {
        await runGeneration({ scheduler, tokenizer: tok, metrics }, g, {} as FastifyRequest, reply as unknown as FastifyReply);
        assert.equal(forwards, 0, 'the sequence never ran');
        assert.equal(sent, null, 'nothing answered to a closed socket');
        assert.equal(kv.usedBlocks, 0);
        assert.equal(scheduler.numActive + scheduler.numWaiting, 0);
        const text = await metrics.registry.metrics();
        assert.match(text, /kvc_engine_requests_total\{endpoint="\/v1\/completions",outcome="cancelled"[^}]*\} 1/);
      } finally {
        await scheduler.close();
      }
    });
  }
});

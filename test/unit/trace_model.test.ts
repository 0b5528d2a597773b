// The trace replay's pure part (harness/trace_model.ts): parsing and its errors, conversations,
// sampling whole conversations, windows, arrival scaling, block → token mapping, and the pooled
// LRU and infinite-cache references, checked against hand-computed cases.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  applyWindow, blockTokenIds, conversations, distinctChunks, mapRequests, parseTrace, parseWindow, pooledEquivalent, promptIds, sampleConversations, sendTimes, simulate,
  type ReplayRequest, type TraceRequest,
} from '../../harness/trace_model.js';

const line = (timestamp: number, input: number, ids: number[], output = 10) => JSON.stringify({ timestamp, input_length: input, output_length: output, hash_ids: ids });

test('parseTrace reads the format and names the line and field of a bad one', () => {
  const t = parseTrace([line(0, 1024, [1, 2]), '', line(5, 600, [1, 3])].join('\n'), 'x.jsonl');
  assert.equal(t.length, 2);
  assert.deepEqual(t[1], { line: 3, timestamp: 5, inputLength: 600, outputLength: 10, hashIds: [1, 3] });
  assert.throws(() => parseTrace('{"timestamp":0}', 'f'), /f:1: input_length: expected an integer >= 0/);
  assert.throws(() => parseTrace(line(0, 1024, [1]), 'f'), /f:1: hash_ids: expected 2 ids for input_length 1024/);
  assert.throws(() => parseTrace(`${line(5, 10, [1])}\n${line(4, 10, [2])}`, 'f'), /f:2: timestamp: 4 is earlier/);
  assert.throws(() => parseTrace('nope', 'f'), /f:1: not JSON/);
  assert.throws(() => parseTrace('\n\n', 'f'), /f: no requests/);
});

function req(ids: number[], input = ids.length * 512, timestamp = 0): TraceRequest {
  return { line: 0, timestamp, inputLength: input, outputLength: 4, hashIds: ids };
}

test('a conversation is a chain of requests each extending a whole earlier prompt', () => {
  const reqs = [
    req([1, 2]), // conversation 0
    req([1, 5]), // shares only the first block (a system prompt): its own conversation
    req([1, 2, 3, 4], 1800), // extends request 0's two full blocks: conversation 0
    req([1, 2, 3, 9]), // extends request 2's full blocks 1,2,3 (its partial 4th does not count): conversation 0
    req([7]),
    req([1, 5, 6]), // extends request 1: conversation 1
    req([1]), // the shared block 1 alone (continued by 2 and by 5): ...
    req([1, 8]), // ... so this is not its next turn
  ];
  assert.deepEqual(conversations(reqs), [0, 1, 0, 0, 4, 1, 6, 7]);
  // Sampling keeps conversations whole: every kept request's conversation is kept entirely.
  const many = Array.from({ length: 400 }, (_, i) => req(i % 2 ? [i - 1, 100_000 + i] : [i]));
  for (const f of [0.1, 0.5]) {
    const kept = sampleConversations(many, f, 3);
    const firsts = new Set(kept.filter((r) => r.hashIds.length === 1).map((r) => r.hashIds[0]));
    for (const r of kept) assert.ok(firsts.has(r.hashIds[0]), 'a later turn kept without its first');
    for (const r of kept.filter((x) => x.hashIds.length === 1)) assert.ok(kept.some((x) => x.hashIds.length === 2 && x.hashIds[0] === r.hashIds[0]), 'a first turn kept without its second');
    assert.ok(Math.abs(kept.length / many.length - f) < 0.12, `kept ${kept.length} of ${many.length} for ${f}`);
  }
  assert.deepEqual(sampleConversations(many, 0.5, 3), sampleConversations(many, 0.5, 3));
  assert.throws(() => sampleConversations(many, 0, 1), /--sample-conversations: expected a fraction in \(0, 1\]/);
});

test('windows and send times keep the trace pattern at the asked rate', () => {
  assert.deepEqual(parseWindow('10:5'), { start: 10, count: 5 });
  assert.throws(() => parseWindow('10'), /--window: expected START:COUNT/);
  assert.throws(() => parseWindow('1:0'), /COUNT > 0/);
  assert.deepEqual(applyWindow([1, 2, 3, 4], { start: 1, count: 10 }), [2, 3, 4]);
  assert.throws(() => applyWindow([1], { start: 1, count: 1 }), /--window: START 1 is past the last request/);
  // Gaps 1 s and 3 s (4 s for 2 gaps = 0.5/s), replayed at 1/s: gaps scaled by 0.5.
  assert.deepEqual(sendTimes([req([1], 512, 1000), req([1], 512, 2000), req([1], 512, 5000)], 1), [0, 500, 2000]);
  assert.deepEqual(sendTimes([req([1]), req([2]), req([3])], 2), [0, 500, 1000]);
  assert.throws(() => sendTimes([req([1])], 0), /--rate/);
});

test('blocks become deterministic tokens; a partial block is the start of the full one; long prompts keep leading blocks', () => {
  const a = blockTokenIds(42, 64, 1);
  assert.deepEqual(blockTokenIds(42, 64, 1), a);
  assert.notDeepEqual(blockTokenIds(43, 64, 1), a);
  assert.deepEqual(blockTokenIds(42, 10, 1), a.slice(0, 10));
  assert.ok(a.every((t) => t >= 100 && t < 31_000));
  const [r] = mapRequests([req([42, 7], 512 + 256)], [0], { blockTokens: 64, maxPromptTokens: 1000, maxOutputTokens: 3 });
  assert.deepEqual(r!.chunks, ['42', '7/32']);
  assert.deepEqual(r!.chunkTokens, [64, 32]);
  assert.equal(r!.maxTokens, 3);
  assert.deepEqual(promptIds(r!, 1), [...a, ...blockTokenIds(7, 32, 1)]);
  const [cut] = mapRequests([req([1, 2, 3, 4])], [0], { blockTokens: 64, maxPromptTokens: 150, maxOutputTokens: 3 });
  assert.deepEqual(cut!.chunks, ['1', '2']);
  assert.equal(cut!.droppedBlocks, 2);
});

const rr = (chunks: string[], tokens = 10): ReplayRequest => ({ index: 0, at: 0, chunks, chunkTokens: chunks.map(() => tokens), maxTokens: 1, droppedBlocks: 0 });

test('the pooled LRU and the infinite cache reuse leading runs only and evict least recently used, tails first', () => {
  const reqs = [rr(['a', 'b']), rr(['a', 'b', 'c']), rr(['x', 'y']), rr(['a', 'b', 'c']), rr(['b'])];
  assert.equal(distinctChunks(reqs), 5);
  const inf = simulate(reqs, Infinity);
  // a,b: 20 computed; a,b,c: 10; x,y: 20; a,b,c: 1 (the last token always); b: 1 (b is cached, although not at the head of any earlier prompt).
  assert.deepEqual(inf.perRequest, [20, 10, 20, 1, 1]);
  assert.equal(inf.sent, 20 + 30 + 20 + 30 + 10);
  // 3 chunks, touched head last: after request 1 the order (oldest → newest) is c, b, a; request 2
  // adds y, x and evicts c, b; request 3 finds a only (computes b, c) and leaves c, b, a; request
  // 4 finds b.
  const lru = simulate(reqs, 3);
  assert.deepEqual(lru.perRequest, [20, 10, 20, 20, 1]);
  assert.deepEqual(simulate(reqs, 0).perRequest, [20, 30, 20, 30, 10]);
  assert.throws(() => simulate(reqs, -1), /capacity/);
});

test('the references name computed chunks as the ledger does: own reason when held nowhere, the break\'s when held after it', () => {
  // Capacity 3. After [a,b,c] and [b] the order is c, a, b; [x] evicts c, [y] evicts a. Then
  // [a,b,d]: a was evicted (the break), b is still held but cut off (takes a's reason), d was never
  // stored (cold on its own, whatever broke before it).
  const reqs = [rr(['a', 'b', 'c']), rr(['b']), rr(['x']), rr(['y']), rr(['a', 'b', 'd'])];
  assert.deepEqual(simulate(reqs, 3).reasons, { cold: 3 + 1 + 1 + 1, evicted: 2, partial: 0 });
  // A partial last chunk is always partial.
  assert.deepEqual(simulate([rr(['a', 'b/p'])], 3).reasons, { cold: 1, evicted: 0, partial: 1 });
});

test('pooledEquivalent finds the pooled LRU size that computes what was measured', () => {
  const r = (index: number, chunks: string[]): ReplayRequest => ({ index, at: index, chunks, chunkTokens: chunks.map(() => 4), maxTokens: 1, droppedBlocks: 0 });
  // Two prompts of two chunks in turn: a cache of 4 holds both, smaller caches hold less.
  const reqs = [r(0, ['a', 'b']), r(1, ['c', 'd']), r(2, ['a', 'b']), r(3, ['c', 'd']), r(4, ['a', 'b'])];
  const ratio = (c: number) => simulate(reqs, c).computed / simulate(reqs, c).sent;
  assert.equal(pooledEquivalent(reqs, ratio(4)), 4);
  assert.equal(pooledEquivalent(reqs, ratio(0)), 0);
  assert.equal(pooledEquivalent(reqs, 1.5), 0);
  // Below the infinite cache's figure no LRU of the window computes that little.
  assert.equal(pooledEquivalent(reqs, ratio(Infinity) - 0.01), null);
});

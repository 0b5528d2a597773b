// The trace generator (harness/trace_gen.ts) behind `--trace generated:NAME`: the same lines for the
// same seed, in the trace format, conversations whose turns resend the previous prompt, and a
// refused shape named.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateTrace, traceText, TRACE_SHAPES, type TraceShape } from '../../harness/trace_gen.js';
import { conversations, parseTrace, TRACE_BLOCK_TOKENS } from '../../harness/trace_model.js';

const small: TraceShape = { tenants: 3, conversations: 40, turns: 4, systemBlocks: 2, turnBlocks: 3, duration: 600, think: 30, skew: 1 };

test('a shape and seed give the same trace, another seed another one, in the trace format', () => {
  const a = traceText(generateTrace(small, 7));
  assert.equal(a, traceText(generateTrace(small, 7)));
  assert.notEqual(a, traceText(generateTrace(small, 8)));
  const reqs = parseTrace(a, 'generated');
  for (let i = 1; i < reqs.length; i++) assert.ok(reqs[i]!.timestamp >= reqs[i - 1]!.timestamp, 'arrival order');
  for (const r of reqs) assert.equal(r.hashIds.length, Math.ceil(r.inputLength / TRACE_BLOCK_TOKENS));
  for (const s of Object.values(TRACE_SHAPES)) assert.ok(generateTrace(s, 1).length > s.conversations, 'named shapes have multi-turn conversations');
});

test("each turn resends its conversation's previous prompt, completed, and every prompt starts with a system prompt", () => {
  const reqs = parseTrace(traceText(generateTrace(small, 3)), 'generated');
  const systems = new Set(reqs.map((r) => r.hashIds.slice(0, small.systemBlocks).join(',')));
  assert.ok(systems.size <= small.tenants);
  // The conversation grouping of the replay finds turns: later turns extend an earlier whole prompt.
  const roots = conversations(reqs);
  const later = roots.filter((root, i) => root !== i).length;
  assert.ok(later > 0, 'some requests continue a conversation');
  roots.forEach((root, i) => {
    if (root === i) return;
    const first = reqs[root]!;
    const full = Math.floor(first.inputLength / TRACE_BLOCK_TOKENS);
    assert.deepEqual(reqs[i]!.hashIds.slice(0, full), first.hashIds.slice(0, full));
  });
  // A partial last block has an id of its own: never the same id at the same position with other tokens.
  const lastIds = reqs.filter((r) => r.inputLength % TRACE_BLOCK_TOKENS).map((r) => r.hashIds.at(-1));
  assert.equal(new Set(lastIds).size, lastIds.length);
});

test('a shape out of range is refused naming what is expected', () => {
  assert.throws(() => generateTrace({ ...small, tenants: 0 }, 1), /trace shape: expected tenants, conversations, turns, turn blocks >= 1/);
  assert.throws(() => generateTrace({ ...small, duration: 0 }, 1), /duration > 0/);
});

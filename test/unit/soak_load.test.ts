// The soak's load: what counts as lost (harness/load.ts judgeAnswer) and the open load's
// shedding (harness/rate_load.ts): an arrival beyond the bound in flight is counted, never sent.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { judgeAnswer, type LoadSend } from '../../harness/load.js';
import { startRateLoad } from '../../harness/rate_load.js';

test('an answer is lost only when it did not come whole or failed without a reason', () => {
  const done = 'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n';
  assert.equal(judgeAnswer(200, done, true).lost, undefined);
  assert.equal(judgeAnswer(200, 'data: {"choices":[{"text":"a"}]}\n\n', true).lost, 'truncated');
  // An error event: failed with a reason (599), not lost.
  const broken = judgeAnswer(200, 'data: {"error":{"message":"decoder gone"}}\n\ndata: [DONE]\n\n', true);
  assert.deepEqual([broken.status, broken.lost], [599, undefined]);
  // Generated text that spells "error": is not an error event.
  assert.equal(judgeAnswer(200, 'data: {"choices":[{"text":"\\"error\\": x"}]}\n\ndata: [DONE]\n\n', true).status, 200);
  assert.equal(judgeAnswer(200, '{"choices":[]}', false).lost, undefined);
  assert.equal(judgeAnswer(200, '{"choi', false).lost, 'truncated');
  assert.equal(judgeAnswer(502, '{"error":{"message":"no decoder answered"}}', false).lost, undefined);
  assert.equal(judgeAnswer(502, '', false).lost, 'no_reason');
  assert.equal(judgeAnswer(500, '{"error":{"message":"  "}}', false).lost, 'no_reason');
  assert.equal(judgeAnswer(0, 'TimeoutError: The operation was aborted due to timeout', false).lost, 'unanswered');
  assert.equal(judgeAnswer(0, 'TypeError: fetch failed', true).lost, 'connection');
});

test('the open load sheds arrivals beyond its bound in flight and counts every one', { timeout: 30_000 }, async () => {
  const release: (() => void)[] = [];
  // A deployment that never answers until released: every arrival past the second is shed.
  const send: LoadSend = (_path, body) =>
    new Promise((r) => release.push(() => r({ status: 200, text: (body as { stream: boolean }).stream ? 'data: [DONE]\n\n' : '{"choices":[]}', ttftMs: 1 })));
  const load = startRateLoad({ perMinute: 600_000, maxInFlight: 2, arrivals: 'even', send, timeoutMs: 60_000 });
  while (load.offered() < 20) await new Promise((r) => setTimeout(r, 5));
  const stopping = load.stop();
  const offered = load.offered();
  assert.equal(release.length, 2);
  assert.equal(load.shed.length, offered - 2);
  for (const r of release) r();
  const results = await stopping;
  assert.equal(results.length, 2);
  assert.ok(results.every((r) => r.status === 200 && !r.lost));
});

// The controller questions of a cache instance (src/kvc/controller_questions.ts): each settles
// once, by its answer, its time bound, a failed send or failAll; stray and late answers are dropped.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ControllerQuestions, type Parsed } from '../../src/kvc/controller_questions.js';

const ok = <T>(data: T): Parsed<T> => ({ success: true, data });
const bad: Parsed<never> = { success: false, error: { issues: [{ message: 'expected an array' }] } };

test('an answer settles its question with what accept makes of it; a second answer is dropped', async () => {
  const q = new ControllerQuestions();
  let sentId = -1;
  const p = q.ask('holder query', 'p2p_holders', 5_000, async (id) => void (sentId = id), (a: { holders: string[] }) => a.holders.length);
  await Promise.resolve();
  q.answer('p2p_holders', { id: sentId }, () => ok({ holders: ['a', 'b'] }));
  assert.equal(await p, 2);
  q.answer('p2p_holders', { id: sentId }, () => assert.fail('a settled question is not parsed again'));
});

test('an answer of another type or with no numeric id is dropped; the question stays open', async () => {
  const q = new ControllerQuestions();
  let sentId = -1;
  const p = q.ask('miss query', 'miss_reasons', 5_000, async (id) => void (sentId = id), (a: number) => a);
  q.answer('p2p_holders', { id: sentId }, () => assert.fail('not parsed: another kind of answer'));
  q.answer('miss_reasons', { id: String(sentId) }, () => assert.fail('not parsed: not a numeric id'));
  q.answer('miss_reasons', { id: sentId }, () => ok(7));
  assert.equal(await p, 7);
});

test('a malformed answer, an answer accept refuses, a failed send, the time bound and failAll each reject with their reason', async () => {
  const q = new ControllerQuestions();
  const ids: number[] = [];
  const ask = (accept: (a: number) => number = (a) => a, send: (id: number) => Promise<unknown> = async (id) => void ids.push(id), ms = 5_000) =>
    q.ask('miss query', 'miss_reasons', ms, send, accept);
  const malformed = ask();
  const refused = ask(() => {
    throw new Error('miss_reasons answered 1 reasons for 2 keys');
  });
  q.answer('miss_reasons', { id: ids[0] }, () => bad);
  q.answer('miss_reasons', { id: ids[1] }, () => ok(1));
  await assert.rejects(malformed, /^Error: malformed miss_reasons answer: expected an array$/);
  await assert.rejects(refused, /answered 1 reasons for 2 keys/);
  await assert.rejects(ask(undefined, () => Promise.reject(new Error('socket closed'))), /^Error: miss query not sent: socket closed$/);
  await assert.rejects(ask(undefined, undefined, 5), /^Error: no answer from the controller within 5 ms$/);
  const a = ask();
  const b = q.ask('holder query', 'p2p_holders', 5_000, async () => undefined, (x: number) => x);
  q.failAll('controller connection lost (test)');
  await assert.rejects(a, /controller connection lost \(test\)/);
  await assert.rejects(b, /controller connection lost \(test\)/);
});

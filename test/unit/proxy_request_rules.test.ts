// What the proxy refuses before any engine computes (src/proxy/request_rules.ts): each refusal a
// 400 that names the field, and a request it accepts left as it was.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { checkRequest } from '../../src/proxy/request_rules.js';

const refused = (kind: 'completion' | 'chat', body: Record<string, unknown>, field: RegExp) =>
  assert.throws(() => checkRequest(kind, body), (e: Error & { status?: number }) => e.status === 400 && field.test(e.message));

test('a completion prompt is a string or token ids, one prompt per request', () => {
  for (const prompt of ['hi', [1, 2, 3], ['hi'], [[1, 2]]]) assert.doesNotThrow(() => checkRequest('completion', { prompt }));
  for (const prompt of [undefined, 3, [], ['a', 'b'], [1, -2], [1.5], [[1], [2]]]) refused('completion', { prompt }, /field `prompt`/);
});

test('a token id a chunk key cannot hold is refused by its position', () => {
  const body = { prompt: [5, 2 ** 32, 7] };
  const before = JSON.stringify(body);
  refused('completion', body, /field `prompt\[1\]`: token id 4294967296 is out of range/);
  refused('completion', { prompt: [[1, 2, 2 ** 40]] }, /field `prompt\[0\]\[2\]`/);
  assert.equal(JSON.stringify(body), before, 'a refused request is left unchanged');
  assert.doesNotThrow(() => checkRequest('completion', { prompt: [2 ** 32 - 1] }));
});

test('chat messages, stream and the answer length are checked by name', () => {
  refused('chat', { messages: [] }, /field `messages`/);
  refused('completion', { prompt: 'x', stream: 'yes' }, /field `stream`/);
  refused('completion', { prompt: 'x', max_tokens: 0 }, /field `max_tokens`/);
  assert.doesNotThrow(() => checkRequest('chat', { messages: [{ role: 'user', content: 'hi' }], stream: true, max_tokens: 4 }));
});

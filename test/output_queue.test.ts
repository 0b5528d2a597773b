// The scheduler's deferred stream writes (src/engine/output_queue.ts): each entry flushed once,
// in order, a failing entry not stopping the others; a writer that ends its answer writes what it
// holds first and its queue entry then writes nothing more.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { OutputQueue } from '../src/engine/output_queue.js';

test('the output queue flushes each entry once, in order, past a failing one', () => {
  const q = new OutputQueue();
  const seen: string[] = [];
  q.add({ flushDeferred: () => seen.push('a') });
  q.add({
    flushDeferred: () => {
      throw new Error('socket gone');
    },
  });
  q.add({ flushDeferred: () => seen.push('c') });
  assert.equal(q.size, 3);
  assert.equal(q.runOne(), true);
  assert.deepEqual(seen, ['a']);
  q.flushAll();
  assert.deepEqual(seen, ['a', 'c']);
  assert.equal(q.size, 0);
  assert.equal(q.runOne(), false, 'nothing left');
  q.add({ flushDeferred: () => seen.push('d') });
  assert.equal(q.runOne(), false, 'the last entry: none left after it');
  assert.deepEqual(seen, ['a', 'c', 'd']);
});

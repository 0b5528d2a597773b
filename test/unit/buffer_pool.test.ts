import assert from 'node:assert/strict';
import test from 'node:test';
import { BufferPool } from '../../src/common/buffer_pool.js';

test('buffer pool: trimIdle keeps at most the given number of idle buffers, largest classes dropped first', () => {
  const pool = new BufferPool(1 << 20);
  const small = [1, 2, 3].map(() => pool.acquire(4096)!);
  const large = [1, 2].map(() => pool.acquire(3 * 4096)!);
  for (const b of [...small, ...large]) pool.release(b);
  assert.equal(pool.idleBytes, 3 * 4096 + 2 * 3 * 4096);
  assert.equal(pool.heldBytes, pool.idleBytes);
  pool.trimIdle(2);
  assert.equal(pool.idleBytes, 2 * 4096, 'the two large buffers and one small one go');
  // What is kept is reused without a new allocation; beyond it the pool allocates again.
  const before = pool.allocations;
  pool.acquire(4096);
  pool.acquire(4096);
  assert.equal(pool.allocations, before);
  pool.acquire(3 * 4096);
  assert.equal(pool.allocations, before + 1);
  assert.equal(pool.inUseBytes, 2 * 4096 + 3 * 4096);
});

test('buffer pool: trimIdle never touches buffers in use, and with enough room keeps everything', () => {
  const pool = new BufferPool(1 << 20);
  const live = pool.acquire(8192)!;
  const idle = pool.acquire(8192)!;
  pool.release(idle);
  pool.trimIdle(5);
  assert.equal(pool.idleBytes, 8192);
  pool.trimIdle(0);
  assert.equal(pool.idleBytes, 0);
  assert.equal(pool.inUseBytes, 8192);
  live[0] = 7; // still a valid buffer
  pool.release(live);
  assert.equal(pool.heldBytes, 8192);
});

// src/common/thread_cpu.ts: the calling thread's CPU time, without the process's other threads
// (the scheduler's step-gap metric is measured in it). Checked with CPU accounting only (a worker
// burns a fixed amount of its own CPU time while this thread waits), never with wall-clock bounds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Worker } from 'node:worker_threads';
import { threadCpuExact, threadCpuMicros } from '../../src/common/thread_cpu.js';

const processMicros = () => {
  const u = process.cpuUsage();
  return u.user + u.system;
};

test('threadCpuMicros counts this thread\'s work and not another thread\'s', async (t) => {
  if (!threadCpuExact()) {
    t.skip('no /proc/thread-self/schedstat on this system: threadCpuMicros falls back to the process CPU time');
    return;
  }
  // This thread's own work shows up.
  const a = threadCpuMicros();
  let x = 0;
  while (threadCpuMicros() - a < 20_000) x += Math.sqrt(x + 1);
  assert.ok(x > 0 && threadCpuMicros() - a >= 20_000);

  // A worker burns 200 ms of ITS OWN CPU time (measured by its own copy of the module) while this
  // thread waits for its message: the process's CPU time grows by that, this thread's barely.
  const url = new URL('../../src/common/thread_cpu.js', import.meta.url).href;
  const code = `
    const { parentPort } = require('node:worker_threads');
    import(${JSON.stringify(url)}).then(({ threadCpuMicros }) => {
      const t0 = threadCpuMicros();
      let y = 0;
      while (threadCpuMicros() - t0 < 200000) y += Math.sqrt(y + 1);
      parentPort.postMessage(threadCpuMicros() - t0 + (y > 0 ? 0 : 1));
    });`;
  const t0 = threadCpuMicros();
  const p0 = processMicros();
  const worker = new Worker(code, { eval: true });
  const burnt = await new Promise<number>((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
  });
  await worker.terminate();
  const mine = threadCpuMicros() - t0;
  const all = processMicros() - p0;
  assert.ok(burnt >= 200_000, `the worker measured its own CPU time: ${burnt} µs`);
  assert.ok(all >= 200_000, `the process's CPU time includes the worker's: ${all} µs`);
  assert.ok(mine < 100_000, `this thread's CPU time does not: ${mine} µs while the worker burnt ${burnt} µs`);
});

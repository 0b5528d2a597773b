// The controller's young-generation flag (src/common/young_gen.ts): given unless the user's
// NODE_OPTIONS sizes the heap, and V8 really keeps the young generation that small.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { controllerNodeArgs, controllerNodeOptions } from '../../src/common/young_gen.js';

test('controllerNodeArgs: a 1 MiB semi-space unless NODE_OPTIONS sizes the heap', () => {
  assert.deepEqual(controllerNodeArgs(undefined), ['--max-semi-space-size=1']);
  assert.deepEqual(controllerNodeArgs(''), ['--max-semi-space-size=1']);
  assert.deepEqual(controllerNodeArgs('--enable-source-maps --max-old-space-size=4096'), ['--max-semi-space-size=1']);
  for (const user of ['--max-semi-space-size=64', '--enable-source-maps --min-semi-space-size=4', '--max-heap-size=512']) {
    assert.deepEqual(controllerNodeArgs(user), [], user);
  }
});

test('controllerNodeOptions: the same flag as a NODE_OPTIONS value, keeping the user\'s options', () => {
  assert.equal(controllerNodeOptions(undefined), '--max-semi-space-size=1');
  assert.equal(controllerNodeOptions(''), '--max-semi-space-size=1');
  assert.equal(controllerNodeOptions(' --enable-source-maps '), '--enable-source-maps --max-semi-space-size=1');
  assert.equal(controllerNodeOptions('--max-semi-space-size=64'), undefined, 'their sizing wins: nothing to add');
});

test('with those flags the young generation does not grow when much survives (without them it does)', () => {
  // Three million live objects: V8 grows the new space after scavenges where most survive.
  const probe =
    "const v8 = require('v8'); const keep = []; for (let i = 0; i < 3e6; i++) keep.push({ i }); " +
    "process.stdout.write(String(v8.getHeapSpaceStatistics().find((s) => s.space_name === 'new_space').space_size))";
  const run = (args: string[], env: NodeJS.ProcessEnv = process.env) => Number(spawnSync(process.execPath, [...args, '-e', probe], { encoding: 'utf8', timeout: 60_000, env }).stdout);
  const MiB = 1024 * 1024;
  assert.ok(run(controllerNodeArgs(undefined)) <= 2 * MiB, 'new space (both semi-spaces) stays at most 2 MiB');
  // The by-hand and Kubernetes form: the flag in NODE_OPTIONS (node accepts it there).
  assert.ok(run([], { ...process.env, NODE_OPTIONS: controllerNodeOptions(undefined) }) <= 2 * MiB, 'the same through NODE_OPTIONS');
  assert.ok(run([], { ...process.env, NODE_OPTIONS: '' }) > 2 * MiB, 'the default grows past it (else the flag would change nothing)');
});

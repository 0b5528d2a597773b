// The controller's young-generation flag (src/common/young_gen.ts): given unless the user's
// NODE_OPTIONS sizes the heap, and V8 really starts with that semi-space.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { CONTROLLER_SEMI_SPACE_MIB, controllerNodeArgs } from '../src/common/young_gen.js';

test('controllerNodeArgs: 16 MiB semi-space unless NODE_OPTIONS sizes the heap', () => {
  assert.deepEqual(controllerNodeArgs(undefined), ['--min-semi-space-size=16']);
  assert.deepEqual(controllerNodeArgs(''), ['--min-semi-space-size=16']);
  assert.deepEqual(controllerNodeArgs('--enable-source-maps --max-old-space-size=4096'), ['--min-semi-space-size=16']);
  for (const user of ['--max-semi-space-size=64', '--enable-source-maps --max-semi-space-size=4', '--max-heap-size=512']) {
    assert.deepEqual(controllerNodeArgs(user), [], user);
  }
});

test('a node process started with those flags has a 16 MiB new space from the start', () => {
  const probe = "const v8 = require('v8'); process.stdout.write(String(v8.getHeapSpaceStatistics().find((s) => s.space_name === 'new_space').space_size))";
  const run = (args: string[]) => Number(spawnSync(process.execPath, [...args, '-e', probe], { encoding: 'utf8', timeout: 30_000 }).stdout);
  assert.equal(run(controllerNodeArgs(undefined)), CONTROLLER_SEMI_SPACE_MIB * 1024 * 1024);
  assert.ok(run([]) < CONTROLLER_SEMI_SPACE_MIB * 1024 * 1024, 'the default starts smaller (else the flag would change nothing)');
});

// Runs every compiled test file (dist/test/**/*.test.js) with node's test runner.
// Node 20's --test does not expand globs, so the files are collected here.
// Files run one at a time: many start real processes on this 2-core machine.
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';

function collect(dir) {
  const out = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...collect(p));
    else if (name.endsWith('.test.js')) out.push(p);
  }
  return out;
}

const filter = process.argv.slice(2);
let files = collect('dist/test');
if (filter.length) files = files.filter((f) => filter.some((x) => f.includes(x)));
if (!files.length) {
  console.error('no test files matched');
  process.exit(1);
}
const r = spawnSync(process.execPath, ['--test', '--test-concurrency=1', '--test-reporter=spec', ...files], {
  stdio: 'inherit',
});
process.exit(r.status ?? 1);

// Runs the compiled tests with node's test runner in two tiers, the unit tier first:
//   unit    dist/test/unit: pure functions, no child process and no socket (.dependency-cruiser.cjs
//           enforces it), so its files run concurrently, one per core.
//   system  dist/test/system: real processes and loopback servers. Its files run one at a time: each
//           starts several processes, and two such files side by side on a 2-core machine would make
//           the suite's outcome depend on the machine's load.
// Node 20's --test does not expand globs, so the files are collected here.
//
// Usage: node scripts/run-tests.mjs [--unit | --system] [--totals FILE] [substring ...]
//   --unit / --system   run one tier only (default: both, unit first)
//   --totals FILE       also write the totals and, per file, its tests' names, counts and time as
//                       JSON (to compare two runs: the same files must run the same tests)
//   substring           run only the files whose path contains one of them
// Prints each test (spec reporter), then the totals per tier and the slowest system files; exits
// non-zero when a test failed or no file matched.
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { basename, join, relative } from 'node:path';
import { spawnSync } from 'node:child_process';

const TIERS = [
  { name: 'unit', dir: 'dist/test/unit', concurrency: availableParallelism() },
  { name: 'system', dir: 'dist/test/system', concurrency: 1 },
];

function collect(dir) {
  if (!existsSync(dir)) return [];
  const out = [];
  for (const name of readdirSync(dir).sort()) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...collect(p));
    else if (name.endsWith('.test.js')) out.push(p);
  }
  return out;
}

/** test/foo.test.ts for dist/test/foo.test.js: a compiled test whose source is gone is stale build output. */
const sourceOf = (compiled) => relative('dist', compiled).replace(/\.js$/, '.ts');

const USAGE = 'usage: node scripts/run-tests.mjs [--unit | --system] [--totals FILE] [substring ...]';
const args = process.argv.slice(2);
let totalsOut = null;
const ti = args.indexOf('--totals');
if (ti >= 0) {
  totalsOut = args[ti + 1];
  if (!totalsOut || totalsOut.startsWith('--')) {
    console.error(`--totals needs a file name (${USAGE})`);
    process.exit(2);
  }
  args.splice(ti, 2);
}
const only = args.filter((a) => a === '--unit' || a === '--system').map((a) => a.slice(2));
const unknown = args.filter((a) => a.startsWith('--') && !['--unit', '--system'].includes(a));
if (unknown.length) {
  console.error(`unknown option ${unknown.join(' ')} (${USAGE})`);
  process.exit(2);
}
const filter = args.filter((a) => !a.startsWith('--'));

// A test outside the two tiers would never run: refuse it, naming where it belongs.
const misplaced = collect('dist/test').filter((f) => !TIERS.some((t) => f.startsWith(t.dir + '/')) && existsSync(sourceOf(f)));
if (misplaced.length) {
  console.error(`test files outside test/unit and test/system:\n  ${misplaced.map(sourceOf).join('\n  ')}\n` +
    'move each to test/unit (pure: no child process, no socket) or test/system (starts processes or servers)');
  process.exit(2);
}

const tmp = mkdtempSync(join(tmpdir(), 'kvc-test-run-'));
const results = [];
let stale = 0;
for (const tier of TIERS) {
  if (only.length && !only.includes(tier.name)) continue;
  let files = collect(tier.dir).filter((f) => {
    const keep = existsSync(sourceOf(f));
    if (!keep) stale++;
    return keep;
  });
  if (filter.length) files = files.filter((f) => filter.some((x) => f.includes(x)));
  if (!files.length) continue;
  console.log(`\n=== ${tier.name} tier: ${files.length} files, ${tier.concurrency} at a time\n`);
  const totalsFile = join(tmp, `${tier.name}.json`);
  const t0 = Date.now();
  const r = spawnSync(
    process.execPath,
    ['--test', `--test-concurrency=${tier.concurrency}`,
      '--test-reporter=spec', '--test-reporter-destination=stdout',
      '--test-reporter=./scripts/test-totals.mjs', `--test-reporter-destination=${totalsFile}`,
      ...files],
    { stdio: 'inherit' },
  );
  const report = existsSync(totalsFile) ? JSON.parse(readFileSync(totalsFile, 'utf8') || '{}') : {};
  results.push({ tier, files: files.length, status: r.status ?? 1, seconds: (Date.now() - t0) / 1000, report });
}
rmSync(tmp, { recursive: true, force: true });
if (stale) console.log(`\n(${stale} compiled test files in dist/ have no source any more and were not run; \`rm -rf dist && npm run build\` removes them)`);
if (!results.length) {
  console.error('no test files matched');
  process.exit(1);
}

console.log('\n=== totals');
const sum = { files: 0, tests: 0, pass: 0, fail: 0, skipped: 0, cancelled: 0, seconds: 0 };
for (const { tier, files, seconds, report } of results) {
  const s = report.summary ?? {};
  const row = { files, tests: s.tests ?? 0, pass: s.pass ?? 0, fail: s.fail ?? 0, skipped: s.skipped ?? 0, cancelled: s.cancelled ?? 0, seconds };
  for (const k of Object.keys(sum)) sum[k] += row[k];
  console.log(`${tier.name.padEnd(7)} ${row.files} files, ${row.tests} tests: ${row.pass} pass, ${row.fail} fail, ${row.skipped} skipped, ${row.cancelled} cancelled; ${seconds.toFixed(1)} s`);
}
if (results.length > 1) {
  console.log(`all     ${sum.files} files, ${sum.tests} tests: ${sum.pass} pass, ${sum.fail} fail, ${sum.skipped} skipped, ${sum.cancelled} cancelled; ${sum.seconds.toFixed(1)} s`);
}
if (totalsOut) {
  const out = Object.fromEntries(results.map(({ tier, files, seconds, status, report }) => [tier.name, { fileCount: files, seconds, status, ...report }]));
  writeFileSync(totalsOut, `${JSON.stringify(out, null, 1)}\n`);
}
const system = results.find((r) => r.tier.name === 'system');
if (system?.report.files) {
  const slow = Object.entries(system.report.files).sort((a, b) => b[1].ms - a[1].ms).slice(0, 5);
  console.log(`slowest system files: ${slow.map(([f, v]) => `${basename(f, '.test.js')} ${(v.ms / 1000).toFixed(0)} s`).join(', ')}`);
}
process.exit(results.every((r) => r.status === 0) ? 0 : 1);

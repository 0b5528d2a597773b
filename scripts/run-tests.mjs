// Runs the compiled tests with node's test runner in two tiers, the unit tier first:
//   unit    dist/test/unit: pure functions, no child process and no socket (.dependency-cruiser.cjs
//           enforces it), so its files run concurrently in one `node --test`, one per core.
//   system  dist/test/system: real processes and loopback servers. Its files run one more at a time
//           than the machine has cores, each in its own `node --test` whose report is printed whole
//           when it ends. A file whose source has a line `// run-tests: exclusive — <why>` runs
//           alone, before the others: it shapes time itself (network namespaces with delayed,
//           lossy or cut links and bounds on what happens then). Every other file must pass with
//           another beside it: its servers bind ports their own process was given (onFreePorts,
//           waitListening) and nothing in it waits a fixed time for something to happen.
// In both tiers the files start longest first, by the last run's times (dist/test/.times.json;
// the larger file first when there is none), so that no long file starts last.
// Node 20's --test does not expand globs, so the files are collected here.
//
// Usage: node scripts/run-tests.mjs [--unit | --system] [--jobs N] [--totals FILE] [substring ...]
//   --unit / --system   run one tier only (default: both, unit first)
//   --jobs N            system files at a time (default: the number of cores + 1; 1 runs them one by one)
//   --totals FILE       also write the totals and, per file, its tests' names, counts and time as
//                       JSON (to compare two runs: the same files must run the same tests)
//   substring           run only the files whose path contains one of them
// Prints each test (spec reporter), then the totals per tier and the slowest system files; exits
// non-zero when a test failed or no file matched.
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { basename, join, relative } from 'node:path';
import { spawn, spawnSync } from 'node:child_process';

const TIERS = [
  { name: 'unit', dir: 'dist/test/unit' },
  { name: 'system', dir: 'dist/test/system' },
];
const TIMES = 'dist/test/.times.json';
const EXCLUSIVE = /^\/\/ run-tests: exclusive\b/m;

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

const USAGE = 'usage: node scripts/run-tests.mjs [--unit | --system] [--jobs N] [--totals FILE] [substring ...]';
const args = process.argv.slice(2);
/** Takes `--name VALUE` out of args; undefined when absent. */
function option(name) {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  const v = args[i + 1];
  if (!v || v.startsWith('--')) {
    console.error(`${name} needs a value (${USAGE})`);
    process.exit(2);
  }
  args.splice(i, 2);
  return v;
}
const totalsOut = option('--totals') ?? null;
const jobsArg = option('--jobs');
// One more system file than cores: a system file spends part of its time waiting for the processes
// it starts (two at a time kept 1.65 of 2 cores busy), and the third fills that (npm test at load
// 37 under high CPU weight: 317 s two at a time, 294 s three).
const jobs = jobsArg === undefined ? availableParallelism() + 1 : Number(jobsArg);
if (!Number.isInteger(jobs) || jobs < 1) {
  console.error(`--jobs: expected a whole number of at least 1, got ${jobsArg} (${USAGE})`);
  process.exit(2);
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

const reporters = (totalsFile) => ['--test-reporter=spec', '--test-reporter-destination=stdout',
  '--test-reporter=./scripts/test-totals.mjs', `--test-reporter-destination=${totalsFile}`];
const readReport = (file) => (existsSync(file) ? JSON.parse(readFileSync(file, 'utf8') || '{}') : {});

// The last run's time of each file (ms, by source path): files start longest first, so that no
// long file starts last and runs alone at the end. Without a record, the larger file first.
const times = existsSync(TIMES) ? JSON.parse(readFileSync(TIMES, 'utf8')) : {};
const expected = (f) => times[sourceOf(f)] ?? statSync(f).size;
const longestFirst = (files) => [...files].sort((a, b) => expected(b) - expected(a));

/** The unit tier: one `node --test` over all its files, one per core. */
function runUnit(files, tmp) {
  console.log(`\n=== unit tier: ${files.length} files, ${availableParallelism()} at a time\n`);
  const totalsFile = join(tmp, 'unit.json');
  const r = spawnSync(process.execPath, ['--test', `--test-concurrency=${availableParallelism()}`, ...reporters(totalsFile), ...longestFirst(files)], { stdio: 'inherit' });
  const report = readReport(totalsFile);
  for (const f of files) {
    const done = Object.entries(report.files ?? {}).find(([k]) => k.endsWith(f));
    if (done) times[sourceOf(f)] = done[1].ms;
  }
  return { status: r.status ?? 1, report };
}

/** Adds one file's report (test-totals.mjs) into the tier's. */
function merge(into, report) {
  into.summary ??= {};
  into.files ??= {};
  for (const [k, v] of Object.entries(report.summary ?? {})) into.summary[k] = (into.summary[k] ?? 0) + v;
  Object.assign(into.files, report.files ?? {});
}

/**
 * The system tier: `jobs` files at a time, each in its own `node --test` (its output printed whole
 * when it ends, so files do not interleave); the exclusive ones first, each alone; longest first.
 */
async function runSystem(files, tmp) {
  const exclusive = new Set(files.filter((f) => EXCLUSIVE.test(readFileSync(sourceOf(f), 'utf8'))));
  const order = longestFirst(files).sort((a, b) => Number(exclusive.has(b)) - Number(exclusive.has(a)));
  console.log(`\n=== system tier: ${files.length} files, ${jobs} at a time (${exclusive.size} of them alone: ${[...exclusive].map((f) => basename(f, '.test.js')).join(', ') || 'none'})\n`);
  const report = {};
  let status = 0;
  let running = 0;
  let next = 0;
  const verbose = Boolean(process.env.KVC_TEST_VERBOSE);
  await new Promise((done) => {
    const start = () => {
      while (next < order.length && running < jobs) {
        const f = order[next];
        // An exclusive file waits until nothing runs and keeps the others waiting while it runs.
        if (exclusive.has(f) ? running > 0 : [...runningSet].some((r) => exclusive.has(r))) break;
        next++;
        running++;
        runningSet.add(f);
        const totalsFile = join(tmp, `system-${next}.json`);
        const t0 = Date.now();
        // Each file beside others picks its ports in a part of the range of its own (harness/ports.ts).
        const slot = exclusive.has(f) ? null : freeSlots.shift();
        const env = slot === null ? process.env : { ...process.env, KVC_TEST_PORT_SLOT: `${slot}/${jobs}` };
        const child = spawn(process.execPath, ['--test', ...reporters(totalsFile), f], { env, stdio: ['ignore', verbose ? 'inherit' : 'pipe', verbose ? 'inherit' : 'pipe'] });
        let out = '';
        child.stdout?.on('data', (d) => { out += d; });
        child.stderr?.on('data', (d) => { out += d; });
        child.on('close', (code) => {
          const seconds = (Date.now() - t0) / 1000;
          process.stdout.write(`--- ${sourceOf(f)} (${seconds.toFixed(1)} s${exclusive.has(f) ? ', alone' : ''})\n${out}`);
          if (code !== 0) status = 1;
          merge(report, readReport(totalsFile));
          times[sourceOf(f)] = seconds * 1000;
          running--;
          runningSet.delete(f);
          if (slot !== null) freeSlots.push(slot);
          if (next >= order.length && running === 0) done();
          else start();
        });
      }
    };
    const runningSet = new Set();
    const freeSlots = Array.from({ length: jobs }, (_, i) => i);
    start();
  });
  return { status, report };
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
  const t0 = Date.now();
  const { status, report } = tier.name === 'unit' ? runUnit(files, tmp) : await runSystem(files, tmp);
  results.push({ tier, files: files.length, status, seconds: (Date.now() - t0) / 1000, report });
}
rmSync(tmp, { recursive: true, force: true });
try {
  writeFileSync(TIMES, `${JSON.stringify(times, null, 1)}\n`);
} catch { /* a read-only dist/: the next run orders by size */ }
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

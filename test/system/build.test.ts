// The first minutes of a fresh clone (issue 36): `npm ci` prints no install-script warning (each
// dependency's install script is reviewed in package.json allowScripts), and `npm run build` (so
// `npm start`) is incremental: with nothing changed, a build compiles nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

function findRoot(): string {
  let d = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(d, 'package.json')) && dirname(d) !== d) d = dirname(d);
  return d;
}
const root = findRoot();
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');

test('a build with nothing changed compiles nothing (tsc -b, dist/.tsbuildinfo)', () => {
  // The first brings dist up to date (the suite's own build has done it already); the second must find nothing to do.
  const first = spawnSync(process.execPath, [tsc, '-b', 'tsconfig.json'], { cwd: root, encoding: 'utf8', timeout: 300_000 });
  assert.equal(first.status, 0, first.stdout + first.stderr);
  const again = spawnSync(process.execPath, [tsc, '-b', 'tsconfig.json', '--verbose'], { cwd: root, encoding: 'utf8', timeout: 120_000 });
  assert.equal(again.status, 0, again.stdout + again.stderr);
  assert.match(again.stdout, /Project 'tsconfig\.json' is up to date/, again.stdout);
});

const npmHasInstallScripts = spawnSync('npm', ['help', 'install-scripts'], { encoding: 'utf8', timeout: 60_000 }).status === 0;

test('every dependency install script is reviewed in allowScripts, so npm ci does not warn', { skip: npmHasInstallScripts ? false : 'this npm has no install-scripts command (npm >= 11.18)' }, () => {
  const r = spawnSync('npm', ['install-scripts', 'ls'], { cwd: root, encoding: 'utf8', timeout: 60_000 });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout + r.stderr, /No packages with unreviewed install scripts/);
});

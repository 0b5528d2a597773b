// The docs stand alone: every repository path a doc names exists, and no doc or comment cites a
// document outside the repository by section ("spec §2.4", "DESIGN §9").
//
// Scanned: docs/*.md, README.md, CONTRIBUTING.md and examples/**/*.md for paths (backticked or
// bare `src/…`, `test/…`, `harness/…`, `bench/…`, `docs/…`, `examples/…`, `scripts/…`, and
// relative markdown links; paths under a folder .gitignore declares generated are outputs of a
// command and exempt; docs/history.md names paths as they were at each entry's commit, so only its
// links are checked); those files plus every .ts/.mjs/.cjs under src/, test/, harness/, bench/ and
// scripts/ for outside citations.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative, sep } from 'node:path';
import { matchingLines, repoRoot, walkFiles as walk } from '../../harness/repo_files.js';

const root = repoRoot();

const isMd = (n: string) => n.endsWith('.md');
const docFiles = [
  ...walk(join(root, 'docs'), isMd).filter((p) => dirname(p) === join(root, 'docs')),
  join(root, 'README.md'),
  join(root, 'CONTRIBUTING.md'),
  ...walk(join(root, 'examples'), isMd),
].filter((p) => existsSync(p));

const TOP = '(?:src|test|harness|bench|docs|examples|scripts)';
// A path starts a word (not inside a URL or another path) and ends on a name character.
const PATH = new RegExp(`(?<![\\w./<>-])(${TOP}/[\\w./*<>-]*[\\w*>])`, 'g');
const LINK = /\]\(([^)\s]+)\)/g;

export interface PathRef {
  /** As written in the doc. */
  text: string;
  /** Repository-relative path (a glob when it holds `*` or a `<placeholder>`). */
  path: string;
  line: number;
}

/** The repository paths `md` names; `file` is its repository-relative name (for relative links). */
export function pathRefs(md: string, file: string): PathRef[] {
  const out: PathRef[] = [];
  const lineOf = (i: number) => md.slice(0, i).split('\n').length;
  for (const m of md.matchAll(PATH)) out.push({ text: m[1]!, path: m[1]!, line: lineOf(m.index!) });
  for (const m of md.matchAll(LINK)) {
    const target = m[1]!.split('#')[0]!;
    if (!target || /^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // anchors, http(s), mailto
    out.push({ text: m[1]!, path: normalize(join(dirname(file), target)).split(sep).join('/'), line: lineOf(m.index!) });
  }
  return out;
}

/** True when `path` (possibly with `*` or `<placeholder>` segments) names something under `base`. */
export function pathExists(base: string, path: string): boolean {
  const parts = path.replace(/\/$/, '').split('/');
  const match = (dir: string, i: number): boolean => {
    if (i === parts.length) return true;
    const seg = parts[i]!;
    if (!/[*<]/.test(seg)) return existsSync(join(dir, seg)) && (i + 1 === parts.length || statSync(join(dir, seg)).isDirectory()) && match(join(dir, seg), i + 1);
    const re = new RegExp(`^${seg.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/\*|<[^>]*>/g, '[^/]*')}$`);
    if (!existsSync(dir) || !statSync(dir).isDirectory()) return false;
    return readdirSync(dir).some((n) => re.test(n) && (i + 1 === parts.length || statSync(join(dir, n)).isDirectory()) && match(join(dir, n), i + 1));
  };
  return match(base, 0);
}

/**
 * Folders .gitignore declares as generated (e.g. `bench/.peer/`): a doc may name what a command
 * writes there, which a fresh checkout does not have yet.
 */
function generatedDirs(): string[] {
  const p = join(root, '.gitignore');
  if (!existsSync(p)) return [];
  return readFileSync(p, 'utf8')
    .split('\n')
    .map((l) => l.trim().replace(/^\//, ''))
    .filter((l) => l.endsWith('/') && !l.startsWith('#') && !/[*?[!]/.test(l));
}

export function isGenerated(path: string, dirs: string[]): boolean {
  return dirs.some((d) => path === d.slice(0, -1) || path.startsWith(d));
}

// "spec §2.4", "DESIGN §9", any "§" section sign, or a design document outside the repository.
const OUTSIDE = /§|\bDESIGN\b|\bspec\.txt\b/;

export const outsideCitations = (text: string) => matchingLines(text, OUTSIDE);

test('the checker finds paths, links and citations (it can fail)', () => {
  const md = 'See `src/common/chunk.ts`, src/nope/missing.ts and [x](../docs/none.md), https://x.org/src/a.ts.\nAs spec §2.4 says.';
  const refs = pathRefs(md, 'docs/a.md');
  assert.deepEqual(
    refs.map((r) => r.path),
    ['src/common/chunk.ts', 'src/nope/missing.ts', 'docs/none.md'],
  );
  assert.ok(pathExists(root, 'src/common/chunk.ts'));
  assert.ok(pathExists(root, 'src/kvc/worker_*.ts'));
  assert.ok(pathExists(root, 'src/cli/<name>.ts'));
  assert.ok(!pathExists(root, 'src/nope/missing.ts'));
  assert.ok(!pathExists(root, 'src/common/chunk.ts/x'));
  assert.deepEqual(outsideCitations(md), [{ line: 2, text: 'As spec §2.4 says.' }]);
  assert.ok(isGenerated('bench/.peer/peer.svg', ['bench/.peer/']) && isGenerated('bench/.peer', ['bench/.peer/']));
  assert.ok(!isGenerated('bench/peer.ts', ['bench/.peer/']));
});

test('every repository path a doc names exists', () => {
  assert.ok(docFiles.length >= 3, `found docs: ${docFiles.length}`);
  const missing: string[] = [];
  const generated = generatedDirs();
  for (const f of docFiles) {
    const rel = relative(root, f).split(sep).join('/');
    for (const r of pathRefs(readFileSync(f, 'utf8'), rel)) {
      if (rel === 'docs/history.md' && r.text === r.path) continue; // a path as it was at the entry's commit
      if (!pathExists(root, r.path) && !isGenerated(r.path, generated)) missing.push(`${rel}:${r.line}: ${r.text}${r.text !== r.path ? ` (${r.path})` : ''}`);
    }
  }
  assert.deepEqual(missing, [], `paths named in the docs that do not exist:\n${missing.join('\n')}`);
});

test('no doc or comment cites a document outside the repository', () => {
  const self = join(root, 'test', 'unit', 'docs_links.test.ts');
  const code = ['src', 'test', 'harness', 'bench', 'scripts'].flatMap((d) => walk(join(root, d), (n) => /\.(ts|mjs|cjs)$/.test(n) && !n.endsWith('.d.ts')));
  assert.ok(code.some((p) => p.endsWith(join('src', 'common', 'errors.ts'))), 'the TypeScript sources are scanned (run from the repository)');
  const found: string[] = [];
  for (const f of [...docFiles, ...code]) {
    if (f === self) continue;
    for (const c of outsideCitations(readFileSync(f, 'utf8'))) found.push(`${relative(root, f)}:${c.line}: ${c.text}`);
  }
  assert.deepEqual(found, [], `outside citations (state the rule or value instead):\n${found.join('\n')}`);
});

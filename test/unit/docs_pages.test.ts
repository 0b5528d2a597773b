// The documentation's shape: docs/README.md indexes every page; design pages describe what is, so
// development rounds ("round 7", "this round", "the pre-round tree") appear only in
// docs/history.md, and no code comment narrates them either; the architecture pictures are what
// scripts/docs-diagrams.mjs draws.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import { pathToFileURL } from 'node:url';
import { matchingLines, repoRoot, walkFiles as walk } from '../../harness/repo_files.js';

const root = repoRoot();
const docsDir = join(root, 'docs');
const pages = readdirSync(docsDir).filter((n) => n.endsWith('.md')).sort();

/** Lines that speak of a development round: "round 7", "rounds 13–15", "round-5", "this round", "pre-round". */
const ROUND = /\brounds?[ -]\d+|\bthis round\b|\bpre-round\b/i;
export const roundMentions = (text: string) => matchingLines(text, ROUND);

test('the round checker finds what it must and leaves bench repetitions alone (it can fail)', () => {
  const hits = roundMentions('a\nSince round 7 the forward\nrounds 13–15 agree\nthe round-5 runs\nbefore this round\nthe pre-round tree\nfive alternating rounds of each\nround-robin\nMath.round(2.5)');
  assert.deepEqual(hits.map((h) => h.line), [2, 3, 4, 5, 6]);
});

test('docs/README.md links every page of docs/, and every page it links exists', () => {
  const index = readFileSync(join(docsDir, 'README.md'), 'utf8');
  const linked = new Set([...index.matchAll(/\]\(([^)#\s]+\.md)(?:#[^)]*)?\)/g)].map((m) => m[1]!).filter((l) => !l.includes('/')));
  const missing = pages.filter((p) => p !== 'README.md' && !linked.has(p));
  assert.deepEqual(missing, [], 'pages of docs/ the index does not list');
  const dangling = [...linked].filter((l) => !pages.includes(l));
  assert.deepEqual(dangling, [], 'pages the index links that do not exist');
});

test('design pages, the READMEs and CONTRIBUTING.md speak of no development round (history.md does)', () => {
  const files = [
    ...pages.filter((p) => p !== 'history.md').map((p) => join(docsDir, p)),
    join(root, 'README.md'),
    join(root, 'CONTRIBUTING.md'),
    ...walk(join(root, 'examples'), (n) => n.endsWith('.md')),
  ];
  const found: string[] = [];
  for (const f of files) for (const m of roundMentions(readFileSync(f, 'utf8'))) found.push(`${relative(root, f)}:${m.line}: ${m.text}`);
  assert.deepEqual(found, [], `move these to docs/history.md or say what is:\n${found.join('\n')}`);
  assert.ok(roundMentions(readFileSync(join(docsDir, 'history.md'), 'utf8')).length > 0, 'history.md keeps the rounds');
});

test('no code comment narrates a development round', () => {
  const self = join(root, 'test', 'unit', 'docs_pages.test.ts');
  const code = ['src', 'test', 'harness', 'bench', 'scripts'].flatMap((d) => walk(join(root, d), (n) => /\.(ts|mjs|cjs)$/.test(n) && !n.endsWith('.d.ts')));
  assert.ok(code.some((p) => p.endsWith(join('src', 'common', 'errors.ts'))), 'the TypeScript sources are scanned (run from the repository)');
  const found: string[] = [];
  for (const f of code) {
    if (f === self) continue;
    for (const m of roundMentions(readFileSync(f, 'utf8'))) found.push(`${relative(root, f).split(sep).join('/')}:${m.line}: ${m.text}`);
  }
  assert.deepEqual(found, [], `comments that tell history (say why the code is as it is, or move the story to docs/history.md):\n${found.join('\n')}`);
});

test('the architecture pictures are what scripts/docs-diagrams.mjs draws', async () => {
  const script = pathToFileURL(join(root, 'scripts', 'docs-diagrams.mjs')).href;
  const { diagrams } = (await import(script)) as { diagrams(): Record<string, string> };
  const drawn = diagrams();
  assert.ok(Object.keys(drawn).length >= 3);
  const md = readFileSync(join(docsDir, 'architecture.md'), 'utf8');
  for (const [name, svg] of Object.entries(drawn)) {
    assert.ok(md.includes(`(img/${name})`), `docs/architecture.md shows img/${name}`);
    const file = join(docsDir, 'img', name);
    assert.ok(existsSync(file), `docs/img/${name} is committed (node scripts/docs-diagrams.mjs writes it)`);
    assert.equal(readFileSync(file, 'utf8'), svg, `docs/img/${name} differs from what the script draws: run node scripts/docs-diagrams.mjs`);
  }
});

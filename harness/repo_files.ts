// The repository's own files, for the tests that check docs and sources against each other:
// the root (found from the compiled file, whatever the outDir) and a walk that skips build output,
// installed packages and dot-folders.
import { existsSync, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository root: the nearest parent of this compiled file holding package.json. */
export function repoRoot(): string {
  let d = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(d, 'package.json')) && dirname(d) !== d) d = dirname(d);
  return d;
}

/** Every file under `dir` whose name `keep` accepts, in name order (node_modules, dist and dot-folders skipped). */
export function walkFiles(dir: string, keep: (name: string) => boolean): string[] {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const name of readdirSync(dir).sort()) {
    if (name === 'node_modules' || name === 'dist' || name.startsWith('.')) continue;
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...walkFiles(p, keep));
    else if (keep(name)) out.push(p);
  }
  return out;
}

/** The lines of `text` that `re` matches, numbered from 1 and trimmed. */
export function matchingLines(text: string, re: RegExp): { line: number; text: string }[] {
  return text
    .split('\n')
    .map((t, i) => ({ line: i + 1, text: t.trim() }))
    .filter((l) => re.test(l.text));
}

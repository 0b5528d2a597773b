// kvc's version: the one in package.json, read once (GET /version, `kvc --version`).
import { readFileSync } from 'node:fs';

function readVersion(): string {
  // src/common/version.ts and dist/src/common/version.js: package.json is at the repository root.
  for (const rel of ['../../package.json', '../../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(rel, import.meta.url), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'kvc' && typeof pkg.version === 'string') return pkg.version;
    } catch {
      // not at this depth
    }
  }
  throw new Error('package.json of kvc not found beside the program');
}

export const KVC_VERSION = readVersion();

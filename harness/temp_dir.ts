// A fresh private directory under the OS temporary folder, for tests and benchmarks that write
// files (cache tiers, checkpoints, logs). Kept apart from proc.ts so that unit tests can use it
// without importing the process helpers.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export function tempDir(prefix = 'kvc-test-'): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

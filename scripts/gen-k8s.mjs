// `npm run k8s`: writes the Kubernetes manifests under k8s/ from src/deploy/k8s.ts (the same plan as
// `kvc up`). Files under k8s/ that the generator no longer produces are removed.
import { mkdirSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { k8sManifests } from '../dist/src/deploy/k8s.js';

const root = 'k8s';
const files = k8sManifests();
function existing(dir) {
  let out = [];
  try {
    for (const n of readdirSync(dir)) {
      const p = join(dir, n);
      out = statSync(p).isDirectory() ? out.concat(existing(p)) : out.concat([p]);
    }
  } catch {
    /* no directory yet */
  }
  return out;
}
for (const p of existing(root)) {
  const rel = relative(root, p);
  if (!files.has(rel) && rel !== 'README.md') rmSync(p);
}
for (const [rel, text] of files) {
  const p = join(root, rel);
  mkdirSync(dirname(p), { recursive: true });
  writeFileSync(p, text);
}
console.log(`wrote ${files.size} files under ${root}/`);

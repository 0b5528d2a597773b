// `npm run bench -- <name>` runs dist/bench/<name>.js; with no name it lists the benchmarks.
import { readdirSync, existsSync } from 'node:fs';
import { spawnSync } from 'node:child_process';

const name = process.argv[2];
const available = existsSync('dist/bench')
  ? readdirSync('dist/bench').filter((f) => f.endsWith('.js') && !f.startsWith('_')).map((f) => f.slice(0, -3))
  : [];
if (!name || !available.includes(name)) {
  console.error(`usage: npm run bench -- <name>\navailable: ${available.join(', ') || '(none built)'}`);
  process.exit(name ? 1 : 0);
}
const r = spawnSync(process.execPath, ['--expose-gc', `dist/bench/${name}.js`, ...process.argv.slice(3)], {
  stdio: 'inherit',
});
process.exit(r.status ?? 1);

// Writes the generated tables of docs/configuration.md from the settings table
// (src/common/flags.ts). Run after `npm run build`: node scripts/gen-config-doc.mjs
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { regenerate } from '../dist/src/cli/flags_doc.js';

const page = fileURLToPath(new URL('../docs/configuration.md', import.meta.url));
writeFileSync(page, regenerate(readFileSync(page, 'utf8')));

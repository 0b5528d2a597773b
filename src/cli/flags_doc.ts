// The tables of docs/configuration.md derived from the settings table (src/common/flags.ts): one
// per command and one of the environment variables. `node scripts/gen-config-doc.mjs` writes them
// between their markers; a test regenerates them and compares, so the page cannot drift.
import { defaultShown, helpFor, settingsOf, SETTINGS, type CommandName, type Setting } from '../common/flags.js';

export const DOC_SECTIONS = ['engine', 'controller', 'proxy', 'up', 'keys', 'environment'] as const;
export type DocSection = (typeof DOC_SECTIONS)[number];

const cell = (s: string) => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');
const code = (s: string) => '`' + s + '`';

function commandTable(command: CommandName): string {
  const rows = ['| flag | default | environment | meaning |', '|---|---|---|---|'];
  for (const [, s] of settingsOf(command)) {
    const shown = defaultShown(s);
    const upPass = command === 'up' && s.passThrough === true;
    const def = shown === undefined ? '' : upPass ? `the engine's (${shown})` : s.defaultText !== undefined ? shown : code(shown);
    rows.push(`| ${code(s.flags!)} | ${cell(def)} | ${(s.env ?? []).map(code).join(', ')} | ${cell(helpFor(s, command))} |`);
  }
  return rows.join('\n');
}

function environmentTable(): string {
  const rows = ['| variable | flag | default | meaning |', '|---|---|---|---|'];
  for (const s of Object.values(SETTINGS) as Setting<unknown>[]) {
    if (!s.env) continue;
    const shown = defaultShown(s);
    const def = shown === undefined ? '' : s.defaultText !== undefined ? shown : code(shown);
    rows.push(`| ${s.env.map(code).join(', ')} | ${s.flags ? code(s.flags.split(' ')[0]!) : ''} | ${cell(def)} | ${cell(s.help)} |`);
  }
  return rows.join('\n');
}

export function renderSection(section: DocSection): string {
  return section === 'environment' ? environmentTable() : commandTable(section);
}

const begin = (s: DocSection) => `<!-- generated from src/common/flags.ts: ${s} -->`;
const END = '<!-- end generated -->';

/** The page with every generated section replaced; throws when a section's markers are missing. */
export function regenerate(page: string): string {
  let out = page;
  for (const s of DOC_SECTIONS) {
    const b = out.indexOf(begin(s));
    if (b < 0) throw new Error(`docs/configuration.md: marker "${begin(s)}" missing`);
    const e = out.indexOf(END, b);
    if (e < 0) throw new Error(`docs/configuration.md: "${END}" missing after "${begin(s)}"`);
    out = out.slice(0, b) + begin(s) + '\n' + renderSection(s) + '\n' + out.slice(e);
  }
  return out;
}

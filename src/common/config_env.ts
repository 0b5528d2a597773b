// Cache keys set by environment variables, as LMCache reads them in containers: every key of the
// cache YAML (kvc's names and LMCache's) is also LMCACHE_<KEY> or KVC_<KEY> (upper case). Values are
// read by the key's type: booleans as true/false (also 1/0, yes/no, on/off), numbers, lists as
// comma-separated items ("7300" or "7300,7301"), anything else as text.
//
// The rule with a configuration file (docs/configuration.md): a variable and the file may both
// set a key only to the same value; different values stop start-up naming both (LMCache ignores
// every variable once a file is given, which would drop the variable's setting without a word).
// A key only the variable sets is applied, and each variable applied is logged once.
import { isDeepStrictEqual } from 'node:util';
import type { z } from 'zod';
import { suggest } from './did_you_mean.js';
import { prefixedVariables } from './environment.js';
import { CACHE_KEY_ALIASES, CACHE_KEYS_OFF_ONLY, LIST_PER_RANK, LMCACHE_NAMES } from './config_aliases.js';
import { parseBoolean, parseNumber } from './parse_value.js';

export interface EnvKeys {
  /** key (as the variable names it, kvc's or LMCache's) → value. */
  doc: Record<string, unknown>;
  /** key → the variable that set it. */
  variables: Record<string, string>;
}

type Kind = 'boolean' | 'number' | 'list' | 'numbers' | 'text';

/** How a key's value is written in a variable, from what its schema (or LMCache's off values) accepts. */
function kindOf(name: string, shape: Record<string, z.ZodType>): Kind {
  if (LIST_PER_RANK.has(name)) return 'numbers';
  const off = CACHE_KEYS_OFF_ONLY[name];
  if (off) return off.off.some((v) => typeof v === 'boolean') ? 'boolean' : off.off.some((v) => typeof v === 'number') ? 'numbers' : 'text';
  const schema = shape[CACHE_KEY_ALIASES[name] ?? name];
  if (!schema) return 'text';
  if (schema.safeParse(true).success) return 'boolean';
  if (schema.safeParse(1).success || schema.safeParse(1.5).success || schema.safeParse(1 << 20).success) return 'number';
  if (schema.safeParse(['tcp']).success) return 'list';
  return 'text';
}

function convert(variable: string, raw: string, kind: Kind): unknown {
  switch (kind) {
    case 'boolean':
      return parseBoolean(variable, raw);
    case 'number':
      return parseNumber(variable, raw);
    case 'numbers': {
      const items = raw.split(',').map((x) => parseNumber(variable, x, { integer: true }));
      return items.length === 1 ? items[0] : items;
    }
    case 'list':
      return raw.split(',').map((x) => x.trim()).filter((x) => x !== '');
    case 'text':
      return raw;
  }
}

/** The cache keys the environment sets; throws naming the variable for a bad or unknown one. */
export function cacheKeysFromEnv(env: NodeJS.ProcessEnv, shape: Record<string, z.ZodType>): EnvKeys {
  const names = [...Object.keys(shape), ...LMCACHE_NAMES];
  const doc: Record<string, unknown> = {};
  const variables: Record<string, string> = {};
  for (const { variable, prefix, name, value } of prefixedVariables(env).sort((a, b) => a.variable.localeCompare(b.variable))) {
    if (!names.includes(name)) {
      const near = suggest(name, names);
      // LMCACHE_ is LMCache's namespace: every variable in it is meant as a cache key. KVC_ is also
      // used by tools around kvc (tests, scripts); only a near miss of a key is surely a typo.
      if (prefix === 'LMCACHE_' || near !== null) {
        throw new Error(`${variable}: not a cache key${near ? ` (did you mean ${prefix}${near.toUpperCase()}?)` : ''}; the keys, each settable as LMCACHE_<KEY> or KVC_<KEY>, are listed in docs/configuration.md`);
      }
      continue;
    }
    const v = convert(variable, value, kindOf(name, shape));
    if (name in doc) {
      if (!isDeepStrictEqual(doc[name], v)) throw new Error(`${variables[name]} and ${variable} set cache key "${name}" to different values (${JSON.stringify(env[variables[name]!])} and ${JSON.stringify(value)}); set one`);
      continue;
    }
    doc[name] = v;
    variables[name] = variable;
  }
  return { doc, variables };
}

/**
 * The file's document with the environment's keys added: a key both set (under any of its names)
 * must have the same value. `canonical` maps a name to the kvc key it sets.
 */
export function mergeEnvKeys(file: Record<string, unknown>, fromEnv: EnvKeys, source: string, canonical: (name: string) => string): { doc: Record<string, unknown>; notes: string[] } {
  const doc = { ...file };
  const notes: string[] = [];
  const fileKeys = new Map(Object.keys(file).map((k) => [canonical(k), k]));
  for (const [name, v] of Object.entries(fromEnv.doc)) {
    const variable = fromEnv.variables[name]!;
    const inFile = fileKeys.get(canonical(name));
    if (inFile !== undefined) {
      if (!isDeepStrictEqual(file[inFile], v)) {
        throw new Error(`${variable}=${JSON.stringify(v)} and key "${inFile}" of ${source} (${JSON.stringify(file[inFile])}) set "${canonical(name)}" differently; the file and the environment may both set a key only to the same value`);
      }
      continue;
    }
    doc[name] = v;
    notes.push(`${variable} read as cache key "${name}"`);
  }
  return { doc, notes };
}

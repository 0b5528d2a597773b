// The environment variables of kvc, read in this one place: each is declared in the settings table
// (src/common/flags.ts, `env`) and parsed by that setting's parser. `environment()` reads the
// process's environment once; the `kvc` command checks it before anything starts (a variable with
// a value nobody understands is refused, naming the variable), and components are handed the
// parsed values. `readEnvironment(env)` parses another environment (tests, child processes).
import { SETTINGS, type Setting, type SettingName, type ValueOf } from './flags.js';

/** Credentials: an empty value is refused rather than read as "unset" (never silently open). */
const EMPTY_IS_ERROR: ReadonlySet<SettingName> = new Set(['apiKey', 'deploymentSecret']);

export interface Environment {
  /** The setting's value from its variable, its default when unset; throws the variable's error when its value is bad. */
  get<K extends SettingName>(name: K): ValueOf<K> | undefined;
  /** Whether one of the setting's variables is set, and which. */
  source(name: SettingName): string | undefined;
  /** Every problem found, one message each naming the variable. */
  readonly errors: readonly string[];
  /** The environment it was read from (what child processes inherit). */
  readonly raw: NodeJS.ProcessEnv;
}

export function readEnvironment(env: NodeJS.ProcessEnv = process.env): Environment {
  const values = new Map<SettingName, unknown>();
  const sources = new Map<SettingName, string>();
  const problems = new Map<SettingName, string>();
  for (const [name, s] of Object.entries(SETTINGS) as [SettingName, Setting<unknown>][]) {
    if (!s.env) continue;
    const set = s.env.filter((v) => env[v] !== undefined && (env[v] !== '' || EMPTY_IS_ERROR.has(name)));
    if (set.length === 0) {
      if (s.default !== undefined) values.set(name, s.default);
      continue;
    }
    const distinct = new Set(set.map((v) => env[v]));
    if (distinct.size > 1) {
      problems.set(name, `${set.join(' and ')} are set to different values (${set.map((v) => `${v}=${JSON.stringify(redact(name, env[v]!))}`).join(', ')}); set one, or both to the same value`);
      continue;
    }
    const variable = set[0]!;
    const raw = env[variable]!;
    try {
      if (raw.trim() === '' && EMPTY_IS_ERROR.has(name)) throw new Error(`${variable}: expected a non-empty value`);
      values.set(name, s.parse ? s.parse(raw, variable) : raw);
      sources.set(name, variable);
    } catch (e) {
      problems.set(name, (e as Error).message);
    }
  }
  return {
    get<K extends SettingName>(name: K): ValueOf<K> | undefined {
      const p = problems.get(name);
      if (p !== undefined) throw new Error(p);
      return values.get(name) as ValueOf<K> | undefined;
    },
    source: (name) => sources.get(name),
    errors: [...problems.values()],
    raw: env,
  };
}

function redact(name: SettingName, v: string): string {
  return EMPTY_IS_ERROR.has(name) ? '***' : v;
}

let processEnvironment: Environment | undefined;

/** The process's environment, read once. */
export function environment(): Environment {
  processEnvironment ??= readEnvironment(process.env);
  return processEnvironment;
}

/** The parsed environment of `env`: the process's own (read once) when it is process.env. */
export function environmentOf(env: NodeJS.ProcessEnv | undefined): Environment {
  return env === undefined || env === process.env ? environment() : readEnvironment(env);
}

/** Prefixes of the variables that set cache keys (LMCache's, and kvc's own). */
export const CACHE_KEY_PREFIXES = ['LMCACHE_', 'KVC_'] as const;

/**
 * The LMCACHE_* and KVC_* variables that are not settings of the table (those name cache keys,
 * src/common/config_env.ts): [variable, prefix, the rest in lower case]. Only read here.
 */
export function prefixedVariables(env: NodeJS.ProcessEnv): { variable: string; prefix: string; name: string; value: string }[] {
  const declared = new Set((Object.values(SETTINGS) as Setting<unknown>[]).flatMap((s) => s.env ?? []));
  const out: { variable: string; prefix: string; name: string; value: string }[] = [];
  for (const [variable, value] of Object.entries(env)) {
    if (value === undefined || declared.has(variable)) continue;
    const prefix = CACHE_KEY_PREFIXES.find((p) => variable.startsWith(p));
    if (prefix) out.push({ variable, prefix, name: variable.slice(prefix.length).toLowerCase(), value });
  }
  return out;
}

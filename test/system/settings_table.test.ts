// The settings table (src/common/flags.ts) is the one declaration of every flag and environment
// variable: the commands' options, the engine's defaults, `kvc up`'s pass-through and the tables
// of docs/configuration.md are derived from it, numbers are parsed by one helper and environment
// variables are read only in src/common/environment.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { defaultShown, longFlag, PASS_THROUGH, passThroughArgs, settingsOf, SETTINGS, type CommandName, type Setting } from '../../src/common/flags.js';
import { readEnvironment } from '../../src/common/environment.js';
import { parseNumber, parseSeconds } from '../../src/common/parse_value.js';
import { regenerate } from '../../src/cli/flags_doc.js';
import { resolveEngineSettings } from '../../src/engine/settings.js';
import { engineArgs, makePlan } from '../../src/deploy/plan.js';
import { cacheConfigSchema } from '../../src/common/config.js';
import { cliProgram, checkArgs } from '../../harness/cli_args.js';

const ROOT = process.cwd();
const COMMANDS: CommandName[] = ['engine', 'controller', 'proxy', 'up', 'keys'];

test('every command has exactly the options the table gives it, with the table defaults', () => {
  const program = cliProgram();
  for (const c of COMMANDS) {
    const sub = program.commands.find((x) => x.name() === c)!;
    const longs = sub.options.map((o) => o.long).filter((l) => l !== '--help');
    const expected = settingsOf(c).map(([, s]) => longFlag(s));
    assert.deepEqual(longs, expected, `kvc ${c}`);
    for (const [, s] of settingsOf(c)) {
      const o = sub.options.find((x) => x.long === longFlag(s))!;
      const upPass = c === 'up' && s.passThrough;
      if (s.default !== undefined && !upPass) assert.deepEqual(o.defaultValue, s.default, `kvc ${c} ${o.long} default`);
      if (defaultShown(s) !== undefined) assert.match(o.description + (o.defaultValueDescription ?? ''), /default|\S/, `kvc ${c} ${o.long}`);
    }
  }
});

test('the engine settings take their defaults from the table', () => {
  const s = resolveEngineSettings({});
  assert.equal(s.maxNumSeqs, SETTINGS.maxNumSeqs.default);
  assert.equal(s.maxNumBatchedTokens, SETTINGS.maxNumBatchedTokens.default);
  assert.equal(s.stepTargetMs, SETTINGS.stepTargetMs.default);
  assert.equal(s.maxQueue, SETTINGS.maxQueueLen.default);
  assert.equal(s.modelSpec, SETTINGS.model.default);
  assert.equal(s.host, SETTINGS.host.default);
  const cache = cacheConfigSchema.parse({});
  assert.equal(cache.chunk_size, SETTINGS.chunkSize.default);
  assert.equal(cache.max_local_cpu_size, SETTINGS.maxLocalCpuSize.default);
});

test('kvc up passes every pass-through setting to its engines as a flag kvc engine parses back to the same value', () => {
  const values = { servedModelName: 'm', maxModelLen: 512, dtype: 'float32', kvCacheDtype: 'float16', maxNumSeqs: 4, maxNumBatchedTokens: 128, stepTargetMs: 0, maxQueueLen: 7, kvCacheMemory: 0.25 };
  assert.deepEqual(Object.keys(values).sort(), [...PASS_THROUGH].sort(), 'the test covers every pass-through setting');
  const plan = makePlan({ prefillers: 1, decoders: 1, model: 'builtin:tiny', portOffset: 0, controller: true, host: '127.0.0.1', engine: values, machineCpus: [0, 1] });
  const args = engineArgs(plan, plan.engines[0]!, '{}');
  const given = checkArgs(cliProgram(), args, 'engineArgs');
  for (const [name, v] of Object.entries(values)) {
    const s = SETTINGS[name as keyof typeof SETTINGS] as Setting<unknown>;
    const raw = given.get(longFlag(s)!);
    assert.ok(typeof raw === 'string', `${longFlag(s)} passed`);
    assert.deepEqual(s.parse ? s.parse(raw, longFlag(s)!) : raw, v, longFlag(s));
  }
  assert.deepEqual(passThroughArgs({}), []);
  // And `kvc up` offers each of them, with the engine's default named in its help.
  const up = cliProgram().commands.find((c) => c.name() === 'up')!;
  for (const name of PASS_THROUGH) {
    const o = up.options.find((x) => x.long === longFlag(SETTINGS[name] as Setting<unknown>));
    assert.ok(o, `kvc up ${name}`);
    assert.match(o.description, /^engines: /);
    assert.equal(o.defaultValue, undefined, 'not passed unless given');
  }
});

test('docs/configuration.md holds the tables the settings table generates', () => {
  const page = readFileSync(join(ROOT, 'docs/configuration.md'), 'utf8');
  assert.equal(page, regenerate(page), 'run `npm run build && node scripts/gen-config-doc.mjs`');
});

test('numbers are parsed by one helper, with the flag and the value in the message', () => {
  assert.equal(parseNumber('--n', ' 12 ', { integer: true, min: 1 }), 12);
  assert.throws(() => parseNumber('--n', '1.5', { integer: true, min: 0 }), /^Error: --n: expected an integer >= 0, found "1.5"$/);
  assert.throws(() => parseNumber('--n', '0', { integer: true, min: 1, max: 9 }), /^Error: --n: expected an integer between 1 and 9, found "0"$/);
  assert.throws(() => parseNumber('--g', '0', { min: 0, minExclusive: true, unit: 'GiB' }), /^Error: --g: expected a number of GiB > 0, found "0"$/);
  assert.throws(() => parseNumber('--g', '', {}), /found ""/);
  assert.throws(() => parseNumber('--g', '1e400', {}), /found "1e400"/);
  assert.equal(parseSeconds('--t', '1.5'), 1500);
  assert.throws(() => SETTINGS.maxNumSeqs.parse!('0', '--max-num-seqs'), /--max-num-seqs: expected an integer >= 1, found "0"/);
});

test('environment variables: parsed by their setting, two names of one setting must agree, empty credentials refused', () => {
  assert.equal(readEnvironment({ PYTHONHASHSEED: '7' }).get('hashSeed'), 7n);
  assert.equal(readEnvironment({}).get('hashSeed'), 0n);
  assert.equal(readEnvironment({ VLLM_API_KEY: 'k1' }).get('apiKey'), 'k1');
  assert.equal(readEnvironment({ VLLM_API_KEY: 'k1', KVC_API_KEY: 'k1' }).get('apiKey'), 'k1');
  const both = readEnvironment({ VLLM_API_KEY: 'k1', KVC_API_KEY: 'k2' });
  assert.throws(() => both.get('apiKey'), /KVC_API_KEY and VLLM_API_KEY are set to different values/);
  assert.ok(!both.errors.join().includes('k2'), 'the keys are not printed');
  assert.throws(() => readEnvironment({ KVC_API_KEY: ' ' }).get('apiKey'), /KVC_API_KEY: expected a non-empty value/);
  assert.equal(readEnvironment({ KVC_LOG_LEVEL: '' }).get('logLevel'), 'info', 'empty is unset');
  assert.deepEqual(readEnvironment({ KVC_GEMM: 'gpu', KVC_LOG_FORMAT: 'xml' }).errors.length, 2);
});

/** Every .ts file under a directory. */
function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    return statSync(p).isDirectory() ? sources(p) : p.endsWith('.ts') ? [p] : [];
  });
}

test('environment variables are read only in src/common/environment.ts, and each is declared in the table', () => {
  const declared = new Set((Object.values(SETTINGS) as Setting<unknown>[]).flatMap((s) => s.env ?? []));
  const readers: string[] = [];
  for (const f of sources(join(ROOT, 'src'))) {
    if (f.endsWith('environment.ts')) continue;
    const text = readFileSync(f, 'utf8');
    // A read: env.NAME or env['NAME'] not followed by an assignment (writing a child's environment is fine).
    for (const m of text.matchAll(/\benv(?:\.|\[')([A-Z][A-Z0-9_]+)\b'?\]?(?!\s*=[^=])/g)) {
      if (m[1] === 'NODE_OPTIONS') continue; // passed on to child processes as it is
      readers.push(`${f.slice(ROOT.length + 1)}: ${m[0]}`);
    }
  }
  assert.deepEqual(readers, []);
  for (const v of ['KVC_API_KEY', 'VLLM_API_KEY', 'KVC_CONFIG_FILE', 'LMCACHE_CONFIG_FILE', 'PYTHONHASHSEED', 'KVC_WASM_FMA', 'KVC_GEMM', 'KVC_LOG_LEVEL']) assert.ok(declared.has(v), v);
});

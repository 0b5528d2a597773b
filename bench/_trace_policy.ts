// `node dist/bench/_trace_policy.js [--trace FILE|generated:NAME] [--sample-conversations F]
// [--window S:C] [--block-tokens B] [--tier-fraction F] [--prefillers N] [--decoders N] [--seed S]
// [--seeds N]`: the same window as `npm run bench -- trace` with the same options, replayed through
// the tier model (harness/tier_model.ts) with the prefiller always keeping a disaggregated prompt
// and with the keeper chosen by room (docs/storage.md "Who keeps a transferred chunk"), each
// against the pooled LRU bound: reuse ÷ the bound's reuse, and the chunks stored per instance.
// With --seeds N it repeats for seeds S..S+N−1 (another sample of conversations, and another
// generated trace) and prints the mean and range: one window's figure moves by ±0.1 with the seed.
import { applyWindow, distinctChunks, mapRequests, parseTrace, parseWindow, sampleConversations, sendTimes, simulate } from '../harness/trace_model.js';
import { modelTiers, type KeeperPolicy } from '../harness/tier_model.js';
import { BUILTIN_MODELS } from '../src/engine/model/formats/builtin.js';
import { DEFAULT_TRACE, loadTrace, TRACE_DEFAULTS } from './_trace_source.js';

const DEFAULTS: Record<string, string> = {
  '--trace': DEFAULT_TRACE,
  '--sample-conversations': String(TRACE_DEFAULTS.sample), '--window': TRACE_DEFAULTS.window, '--block-tokens': String(TRACE_DEFAULTS.blockTokens),
  '--tier-fraction': String(TRACE_DEFAULTS.tierFraction), '--prefillers': '2', '--decoders': '2', '--seed': '1', '--seeds': '1',
};
const KEEPERS: KeeperPolicy[] = ['prefiller', 'room'];

function main(): void {
  const o = { ...DEFAULTS };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    if (!(argv[i]! in DEFAULTS)) throw new Error(`${argv[i]}: unknown option (expected one of ${Object.keys(DEFAULTS).join(', ')})`);
    if (argv[i + 1] === undefined) throw new Error(`${argv[i]}: expected a value`);
    o[argv[i]!] = argv[i + 1]!;
  }
  const num = (f: string, ok: (n: number) => boolean, what: string) => {
    const n = Number(o[f]);
    if (o[f]!.trim() === '' || !Number.isFinite(n) || !ok(n)) throw new Error(`${f}: expected ${what}, found "${o[f]}"`);
    return n;
  };
  const int = (n: number) => Number.isInteger(n);
  const block = num('--block-tokens', (n) => int(n) && n >= 1 && n <= 512, 'an integer 1..512');
  const prefillers = num('--prefillers', (n) => int(n) && n >= 0 && n <= 8, 'an integer 0..8');
  const decoders = num('--decoders', (n) => int(n) && n >= 1 && n <= 8, 'an integer 1..8');
  const sample = num('--sample-conversations', (n) => n > 0 && n <= 1, 'a fraction in (0, 1]');
  const fraction = num('--tier-fraction', (n) => n > 0 && n <= 10, 'a fraction > 0');
  const first = num('--seed', (n) => int(n) && n >= 0, 'an integer >= 0');
  const seeds = num('--seeds', (n) => int(n) && n >= 1 && n <= 100, 'an integer 1..100');
  const window = parseWindow(o['--window']!);
  const engines = prefillers + decoders;
  const out = new Map<KeeperPolicy, number[]>(KEEPERS.map((k) => [k, []]));
  for (let seed = first; seed < first + seeds; seed++) {
    const src = loadTrace(o['--trace']!, seed);
    const sampled = sampleConversations(parseTrace(src.text, src.file), sample, seed);
    const win = applyWindow(sampled, window);
    // The bench's own mapping: the built-in model's context less 16 output tokens.
    const reqs = mapRequests(win, sendTimes(win, 1), { blockTokens: block, maxPromptTokens: BUILTIN_MODELS.tiny!.maxPositionEmbeddings - 16, maxOutputTokens: 16 });
    const perTier = Math.max(1, Math.ceil((fraction * distinctChunks(reqs)) / engines));
    const bound = simulate(reqs, perTier * engines);
    const reuse = (c: number, s: number) => (1 - c / s) / (1 - bound.computed / bound.sent);
    console.log(`${src.file} seed ${seed}: ${reqs.length} requests, ${distinctChunks(reqs)} distinct chunks, ${prefillers}P${decoders}D tiers of ${perTier} chunks; pooled LRU computed/sent ${(bound.computed / bound.sent).toFixed(3)}`);
    for (const keeper of KEEPERS) {
      // 256 tokens of local prefill (kv-aware's default) in chunks of this size.
      const m = modelTiers(reqs, { prefillers, decoders, perTier, maxLocalChunks: Math.floor(256 / block), keeper });
      out.get(keeper)!.push(reuse(m.computed, m.sent));
      console.log(`  keeper ${keeper.padEnd(9)}: computed/sent ${(m.computed / m.sent).toFixed(3)}, reuse ${out.get(keeper)!.at(-1)!.toFixed(3)} x the pooled bound's; chunks stored per instance ${m.stored.join(' ')}`);
    }
  }
  const mean = (a: number[]) => a.reduce((x, y) => x + y, 0) / a.length;
  const r3 = (v: number) => Math.round(v * 1000) / 1000;
  if (seeds > 1) for (const [k, a] of out) console.log(`keeper ${k.padEnd(9)} over ${seeds} seeds: reuse ${mean(a).toFixed(3)} x the pooled bound's (${Math.min(...a).toFixed(3)}–${Math.max(...a).toFixed(3)})`);
  const p = out.get('prefiller')!;
  const r = out.get('room')!;
  console.log(JSON.stringify({ bench: 'trace_policy', seeds, prefiller_keeps: r3(mean(p)), keeper_by_room: r3(mean(r)), keeper_by_room_min: r3(Math.min(...r)), keeper_by_room_max: r3(Math.max(...r)) }));
}

try {
  main();
} catch (e) {
  console.error(`trace policy: ${(e as Error).message}`);
  process.exit(1);
}

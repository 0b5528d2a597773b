// `node dist/bench/_trace_policy.js [--trace FILE] [--sample-conversations F] [--window S:C]
// [--block-tokens B] [--tier-fraction F] [--prefillers N] [--decoders N] [--seed S]`: the same
// window as `npm run bench -- trace` with the same options, replayed through the tier model
// (harness/tier_model.ts) with the prefiller always keeping a disaggregated prompt and with the
// keeper chosen by room (docs/storage.md "Who keeps a transferred chunk"), each against the pooled
// LRU bound: reuse ÷ the bound's reuse, and the chunks stored per instance.
import { applyWindow, distinctChunks, mapRequests, parseTrace, parseWindow, sampleConversations, sendTimes, simulate } from '../harness/trace_model.js';
import { modelTiers, type KeeperPolicy } from '../harness/tier_model.js';
import { BUILTIN_MODELS } from '../src/engine/model/formats/builtin.js';
import { DEFAULT_TRACE, loadTrace } from './_trace_source.js';

const DEFAULTS: Record<string, string> = {
  '--trace': DEFAULT_TRACE,
  '--sample-conversations': '0.05', '--window': '0:200', '--block-tokens': '64', '--tier-fraction': '0.2', '--prefillers': '2', '--decoders': '2', '--seed': '1',
};

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
  const seed = num('--seed', (n) => int(n) && n >= 0, 'an integer >= 0');
  const src = loadTrace(o['--trace']!, seed);
  const all = parseTrace(src.text, src.file);
  const sampled = sampleConversations(all, num('--sample-conversations', (n) => n > 0 && n <= 1, 'a fraction in (0, 1]'), seed);
  const window = applyWindow(sampled, parseWindow(o['--window']!));
  // The bench's own mapping: the built-in model's context less 16 output tokens.
  const reqs = mapRequests(window, sendTimes(window, 1), { blockTokens: block, maxPromptTokens: BUILTIN_MODELS.tiny!.maxPositionEmbeddings - 16, maxOutputTokens: 16 });
  const engines = prefillers + decoders;
  const perTier = Math.max(1, Math.ceil((num('--tier-fraction', (n) => n > 0 && n <= 10, 'a fraction > 0') * distinctChunks(reqs)) / engines));
  const bound = simulate(reqs, perTier * engines);
  const reuse = (c: number, s: number) => (1 - c / s) / (1 - bound.computed / bound.sent);
  console.log(`${src.file}: ${reqs.length} requests, ${distinctChunks(reqs)} distinct chunks, ${prefillers}P${decoders}D tiers of ${perTier} chunks; pooled LRU computed/sent ${(bound.computed / bound.sent).toFixed(3)}`);
  const out: Record<string, number> = {};
  for (const keeper of ['prefiller', 'room'] as KeeperPolicy[]) {
    // 256 tokens of local prefill (kv-aware's default) in chunks of this size.
    const m = modelTiers(reqs, { prefillers, decoders, perTier, maxLocalChunks: Math.floor(256 / block), keeper });
    out[keeper] = reuse(m.computed, m.sent);
    console.log(`keeper ${keeper.padEnd(9)}: computed/sent ${(m.computed / m.sent).toFixed(3)}, reuse ${out[keeper]!.toFixed(3)} x the pooled bound's; chunks stored per instance ${m.stored.join(' ')}`);
  }
  console.log(JSON.stringify({ bench: 'trace_policy', requests: reqs.length, prefiller_keeps: Math.round(out.prefiller! * 1000) / 1000, keeper_by_room: Math.round(out.room! * 1000) / 1000 }));
}

try {
  main();
} catch (e) {
  console.error(`trace policy: ${(e as Error).message}`);
  process.exit(1);
}

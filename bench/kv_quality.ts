// `npm run bench -- kv_quality`: what each KV representation costs in output quality, against f32
// KV, on the trained stories15M model (src/engine/model/formats/stories.ts: `npm run model --
// stories15m` fetches it; 40-token story openings), the built-in tiny model and the random 156M
// model (bench/_peer_setup.ts) — the random ones' near-flat logits flip on tiny perturbations. A representation
// is an engine KV dtype (--kv-cache-dtype: every dtype the engine holds) alone, or with a tier
// codec (serde: every codec besides naive; 32- and 16-bit dtypes only, 8-bit chunks are stored as
// held) that the prompt's KV went through, as a cache hit from
// that tier delivers it. Per representation: bytes per token and their share of f32's, top-1
// agreement and mean/max KL of the next-token distributions, and greedy agreement over
// 200-token continuations (bench/_kv_quality.ts says how each is measured); and where the flips
// are: top-1 per class of the reference's top-1 − top-2 gap, the representation's perturbation of
// the reference's choice, and the models' K channel spread (whether per-channel K would pay).
// Target (issue 33): an 8-bit choice at ≤ 0.27 × f32 bytes per token with top-1 ≥ 99 % and mean
// KL ≤ 0.01, judged on the trained model.
// Options: --models stories,tiny,big (default all three; stories only when its GGUF is already in
// the cache, else it says how to get it; naming it fetches it), --prompts N (default 24), --group N (prompts decoded
// together in one batch, default 6; it bounds the reference's kept logits), --configs LIST (the
// representations to measure, default all).
// Writes bench-results/kv_quality/{top1,kl}.svg; last line {"bench":"kv_quality",…}.
import { join } from 'node:path';
import { Command, InvalidArgumentError, Option } from 'commander';
import { Codec } from '../src/common/chunk.js';
import { CODECS, codecByName, codecName } from '../src/common/chunk_codec.js';
import { DType, DTYPE_NAMES, isEightBit } from '../src/common/dtype.js';
import { ensureBuiltinModel } from '../src/engine/model/formats/builtin.js';
import { loadGguf } from '../src/engine/model/formats/gguf_model.js';
import { ensureStories15m, stories15mPath } from '../src/engine/model/formats/stories.js';
import { existsSync } from 'node:fs';
import { LlamaModel } from '../src/engine/model/model.js';
import { bytesPerToken, channelSpread, configName, CONTINUATION, kvcReference, qualityPrompts, referenceMargins, runKvc, storyPrompts, Tally, type ChannelSpread, type KvcConfig, type QualityFigures } from './_kv_quality.js';
import { bigModelDir } from './_peer_setup.js';
import { resultsDir, writeBarsSvg, type BarRow } from './_plot.js';

const MODELS = ['stories', 'tiny', 'big'] as const;
type ModelName = (typeof MODELS)[number];
const MODEL_LABEL: Record<ModelName, string> = { stories: 'trained stories15M', tiny: 'built-in tiny', big: 'random 156M' };
/** The model the 8-bit target is judged on: the trained one, else (not measured) the 156M one. */
const TARGET_MODELS: ModelName[] = ['stories', 'big'];

interface Options {
  models: ModelName[] | undefined;
  prompts: number;
  group: number;
  configs: string[] | undefined;
}

function parseOptions(argv: string[]): Options {
  const int = (lo: number, hi: number) => (v: string) => {
    if (!/^[0-9]+$/.test(v) || Number(v) < lo || Number(v) > hi) throw new InvalidArgumentError(`expected an integer from ${lo} to ${hi}, got "${v}"`);
    return Number(v);
  };
  const models = (v: string): ModelName[] => {
    const list = v.split(',').map((x) => x.trim());
    for (const x of list) if (!(MODELS as readonly string[]).includes(x)) throw new InvalidArgumentError(`"${x}" is not a model; expected a comma-separated subset of ${MODELS.join(', ')}`);
    return list as ModelName[];
  };
  const names = configs().map((c) => configName(c, codecName));
  const configList = (v: string): string[] => {
    const list = v.split(',').map((x) => x.trim());
    for (const x of list) if (!names.includes(x)) throw new InvalidArgumentError(`"${x}" is not a representation; expected a comma-separated subset of ${names.join(', ')}`);
    return list;
  };
  return new Command('kv_quality')
    .description('output quality of each KV dtype and tier codec against f32 KV')
    .addOption(new Option('--models <list>', `models, comma-separated: ${MODELS.join(', ')} (default all; stories when its GGUF is cached)`).argParser(models))
    .addOption(new Option('--prompts <n>', 'prompts per model').argParser(int(1, 1000)).default(24))
    .addOption(new Option('--group <n>', 'prompts decoded together in one batch').argParser(int(1, 64)).default(6))
    .addOption(new Option('--configs <list>', `representations to measure, comma-separated (default all): ${names.join(', ')}`).argParser(configList))
    .parse(argv, { from: 'user' })
    .opts<Options>();
}

/** Every engine KV dtype alone, and the 32/16-bit ones with every compressing codec (8-bit chunks are stored as held); f32 alone is the reference. */
function configs(): KvcConfig[] {
  const dtypes = Object.keys(DTYPE_NAMES).map(Number) as DType[];
  const out: KvcConfig[] = [];
  for (const dtype of dtypes) {
    for (const name of CODECS) {
      if (dtype === DType.f32 && name === 'naive') continue;
      if (name !== 'naive' && isEightBit(dtype)) continue;
      out.push({ dtype, codec: codecByName(name) });
    }
  }
  return out;
}

interface Row extends QualityFigures {
  config: string;
  bytesPerToken: number;
  bytesRatio: number;
  seconds: number;
}

interface Measured {
  rows: Row[];
  skipped: Record<string, string>;
  /** The reference's top-1 − top-2 logit gap: median, and share of positions under 0.05. */
  margin: { medianGap: number; under005: number };
  spread: ChannelSpread;
}

async function measure(model: ModelName, promptCount: number, group: number, only: string[] | undefined): Promise<Measured> {
  let m: LlamaModel;
  let prompts: number[][];
  if (model === 'stories') {
    const { model: sm, tokenizer } = await loadGguf(await ensureStories15m(process.env, (s) => console.log(s)));
    m = sm;
    prompts = storyPrompts(promptCount, (t) => tokenizer.encode(t, { addBos: true }));
  } else {
    m = await LlamaModel.load(model === 'tiny' ? await ensureBuiltinModel('tiny') : await bigModelDir());
    prompts = qualityPrompts(promptCount, model === 'tiny' ? 7 : 11);
  }
  const cfgs = configs().filter((c) => !only || only.includes(configName(c, codecName)));
  const tallies = cfgs.map(() => new Tally());
  const seconds = cfgs.map(() => 0);
  const skipped: Record<string, string> = {};
  const gaps: { medianGap: number; under005: number }[] = [];
  let spread: ChannelSpread;
  try {
    spread = channelSpread(m, prompts[0]!);
    for (let g = 0; g < prompts.length; g += group) {
      const ps = prompts.slice(g, g + group);
      const t0 = performance.now();
      const refs = kvcReference(m, ps);
      gaps.push(referenceMargins(refs));
      console.log(`[${model}] prompts ${g + 1}-${g + ps.length}: f32 reference in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
      for (const [k, c] of cfgs.entries()) {
        const name = configName(c, codecName);
        if (skipped[name]) continue;
        const t = performance.now();
        try {
          runKvc(m, c, ps, refs, (i, step, lg) => tallies[k]!.add(refs[i]!, step, lg));
        } catch (err) {
          skipped[name] = (err as Error).message;
          console.log(`[${model}] ${name}: not measured: ${skipped[name]}`);
          continue;
        }
        seconds[k]! += (performance.now() - t) / 1000;
      }
    }
  } finally {
    m.close();
  }
  const f32Bytes = bytesPerToken(m.layout, { dtype: DType.f32, codec: Codec.naive });
  const rows: Row[] = [];
  for (const [k, c] of cfgs.entries()) {
    const name = configName(c, codecName);
    if (skipped[name]) continue;
    const b = bytesPerToken(m.layout, c);
    rows.push({ config: name, bytesPerToken: b, bytesRatio: b / f32Bytes, seconds: seconds[k]!, ...tallies[k]!.summary() });
  }
  // Per group, weighted alike (groups differ by at most one prompt): a summary, not an exact pooled median.
  const margin = { medianGap: gaps.reduce((a, g) => a + g.medianGap, 0) / gaps.length, under005: gaps.reduce((a, g) => a + g.under005, 0) / gaps.length };
  return { rows, skipped, margin, spread };
}

function printTable(model: ModelName, rows: Row[], prompts: number, margin: Measured['margin'], spread: ChannelSpread): void {
  console.log(`\n${MODEL_LABEL[model]}: ${prompts} prompts × ${CONTINUATION} tokens, against f32 KV`);
  console.log(`reference top-1 − top-2 logit gap: median ${margin.medianGap.toFixed(3)}, ${(100 * margin.under005).toFixed(1)} % of positions under 0.05`);
  console.log(`channel RMS, largest ÷ median over a (layer, KV head)'s head_dim channels: K median ${spread.k.median.toFixed(2)}, max ${spread.k.max.toFixed(2)}; V median ${spread.v.median.toFixed(2)}, max ${spread.v.max.toFixed(2)}`);
  console.log('config          bytes/token  × f32   top-1 %   mean KL    max KL   greedy identical  mean tokens to 1st diff');
  for (const r of rows) {
    console.log(
      `${r.config.padEnd(14)}  ${String(r.bytesPerToken).padStart(11)}  ${r.bytesRatio.toFixed(3)}  ${(100 * r.top1).toFixed(2).padStart(7)}  ${r.meanKl.toExponential(2).padStart(9)}  ${r.maxKl.toExponential(2).padStart(8)}  ${`${r.greedyIdentical}/${r.prompts}`.padStart(16)}  ${r.greedyMeanPrefix.toFixed(1).padStart(23)}`,
    );
  }
  // Where the flips are: a position flips only where the representation's perturbation exceeds the reference's gap.
  const byGap = rows[0]?.byGap ?? [];
  const cls = (b: { from: number; to: number }) => (b.to === Infinity ? `≥ ${b.from}` : `${b.from}–${b.to}`);
  console.log(`\ntop-1 % by the reference's top-1 − top-2 gap (logits), and the representation's perturbation of the reference's choice (logits)`);
  console.log(`config          ${byGap.map((b) => cls(b).padStart(10)).join('')}   pert. p50   pert. p99   top-1 where gap > p99 (share)`);
  console.log(`share of pos.   ${byGap.map((b) => `${(100 * b.share).toFixed(1)} %`.padStart(10)).join('')}`);
  for (const r of rows) {
    const pct = (x: number) => (Number.isNaN(x) ? '—' : (100 * x).toFixed(2));
    console.log(
      `${r.config.padEnd(14)}  ${r.byGap.map((b) => pct(b.top1).padStart(10)).join('')}  ${r.perturbation.p50.toExponential(2).padStart(10)}  ${r.perturbation.p99.toExponential(2).padStart(10)}   ${pct(r.beyondP99.top1)} (${(100 * r.beyondP99.share).toFixed(1)} %)`,
    );
  }
}

/** The issue's 8-bit target: ≤ 0.27 × f32 bytes, top-1 ≥ 99 %, mean KL ≤ 0.01. */
const meetsTarget = (r: Row) => r.bytesRatio <= 0.27 && r.top1 >= 0.99 && r.meanKl <= 0.01;

async function main(): Promise<void> {
  const o = parseOptions(process.argv.slice(2));
  const results: Partial<Record<ModelName, Row[]>> = {};
  const skippedAll: Record<string, Record<string, string>> = {};
  const margins: Record<string, Measured['margin']> = {};
  const spreads: Record<string, ChannelSpread> = {};
  let models = o.models;
  if (!models) {
    models = existsSync(stories15mPath()) ? [...MODELS] : MODELS.filter((x) => x !== 'stories');
    if (!models.includes('stories')) console.log(`the trained model is not in the cache (${stories15mPath()}): measuring ${models.join(', ')} only; \`npm run model -- stories15m\` fetches it (or pass --models stories)`);
  }
  for (const model of models) {
    const { rows, skipped, margin, spread } = await measure(model, o.prompts, o.group, o.configs);
    results[model] = rows;
    skippedAll[model] = skipped;
    margins[model] = margin;
    spreads[model] = spread;
    printTable(model, rows, o.prompts, margin, spread);
  }
  const targetModel = TARGET_MODELS.find((x) => results[x]);
  const winners = targetModel ? results[targetModel]!.filter(meetsTarget).map((r) => r.config) : null;
  if (targetModel) console.log(`\n8-bit target on the ${MODEL_LABEL[targetModel]} model (≤ 0.27 × f32 bytes, top-1 ≥ 99 %, mean KL ≤ 0.01): ${winners!.length ? `met by ${winners!.join(', ')}` : 'NOT met'}`);
  const top1: BarRow[] = [];
  const kl: BarRow[] = [];
  for (const [model, rows] of Object.entries(results) as [ModelName, Row[]][]) {
    for (const r of rows) {
      top1.push({ panel: MODEL_LABEL[model], series: r.config, value: 100 * r.top1 });
      kl.push({ panel: MODEL_LABEL[model], series: r.config, value: r.meanKl });
    }
  }
  const dir = resultsDir('kv_quality');
  console.log(`plot: ${await writeBarsSvg(join(dir, 'top1.svg'), 'Top-1 agreement with f32 KV (%, higher is better)', top1, 'top-1 %')}`);
  console.log(`plot: ${await writeBarsSvg(join(dir, 'kl.svg'), 'Mean KL(f32 ‖ config) of next-token distributions (nats, lower is better)', kl, 'mean KL')}`);
  const round = (x: number) => Number(x.toPrecision(4));
  console.log(
    JSON.stringify({
      bench: 'kv_quality',
      prompts: o.prompts,
      continuation: CONTINUATION,
      target_model: targetModel ?? null,
      target_met: winners ? winners.length > 0 : null,
      target_configs: winners,
      models: Object.fromEntries(
        Object.entries(results).map(([model, rows]) => [
          model,
          Object.fromEntries(
            rows.map((r) => [
              r.config,
              {
                bytes_per_token: r.bytesPerToken,
                bytes_ratio: round(r.bytesRatio),
                top1: round(r.top1),
                mean_kl: round(r.meanKl),
                max_kl: round(r.maxKl),
                greedy_identical: r.greedyIdentical,
                greedy_mean_prefix: round(r.greedyMeanPrefix),
                perturbation_p50: round(r.perturbation.p50),
                perturbation_p99: round(r.perturbation.p99),
                top1_by_gap: r.byGap.map((b) => ({ gap_from: b.from, gap_to: b.to === Infinity ? null : b.to, share: round(b.share), top1: Number.isNaN(b.top1) ? null : round(b.top1) })),
                top1_beyond_p99: { share: round(r.beyondP99.share), top1: Number.isNaN(r.beyondP99.top1) ? null : round(r.beyondP99.top1) },
              },
            ]),
          ),
        ]),
      ),
      skipped: skippedAll,
      reference_margin: Object.fromEntries(Object.entries(margins).map(([k, v]) => [k, { median_gap: round(v.medianGap), share_under_0_05: round(v.under005) }])),
      channel_spread: Object.fromEntries(Object.entries(spreads).map(([k, v]) => [k, { k_median: round(v.k.median), k_max: round(v.k.max), v_median: round(v.v.median), v_max: round(v.v.max) }])),
    }),
  );
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});

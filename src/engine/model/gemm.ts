// Matrix multiply for the model's linear layers: out[m][n] = sum_k a[m][k] * W[n][k], W in the
// Hugging Face [out][in] layout, pre-transposed once at load to Wt [k][nPad].
//
// Determinism contract (shared by both implementations, and tested bitwise):
//   every output element is a single f32 accumulator, starting at 0, updated as
//   acc = f32(acc + f32(a[m][k] * Wt[k][n])) for k ascending.
// Nothing depends on M, on the row's position in the batch or on how columns are split, so a
// row's result is the same alone or in any batch (batch invariance), and the WASM SIMD kernel
// (vectorised over n, separate mul and add, no FMA) equals the plain-JS reference bit for bit.
// (JS evaluates in f64; rounding the product and the sum to f32 each step gives exactly the f32
// results, since f64 has more than 2*24+2 bits.)
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { CTL } from './gemm_ctl.js';
import { EXP_CONSTS, gemmWat, STRIP } from './gemm_wat.js';
import { BLOCK_SHIFT, BLOCK_TOKENS } from './kv_cache.js';

export interface Weight {
  /** Input features (K) and output features (N) of the layer. */
  readonly k: number;
  readonly n: number;
  /** N padded to the kernel's strip width; Wt rows have this stride. */
  readonly nPad: number;
  /** Byte offset of Wt in WASM memory (wasm kernel) … */
  readonly ptr: number;
  /** … or the Wt array itself (JS kernel). */
  readonly data: Float32Array | null;
  /** Which WASM instance holds it (WasmGemmPool). */
  readonly part: number;
}

export interface Gemm {
  readonly kind: 'wasm-simd' | 'js';
  /** Copies a weight given as [n][k] (row-major, HF layout) into kernel layout. */
  upload(w: Float32Array, n: number, k: number): Weight;
  /** out[0..m*n) = a[0..m*k) · Wᵀ. */
  matmul(w: Weight, a: Float32Array, m: number, out: Float32Array): void;
  /** Releases threads (the kernel still works afterwards, single-threaded). */
  close(): void;
  /** out[m][n] = a[m][k] · b[k][n] for a transient b (attention), same summation order. */
  matmulDense(a: Float32Array, m: number, k: number, b: Float32Array, n: number, out: Float32Array): void;
  /**
   * Attention core for M query rows of one KV head: S = q·kt ([M][hd]·[hd][P]), row r softmaxed
   * over its first lens[r] columns (scaled by `scale`, the rest set to 0), out = S·v ([P][hd]).
   * P must be a multiple of STRIP (callers pad keys/values with zeros).
   */
  attend(q: Float32Array, M: number, hd: number, kt: Float32Array, P: number, v: Float32Array, lens: Int32Array, scale: number, out: Float32Array): void;
  /**
   * Stages one layer of a sequence's paged KV for attendStaged: for each of `nBlocks` cache
   * blocks, the 2*BLOCK_TOKENS*kvDim floats (K slab, then V slab) at
   * pool[blocks[b] * blockFloats + layerOffset]. Copied in bulk, once per sequence and layer.
   */
  stageKv(pool: Float32Array, blocks: readonly number[], nBlocks: number, blockFloats: number, layerOffset: number, kvDim: number): void;
  /**
   * attend() over the staged KV of one KV head (columns [off, off+hd) of each position), using
   * its first `keys` positions (zero-padded to a multiple of STRIP). Same result bits as
   * attend() given those keys/values and zeros as padding.
   */
  attendStaged(q: Float32Array, M: number, hd: number, off: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void;
  /**
   * attendStaged for every KV head of the staged KV: q is [heads][M][hd] (head g's rows at
   * g*M*hd), out the same shape. Same bits as calling attendStaged per head.
   */
  attendStagedHeads(q: Float32Array, M: number, hd: number, heads: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void;
  /** Index of the largest value, lowest index on ties (greedy sampling): argmaxJs's answer, NaN included. */
  argmax(x: Float32Array): number;
}

/** Greedy decoding's scalar argmax: the largest value, the lowest index on ties. */
export function argmaxJs(x: Float32Array): number {
  let best = 0;
  let bv = x[0]!;
  for (let i = 1; i < x.length; i++) {
    const v = x[i]!;
    if (v > bv) {
      bv = v;
      best = i;
    }
  }
  return best;
}

/** JS twin of the WASM gatherkv: kt [hd][Pb] transposed keys, v [Pb][hd] values, zero padding. */
function gatherStagedJs(src: Float32Array, kvDim: number, off: number, hd: number, P: number, Pb: number, kt: Float32Array, v: Float32Array): void {
  kt.fill(0, 0, hd * Pb);
  v.fill(0, 0, Pb * hd);
  const slab = BLOCK_TOKENS * kvDim;
  for (let j = 0; j < P; j++) {
    const kp = (j >> BLOCK_SHIFT) * 2 * slab + (j & (BLOCK_TOKENS - 1)) * kvDim + off;
    const vp = kp + slab;
    for (let e = 0; e < hd; e++) {
      kt[e * Pb + j] = src[kp + e]!;
      v[j * hd + e] = src[vp + e]!;
    }
  }
}

function stageInto(dest: Float32Array, destOff: number, pool: Float32Array, blocks: readonly number[], nBlocks: number, blockFloats: number, layerOffset: number, kvDim: number): void {
  const slabs = 2 * BLOCK_TOKENS * kvDim;
  for (let b = 0; b < nBlocks; b++) {
    const at = blocks[b]! * blockFloats + layerOffset;
    dest.set(pool.subarray(at, at + slabs), destOff + b * slabs);
  }
}

// ---- softmax reference (mirrors the WASM "softmax" function in gemm_wat.ts bit for bit) ----

const fr = Math.fround;
const EC = {
  lo: fr(EXP_CONSTS.lo),
  log2e: fr(EXP_CONSTS.log2e),
  half: fr(EXP_CONSTS.half),
  c1: fr(EXP_CONSTS.c1),
  c2: fr(EXP_CONSTS.c2),
  p: EXP_CONSTS.p.map(fr),
};
const powBuf = new Int32Array(1);
const powF = new Float32Array(powBuf.buffer);

/** Cephes expf in f32, every operation rounded like the WASM kernel's. Valid for x <= 88. */
export function expf32(x: number): number {
  x = Math.max(x, EC.lo);
  const fx = Math.floor(fr(fr(x * EC.log2e) + EC.half));
  x = fr(x - fr(fx * EC.c1));
  x = fr(x - fr(fx * EC.c2));
  const z = fr(x * x);
  let y = EC.p[0]!;
  for (let i = 1; i < 6; i++) y = fr(fr(y * x) + EC.p[i]!);
  y = fr(fr(fr(y * z) + x) + 1);
  powBuf[0] = (fx + 127) << 23;
  return fr(y * powF[0]!);
}

export function softmaxRowsJs(S: Float32Array, rows: number, stride: number, lens: Int32Array, scale: number): void {
  const sc = fr(scale);
  for (let r = 0; r < rows; r++) {
    const p = r * stride;
    const len = lens[r]!;
    const len4 = len & ~3;
    let m = -Infinity;
    for (let j = 0; j < len; j++) m = Math.max(m, fr(S[p + j]! * sc));
    const acc = [0, 0, 0, 0];
    for (let j = 0; j < len4; j++) {
      const e = expf32(fr(fr(S[p + j]! * sc) - m));
      S[p + j] = e;
      acc[j & 3] = fr(acc[j & 3]! + e);
    }
    let sum = fr(fr(acc[0]! + acc[1]!) + fr(acc[2]! + acc[3]!));
    for (let j = len4; j < len; j++) {
      const e = expf32(fr(fr(S[p + j]! * sc) - m));
      S[p + j] = e;
      sum = fr(sum + e);
    }
    const inv = fr(1 / sum);
    for (let j = 0; j < len; j++) S[p + j] = fr(S[p + j]! * inv);
    S.fill(0, p + len, p + stride);
  }
}

const padTo = (n: number, s: number) => Math.ceil(n / s) * s;

function transposePadded(w: Float32Array, n: number, k: number, nPad: number, dest: Float32Array): void {
  if (w.length !== n * k) throw new Error(`weight has ${w.length} values, expected ${n}x${k}`);
  dest.fill(0, 0, k * nPad);
  for (let i = 0; i < n; i++) {
    const row = i * k;
    for (let j = 0; j < k; j++) dest[j * nPad + i] = w[row + j]!;
  }
}

/** Wt packed in strips (the WASM kernel's weight layout): dest[s][k][j] = w[s*STRIP + j][k]. */
function packStrips(w: Float32Array, n: number, k: number, nPad: number, dest: Float32Array): void {
  if (w.length !== n * k) throw new Error(`weight has ${w.length} values, expected ${n}x${k}`);
  dest.fill(0, 0, k * nPad);
  for (let i = 0; i < n; i++) {
    const row = i * k;
    const base = (i - (i % STRIP)) * k + (i % STRIP);
    for (let j = 0; j < k; j++) dest[base + j * STRIP] = w[row + j]!;
  }
}

function checkArgs(w: Weight, a: Float32Array, m: number, out: Float32Array): void {
  if (a.length < m * w.k) throw new Error(`matmul: input holds ${a.length} values, ${m}x${w.k} needed`);
  if (out.length < m * w.n) throw new Error(`matmul: output holds ${out.length} values, ${m}x${w.n} needed`);
}

/** Plain-JS kernel with the exact summation order of the WASM kernel (reference and fallback). */
export class JsGemm implements Gemm {
  readonly kind = 'js' as const;

  close(): void {}

  upload(w: Float32Array, n: number, k: number): Weight {
    const nPad = padTo(n, STRIP);
    const data = new Float32Array(k * nPad);
    transposePadded(w, n, k, nPad, data);
    return { k, n, nPad, ptr: -1, data, part: 0 };
  }

  matmul(w: Weight, a: Float32Array, m: number, out: Float32Array): void {
    checkArgs(w, a, m, out);
    const wt = w.data!;
    const { k: K, n: N, nPad } = w;
    const fr = Math.fround;
    for (let r = 0; r < m; r++) {
      const c = out.subarray(r * N, r * N + N);
      c.fill(0);
      const ar = r * K;
      for (let kk = 0; kk < K; kk++) {
        const av = a[ar + kk]!;
        const base = kk * nPad;
        for (let j = 0; j < N; j++) c[j] = c[j]! + fr(av * wt[base + j]!);
      }
    }
  }

  argmax(x: Float32Array): number {
    return argmaxJs(x);
  }

  attendStagedHeads(q: Float32Array, M: number, hd: number, heads: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    for (let g = 0; g < heads; g++) {
      const rows = M * hd;
      this.attendStaged(q.subarray(g * rows, (g + 1) * rows), M, hd, g * hd, keys, lens, scale, out.subarray(g * rows, (g + 1) * rows));
    }
  }

  private staged = new Float32Array(0);
  private stagedKvDim = 0;

  stageKv(pool: Float32Array, blocks: readonly number[], nBlocks: number, blockFloats: number, layerOffset: number, kvDim: number): void {
    const n = nBlocks * 2 * BLOCK_TOKENS * kvDim;
    if (this.staged.length < n) this.staged = new Float32Array(n);
    this.stagedKvDim = kvDim;
    stageInto(this.staged, 0, pool, blocks, nBlocks, blockFloats, layerOffset, kvDim);
  }

  attendStaged(q: Float32Array, M: number, hd: number, off: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    const Pb = padTo(keys, STRIP);
    const kt = new Float32Array(hd * Pb);
    const v = new Float32Array(Pb * hd);
    gatherStagedJs(this.staged, this.stagedKvDim, off, hd, keys, Pb, kt, v);
    this.attend(q, M, hd, kt, Pb, v, lens, scale, out);
  }

  attend(q: Float32Array, M: number, hd: number, kt: Float32Array, P: number, v: Float32Array, lens: Int32Array, scale: number, out: Float32Array): void {
    const S = new Float32Array(M * P);
    this.matmulDense(q, M, hd, kt, P, S);
    softmaxRowsJs(S, M, P, lens, scale);
    this.matmulDense(S, M, P, v, hd, out);
  }

  matmulDense(a: Float32Array, m: number, K: number, b: Float32Array, N: number, out: Float32Array): void {
    const fr = Math.fround;
    for (let r = 0; r < m; r++) {
      const c = out.subarray(r * N, r * N + N);
      c.fill(0);
      const ar = r * K;
      for (let kk = 0; kk < K; kk++) {
        const av = a[ar + kk]!;
        const base = kk * N;
        for (let j = 0; j < N; j++) c[j] = c[j]! + fr(av * b[base + j]!);
      }
    }
  }
}

interface GemmExports {
  /** Dense Wt [K][N] (attention operands). */
  gemm(A: number, W: number, C: number, M: number, K: number, N: number, m0: number, m1: number, n0: number, n1: number): void;
  /** Strip-packed Wt (model weights); same arguments and bits as gemm. */
  gemmp(A: number, W: number, C: number, M: number, K: number, N: number, m0: number, m1: number, n0: number, n1: number): void;
  softmax(S: number, rows: number, stride: number, L: number, scale: number): void;
  gatherkv(src: number, P: number, Pb: number, kvDim: number, off: number, hd: number, kt: number, v: number, hdPad: number): void;
  argmax(p: number, n: number): number;
  attendheads(stage: number, Q: number, KT: number, S: number, V: number, O: number, L: number, M: number, hd: number, hdPad: number, kvDim: number, heads: number, keys: number, P: number, scale: number): void;
}

let wasmModulePromise: Promise<WebAssembly.Module> | null = null;

/** Compiles the kernel's WAT (gemm_wat.ts) with wabt, once per process. */
export function gemmModule(): Promise<WebAssembly.Module> {
  wasmModulePromise ??= (async () => {
    const require = createRequire(import.meta.url);
    const wabtInit = require('wabt') as () => Promise<{ parseWat(f: string, s: string, o: object): { toBinary(o: object): { buffer: Uint8Array }; destroy(): void } }>;
    const wabt = await wabtInit();
    const mod = wabt.parseWat('gemm.wat', gemmWat(), { simd: true, threads: true });
    try {
      const { buffer } = mod.toBinary({});
      return await WebAssembly.compile(new Uint8Array(buffer));
    } finally {
      mod.destroy();
    }
  })();
  return wasmModulePromise;
}

const PAGE = 65536;
/** wasm32 addresses 4 GiB; stay clear of the top for scratch. */
export const WASM_MAX_BYTES = 4 * 1024 * 1024 * 1024 - 256 * 1024 * 1024;
/** Weights one instance takes; the rest of its address space is left for scratch. */
export const WASM_WEIGHT_CAP = WASM_MAX_BYTES - 512 * 1024 * 1024;

/** Below this many multiply-adds a call stays on one thread (hand-off costs ~tens of µs). */
const SPLIT_MIN_MACS = 1 << 20;
const CHUNKS_PER_CALL = 16;
/** A worker that has not finished its half by then is considered broken. */
const WORKER_TIMEOUT_MS = 30_000;

/**
 * WASM SIMD kernel. Weights live in the module's (shared) memory; inputs and outputs pass
 * through scratch. Large calls split the columns with one worker thread.
 */
export class WasmGemm implements Gemm {
  readonly kind = 'wasm-simd' as const;
  private top = 64; // bump allocator; 0 stays unused
  private scratchPtr = 0;
  private scratchBytes = 0;
  private f32: Float32Array;
  private worker: Worker | null = null;
  private weightBytes = 0;
  private weightCap = WASM_WEIGHT_CAP;
  private readonly ctl = new Int32Array(new SharedArrayBuffer(CTL.SIZE * 4));
  private seq = 0;

  private constructor(
    private readonly mem: WebAssembly.Memory,
    private readonly exp: GemmExports,
  ) {
    this.f32 = new Float32Array(mem.buffer);
  }

  /**
   * `threads`: 1 or 2 (default: 2 when the machine has 2+ cores, unless KVC_GEMM_THREADS=1).
   * `weightCapBytes`: weights this instance accepts (default: what wasm32 leaves after scratch).
   */
  static async create(opts: { threads?: number; weightCapBytes?: number } = {}): Promise<WasmGemm> {
    const mod = await gemmModule();
    const mem = new WebAssembly.Memory({ initial: 16, maximum: 65536, shared: true });
    const inst = await WebAssembly.instantiate(mod, { env: { mem } });
    const g = new WasmGemm(mem, inst.exports as unknown as GemmExports);
    if (opts.weightCapBytes !== undefined) g.weightCap = Math.min(opts.weightCapBytes, WASM_WEIGHT_CAP);
    const threads = opts.threads ?? (process.env.KVC_GEMM_THREADS === '1' ? 1 : Math.min(2, availableParallelism()));
    if (threads >= 2) await g.startWorker(mod);
    return g;
  }

  get threads(): number {
    return this.worker ? 2 : 1;
  }

  private async startWorker(mod: WebAssembly.Module): Promise<void> {
    const w = new Worker(new URL('./gemm_worker.js', import.meta.url), { workerData: { module: mod, memory: this.mem, ctl: this.ctl.buffer } });
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('GEMM worker did not start within 10 s')), 10_000);
        w.once('message', () => {
          clearTimeout(timer);
          resolve();
        });
        w.once('error', (e) => {
          clearTimeout(timer);
          reject(e);
        });
      });
    } catch {
      void w.terminate();
      return; // single-threaded: same results, just slower
    }
    w.on('error', () => this.dropWorker());
    w.on('exit', () => {
      if (this.worker === w) this.worker = null;
    });
    w.unref(); // never keeps the process alive
    this.worker = w;
  }

  private dropWorker(): void {
    const w = this.worker;
    this.worker = null;
    Atomics.store(this.ctl, CTL.STOP, 1);
    Atomics.notify(this.ctl, CTL.SEQ);
    if (w) void w.terminate();
  }

  /** Stops the worker thread (the kernel keeps working single-threaded). */
  close(): void {
    this.dropWorker();
  }

  /**
   * Runs the kernel over all of C, splitting the column strips with the worker when worth it.
   * `kernel`: 'gemmp' when W is a strip-packed weight, 'gemm' when it is a dense [K][nPad] operand.
   */
  private run(kernel: 'gemm' | 'gemmp', A: number, W: number, C: number, m: number, K: number, nPad: number): void {
    const strips = nPad / STRIP;
    const packed = kernel === 'gemmp';
    const gemm = this.exp[kernel];
    if (!this.worker || strips < 2 || m * K * nPad < SPLIT_MIN_MACS) {
      gemm(A, W, C, m, K, nPad, 0, m, 0, nPad);
      return;
    }
    const c = this.ctl;
    c[CTL.PACKED] = packed ? 1 : 0;
    const args = [A, W, C, m, K, nPad, 0, m, 0, nPad];
    for (let i = 0; i < args.length; i++) c[CTL.ARGS + i] = args[i]!;
    // ~16 chunks: fine enough to balance a late or preempted worker, coarse enough that the
    // per-call overhead stays negligible.
    const chunk = Math.ceil(strips / CHUNKS_PER_CALL) * STRIP;
    c[CTL.CHUNK] = chunk;
    Atomics.store(c, CTL.NEXT, 0);
    const seq = (this.seq = (this.seq + 1) | 0);
    Atomics.store(c, CTL.SEQ, seq);
    Atomics.notify(c, CTL.SEQ);
    for (;;) {
      const n0 = Atomics.add(c, CTL.NEXT, 1) * chunk;
      if (n0 >= nPad) break;
      gemm(A, W, C, m, K, nPad, 0, m, n0, Math.min(n0 + chunk, nPad));
    }
    // The worker never joined this job: every chunk was computed here.
    if (Atomics.compareExchange(c, CTL.CLAIM, (seq - 1) | 0, seq) === ((seq - 1) | 0)) return;
    const deadline = Date.now() + WORKER_TIMEOUT_MS;
    for (;;) {
      const done = Atomics.load(c, CTL.DONE);
      if (done === seq) return;
      const left = deadline - Date.now();
      if (left <= 0) {
        // Broken worker: recompute everything here (same bits) and continue single-threaded.
        this.dropWorker();
        gemm(A, W, C, m, K, nPad, 0, m, 0, nPad);
        return;
      }
      Atomics.wait(c, CTL.DONE, done, Math.min(left, 1000));
    }
  }

  private alloc(bytes: number): number {
    const ptr = padTo(this.top, 64);
    const end = ptr + bytes;
    if (end > WASM_MAX_BYTES) throw new Error(`WASM kernel memory exhausted (${end} bytes requested); use the JS kernel for models this large`);
    const have = this.mem.buffer.byteLength;
    if (end > have) this.mem.grow(Math.ceil((end - have) / PAGE));
    this.top = end;
    this.f32 = new Float32Array(this.mem.buffer);
    return ptr;
  }

  /** Whether a weight of `n` x `k` still fits this instance's weight budget. */
  canHold(n: number, k: number): boolean {
    return this.weightBytes + k * padTo(n, STRIP) * 4 <= this.weightCap;
  }

  upload(w: Float32Array, n: number, k: number): Weight {
    const nPad = padTo(n, STRIP);
    if (!this.canHold(n, k)) throw new Error(`WASM kernel instance full: a ${n}x${k} weight does not fit its ${this.weightCap}-byte budget`);
    this.weightBytes += k * nPad * 4;
    const ptr = this.alloc(k * nPad * 4);
    packStrips(w, n, k, nPad, this.f32.subarray(ptr / 4, ptr / 4 + k * nPad));
    return { k, n, nPad, ptr, data: null, part: 0 };
  }

  private scratch(bytes: number): number {
    if (bytes > this.scratchBytes) {
      const size = Math.max(bytes, this.scratchBytes * 2);
      this.scratchPtr = this.alloc(size);
      this.scratchBytes = size;
    }
    return this.scratchPtr;
  }

  /** SIMD argmax over 32000 logits is ~5x the JS loop; batched greedy decode runs one per row and step. */
  argmax(x: Float32Array): number {
    if (x.length === 0) return 0;
    const p = this.scratch(x.length * 4);
    this.f32.set(x, p / 4);
    return this.exp.argmax(p, x.length);
  }

  private stagePtr = 0;
  private stageBytes = 0;
  private stageKvDim = 0;

  stageKv(pool: Float32Array, blocks: readonly number[], nBlocks: number, blockFloats: number, layerOffset: number, kvDim: number): void {
    const bytes = nBlocks * 2 * BLOCK_TOKENS * kvDim * 4;
    if (bytes > this.stageBytes) {
      const size = Math.max(bytes, this.stageBytes * 2);
      this.stagePtr = this.alloc(size);
      this.stageBytes = size;
    }
    this.stageKvDim = kvDim;
    stageInto(this.f32, this.stagePtr / 4, pool, blocks, nBlocks, blockFloats, layerOffset, kvDim);
  }

  attendStaged(q: Float32Array, M: number, hd: number, off: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    const P = padTo(keys, STRIP);
    this.attendCore(q, M, hd, P, lens, scale, out, (KT, V, hdPad) => this.exp.gatherkv(this.stagePtr, keys, P, this.stageKvDim, off, hd, KT, V, hdPad));
  }

  /**
   * When neither product would be split with the worker (a decode step), every head in one WASM
   * call (attendheads: the per-head sequence inside WASM, so one JS→WASM crossing instead of
   * several per head); otherwise per head, each product shared with the worker.
   */
  attendStagedHeads(q: Float32Array, M: number, hd: number, heads: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    if (M === 0 || heads === 0) return;
    const P = padTo(keys, STRIP);
    const hdPad = padTo(hd, STRIP);
    const rows = M * hd;
    if (this.worker && (M * hd * P >= SPLIT_MIN_MACS || M * P * hdPad >= SPLIT_MIN_MACS)) {
      for (let g = 0; g < heads; g++) {
        this.attendStaged(q.subarray(g * rows, (g + 1) * rows), M, hd, g * hd, keys, lens, scale, out.subarray(g * rows, (g + 1) * rows));
      }
      return;
    }
    const s = this.attnScratch(q, heads, M, hd, P, lens);
    this.exp.attendheads(this.stagePtr, s.Q, s.KT, s.S, s.V, s.O, s.L, M, hd, s.hdPad, this.stageKvDim, heads, keys, P, scale);
    this.copyRows(s.O, heads * M, hd, s.hdPad, out);
  }

  attend(q: Float32Array, M: number, hd: number, kt: Float32Array, P: number, v: Float32Array, lens: Int32Array, scale: number, out: Float32Array): void {
    if (P % STRIP !== 0) throw new Error(`attend: P=${P} must be a multiple of ${STRIP}`);
    this.attendCore(q, M, hd, P, lens, scale, out, (KT, V, hdPad) => {
      const f32 = this.f32;
      f32.set(kt.subarray(0, hd * P), KT / 4);
      if (hdPad === hd) f32.set(v.subarray(0, P * hd), V / 4);
      else {
        for (let j = 0; j < P; j++) {
          f32.set(v.subarray(j * hd, j * hd + hd), V / 4 + j * hdPad);
          f32.fill(0, V / 4 + j * hdPad + hd, V / 4 + (j + 1) * hdPad);
        }
      }
    });
  }

  /**
   * Attention operands on kernel scratch for `heads` heads of M query rows over P keys: Q (the
   * queries, copied in, [heads][M][hd]), KT ([hd][P]), S ([M][P]), V ([P][hdPad]), O
   * ([heads][M][hdPad]) and L (the M row lengths, copied in), as byte addresses.
   */
  private attnScratch(q: Float32Array, heads: number, M: number, hd: number, P: number, lens: Int32Array) {
    const hdPad = padTo(hd, STRIP);
    const sz = (n: number) => padTo(n * 4, 64);
    const Q = this.scratch(sz(heads * M * hd) + sz(hd * P) + sz(M * P) + sz(P * hdPad) + sz(heads * M * hdPad) + sz(M));
    const KT = Q + sz(heads * M * hd);
    const S = KT + sz(hd * P);
    const V = S + sz(M * P);
    const O = V + sz(P * hdPad);
    const L = O + sz(heads * M * hdPad);
    this.f32.set(q.subarray(0, heads * M * hd), Q / 4);
    new Int32Array(this.mem.buffer, L, M).set(lens.subarray(0, M));
    return { Q, KT, S, V, O, L, hdPad };
  }

  /** `rows` rows of `hd` floats from kernel memory at byte address O (row stride hdPad) into out. */
  private copyRows(O: number, rows: number, hd: number, hdPad: number, out: Float32Array): void {
    const f32 = this.f32;
    const o0 = O / 4;
    if (hdPad === hd) out.set(f32.subarray(o0, o0 + rows * hd));
    else for (let r = 0; r < rows; r++) out.set(f32.subarray(o0 + r * hdPad, o0 + r * hdPad + hd), r * hd);
  }

  /**
   * One head's attention on kernel scratch: `fillKV(KT, V, hdPad)` writes keys ([hd][P]) and
   * values ([P][hdPad]) at those byte addresses; then S = Q·KT, softmax, O = S·V, copied to `out`.
   */
  private attendCore(q: Float32Array, M: number, hd: number, P: number, lens: Int32Array, scale: number, out: Float32Array, fillKV: (KT: number, V: number, hdPad: number) => void): void {
    if (M === 0) return;
    const { Q, KT, S, V, O, L, hdPad } = this.attnScratch(q, 1, M, hd, P, lens);
    fillKV(KT, V, hdPad);
    this.run('gemm', Q, KT, S, M, hd, P);
    this.exp.softmax(S, M, P, L, scale);
    this.run('gemm', S, V, O, M, P, hdPad);
    this.copyRows(O, M, hd, hdPad, out);
  }

  matmulDense(a: Float32Array, m: number, K: number, b: Float32Array, N: number, out: Float32Array): void {
    if (m === 0 || N === 0) return;
    if (K === 0) {
      out.fill(0, 0, m * N);
      return;
    }
    const nPad = padTo(N, STRIP);
    const aBytes = padTo(m * K * 4, 64);
    const bBytes = padTo(K * nPad * 4, 64);
    const A = this.scratch(aBytes + bBytes + m * nPad * 4);
    const B = A + aBytes;
    const C = B + bBytes;
    const f32 = this.f32;
    f32.set(a.subarray(0, m * K), A / 4);
    if (nPad === N) f32.set(b.subarray(0, K * N), B / 4);
    else {
      const b0 = B / 4;
      for (let kk = 0; kk < K; kk++) {
        f32.set(b.subarray(kk * N, kk * N + N), b0 + kk * nPad);
        f32.fill(0, b0 + kk * nPad + N, b0 + (kk + 1) * nPad);
      }
    }
    this.run('gemm', A, B, C, m, K, nPad);
    const c0 = C / 4;
    if (nPad === N) out.set(f32.subarray(c0, c0 + m * N));
    else for (let r = 0; r < m; r++) out.set(f32.subarray(c0 + r * nPad, c0 + r * nPad + N), r * N);
  }

  matmul(w: Weight, a: Float32Array, m: number, out: Float32Array): void {
    checkArgs(w, a, m, out);
    if (m === 0) return;
    const { k: K, n: N, nPad } = w;
    const aBytes = padTo(m * K * 4, 64);
    const A = this.scratch(aBytes + m * nPad * 4);
    const C = A + aBytes;
    const f32 = this.f32;
    f32.set(a.subarray(0, m * K), A / 4);
    this.run('gemmp', A, w.ptr, C, m, K, nPad);
    const c0 = C / 4;
    if (nPad === N) out.set(f32.subarray(c0, c0 + m * N));
    else for (let r = 0; r < m; r++) out.set(f32.subarray(c0 + r * nPad, c0 + r * nPad + N), r * N);
  }
}

/**
 * Weights spread over several WASM instances (each addresses at most 4 GiB), for checkpoints
 * whose f32 weights exceed one. A weight is used by the instance that holds it; attention runs
 * on the first. Same kernel everywhere, so the same bits as a single instance.
 */
export class WasmGemmPool implements Gemm {
  readonly kind = 'wasm-simd' as const;
  private cur = 0;

  constructor(private readonly parts: WasmGemm[]) {
    if (parts.length === 0) throw new Error('WasmGemmPool needs at least one instance');
  }

  get size(): number {
    return this.parts.length;
  }

  upload(w: Float32Array, n: number, k: number): Weight {
    while (this.cur < this.parts.length && !this.parts[this.cur]!.canHold(n, k)) this.cur++;
    const part = this.parts[this.cur];
    if (!part) throw new Error(`WASM kernel pool full: no instance left for a ${n}x${k} weight`);
    return { ...part.upload(w, n, k), part: this.cur };
  }

  matmul(w: Weight, a: Float32Array, m: number, out: Float32Array): void {
    this.parts[w.part]!.matmul(w, a, m, out);
  }

  matmulDense(a: Float32Array, m: number, k: number, b: Float32Array, n: number, out: Float32Array): void {
    this.parts[0]!.matmulDense(a, m, k, b, n, out);
  }

  attend(q: Float32Array, M: number, hd: number, kt: Float32Array, P: number, v: Float32Array, lens: Int32Array, scale: number, out: Float32Array): void {
    this.parts[0]!.attend(q, M, hd, kt, P, v, lens, scale, out);
  }

  stageKv(pool: Float32Array, blocks: readonly number[], nBlocks: number, blockFloats: number, layerOffset: number, kvDim: number): void {
    this.parts[0]!.stageKv(pool, blocks, nBlocks, blockFloats, layerOffset, kvDim);
  }

  attendStaged(q: Float32Array, M: number, hd: number, off: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    this.parts[0]!.attendStaged(q, M, hd, off, keys, lens, scale, out);
  }

  argmax(x: Float32Array): number {
    return this.parts[0]!.argmax(x);
  }

  attendStagedHeads(q: Float32Array, M: number, hd: number, heads: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    this.parts[0]!.attendStagedHeads(q, M, hd, heads, keys, lens, scale, out);
  }

  close(): void {
    for (const p of this.parts) p.close();
  }
}

/**
 * The kernel for a model: WASM SIMD (one instance, or a pool of them when the weights exceed
 * one 4 GiB address space), else JS. All give bitwise identical results, so the choice never
 * changes outputs. `weightCapBytes` (tests) lowers the per-instance weight budget.
 */
export async function createGemm(opts: { shapes?: [number, number][]; prefer?: 'wasm' | 'js'; weightCapBytes?: number } = {}): Promise<Gemm> {
  const prefer = opts.prefer ?? (process.env.KVC_GEMM === 'js' ? 'js' : 'wasm');
  if (prefer === 'js') return new JsGemm();
  const cap = Math.min(opts.weightCapBytes ?? WASM_WEIGHT_CAP, WASM_WEIGHT_CAP);
  // Pack the weights (in upload order, first fit like WasmGemmPool.upload) to count instances.
  let parts = 1;
  let used = 0;
  for (const [n, k] of opts.shapes ?? []) {
    const b = k * padTo(n, STRIP) * 4;
    if (b > cap) return new JsGemm(); // one weight larger than an address space
    if (used + b > cap) {
      parts++;
      used = 0;
    }
    used += b;
  }
  try {
    if (parts === 1) return await WasmGemm.create(opts.weightCapBytes !== undefined ? { weightCapBytes: cap } : {});
    const list: WasmGemm[] = [];
    for (let i = 0; i < parts; i++) list.push(await WasmGemm.create({ weightCapBytes: cap, ...(i > 0 ? { threads: 1 } : {}) }));
    return new WasmGemmPool(list);
  } catch {
    return new JsGemm();
  }
}

/** The textbook triple loop (i-k-j order) over Float32Arrays: the "plain JS" baseline. */
export function plainJsMatmul(a: Float32Array, b: Float32Array, c: Float32Array, m: number, n: number, k: number): void {
  c.fill(0, 0, m * n);
  for (let i = 0; i < m; i++) {
    for (let p = 0; p < k; p++) {
      const av = a[i * k + p]!;
      const bo = p * n;
      const co = i * n;
      for (let j = 0; j < n; j++) c[co + j] += av * b[bo + j]!;
    }
  }
}

function randomArray(len: number, seed: number): Float32Array {
  const out = new Float32Array(len);
  let s = seed >>> 0;
  for (let i = 0; i < len; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s / 4294967296 - 0.5;
  }
  return out;
}

/**
 * GEMM rates for the engine benchmark: the model's kernel (as prefill uses it) against the plain-JS
 * triple loop, on the same M x N x K problem, GFLOP/s counting a multiply-add as 2 FLOPs.
 */
export async function measureGemm(m = 256, n = 768, k = 256, iters = 5): Promise<{ kernelGflops: number; jsGflops: number; kernel: string }> {
  const flops = 2 * m * n * k;
  const a = randomArray(m * k, 1);
  const w = randomArray(n * k, 2);
  const out = new Float32Array(m * n);
  const gemm = await createGemm();
  const wt = gemm.upload(w, n, k);
  gemm.matmul(wt, a, m, out); // warm-up (JIT / tier-up)
  let t = process.hrtime.bigint();
  for (let i = 0; i < iters; i++) gemm.matmul(wt, a, m, out);
  const kernelSec = Number(process.hrtime.bigint() - t) / 1e9;
  const b = new Float32Array(k * n);
  for (let i = 0; i < n; i++) for (let j = 0; j < k; j++) b[j * n + i] = w[i * k + j]!;
  const c = new Float32Array(m * n);
  plainJsMatmul(a, b, c, m, n, k);
  t = process.hrtime.bigint();
  for (let i = 0; i < iters; i++) plainJsMatmul(a, b, c, m, n, k);
  const jsSec = Number(process.hrtime.bigint() - t) / 1e9;
  gemm.close();
  return { kernelGflops: (flops * iters) / kernelSec / 1e9, jsGflops: (flops * iters) / jsSec / 1e9, kernel: gemm.kind };
}

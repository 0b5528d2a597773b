// The WASM SIMD kernel: weights in the kernel module's shared memory (wasm_modules.ts), large
// products, attention and SwiGLU split with one worker thread (worker_host.ts), everything else on
// the calling thread. Several instances form a pool for larger checkpoints (wasm_kernel_pool.ts).
import { availableParallelism } from 'node:os';
import { stageInto } from './attention_js.js';
import type { KvElements } from './layout.js';
import { DType, DTYPE_BYTES } from '../../../common/dtype.js';
import { fmaSupport } from './fma.js';
import { kernelModule, opsModule, type KernelExports, type OpsExports } from './wasm_modules.js';
import { WorkerHost } from './worker_host.js';
import { kernelEnv } from './env.js';
import { padTo, STRIP, type WFmt } from './layout.js';
import { checkArgs, packGluStrips, packStrips, type Kernel, type UploadOptions, type Weight } from './kernel.js';
import { BLOCK_TOKENS } from '../kv_cache.js';
import { addIntoJs, copyRowsJs, rmsNormJs, ropeJs } from './ops_js.js';
import { wasmConverter, type WasmConverter } from './convert_wasm.js';
import { ACTIVATION_CAP, ARGMAX_ROWS, ATTEND_ROWS, ATTEND_ROW_UNIT, FMT_CODE, GLU, NARROW_MAX_ROWS, PAGE, SPLIT_MIN_MACS, SWIGLU_ROWS, SWIGLU_SPLIT_MIN, WASM_MAX_BYTES, WASM_WEIGHT_CAP } from './wasm_limits.js';
import { asQ8_0, checkEncoded, heldFormat, kernelFormat, packEncoded, packedBytes, type EncodedWeight } from './weight_pack.js';

/**
 * WASM SIMD kernel. Weights live in the module's (shared) memory; inputs and outputs pass
 * through scratch. Large calls split the columns with one worker thread.
 */
export class WasmKernel implements Kernel {
  readonly kind = 'wasm-simd' as const;
  private top = 64; // bump allocator; 0 stays unused
  /** Packs encoded weights at upload (convert_wasm.ts); null: packEncoded's JavaScript, same bytes. */
  private converter: WasmConverter | null = null;
  private scratchPtr = 0;
  private scratchBytes = 0;
  private f32: Float32Array;
  /** The second thread, when there is one (worker_host.ts). */
  private readonly helper = new WorkerHost();
  /** The worker thread's start (create); resolved when it runs or was given up on. */
  private started: Promise<void> = Promise.resolve();
  private weightBytes = 0;
  private weightCap = WASM_WEIGHT_CAP;
  private argmaxOutPtr = 0;
  private argmaxOutRows = 0;
  /** matmul's chunked-argmax candidates (argmaxSlots), grown as needed. */
  private amPtr = 0;
  private amBytes = 0;
  /**
   * Milliseconds the calling thread has spent so far on the greedy argmax that matmul takes with
   * `argmaxOut` (its chunks' scans and the merge): the sampling work a forward now does inside
   * the LM-head product, which the engine benchmark's step cost counts apart (bench/_engine_step_child.ts).
   */
  argmaxMs = 0;

  /** Every buffer object this memory has had (it changes on growth; older views stay valid). */
  private readonly ownBuffers = new WeakSet<ArrayBufferLike>();
  /** Activation slots: byte address and capacity in floats. */
  private readonly acts: { ptr: number; floats: number }[] = [];
  private actBytes = 0;

  private constructor(
    private readonly mem: WebAssembly.Memory,
    private readonly exp: KernelExports,
    private readonly ops: OpsExports,
    /** The f32/16-bit GEMMs use fused multiply-add (fma.ts). */
    readonly fma: boolean,
    /** Q4_0, Q4_1 and Q4_K weights are held as q4 (gemmpq4), else as q8 (KVC_WEIGHTS_4BIT). */
    readonly q4: boolean,
  ) {
    this.f32 = new Float32Array(mem.buffer);
    this.ownBuffers.add(mem.buffer);
  }

  /** Byte address of `a` when it is a view of this kernel's memory, else -1. */
  private addrOf(a: ArrayBufferView): number {
    return this.ownBuffers.has(a.buffer) ? a.byteOffset : -1;
  }

  activation(slot: number, n: number): Float32Array {
    let s = this.acts[slot];
    if (!s || s.floats < n) {
      const floats = Math.max(n, (s?.floats ?? 0) * 2);
      if (this.actBytes + floats * 4 > ACTIVATION_CAP) return new Float32Array(n);
      s = { ptr: this.alloc(floats * 4), floats };
      this.actBytes += floats * 4;
      this.acts[slot] = s;
    }
    const buf = this.mem.buffer;
    this.ownBuffers.add(buf);
    return new Float32Array(buf, s.ptr, n);
  }

  hold(v: Float32Array): Float32Array {
    const ptr = this.alloc(v.length * 4);
    const out = new Float32Array(this.mem.buffer, ptr, v.length);
    out.set(v);
    return out;
  }

  rmsNorm(x: Float32Array, w: Float32Array, out: Float32Array, rows: number, dim: number, eps: number): void {
    const X = this.addrOf(x);
    const W = this.addrOf(w);
    const O = this.addrOf(out);
    if (X < 0 || W < 0 || O < 0 || x.length < rows * dim || out.length < rows * dim || w.length < dim) rmsNormJs(x, w, out, rows, dim, eps);
    else this.ops.rmsnorm(X, W, O, rows, dim, eps);
  }

  rope(qkv: Float32Array, rows: number, stride: number, heads: number, hd: number, pos: Int32Array, cos: Float32Array, sin: Float32Array): void {
    const Q = this.addrOf(qkv);
    const P = this.addrOf(pos);
    const C = this.addrOf(cos);
    const S = this.addrOf(sin);
    if (Q < 0 || P < 0 || C < 0 || S < 0 || rows === 0 || qkv.length < (rows - 1) * stride + heads * hd || pos.length < rows) ropeJs(qkv, rows, stride, heads, hd, pos, cos, sin);
    else {
      // The tables must cover every row's position (the JS twin reads undefined → NaN otherwise).
      const half = hd >> 1;
      for (let r = 0; r < rows; r++) if ((pos[r]! + 1) * half > Math.min(cos.length, sin.length)) throw new Error(`rope: position ${pos[r]} is beyond the cos/sin tables`);
      this.ops.rope(Q, rows, stride, heads, hd, P, C, S);
    }
  }

  addInto(x: Float32Array, y: Float32Array, n: number): void {
    const X = this.addrOf(x);
    const Y = this.addrOf(y);
    if (X < 0 || Y < 0 || x.length < n || y.length < n) addIntoJs(x, y, n);
    else this.ops.addinto(X, Y, n);
  }

  copyRows(src: Float32Array, so: number, ss: number, dst: Float32Array, d0: number, ds: number, rows: number, n: number): void {
    if (rows <= 0 || n <= 0) return;
    const S = this.addrOf(src);
    const D = this.addrOf(dst);
    const fits = so >= 0 && d0 >= 0 && so + (rows - 1) * ss + n <= src.length && d0 + (rows - 1) * ds + n <= dst.length;
    if (S < 0 || D < 0 || !fits) copyRowsJs(src, so, ss, dst, d0, ds, rows, n);
    else this.ops.copyrows(S + so * 4, ss, D + d0 * 4, ds, rows, n);
  }

  /**
   * `threads`: 1 or 2 (default: 2 when the machine has 2+ cores, unless KVC_GEMM_THREADS=1).
   * `weightCapBytes`: weights this instance accepts (default: what wasm32 leaves after scratch).
   * `fma`: fused multiply-add in the GEMMs (default: fmaSupport(), i.e. KVC_WASM_FMA and the
   * platform); true where it is unavailable is an error.
   * `threadsLater`: return before the worker thread runs (it starts in the background, ready()
   * says when; the model uploads its weights meanwhile), instead of after.
   */
  static async create(opts: { threads?: number; weightCapBytes?: number; fma?: boolean; q4?: boolean; threadsLater?: boolean } = {}): Promise<WasmKernel> {
    const fma = opts.fma ?? fmaSupport().fma;
    const q4 = opts.q4 ?? kernelEnv(process.env).q4;
    const mod = await kernelModule(fma, q4);
    const mem = new WebAssembly.Memory({ initial: 16, maximum: 65536, shared: true });
    const inst = await WebAssembly.instantiate(mod, { env: { mem } });
    const ops = await WebAssembly.instantiate(await opsModule(), { env: { mem } });
    const g = new WasmKernel(mem, inst.exports as unknown as KernelExports, ops.exports as unknown as OpsExports, fma, q4);
    if (opts.weightCapBytes !== undefined) g.weightCap = Math.min(opts.weightCapBytes, WASM_WEIGHT_CAP);
    const threads = opts.threads ?? kernelEnv(process.env).threads ?? Math.min(2, availableParallelism());
    // The worker boots (a Node.js thread: ~0.1–0.4 s) while the converter compiles and the caller goes on.
    g.started = threads >= 2 ? g.helper.start(mod, mem) : Promise.resolve();
    g.converter = await wasmConverter();
    if (!opts.threadsLater) await g.started;
    return g;
  }

  ready(): Promise<void> {
    return this.started;
  }

  get threads(): number {
    return this.helper.running ? 2 : 1;
  }

  /** Stops the worker thread (the kernel keeps working single-threaded). */
  close(): void {
    this.helper.stop();
  }

  park(): void {
    this.helper.park();
  }

  /**
   * Runs the kernel over all of C, splitting the column strips with the worker when worth it.
   * `fmt`: the format of a strip-packed weight (gemmp and its variants), or null for a dense
   * [K][nPad] operand (gemm).
   */
  private run(A: number, W: number, C: number, m: number, K: number, nPad: number, fmt: WFmt | null, argmax?: { n: number; out: Int32Array }): void {
    const strips = nPad / STRIP;
    const code = fmt === null ? 0 : FMT_CODE[fmt];
    const gemm = code === 0 ? this.exp.gemm : code === 1 ? this.exp.gemmp : code === 2 ? this.exp.gemmpbf16 : code === 3 ? this.exp.gemmpf16 : code === 4 ? this.exp.gemmpq8 : this.exp.gemmpq4;
    if (!this.helper.running || strips < 2 || m * K * nPad < SPLIT_MIN_MACS) {
      gemm(A, W, C, m, K, nPad, 0, m, 0, nPad);
      if (argmax) {
        const t = performance.now();
        this.argmaxPadded(C, m, nPad, argmax.n, argmax.out);
        this.argmaxMs += performance.now() - t;
      }
      return;
    }
    if (!argmax) {
      this.helper.share(code, gemm, [A, W, C, m, K, nPad, 0, m], nPad, STRIP);
      return;
    }
    // Greedy argmax chunk by chunk, by the thread that computed the chunk, while its columns are
    // still in that core's cache (a separate pass read 1 MB of logits for 8 rows, most of it
    // written by the other core); then the chunks' candidates merged in column order.
    const slot = this.argmaxSlots(m, strips);
    const cols = this.exp.argmaxcols;
    const post = (n0: number, n1: number) => {
      const t = performance.now();
      cols(C, nPad, argmax.n, m, slot, 0, 0, 0, n0, n1);
      this.argmaxMs += performance.now() - t;
    };
    this.helper.share(code, gemm, [A, W, C, m, K, nPad, 0, m], nPad, STRIP, { slot, n: argmax.n, post });
    const t = performance.now();
    this.mergeArgmax(C, m, nPad, argmax.n, slot, argmax.out);
    this.argmaxMs += performance.now() - t;
  }

  /** Candidate space for a chunked argmax: per strip, its chunk's end and M (index, value) pairs. */
  private argmaxSlots(m: number, strips: number): number {
    const bytes = strips * (8 + 8 * m);
    if (this.amBytes < bytes) {
      this.amPtr = this.alloc(bytes);
      this.amBytes = bytes;
    }
    return this.amPtr;
  }

  /**
   * Each row's argmax from its chunks' candidates, by argmaxJs's rules: start from column 0 (the
   * answer when it is NaN), take a chunk's candidate only when strictly larger. A chunk's
   * candidate is the first strict maximum of its columns, NaN never taken, so the first chunk
   * holding the row's largest value gives its first column, as the scalar scan would.
   */
  private mergeArgmax(C: number, m: number, nPad: number, n: number, slot: number, out: Int32Array): void {
    const f32 = this.f32;
    const i32 = new Int32Array(this.mem.buffer);
    const stride = 8 + 8 * m;
    for (let r = 0; r < m; r++) {
      let best = f32[C / 4 + r * nPad]!;
      let at = 0;
      if (best === best) {
        for (let n0 = 0; n0 < n; ) {
          const base = slot + (n0 / STRIP) * stride;
          const i = i32[(base + 8 + 8 * r) / 4]!;
          if (i >= 0) {
            const v = f32[(base + 12 + 8 * r) / 4]!;
            if (v > best) {
              best = v;
              at = i;
            }
          }
          n0 = i32[base / 4]!;
        }
      }
      out[r] = at;
    }
  }

  /** argmaxRows of the m rows of C when its rows have the padded stride (nPad ≥ n columns). */
  private argmaxPadded(C: number, m: number, nPad: number, n: number, out: Int32Array): void {
    for (let r = 0; r < m; r++) out[r] = this.exp.argmax(C + r * nPad * 4, n);
  }

  private alloc(bytes: number): number {
    const ptr = padTo(this.top, 64);
    const end = ptr + bytes;
    if (end > WASM_MAX_BYTES) throw new Error(`WASM kernel memory exhausted (${end} bytes requested); use the JS kernel for models this large`);
    const have = this.mem.buffer.byteLength;
    if (end > have) this.mem.grow(Math.ceil((end - have) / PAGE));
    this.top = end;
    this.f32 = new Float32Array(this.mem.buffer);
    this.ownBuffers.add(this.mem.buffer);
    return ptr;
  }

  /** Whether a weight of `n` x `k` still fits this instance's weight budget. */
  canHold(n: number, k: number, fmt: WFmt = 'f32'): boolean {
    return this.weightBytes + packedBytes(fmt, n, k) <= this.weightCap;
  }

  uploadEncoded(w: EncodedWeight, n: number, k: number): Weight {
    checkEncoded(w, n, k);
    const fmt = heldFormat(w.type, this.q4);
    // Unless the kernel holds 4-bit weights as q4, they are held as q8.
    if (fmt !== kernelFormat(w.type)) w = asQ8_0(w, this.converter);
    const nPad = padTo(n, STRIP);
    const bytes = packedBytes(fmt, n, k);
    if (!this.canHold(n, k, fmt)) throw new Error(`WASM kernel instance full: a ${n}x${k} weight does not fit its ${this.weightCap}-byte budget`);
    const ptr = this.alloc(bytes);
    packEncoded(w, n, k, new Uint8Array(this.mem.buffer, ptr, bytes), this.converter);
    this.weightBytes += bytes;
    return { k, n, nPad, ptr, data: null, part: 0, fmt };
  }

  upload(w: Float32Array, n: number, k: number, opts: UploadOptions = {}): Weight {
    const nPad = padTo(n, STRIP);
    if (!this.canHold(n, k)) throw new Error(`WASM kernel instance full: a ${n}x${k} weight does not fit its ${this.weightCap}-byte budget`);
    this.weightBytes += k * nPad * 4;
    const ptr = this.alloc(k * nPad * 4);
    // A gate|up weight whose halves fill whole strips is packed for the fused SwiGLU kernel.
    const glu = opts.glu === true && n % 32 === 0;
    if (glu) packGluStrips(w, n / 2, k, this.f32.subarray(ptr / 4, ptr / 4 + k * nPad));
    else packStrips(w, n, k, nPad, this.f32.subarray(ptr / 4, ptr / 4 + k * nPad));
    return { k, n, nPad, ptr, data: null, part: 0, fmt: 'f32', glu };
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
    const at = this.addrOf(x);
    if (at >= 0) return this.exp.argmax(at, x.length);
    const p = this.scratch(x.length * 4);
    this.f32.set(x, p / 4);
    return this.exp.argmax(p, x.length);
  }

  /**
   * Greedy argmax of `rows` rows of n floats, rows shared with the worker (a row each, pulled from
   * the shared counter) when there is one: each row's answer is argmax()'s.
   */
  argmaxRows(x: Float32Array, rows: number, n: number, out: Int32Array): void {
    if (rows === 0 || n === 0) {
      out.fill(0, 0, rows);
      return;
    }
    let X = this.addrOf(x);
    if (X < 0) {
      X = this.scratch(rows * n * 4);
      this.f32.set(x.subarray(0, rows * n), X / 4);
    }
    if (this.argmaxOutRows < rows) {
      this.argmaxOutPtr = this.alloc(rows * 4);
      this.argmaxOutRows = rows;
    }
    const O = this.argmaxOutPtr;
    if (this.helper.running && rows >= 2) this.helper.share(ARGMAX_ROWS, this.exp.argmaxrows, [X, O, n, 0, 0, 0, 0, 0], rows, 1);
    else this.exp.argmaxrows(X, O, n, 0, 0, 0, 0, 0, 0, rows);
    out.set(new Int32Array(this.mem.buffer, O, rows));
  }

  /** SwiGLU in WASM SIMD (f32 exp polynomial): ~10x the JS loop over Math.exp, same bits as swigluJs. */
  swiglu(gu: Float32Array, rows: number, hidden: number, out: Float32Array): void {
    if (rows === 0 || hidden === 0) return;
    const n = rows * hidden;
    // In place when both are in kernel memory (activation buffers), else through scratch.
    const inGU = gu.length >= 2 * n ? this.addrOf(gu) : -1;
    const inO = out.length >= n ? this.addrOf(out) : -1;
    const GU = inGU >= 0 ? inGU : this.scratch(padTo(2 * n * 4, 64) + n * 4);
    const O = inO >= 0 ? inO : inGU >= 0 ? this.scratch(n * 4) : GU + padTo(2 * n * 4, 64);
    if (inGU < 0) this.f32.set(gu.subarray(0, 2 * n), GU / 4);
    // Per element, so splitting rows with the worker changes no bit; serial, it was ~5 % of a
    // two-thread prefill.
    if (this.helper.running && n >= SWIGLU_SPLIT_MIN) this.helper.share(SWIGLU_ROWS, this.exp.swiglurows, [GU, O, hidden, 0, 0, 0, 0, 0], rows, 1);
    else this.exp.swiglu(GU, O, rows, hidden);
    if (inO < 0) out.set(this.f32.subarray(O / 4, O / 4 + n));
  }

  private stagePtr = 0;
  private stageBytes = 0;
  private stageKvDim = 0;
  /** The staged KV's dtype code for gatherkv/attendheads (= DType: 0 f32, 1 f16, 2 bf16, 3 int8, 4 fp8_e4m3, 5 fp8_e5m2). */
  private stageDtype: number = DType.f32;

  stageKv(pool: KvElements, blocks: readonly number[], nBlocks: number, blockFloats: number, layerOffset: number, kvDim: number, dtype: DType = DType.f32, layerElems = 2 * BLOCK_TOKENS * kvDim): void {
    const eb = DTYPE_BYTES[dtype];
    const bytes = nBlocks * layerElems * eb;
    if (bytes > this.stageBytes) {
      const size = Math.max(bytes, this.stageBytes * 2);
      this.stagePtr = this.alloc(size);
      this.stageBytes = size;
    }
    this.stageKvDim = kvDim;
    this.stageDtype = dtype;
    const buf = this.mem.buffer;
    if (eb === 4) stageInto(this.f32, this.stagePtr / 4, pool as Float32Array, blocks, nBlocks, blockFloats, layerOffset, layerElems);
    else if (eb === 2) stageInto(new Uint16Array(buf), this.stagePtr / 2, pool as Uint16Array, blocks, nBlocks, blockFloats, layerOffset, layerElems);
    else stageInto(new Uint8Array(buf), this.stagePtr, pool as Uint8Array, blocks, nBlocks, blockFloats, layerOffset, layerElems);
  }

  attendStaged(q: Float32Array, M: number, hd: number, off: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    const P = padTo(keys, STRIP);
    if (this.stageDtype === DType.int8 && hd % 4 === 0 && M > 0) {
      const s = this.attnScratch(q, 1, M, hd, P, lens, out);
      const g = off / hd;
      this.exp.attendnarrow(this.stagePtr, s.Q, s.S, s.O, s.L, M, hd, s.hdPad, this.stageKvDim, this.stageKvDim / hd, g, g + 1, keys, P, scale, DType.int8, s.KT, this.queryScratch(M, hd, s.V));
      if (s.O !== s.outAt) this.readRows(s.O, M, hd, s.hdPad, out);
      return;
    }
    this.attendCore(q, M, hd, P, lens, scale, out, (KT, V, hdPad) => this.exp.gatherkv(this.stagePtr, keys, P, this.stageKvDim, off, hd, KT, V, hdPad, this.stageDtype));
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
    const split = this.helper.running && (M * hd * P >= SPLIT_MIN_MACS || M * P * hdPad >= SPLIT_MIN_MACS);
    // Narrow KV, few rows (decode): the products read the staged rows themselves, same bits.
    // int8 always (its semantics are attendnarrow's, attention_int8_js.ts).
    const narrow = this.stageDtype !== DType.f32 && hd % 4 === 0 && ((M <= NARROW_MAX_ROWS && (M < 8 || !split)) || this.stageDtype === DType.int8);
    if (split && !narrow) {
      for (let g = 0; g < heads; g++) {
        this.attendStaged(q.subarray(g * rows, (g + 1) * rows), M, hd, g * hd, keys, lens, scale, out.subarray(g * rows, (g + 1) * rows));
      }
      return;
    }
    const s = this.attnScratch(q, heads, M, hd, P, lens, out);
    if (narrow) this.exp.attendnarrow(this.stagePtr, s.Q, s.S, s.O, s.L, M, hd, s.hdPad, this.stageKvDim, heads, 0, heads, keys, P, scale, this.stageDtype, s.KT, this.queryScratch(M, hd, s.V));
    else this.exp.attendheads(this.stagePtr, s.Q, s.KT, s.S, s.V, s.O, s.L, M, hd, s.hdPad, this.stageKvDim, heads, keys, P, scale, this.stageDtype);
    if (s.O !== s.outAt) this.readRows(s.O, heads * M, hd, s.hdPad, out);
  }

  attend(q: Float32Array, M: number, hd: number, kt: Float32Array, P: number, v: Float32Array, lens: Int32Array, scale: number, out: Float32Array): void {
    if (P % STRIP !== 0) throw new Error(`attend: P=${P} must be a multiple of ${STRIP}`);
    this.attendCore(q, M, hd, P, lens, scale, out, (KT, V, hdPad) => {
      const f32 = this.f32;
      // Kᵀ strip-packed ([P/32][hd][32]), the layout gatherkv writes and attgroups reads.
      for (let s = 0; s < P / STRIP; s++) {
        for (let e = 0; e < hd; e++) f32.set(kt.subarray(e * P + s * STRIP, e * P + s * STRIP + STRIP), KT / 4 + (s * hd + e) * STRIP);
      }
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
   * queries, copied in, [heads][M][hd]), KT (strip-packed [P/32][hd][32]), S ([M][P]), V ([P][hdPad]), O
   * ([heads][M][hdPad]) and L (the M row lengths, copied in), as byte addresses.
   */
  private attnScratch(q: Float32Array, heads: number, M: number, hd: number, P: number, lens: Int32Array, out: Float32Array) {
    const hdPad = padTo(hd, STRIP);
    const sz = (n: number) => padTo(n * 4, 64);
    // Queries in kernel memory (an activation buffer) are read in place.
    const inQ = q.length >= heads * M * hd ? this.addrOf(q) : -1;
    const base = this.scratch(sz(heads * M * hd) + sz(hd * P) + sz(M * P) + sz(P * hdPad) + sz(heads * M * hdPad) + sz(M));
    const Q = inQ >= 0 ? inQ : base;
    const KT = base + sz(heads * M * hd);
    const S = KT + sz(hd * P);
    const V = S + sz(M * P);
    const O0 = V + sz(P * hdPad);
    const L = O0 + sz(heads * M * hdPad);
    // The output written in place when it is in kernel memory with the kernel's row stride.
    const outAt = hdPad === hd && out.length >= heads * M * hd ? this.addrOf(out) : -1;
    const O = outAt >= 0 ? outAt : O0;
    if (inQ < 0) this.f32.set(q.subarray(0, heads * M * hd), Q / 4);
    new Int32Array(this.mem.buffer, L, M).set(lens.subarray(0, M));
    return { Q, KT, S, V, O, L, hdPad, outAt };
  }

  /** `rows` rows of `hd` floats from kernel memory at byte address O (row stride hdPad) into out. */
  private readRows(O: number, rows: number, hd: number, hdPad: number, out: Float32Array): void {
    const f32 = this.f32;
    const o0 = O / 4;
    if (hdPad === hd) out.set(f32.subarray(o0, o0 + rows * hd));
    else for (let r = 0; r < rows; r++) out.set(f32.subarray(o0 + r * hdPad, o0 + r * hdPad + hd), r * hd);
  }

  /**
   * One head's attention on kernel scratch: `fillKV(KT, V, hdPad)` writes keys and
   * values ([P][hdPad]) at those byte addresses (keys strip-packed, [P/32][hd][32]); then S = Q·KT, softmax, O = S·V, copied to `out`.
   */
  private attendCore(q: Float32Array, M: number, hd: number, P: number, lens: Int32Array, scale: number, out: Float32Array, fillKV: (KT: number, V: number, hdPad: number) => void): void {
    if (M === 0) return;
    const { Q, KT, S, V, O, L, hdPad, outAt } = this.attnScratch(q, 1, M, hd, P, lens, out);
    fillKV(KT, V, hdPad);
    // S = Q·KT, softmax and O = S·V per query row (attendrows), the rows shared with the worker
    // when the head is big enough: the softmax and O = S·V (a single 32-column strip) could not
    // be split by columns, and one hand-off replaces three.
    this.prm ||= this.alloc(64);
    const w = new Int32Array(this.mem.buffer, this.prm, 11);
    w.set([Q, KT, S, V, O, L, M, hd, P, hdPad]);
    new Float32Array(this.mem.buffer, this.prm + 40, 1)[0] = scale;
    const args = [this.prm, 0, 0, 0, 0, 0, 0, 0];
    if (this.helper.running && M >= 8 && M * P * (hd + hdPad) >= SPLIT_MIN_MACS) this.helper.share(ATTEND_ROWS, this.exp.attendrows, args, M, ATTEND_ROW_UNIT);
    else this.exp.attendrows(this.prm, 0, 0, 0, 0, 0, 0, 0, 0, M);
    if (O !== outAt) this.readRows(O, M, hd, hdPad, out);
  }

  private qsPtr = 0;
  private qsBytes = 0;

  /**
   * attendnarrow's query scratch: f16/fp8's scaled queries (M·hd floats, at most 32 rows: the
   * unused V operand `V` holds them), int8's int16 queries and scales (any M: a buffer of their own).
   */
  private queryScratch(M: number, hd: number, V: number): number {
    if (this.stageDtype !== DType.int8) return V;
    const bytes = padTo(M * padTo(hd, 8) * 2, 16) + (M + 4) * 4;
    if (bytes > this.qsBytes) {
      this.qsBytes = Math.max(bytes, this.qsBytes * 2);
      this.qsPtr = this.alloc(this.qsBytes);
    }
    return this.qsPtr;
  }

  /** Byte address of attendrows' parameter block (allocated at first use). */
  private prm = 0;

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
    this.run(A, B, C, m, K, nPad, null);
    const c0 = C / 4;
    if (nPad === N) out.set(f32.subarray(c0, c0 + m * N));
    else for (let r = 0; r < m; r++) out.set(f32.subarray(c0 + r * nPad, c0 + r * nPad + N), r * N);
  }

  matmulSwiglu(w: Weight, a: Float32Array, m: number, gu: Float32Array, out: Float32Array): void {
    if (!w.glu) {
      this.matmul(w, a, m, gu);
      this.swiglu(gu, m, w.n / 2, out);
      return;
    }
    const h = w.n / 2;
    if (a.length < m * w.k) throw new Error(`matmulSwiglu: input holds ${a.length} values, ${m}x${w.k} needed`);
    if (out.length < m * h) throw new Error(`matmulSwiglu: output holds ${out.length} values, ${m}x${h} needed`);
    if (m === 0) return;
    const K = w.k;
    const inA = this.addrOf(a);
    const inC = this.addrOf(out);
    const aBytes = inA >= 0 ? 0 : padTo(m * K * 4, 64);
    const cBytes = inC >= 0 ? 0 : m * h * 4;
    const base = aBytes + cBytes > 0 ? this.scratch(aBytes + cBytes) : 0;
    const A = inA >= 0 ? inA : base;
    const C = inC >= 0 ? inC : base + aBytes;
    if (inA < 0) this.f32.set(a.subarray(0, m * K), A / 4);
    // Columns split in packed strips like any product (a strip is 16 output columns, 64 bytes of
    // a C row, so the threads still never write the same cache line: rows are 64-byte aligned).
    const strips = w.nPad / STRIP;
    if (!this.helper.running || strips < 2 || m * K * w.nPad < SPLIT_MIN_MACS) this.exp.gemmpglu(A, w.ptr, C, m, K, w.nPad, 0, m, 0, w.nPad);
    else this.helper.share(GLU, this.exp.gemmpglu, [A, w.ptr, C, m, K, w.nPad, 0, m], w.nPad, STRIP);
    if (inC < 0) out.set(this.f32.subarray(C / 4, C / 4 + m * h));
  }

  matmul(w: Weight, a: Float32Array, m: number, out: Float32Array, argmaxOut?: Int32Array): void {
    checkArgs(w, a, m, out);
    if (argmaxOut && argmaxOut.length < m) throw new Error(`matmul: argmaxOut holds ${argmaxOut.length} rows, expected at least ${m}`);
    if (w.glu) throw new Error('matmul: a gate|up weight packed for the fused SwiGLU is computed by matmulSwiglu');
    if (m === 0) return;
    const { k: K, n: N, nPad } = w;
    // Operands in kernel memory (activation buffers) are read and written in place; others
    // pass through scratch (the output only when its rows have the kernel's padded stride).
    const inA = this.addrOf(a);
    const inC = nPad === N ? this.addrOf(out) : -1;
    const aBytes = inA >= 0 ? 0 : padTo(m * K * 4, 64);
    // Q8: the activations quantized (int16 [m][K], then f32 scales [m][K/32]); Q4: int8 [m][K],
    // then scales and block sums.
    const int8 = w.fmt === 'q8' || w.fmt === 'q4';
    const qBytes = w.fmt === 'q8' ? padTo(m * K * 2 + m * (K / 32) * 4, 64) : w.fmt === 'q4' ? padTo(m * K + 2 * m * (K / 32) * 4, 64) : 0;
    const cBytes = inC >= 0 ? 0 : m * nPad * 4;
    const base = aBytes + qBytes + cBytes > 0 ? this.scratch(aBytes + qBytes + cBytes) : 0;
    const A = inA >= 0 ? inA : base;
    const Q = base + aBytes;
    const C = inC >= 0 ? inC : Q + qBytes;
    const f32 = this.f32;
    if (inA < 0) f32.set(a.subarray(0, m * K), A / 4);
    if (int8) {
      if (w.fmt === 'q4') this.exp.quantq8i8(A, m, K, Q);
      else this.exp.quantq8(A, m, K, Q);
      this.run(Q, w.ptr, C, m, K, nPad, w.fmt, argmaxOut && { n: N, out: argmaxOut });
    } else this.run(A, w.ptr, C, m, K, nPad, w.fmt, argmaxOut && { n: N, out: argmaxOut });
    if (inC >= 0) return;
    const c0 = C / 4;
    if (nPad === N) out.set(f32.subarray(c0, c0 + m * N));
    else for (let r = 0; r < m; r++) out.set(f32.subarray(c0 + r * nPad, c0 + r * nPad + N), r * N);
  }
}

// The load-time conversions of wat/convert.ts, run through a module of their own: a tensor goes
// through its memory in chunks of a few MiB (so the module stays small whatever the model), and
// the results are copied out. Same bytes as the JavaScript definitions (gguf_blocks.ts
// decodeBlocks, gguf_format.ts quantizeQ8_0, weight_pack.ts q4_0AsQ8_0, packEncoded and packQ4),
// which remain the fallback where the module cannot be compiled.
import { convertWat } from './wat/convert.js';
import { padTo, Q4_BLOCK_BYTES, Q8_BLOCK_BYTES, STRIP } from './layout.js';
import { BLOCK_LAYOUT, type RequantizedType } from '../formats/gguf_blocks.js';
import { compileWat } from './wat/compile.js';


type Decode = (S: number, F: number, blocks: number) => void;
interface ConvertExports {
  q8quant(X: number, O: number, blocks: number): void;
  q8pack(S: number, D: number, n: number, k: number): void;
  p16pack(S: number, D: number, n: number, k: number, f16: number): number;
  q4pack(S: number, D: number, n: number, k: number, type: number): void;
  q4toq8(S: number, O: number, blocks: number): void;
  dq4_1: Decode;
  dq5_0: Decode;
  dq5_1: Decode;
  dq4_k: Decode;
  dq5_k: Decode;
  dq6_k: Decode;
}

const DECODER: Record<RequantizedType, keyof ConvertExports> = { Q4_1: 'dq4_1', Q5_0: 'dq5_0', Q5_1: 'dq5_1', Q4_K: 'dq4_k', Q5_K: 'dq5_k', Q6_K: 'dq6_k' };

const PAGE = 65536;
/** Blocks of 32 values quantized per call: 2 MiB of f32 in, 544 KiB out. */
const QUANT_CHUNK_BLOCKS = 16384;
/** Bytes of Q8_0 source rows packed per call (at least one strip of 32 rows, whatever its size). */
const PACK_CHUNK_BYTES = 4 << 20;
/** Values decoded per call, and where a call's file bytes, f32 values and Q8_0 blocks go. */
const DECODE_CHUNK = 65536;
const DEC_IN = 0;
const DEC_F32 = 65536; // past the largest chunk of file bytes (Q5_1: 24 bytes per 32 values)
const DEC_Q8 = DEC_F32 + DECODE_CHUNK * 4;

export class WasmConverter {
  private constructor(
    private readonly mem: WebAssembly.Memory,
    private readonly fns: ConvertExports,
  ) {}

  static async create(): Promise<WasmConverter> {
    const mem = new WebAssembly.Memory({ initial: 1 });
    const inst = await WebAssembly.instantiate(await convertModule(), { env: { mem } });
    return new WasmConverter(mem, inst.exports as unknown as ConvertExports);
  }

  /** The module's memory as bytes, grown to at least `bytes` first. */
  private bytes(bytes: number): Uint8Array {
    const have = this.mem.buffer.byteLength;
    if (bytes > have) this.mem.grow(Math.ceil((bytes - have) / PAGE));
    return new Uint8Array(this.mem.buffer);
  }

  /** quantizeQ8_0(x, out, outOff) of gguf_format.ts: the same bytes. */
  quantizeQ8_0(x: Float32Array, out: Uint8Array, outOff = 0): void {
    if (x.length % 32 !== 0) throw new Error(`Q8_0 needs a multiple of 32 values, got ${x.length}`);
    const blocks = x.length / 32;
    if (outOff + blocks * 34 > out.length) throw new Error(`Q8_0 output of ${out.length} bytes cannot take ${blocks} blocks at ${outOff}`);
    const src = new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
    const inBytes = QUANT_CHUNK_BLOCKS * 128;
    const mem = this.bytes(inBytes + QUANT_CHUNK_BLOCKS * 34);
    for (let b = 0; b < blocks; b += QUANT_CHUNK_BLOCKS) {
      const nb = Math.min(QUANT_CHUNK_BLOCKS, blocks - b);
      mem.set(src.subarray(b * 128, (b + nb) * 128), 0);
      this.fns.q8quant(0, inBytes, nb);
      out.set(mem.subarray(inBytes, inBytes + nb * 34), outOff + b * 34);
    }
  }

  /**
   * decodeBlocks(type, bytes, count, out) of gguf_blocks.ts, the same values, and with `q8` also
   * quantizeQ8_0 of them into `q8` (count / 32 × 34 bytes): a re-quantized tensor never exists
   * as f32 outside the module.
   */
  private decodeChunks(type: RequantizedType, bytes: Uint8Array, count: number, out: Float32Array | null, q8: Uint8Array | null): void {
    const { block, bytes: bb } = BLOCK_LAYOUT[type];
    if (count % block !== 0) throw new Error(`${type} needs a multiple of ${block} values, got ${count}`);
    if (bytes.length < (count / block) * bb) throw new Error(`${type}: ${bytes.length} bytes cannot hold ${count} values`);
    const mem = this.bytes(DEC_Q8 + (DECODE_CHUNK / 32) * 34);
    const f32 = new Float32Array(mem.buffer, DEC_F32, DECODE_CHUNK);
    const decode = this.fns[DECODER[type]] as Decode;
    for (let v = 0; v < count; v += DECODE_CHUNK) {
      const n = Math.min(DECODE_CHUNK, count - v);
      const b0 = (v / block) * bb;
      mem.set(bytes.subarray(b0, b0 + (n / block) * bb), DEC_IN);
      decode(DEC_IN, DEC_F32, n / block);
      if (out) out.set(f32.subarray(0, n), v);
      if (q8) {
        this.fns.q8quant(DEC_F32, DEC_Q8, n / 32);
        q8.set(mem.subarray(DEC_Q8, DEC_Q8 + (n / 32) * 34), (v / 32) * 34);
      }
    }
  }

  /** decodeBlocks of gguf_blocks.ts: the same f32 values. */
  decode(type: RequantizedType, bytes: Uint8Array, count: number, out: Float32Array): void {
    this.decodeChunks(type, bytes, count, out, null);
  }

  /** The Q8_0 bytes quantizeQ8_0 gives for decodeBlocks' values of a tensor. */
  requantize(type: RequantizedType, bytes: Uint8Array, count: number): Uint8Array {
    const q8 = new Uint8Array((count / 32) * 34);
    this.decodeChunks(type, bytes, count, null, q8);
    return q8;
  }

  /** q4_0AsQ8_0 of weight_pack.ts: the same bytes. */
  q4_0AsQ8_0(bytes: Uint8Array): Uint8Array {
    if (bytes.length % 18 !== 0) throw new Error(`Q4_0 weight of ${bytes.length} bytes is not whole 18-byte blocks`);
    const blocks = bytes.length / 18;
    const out = new Uint8Array(blocks * 34);
    const mem = this.bytes(QUANT_CHUNK_BLOCKS * (18 + 34));
    const o = QUANT_CHUNK_BLOCKS * 18;
    for (let b = 0; b < blocks; b += QUANT_CHUNK_BLOCKS) {
      const nb = Math.min(QUANT_CHUNK_BLOCKS, blocks - b);
      mem.set(bytes.subarray(b * 18, (b + nb) * 18), 0);
      this.fns.q4toq8(0, o, nb);
      out.set(mem.subarray(o, o + nb * 34), b * 34);
    }
    return out;
  }

  /**
   * Runs `pack(S, D, rows, r0)` over n rows of `rowBytes` each, a few MiB of strips (32 rows) at a
   * time: the rows copied in at S = 0, the strips' `stripOut` bytes of output at D zeroed first
   * (columns past n stay zero), then copied out to `dest` at the strips' place.
   */
  private byStrips(src: Uint8Array, n: number, rowBytes: number, stripOut: number, dest: Uint8Array, pack: (D: number, rows: number, r0: number) => void): void {
    const stripsPerCall = Math.max(1, Math.floor(PACK_CHUNK_BYTES / (STRIP * rowBytes)));
    const inBytes = padTo(stripsPerCall * STRIP * rowBytes, 16);
    const mem = this.bytes(inBytes + stripsPerCall * stripOut);
    const strips = Math.ceil(n / STRIP);
    for (let s = 0; s < strips; s += stripsPerCall) {
      const ns = Math.min(stripsPerCall, strips - s);
      const r0 = s * STRIP;
      const r1 = Math.min(n, (s + ns) * STRIP);
      mem.set(src.subarray(r0 * rowBytes, r1 * rowBytes), 0);
      mem.fill(0, inBytes, inBytes + ns * stripOut);
      pack(inBytes, r1 - r0, r0);
      dest.set(mem.subarray(inBytes, inBytes + ns * stripOut), s * stripOut);
    }
  }

  /**
   * The q8 layout of n rows of Q8_0 blocks (k values a row) into `dest` (packedBytes('q8', n, k)
   * bytes; columns past n are zero), as weight_pack.ts packEncoded places them. The caller has
   * checked the sizes.
   */
  packQ8(src: Uint8Array, n: number, k: number, dest: Uint8Array): void {
    this.byStrips(src, n, (k / 32) * 34, (k / 32) * Q8_BLOCK_BYTES, dest, (D, rows) => this.fns.q8pack(0, D, rows, k));
  }

  /**
   * The q4 layout of n rows of Q4_0, Q4_1 or Q4_K blocks (k values a row) into `dest`
   * (packedBytes('q4', n, k) bytes; columns past n are zero), as weight_pack.ts packQ4 places
   * them. The caller has checked the sizes.
   */
  packQ4(type: 'Q4_0' | 'Q4_1' | 'Q4_K', src: Uint8Array, n: number, k: number, dest: Uint8Array): void {
    const rowBytes = type === 'Q4_K' ? (k / 256) * 144 : (k / 32) * (type === 'Q4_0' ? 18 : 20);
    const code = type === 'Q4_0' ? 0 : type === 'Q4_1' ? 1 : 2;
    this.byStrips(src, n, rowBytes, (k / 32) * Q4_BLOCK_BYTES, dest, (D, rows) => this.fns.q4pack(0, D, rows, k, code));
  }

  /**
   * The 16-bit panel layout of n rows of k F16 or BF16 values into `dest` (packedBytes('f16', n,
   * k) bytes; columns past n are zero), as weight_pack.ts packEncoded places them; for F16, an
   * Inf or NaN is refused naming its row and column (the kernel widens finite halves only).
   */
  pack16(src: Uint8Array, n: number, k: number, f16: boolean, dest: Uint8Array): void {
    this.byStrips(src, n, k * 2, STRIP * k * 2, dest, (D, rows, r0) => {
      const bad = this.fns.p16pack(0, D, rows, k, f16 ? 1 : 0);
      if (bad) throw new Error(`F16 weight holds Inf or NaN at row ${r0 + Math.floor((bad - 1) / k)}, column ${(bad - 1) % k}`);
    });
  }
}

let modulePromise: Promise<WebAssembly.Module> | null = null;
function convertModule(): Promise<WebAssembly.Module> {
  modulePromise ??= compileWat('convert.wat', convertWat(), { simd: true });
  return modulePromise;
}

let converterPromise: Promise<WasmConverter | null> | null = null;

/**
 * The process's converter, or null where its module does not compile (the JavaScript definitions
 * then do the work, with the same result, slower; a warning says so). Its methods are
 * synchronous, so one instance serves every load in the process.
 */
export function wasmConverter(): Promise<WasmConverter | null> {
  converterPromise ??= WasmConverter.create().catch((e: Error) => {
    process.emitWarning(`kvc: the WASM load-time converter is unavailable (${e.message}); weights are converted in JavaScript, slower`);
    return null;
  });
  return converterPromise;
}

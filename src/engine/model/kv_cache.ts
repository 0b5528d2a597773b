// Paged KV cache: K/V in fixed blocks of BLOCK_TOKENS positions, handed out from one pool
// sized by a byte budget, held in the KV dtype (--kv-cache-dtype): f32 values, f16 / bf16 bit
// patterns (a Uint16Array), or bytes (a Uint8Array: int8 with per-token-per-head f16 scales,
// fp8_e4m3, fp8_e5m2), rounded to nearest even (int8: quantised, common/int8_rows.ts) when the
// model writes them; attention reads them as held and widens them in the kernel's products
// (kernels/wat/attention_narrow.ts; a prefill's gather, kernels/wat/gather.ts). A sequence owns a
// block table; positions map to (block, slot).
// Block layout: [numLayers] of one layer's region: K [BLOCK_TOKENS][numKvHeads*headDim], then V
// likewise (elements of the dtype), then for int8 only the scales, K [BLOCK_TOKENS][numKvHeads]
// f16 then V likewise. A layer's region of a block is contiguous, so attention stages it with one
// copy. exportRange/importRange translate to and from the chunk payload layout of
// src/common/chunk.ts, [2][numLayers][numTokens][numKvHeads*headDim] (the dtype's elements; int8:
// the scales [2][numLayers][numTokens][numKvHeads] f16 first), copying the exact bytes: imported KV
// is bitwise what was held.
import { DType, DTYPE_BYTES, type KvLayout } from '../../common/chunk.js';
import { rowScaleBytes } from '../../common/dtype.js';
import { f32ToE4m3, f32ToE5m2 } from '../../common/fp8.js';
import { f16ToF32, f32ToBf16, f32ToF16 } from '../../common/half.js';
import { quantizeInt8Row } from '../../common/int8_rows.js';
import type { KvElements } from './kernels/layout.js';

/** A scale rounded to f16 (nearest even), saturating at f16's largest finite value. */
function f16Scale(s: number): number {
  const v = f16ToF32(f32ToF16(s));
  return v === Infinity ? 65504 : v;
}

export const BLOCK_TOKENS = 16;
/** log2(BLOCK_TOKENS): position j is in block j >> BLOCK_SHIFT (the attention kernels rely on it). */
export const BLOCK_SHIFT = 4;
if (1 << BLOCK_SHIFT !== BLOCK_TOKENS) throw new Error('BLOCK_TOKENS must be 1 << BLOCK_SHIFT');

export class KvCacheFullError extends Error {
  override name = 'KvCacheFullError';
}

export class KvCacheError extends Error {
  override name = 'KvCacheError';
}

interface SeqState {
  blocks: number[];
  /** Number of leading positions holding valid KV (written by forward or importRange). */
  length: number;
}

export class PagedKvCache {
  readonly layout: KvLayout;
  readonly kvDim: number;
  /** Pool elements in one block (for the byte dtypes, bytes: int8 scales included). */
  readonly blockFloats: number;
  /** Pool elements of one layer's region of a block (K, V, and int8's scales). */
  readonly layerElems: number;
  readonly blockBytes: number;
  readonly totalBlocks: number;
  /** Bytes of one element (4 for f32, 2 for f16 and bf16, 1 for the 8-bit types). */
  readonly elemBytes: number;
  /** Bytes of scales per (K/V, token, KV head) row: 2 (f16) for int8, else 0. */
  readonly scaleBytes: number;
  /** The whole pool; model.ts writes it through writeRows() and the kernel stages it. */
  readonly pool: KvElements;
  private readonly poolBytes: Uint8Array;
  /** int8: the pool seen as u16, for the f16 scales (2-byte aligned within every region). */
  private readonly poolScales: Uint16Array | null;
  /** int8: one head's quantised row before it is copied into the pool (and its bytes). */
  private readonly qRow: Int8Array;
  private readonly qRowBytes: Uint8Array;
  private readonly freeList: number[];
  /** Most blocks ever in use at once: blocks are reused last-freed first, so exactly these are resident. */
  private peakUsed = 0;
  private readonly seqs = new Map<string | number, SeqState>();

  constructor(shape: { numLayers: number; numKvHeads: number; headDim: number; dtype?: DType }, budgetBytes: number) {
    const dtype = shape.dtype ?? DType.f32;
    this.layout = { dtype, numLayers: shape.numLayers, numKvHeads: shape.numKvHeads, headDim: shape.headDim };
    this.kvDim = shape.numKvHeads * shape.headDim;
    this.elemBytes = DTYPE_BYTES[dtype];
    this.scaleBytes = rowScaleBytes(dtype);
    this.layerElems = 2 * BLOCK_TOKENS * this.kvDim + (this.scaleBytes * 2 * BLOCK_TOKENS * shape.numKvHeads) / this.elemBytes;
    this.blockFloats = shape.numLayers * this.layerElems;
    this.blockBytes = this.blockFloats * this.elemBytes;
    if (!Number.isFinite(budgetBytes) || budgetBytes < this.blockBytes) {
      throw new KvCacheError(`KV cache budget of ${budgetBytes} bytes is smaller than one block (${this.blockBytes} bytes)`);
    }
    this.totalBlocks = Math.floor(budgetBytes / this.blockBytes);
    // Zero-filled pages are only touched when used, so a generous budget costs no RSS up front.
    const n = this.totalBlocks * this.blockFloats;
    this.pool = dtype === DType.f32 ? new Float32Array(n) : this.elemBytes === 2 ? new Uint16Array(n) : new Uint8Array(n);
    this.poolBytes = new Uint8Array(this.pool.buffer);
    this.poolScales = this.scaleBytes ? new Uint16Array(this.pool.buffer, 0, Math.floor(this.pool.byteLength / 2)) : null;
    this.qRow = new Int8Array(shape.headDim);
    this.qRowBytes = new Uint8Array(this.qRow.buffer);
    // Pop from the end → blocks are handed out in ascending order.
    this.freeList = Array.from({ length: this.totalBlocks }, (_, i) => this.totalBlocks - 1 - i);
  }

  get usedBlocks(): number {
    return this.totalBlocks - this.freeList.length;
  }
  get freeBlocks(): number {
    return this.freeList.length;
  }
  /** Bytes of the pool's pages touched so far (resident for good: the pool never hands pages back). */
  get residentBytes(): number {
    return this.peakUsed * this.blockBytes;
  }
  /** Positions the whole pool can hold. */
  get capacityTokens(): number {
    return this.totalBlocks * BLOCK_TOKENS;
  }

  static blocksFor(numTokens: number): number {
    return Math.ceil(numTokens / BLOCK_TOKENS);
  }

  /** Blocks still missing for `seqId` (or a new sequence) to hold `numTokens` positions. */
  blocksNeeded(numTokens: number, seqId?: string | number): number {
    const have = seqId !== undefined ? (this.seqs.get(seqId)?.blocks.length ?? 0) : 0;
    return Math.max(0, PagedKvCache.blocksFor(numTokens) - have);
  }

  /** True if `numTokens` positions (total, for `seqId` if it exists) fit in the free blocks. */
  canAllocate(numTokens: number, seqId?: string | number): boolean {
    return this.blocksNeeded(numTokens, seqId) <= this.freeList.length;
  }

  has(seqId: string | number): boolean {
    return this.seqs.has(seqId);
  }

  /** Valid (written) positions of a sequence; 0 if unknown. */
  length(seqId: string | number): number {
    return this.seqs.get(seqId)?.length ?? 0;
  }

  /** Ensures `seqId` has room for `numTokens` positions in total (grow only). Throws KvCacheFullError. */
  allocate(seqId: string | number, numTokens: number): void {
    if (!Number.isInteger(numTokens) || numTokens < 0) throw new KvCacheError(`allocate: numTokens must be a non-negative integer, got ${numTokens}`);
    let s = this.seqs.get(seqId);
    const need = this.blocksNeeded(numTokens, seqId);
    if (need > this.freeList.length) {
      throw new KvCacheFullError(`KV cache full: sequence ${seqId} needs ${need} more blocks, ${this.freeList.length} of ${this.totalBlocks} free`);
    }
    if (!s) {
      s = { blocks: [], length: 0 };
      this.seqs.set(seqId, s);
    }
    for (let i = 0; i < need; i++) s.blocks.push(this.freeList.pop()!);
    this.peakUsed = Math.max(this.peakUsed, this.totalBlocks - this.freeList.length);
  }

  /** Releases every block of the sequence (no-op for an unknown id). */
  free(seqId: string | number): void {
    const s = this.seqs.get(seqId);
    if (!s) return;
    for (let i = s.blocks.length - 1; i >= 0; i--) this.freeList.push(s.blocks[i]!);
    this.seqs.delete(seqId);
  }

  /** The block table of a sequence (pool block indices); throws if unknown. */
  blockTable(seqId: string | number): readonly number[] {
    const s = this.seqs.get(seqId);
    if (!s) throw new KvCacheError(`unknown sequence ${seqId}`);
    return s.blocks;
  }

  /** Records that positions [0, length) hold valid KV (called by the model after writing). */
  setLength(seqId: string | number, length: number): void {
    const s = this.seqs.get(seqId);
    if (!s) throw new KvCacheError(`unknown sequence ${seqId}`);
    if (length > s.blocks.length * BLOCK_TOKENS) throw new KvCacheError(`sequence ${seqId}: length ${length} exceeds its ${s.blocks.length} blocks`);
    s.length = length;
  }

  /** Element offset in `pool` of K (kv=0) or V (kv=1) of `layer` at `pos`. */
  offset(blocks: readonly number[], layer: number, kv: 0 | 1, pos: number): number {
    const b = blocks[pos >> 4];
    if (b === undefined) throw new KvCacheError(`position ${pos} is beyond the allocated blocks`);
    return b * this.blockFloats + layer * this.layerElems + (kv * BLOCK_TOKENS + (pos & 15)) * this.kvDim;
  }

  /** Element offset of `layer`'s region within a block (what attention stages). */
  layerOffset(layer: number): number {
    return layer * this.layerElems;
  }

  /** int8: byte offset in the pool of the scales of the row at element offset `at` (an offset() value). */
  private scaleOffset(at: number): number {
    const rel = at % this.layerElems;
    return at - rel + 2 * BLOCK_TOKENS * this.kvDim + (rel / this.kvDim) * this.layout.numKvHeads * this.scaleBytes;
  }

  /** Chunk payload bytes for `numTokens` positions. */
  payloadBytes(numTokens: number): number {
    return 2 * this.layout.numLayers * numTokens * (this.kvDim * this.elemBytes + this.layout.numKvHeads * this.scaleBytes);
  }

  /**
   * Writes f32 rows src[from..to) (whole positions of one block, K or V) at element offset `at` of
   * the pool (offset()), rounding to the KV dtype (nearest even; fp8 saturating; int8 quantised per
   * head with its f16 scale written beside the block's rows).
   */
  writeRows(src: Float32Array, from: number, to: number, at: number): void {
    const pool = this.pool;
    if (pool instanceof Float32Array) {
      pool.set(src.subarray(from, to), at);
      return;
    }
    const dt = this.layout.dtype;
    if (dt === DType.f16) for (let i = from; i < to; i++) pool[at++] = f32ToF16(src[i]!);
    else if (dt === DType.bf16) for (let i = from; i < to; i++) pool[at++] = f32ToBf16(src[i]!);
    else if (dt === DType.fp8_e4m3) for (let i = from; i < to; i++) pool[at++] = f32ToE4m3(src[i]!);
    else if (dt === DType.fp8_e5m2) for (let i = from; i < to; i++) pool[at++] = f32ToE5m2(src[i]!);
    else this.writeInt8Rows(src, from, to, at);
  }

  private writeInt8Rows(src: Float32Array, from: number, to: number, at: number): void {
    const hd = this.layout.headDim;
    const q = this.qRow;
    const pool = this.poolBytes;
    const scales = this.poolScales!;
    for (let r = from; r < to; r += this.kvDim, at += this.kvDim) {
      let so = this.scaleOffset(at) / 2;
      for (let e = 0; e < this.kvDim; e += hd) {
        scales[so++] = f32ToF16(quantizeInt8Row(src, r + e, hd, q, 0, f16Scale));
        pool.set(this.qRowBytes, at + e);
      }
    }
  }

  /**
   * Copies positions [start, end) of `seqId` into `dest` in chunk payload layout
   * [2][numLayers][end-start][kvDim] elements of the dtype, LE. `dest` may be any byte view (no alignment needed).
   */
  exportRange(seqId: string | number, start: number, end: number, dest: Uint8Array): void {
    const s = this.seqs.get(seqId);
    if (!s) throw new KvCacheError(`exportRange: unknown sequence ${seqId}`);
    if (!(Number.isInteger(start) && Number.isInteger(end) && 0 <= start && start < end && end <= s.length)) {
      throw new KvCacheError(`exportRange: range [${start}, ${end}) is not within the ${s.length} valid positions of sequence ${seqId}`);
    }
    const n = end - start;
    if (dest.byteLength < this.payloadBytes(n)) throw new KvCacheError(`exportRange: destination holds ${dest.byteLength} bytes, ${this.payloadBytes(n)} needed`);
    this.copyRows(s.blocks, start, n, dest, true);
  }

  /**
   * The row copies between the pool and a chunk payload `buf` ([2][L][n][kvDim] elements of the
   * dtype; int8: after the scales [2][L][n][H] f16) for positions start..start+n of `blocks`:
   * into `buf` when `out`, else out of it.
   */
  private copyRows(blocks: readonly number[], start: number, n: number, buf: Uint8Array, out: boolean): void {
    const eb = this.elemBytes;
    const rowBytes = this.kvDim * eb;
    const sRow = this.layout.numKvHeads * this.scaleBytes;
    const L = this.layout.numLayers;
    const values = 2 * L * n * sRow; // int8's scales come first
    const pool = this.poolBytes;
    for (let kv = 0; kv < 2; kv++) {
      for (let l = 0; l < L; l++) {
        const row0 = (kv * L + l) * n;
        for (let i = 0; i < n; i++) {
          const at = this.offset(blocks, l, kv as 0 | 1, start + i);
          const o = at * eb;
          const d = values + (row0 + i) * rowBytes;
          if (out) buf.set(pool.subarray(o, o + rowBytes), d);
          else pool.set(buf.subarray(d, d + rowBytes), o);
          if (sRow === 0) continue;
          const so = this.scaleOffset(at);
          const ds = (row0 + i) * sRow;
          if (out) buf.set(pool.subarray(so, so + sRow), ds);
          else pool.set(buf.subarray(ds, ds + sRow), so);
        }
      }
    }
  }

  /**
   * Writes `numTokens` positions starting at `start` from a chunk payload. The sequence must
   * already have valid KV up to `start` (imports extend a prefix) and is grown as needed.
   */
  importRange(seqId: string | number, start: number, payload: Uint8Array, numTokens: number): void {
    if (!Number.isInteger(numTokens) || numTokens <= 0) throw new KvCacheError(`importRange: numTokens must be a positive integer, got ${numTokens}`);
    const cur = this.length(seqId);
    if (!Number.isInteger(start) || start < 0 || start > cur) {
      throw new KvCacheError(`importRange: start ${start} leaves a gap after the ${cur} valid positions of sequence ${seqId}`);
    }
    if (payload.byteLength !== this.payloadBytes(numTokens)) {
      throw new KvCacheError(`importRange: payload of ${payload.byteLength} bytes does not match ${numTokens} tokens (${this.payloadBytes(numTokens)} bytes)`);
    }
    this.allocate(seqId, start + numTokens);
    const s = this.seqs.get(seqId)!;
    this.copyRows(s.blocks, start, numTokens, payload, false);
    s.length = Math.max(s.length, start + numTokens);
  }
}

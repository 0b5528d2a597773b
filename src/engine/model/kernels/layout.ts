// How the kernels lay out weights and split work: the strip and panel geometry of packed weights,
// the packed formats and their block sizes, the attention row group. The WAT generators (wat/),
// the weight packers (weight_pack.ts, convert_wasm.ts) and the kernel drivers all read them here.

/** Columns per strip of packed weights (and per GEMM column chunk). */
export const STRIP = 32;
/** `n` rounded up to a multiple of `s` (columns to whole strips, bytes to alignment). */
export const padTo = (n: number, s: number) => Math.ceil(n / s) * s;

/** Rows per row block of the GEMMs (its A block stays in L1/L2). */
export const MB = 64;

/**
 * Columns per panel: a strip of packed weights is STRIP / PANEL panels, each [K][PANEL] — the
 * columns of one register tile, contiguous over k (see gemmFunc).
 */
export const PANEL = 8;

/**
 * Where packed column `c` of a weight with `k` rows starts, in values, in the WASM kernel's weight
 * layout (wat/gemm.ts gemmFunc): strips of STRIP columns, each STRIP / PANEL panels of [k][PANEL];
 * its value at row kk is at panelIndex(c, k) + kk * PANEL.
 */
export function panelIndex(c: number, k: number): number {
  const inStrip = c % STRIP;
  return (c - inStrip) * k + (inStrip - (inStrip % PANEL)) * k + (inStrip % PANEL);
}

/**
 * Weight formats of packed weights (see gemmFunc). Each is turned into the f32 value the
 * plain-JS decoder (gguf_format.ts dequantize, safetensors.ts) gives, then used exactly like an
 * f32 weight: a model computes the same bits as with those values widened to f32 at load.
 *   f32   [4][K][8] f32 per strip (panels), 32 bytes a panel row;
 *   bf16  [4][K][8] u16 per strip: the f32 bits are the u16 << 16;
 *   f16   [4][K][8] u16 per strip: |h| << 13 reinterpreted as f32, times 2^112 (exact for normal and
 *         subnormal halves; Inf/NaN weights are refused at upload), then the sign;
 *   q8    per strip, two runs of k-blocks, one per half of 16 columns (two streams from memory);
 *         per half and block of 32 k: 16 f32 column scales (64 bytes), then 16 k-pairs of
 *         [16 columns][2] i8 (512 bytes) — the layout i32x4.dot_i16x8_s takes (two streams
 *         instead of one run of 32-column blocks); computed as an int8 dot product
 *         against quantized activations (q8_dot.ts defines the bits; gemmpq8 below), not widened;
 *   q4    4-bit weights with a scale and an offset per column and block of 32 (x = s·q − o, q in
 *         0..15: Q4_0, Q4_1 and Q4_K as their files hold them), in modules built with relaxed
 *         SIMD only (gemmpq4 multiplies with its i8 × i7 dot): q8's runs of k-blocks per half,
 *         each half-block 16 f32 scales, 16 f32 offsets, then 8 k-quad rows of 32 bytes — 4-column
 *         group g's 16 values (column c mod 4, then k mod 4: [c][k]) in bytes 16·(g >> 1) …,
 *         low nibbles for even g, high for odd (0.75 bytes a weight against q8's 1.125).
 */
export type WFmt = 'f32' | 'bf16' | 'f16' | 'q8' | 'q4';

/** q8: bytes of one k-block of a strip (scales + 32 rows of 32 i8). */
export const Q8_BLOCK_BYTES = STRIP * 4 + 32 * STRIP;
/** q8: columns of one half of a strip (gemmpq8 takes a strip in two passes, one per half). */
export const Q8_HALF_COLS = STRIP / 2;
/** q8: bytes of one k-pair row of a half: its columns × 2 i8. */
export const Q8_HALF_PAIR_BYTES = Q8_HALF_COLS * 2;
/** q8: bytes of one k-block of one half of a strip: its column scales (f32), then 16 k-pair rows. */
export const Q8_HALF_BLOCK_BYTES = Q8_BLOCK_BYTES / 2;
/** q4: bytes of one k-quad row of a half (4 k of 16 columns as nibbles). */
export const Q4_HALF_QUAD_BYTES = 32;
/** q4: bytes of one k-block of one half: 16 f32 column scales, 16 f32 column offsets, 8 k-quad rows. */
export const Q4_HALF_BLOCK_BYTES = Q8_HALF_COLS * 8 + 8 * Q4_HALF_QUAD_BYTES;
/** q4: bytes of one k-block of a strip (both halves). */
export const Q4_BLOCK_BYTES = 2 * Q4_HALF_BLOCK_BYTES;

/**
 * Query rows per attention group (a power of two, a multiple of the 4-row tile): the rows that
 * share one key count. 16 rows (four tiles) reuse each 32-key strip of Kᵀ and V from L1 four
 * times; 4-row groups walked all keys per tile (one thread: 8 % slower than the 64-token blocks
 * before them, where 16-row groups are within 4 %).
 */
export const ATT_GROUP = 16;

/** The KV pool's element array: f32 values, 16-bit patterns (f16, bf16) or bytes (int8 with its scales, fp8), widened by the kernels. */
export type KvElements = Float32Array | Uint16Array | Uint8Array;

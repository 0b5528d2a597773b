// The WASM kernel's job codes (CTL.PACKED: which export a worker job runs) and its size limits:
// the numbers wasm_kernel.ts decides by, apart from the code that uses them.
import { ATT_GROUP, type WFmt } from './layout.js';

/** CTL.PACKED codes: which export a job runs (the worker picks the same). */
export const FMT_CODE: Record<WFmt, number> = { f32: 1, bf16: 2, f16: 3, q8: 4, q4: 9 };
/** CTL.PACKED code of attendrows (a job over query rows). */
export const ATTEND_ROWS = 5;
/** CTL.PACKED code of swiglurows (a job over activation rows). */
export const SWIGLU_ROWS = 6;
/** CTL.PACKED code of gemmpglu (the fused gate|up product and SwiGLU; columns in the packed space). */
export const GLU = 7;
/** CTL.PACKED code of argmaxrows (greedy argmax of logits rows). */
export const ARGMAX_ROWS = 8;
/** Query rows a narrow KV's attention reads the staged rows for (attendnarrow); more share one f32 copy (the GEMMs). */
export const NARROW_MAX_ROWS = 32;
/** attendrows chunks are whole attention groups (layout.ts ATT_GROUP: rows sharing one key count). */
export const ATTEND_ROW_UNIT = ATT_GROUP;

/**
 * Activation buffers stay in kernel memory up to this many bytes in all (beyond, plain arrays
 * that the kernel copies through scratch): weights take most of a large model's address space.
 */
export const ACTIVATION_CAP = 1024 * 1024 * 1024;

export const PAGE = 65536;
/** wasm32 addresses 4 GiB; stay clear of the top for scratch. */
export const WASM_MAX_BYTES = 4 * 1024 * 1024 * 1024 - 256 * 1024 * 1024;
/** Weights one instance takes; the rest of its address space is left for scratch. */
export const WASM_WEIGHT_CAP = WASM_MAX_BYTES - 512 * 1024 * 1024;

/** Below this many multiply-adds a call stays on one thread (hand-off costs ~tens of µs). */
export const SPLIT_MIN_MACS = 1 << 20;
/** Below this many SwiGLU elements the activation stays on one thread (~10 ns each). */
export const SWIGLU_SPLIT_MIN = 1 << 15;

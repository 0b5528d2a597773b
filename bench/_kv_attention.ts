// Attention alone for the KV-dtype bench (bench/_kv_dtype.ts): one decode step's attention of the
// built-in model's shape (every layer: staging the sequence's blocks into the kernel, then the
// score, softmax and value products of all heads) at a context, per --kv-cache-dtype, on the
// WASM kernel with one thread (decode attention never splits with the worker), outside the model:
// the part a KV dtype can change, measured apart from the rest of the step.
import { DType } from '../src/common/dtype.js';
import type { KvLayout } from '../src/common/chunk.js';
import { PagedKvCache } from '../src/engine/model/kv_cache.js';
import { WasmKernel } from '../src/engine/model/kernels/wasm_kernel.js';

const WARM = 30;
const REPS = 15;
const STEPS = 10;

/** Median ms of one decode step's attention (all layers) per dtype, at `keys` positions; query heads per KV head `group`. */
export async function attentionAlone(layout: Omit<KvLayout, 'dtype'>, group: number, keys: number, dtypes: DType[]): Promise<Map<DType, number>> {
  const k = await WasmKernel.create({ threads: 1 });
  const out = new Map<DType, number>();
  try {
    const { numLayers: L, numKvHeads: H, headDim: hd } = layout;
    const kvDim = H * hd;
    for (const dtype of dtypes) {
      const kv = new PagedKvCache({ ...layout, dtype }, (keys + 16) * kvDim * 2 * L * 4 + (1 << 20));
      kv.allocate('s', keys);
      const blocks = kv.blockTable('s');
      let seed = 7;
      const rows = Float32Array.from({ length: 16 * kvDim }, () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32) * 2 - 1);
      for (let l = 0; l < L; l++) for (let p = 0; p < keys; p += 16) for (const c of [0, 1] as const) kv.writeRows(rows, 0, 16 * kvDim, kv.offset(blocks, l, c, p));
      kv.setLength('s', keys);
      const q = Float32Array.from({ length: H * group * hd }, (_, i) => Math.sin(i));
      const o = new Float32Array(H * group * hd);
      const lens = new Int32Array(group).fill(keys);
      const step = () => {
        for (let l = 0; l < L; l++) {
          k.stageKv(kv.pool, blocks, Math.ceil(keys / 16), kv.blockFloats, kv.layerOffset(l), kvDim, dtype, kv.layerElems);
          k.attendStagedHeads(q, group, hd, H, keys, lens, 1 / Math.sqrt(hd), o);
        }
      };
      for (let i = 0; i < WARM; i++) step();
      const ms: number[] = [];
      for (let r = 0; r < REPS; r++) {
        const t0 = performance.now();
        for (let i = 0; i < STEPS; i++) step();
        ms.push((performance.now() - t0) / STEPS);
      }
      ms.sort((a, b) => a - b);
      out.set(dtype, ms[REPS >> 1]!);
    }
  } finally {
    k.close();
  }
  return out;
}

// The KV-dtype part of `npm run bench -- engine` (`--only kv-dtype` runs just it): decode batch 1
// at a long context with the paged KV held in float32, float16 and bfloat16, in process
// (LlamaModel.forward on the built-in model, so the HTTP path's noise stays out), rounds
// alternating the dtypes so a busy neighbour hits each alike. Prints ms a step per round and the
// 16-bit ÷ f32 speed ratios of the same round.
import { DType, DTYPE_NAMES } from '../src/common/dtype.js';
import { LlamaModel } from '../src/engine/model/model.js';
import { PagedKvCache } from '../src/engine/model/kv_cache.js';
import { ensureBuiltinModel } from '../src/engine/model/formats/builtin.js';

const ROUNDS = 3;
const STEPS = 30;

export async function kvDtypeDecode(contexts = [2048, 4096]): Promise<Record<string, unknown>> {
  const m = await LlamaModel.load(await ensureBuiltinModel('tiny'));
  const out: Record<string, unknown> = {};
  try {
    for (const ctx of contexts) {
      const prompt = Array.from({ length: ctx }, (_, i) => 3 + ((i * 7919) % 31000));
      const ms: Record<string, number[]> = {};
      for (let r = 0; r < ROUNDS; r++) {
        for (const dt of [DType.f32, DType.f16, DType.bf16]) {
          const kv = new PagedKvCache({ ...m.layout, dtype: dt }, 2 * ctx * kvBytesPerToken(m, dt) + (64 << 20));
          for (let s = 0; s < ctx; s += 512) m.forward([{ seqId: 's', tokens: prompt.slice(s, s + 512), startPos: s, wantLogits: false }], kv);
          const t0 = performance.now();
          for (let t = 0; t < STEPS; t++) m.forward([{ seqId: 's', tokens: [5], startPos: ctx + t, wantLogits: true }], kv);
          (ms[DTYPE_NAMES[dt]] ??= []).push((performance.now() - t0) / STEPS);
        }
      }
      const ratio = (d: string) => ms.f32!.map((x, i) => +(x / ms[d]![i]!).toFixed(2));
      console.log(
        `decode batch 1 at ${ctx} tokens, ms a step per round: f32 ${fmt(ms.f32!)}, f16 ${fmt(ms.f16!)}, bf16 ${fmt(ms.bf16!)}; ` +
          `speed vs f32: f16 ${ratio('f16').join(' / ')}, bf16 ${ratio('bf16').join(' / ')}; KV bytes a token: f32 ${kvBytesPerToken(m, DType.f32)}, 16-bit ${kvBytesPerToken(m, DType.f16)}`,
      );
      out[`kv_decode_${ctx}`] = { f32_ms: ms.f32, f16_ms: ms.f16, bf16_ms: ms.bf16, f16_speed_ratio: ratio('f16'), bf16_speed_ratio: ratio('bf16') };
    }
  } finally {
    m.close();
  }
  return out;
}

function kvBytesPerToken(m: LlamaModel, dt: DType): number {
  return 2 * m.layout.numLayers * m.layout.numKvHeads * m.layout.headDim * (dt === DType.f32 ? 4 : 2);
}

const fmt = (xs: number[]) => xs.map((x) => x.toFixed(1)).join(' / ');

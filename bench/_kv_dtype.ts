// The KV-dtype part of `npm run bench -- engine` (`--only kv-dtype` runs just it): decode batch 1
// at a long context with the paged KV held in each --kv-cache-dtype (float32, float16, bfloat16,
// int8, fp8_e4m3, fp8_e5m2), in process (LlamaModel.forward on the built-in model, so the HTTP
// path's noise stays out). Every dtype's sequence is prefilled once; then the decode steps are
// interleaved, RUN steps of each dtype in turn (the order rotating every turn), so a busy
// neighbour hits every dtype alike: per round, the median ms a step of each dtype and its speed
// ÷ f32's of the same round. Also the bytes a cached token takes (int8's scales included) ÷ f32,
// and, in the same run, llama.cpp's own decode step on the same model with F32, F16 and Q8_0 KV
// (bench/_kv_dtype_peer.ts): its F16 ÷ F32 and Q8_0 ÷ F32 beside kvc's (skipped, by name, when
// the peer is not installed).
import { DType, DTYPE_NAMES } from '../src/common/dtype.js';
import { payloadBytes } from '../src/common/chunk.js';
import { LlamaModel } from '../src/engine/model/model.js';
import { PagedKvCache } from '../src/engine/model/kv_cache.js';
import { BUILTIN_MODELS, ensureBuiltinModel } from '../src/engine/model/formats/builtin.js';
import { attentionAlone } from './_kv_attention.js';
import { peerDecode, peerDecodeSetup } from './_kv_dtype_peer.js';

const ROUNDS = 3;
const STEPS = 40;
/** Consecutive decode steps of one dtype before the next takes over (its first step finds the caches holding another dtype's KV). */
const RUN = 4;
/** The context of the reference step with almost no attention. */
const FLOOR_CTX = 16;
const DTYPES = [DType.f32, DType.f16, DType.bf16, DType.int8, DType.fp8_e4m3, DType.fp8_e5m2];

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

export async function kvDtypeDecode(contexts = [2048, 4096]): Promise<Record<string, unknown>> {
  const m = await LlamaModel.load(await ensureBuiltinModel('tiny'));
  const out: Record<string, unknown> = {};
  const f32Bytes = payloadBytes({ ...m.layout, dtype: DType.f32 }, 1);
  const bytesPerToken = Object.fromEntries(DTYPES.map((d) => [DTYPE_NAMES[d], payloadBytes({ ...m.layout, dtype: d }, 1)]));
  const bytesRatio = Object.fromEntries(DTYPES.map((d) => [DTYPE_NAMES[d], +(payloadBytes({ ...m.layout, dtype: d }, 1) / f32Bytes).toFixed(4)]));
  console.log(`KV bytes a cached token (K+V, all layers; int8 with its f16 scales), ÷ f32: ${DTYPES.map((d) => `${DTYPE_NAMES[d]} ${bytesPerToken[DTYPE_NAMES[d]]} B (${bytesRatio[DTYPE_NAMES[d]]})`).join(', ')}`);
  out.kv_bytes_per_token = bytesPerToken;
  out.kv_bytes_ratio = bytesRatio;
  const pd = await peerDecodeSetup();
  if (!pd.ok) console.log(`llama.cpp reference: skipped: ${pd.why}`);
  out.peer_skipped = pd.ok ? null : pd.why;
  try {
    for (const ctx of contexts) {
      const prompt = Array.from({ length: ctx }, (_, i) => 3 + ((i * 7919) % 31000));
      const ms: Record<string, number[]> = {};
      for (let r = 0; r < ROUNDS; r++) {
        // The dtypes at ctx, and f32 at FLOOR_CTX tokens: the step without (almost) any attention,
        // what no KV dtype can go below.
        const variants = [...DTYPES.map((dt) => ({ name: DTYPE_NAMES[dt], dt, at: ctx })), { name: 'f32_floor', dt: DType.f32, at: FLOOR_CTX }];
        const caches = variants.map(({ dt, at }) => {
          const kv = new PagedKvCache({ ...m.layout, dtype: dt }, (at + STEPS + 16) * payloadBytes({ ...m.layout, dtype: dt }, 1) * 1.1 + (1 << 20));
          for (let s = 0; s < at; s += 512) m.forward([{ seqId: 's', tokens: prompt.slice(s, Math.min(at, s + 512)), startPos: s, wantLogits: false }], kv);
          return kv;
        });
        const steps: number[][] = variants.map(() => []);
        for (let b = 0; b < STEPS / RUN; b++) {
          for (let k = 0; k < variants.length; k++) {
            const i = (k + b) % variants.length;
            for (let t = b * RUN; t < (b + 1) * RUN; t++) {
              const t0 = performance.now();
              m.forward([{ seqId: 's', tokens: [5], startPos: variants[i]!.at + t, wantLogits: true }], caches[i]!);
              steps[i]!.push(performance.now() - t0);
            }
          }
        }
        variants.forEach((v, i) => (ms[v.name] ??= []).push(median(steps[i]!)));
      }
      const ratio = (d: string) => ms.f32!.map((x, i) => +(x / ms[d]![i]!).toFixed(2));
      const names = DTYPES.map((d) => DTYPE_NAMES[d]);
      // Attention's share of an f32 step: what the KV dtype can act on at all.
      const share = ms.f32!.map((x, i) => +(1 - ms.f32_floor![i]! / x).toFixed(2));
      console.log(
        `decode batch 1 at ${ctx} tokens, median ms a step per round: ${names.map((n) => `${n} ${fmt(ms[n]!)}`).join(', ')}, f32 at ${FLOOR_CTX} tokens ${fmt(ms.f32_floor!)}; ` +
          `speed ÷ f32 per round: ${names.slice(1).map((n) => `${n} ${ratio(n).join(' / ')}`).join(', ')}; ` +
          `attention's share of the f32 step (1 − ${FLOOR_CTX}-token step ÷ it) ${share.join(' / ')}, so no dtype can exceed ${share.map((x) => (1 / (1 - x)).toFixed(2)).join(' / ')}×`,
      );
      // The part a dtype acts on, apart: one step's attention (staging + products, all layers) per dtype.
      const spec = BUILTIN_MODELS.tiny!;
      const att = await attentionAlone(m.layout, spec.numHeads / spec.numKvHeads, ctx, DTYPES);
      const attF32 = att.get(DType.f32)!;
      console.log(
        `attention alone at ${ctx} tokens (one decode step, all layers: staging + score/softmax/value, one thread), ms: ` +
          `${DTYPES.map((d) => `${DTYPE_NAMES[d]} ${att.get(d)!.toFixed(3)} (${(attF32 / att.get(d)!).toFixed(2)}× f32)`).join(', ')}; ` +
          `KV bytes read a step: ${DTYPES.map((d) => `${DTYPE_NAMES[d]} ${((ctx * bytesPerToken[DTYPE_NAMES[d]]!) / 2 ** 20).toFixed(2)} MiB`).join(', ')}`,
      );
      out[`kv_decode_${ctx}`] = {
        attention_alone_ms: Object.fromEntries(DTYPES.map((d) => [DTYPE_NAMES[d], +att.get(d)!.toFixed(3)])),
        ...Object.fromEntries(names.flatMap((n) => [[`${n}_ms`, ms[n]!.map((x) => +x.toFixed(2))], ...(n === 'f32' ? [] : [[`${n}_speed_ratio`, ratio(n)]])])),
        f32_floor_ms: ms.f32_floor!.map((x) => +x.toFixed(2)),
        attention_share: share,
      };
      if (pd.ok) {
        const p = await peerDecode(pd.model, prompt, ROUNDS, STEPS, RUN);
        console.log(
          `llama.cpp (same model as GGUF, ${ROUNDS} rounds of ${STEPS} steps, 2 threads) decode batch 1 at ${ctx} tokens, median ms a step per round: ` +
            `${Object.entries(p.ms).map(([k, v]) => `${k} ${fmt(v)}`).join(', ')} (_fa: flash attention on; llama.cpp's Q8_0 V cache needs it); ` +
            `speed ÷ F32 per round: F16 ${p.ratios.f16!.join(' / ')}, with flash attention F16 ${p.ratios.f16_fa!.join(' / ')}, Q8_0 ${p.ratios.q8_0_fa!.join(' / ')}; against the faster F32 of the round: the faster F16 ${p.ratios.f16_best_vs_best_f32!.join(' / ')}, Q8_0 ${p.ratios.q8_0_vs_best_f32!.join(' / ')} ` +
            `— kvc in this run: f16 ${ratio('f16').join(' / ')}, int8 ${ratio('int8').join(' / ')} (targets: 16-bit ≥ 1.3, 8-bit ≥ 1.5 at 2,048 tokens)`,
        );
        (out[`kv_decode_${ctx}`] as Record<string, unknown>).peer = { ms: Object.fromEntries(Object.entries(p.ms).map(([k, v]) => [k, v.map((x) => +x.toFixed(2))])), speed_ratio: p.ratios };
      }
    }
  } finally {
    m.close();
    if (pd.ok) await pd.close();
  }
  return out;
}

const fmt = (xs: number[]) => xs.map((x) => x.toFixed(1)).join(' / ');

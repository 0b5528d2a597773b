// npm run bench -- xfer
// Sender → receiver throughput of the xfer library between two processes, against raw loopback
// TCP between two processes measured in the same run.
//   large: Llama-3-8B-shaped chunks (32 layers, 8 KV heads, head dim 128, f16, 256 tokens = 32 MiB)
//   small: the built-in model's chunks (4 layers, 2 KV heads, head dim 32, f32, 256 tokens = 512 KiB)
// The receiver consumes (take + release) each request as soon as it is complete, as a decoder
// would, so its buffer is recycled. Also reported: the receiver's CPU time per GB received and its
// garbage collections during the measured transfer, beside the raw TCP sink's CPU per GB.
// Per KV dtype (the engine's --kv-cache-dtype, each dtype chunks can hold): the same Llama-3-8B
// shape at 256 tokens a chunk in each dtype, a warm sender/receiver pair per dtype (sender on CPU 0,
// receiver on CPU 1, as a deployment's CPU sets place a prefiller and a decoder), tokens a second
// moved and their ratio to f32's in the same round (target: float16 ≥ 1.8 × f32). A round is three
// slices; in each, every dtype moves the same bytes (1 GiB: 16 chunks at f32, 32 at float16, 64 at
// 8 bits), the dtypes' order rotating from slice to slice. Then the same for P2P fetches of a
// 1,536-token prompt from a holder process per dtype (bench/_p2p_dtype.ts).
// `--only dtype` runs just that part; `--rounds N` sets its rounds (default 3).
// Last line: {"bench":"xfer","xfer_gbps":…,"tcp_gbps":…,"small_chunks_per_s":…,"recv_cpu_s_per_gb":…,
//             "tcp_sink_cpu_s_per_gb":…,"recv_full_gcs":…,"dtype_tokens_per_s":{…},"dtype_ratio_vs_f32":{…}}
import { Command, InvalidArgumentError, Option } from 'commander';
import { DType, chunkBytes, type KvLayout } from '../src/common/chunk.js';
import { DTYPE_NAMES } from '../src/common/dtype.js';
import { P2P_FETCHES_PER_ROUND, P2P_TOKENS, p2pPerDtype } from './_p2p_dtype.js';
import { LANES, tcpBaseline, xferPair, xferRun, type XferFigures, type XferPair } from './_xfer_run.js';

const LLAMA: KvLayout = { dtype: DType.f16, numLayers: 32, numKvHeads: 8, headDim: 128 };
const BUILTIN: KvLayout = { dtype: DType.f32, numLayers: 4, numKvHeads: 2, headDim: 32 };
const TOKENS = 256;
const LARGE_PER_REQ = 4; // 128 MiB per request
const LARGE_REQS = 12; // 1.5 GiB measured
const SMALL_PER_REQ = 8;
const SMALL_REQS = 400;

const DTYPE_PER_REQ = 2;
/** Requests of an f32 slice (1 GiB); the other dtypes move the same bytes (more requests of smaller chunks). */
const DTYPE_REQS = 8;
/** Slices of a round: each dtype moves DTYPE_SLICES × 1 GiB a round. */
const DTYPE_SLICES = 3;
/**
 * Requests of a dtype's run: as many as move the f32 run's bytes, so every dtype's rate is measured
 * over the same volume. With the same number of chunks instead, a 16 MiB-chunk run lasted ~0.2 s
 * and what every run pays once (the first ALLOC, the last ACK, the call into the sender process)
 * weighed on its tokens a second four times as much as on f32's.
 */
function dtypeReqs(d: DType): number {
  return Math.round((DTYPE_REQS * chunkBytes({ ...LLAMA, dtype: DType.f32 }, TOKENS)) / chunkBytes({ ...LLAMA, dtype: d }, TOKENS));
}

function parseOptions(argv: string[]): { only: 'all' | 'dtype'; rounds: number } {
  return new Command('xfer')
    .description('xfer throughput between two processes')
    .addOption(new Option('--only <part>', 'run one part').choices(['all', 'dtype']).default('all'))
    .addOption(
      new Option('--rounds <n>', 'rounds of the per-dtype part').default(3).argParser((v) => {
        if (!/^[1-9][0-9]?$/.test(v)) throw new InvalidArgumentError(`expected an integer from 1 to 99, got "${v}"`);
        return Number(v);
      }),
    )
    .parse(argv, { from: 'user' })
    .opts<{ only: 'all' | 'dtype'; rounds: number }>();
}

/**
 * Tokens a second moved per dtype, per round, and the ratios to f32 of each round. One warm
 * sender/receiver pair per dtype serves every round (as a running deployment's would). A round is
 * DTYPE_SLICES slices; in each slice every dtype moves the same bytes (DTYPE_REQS requests' worth
 * at f32), in an order that rotates from slice to slice, so each dtype's share of a round is spread
 * over the whole round and a second of a busy machine falls on all of them alike. A dtype's round
 * figure is its tokens over its seconds, summed over the slices.
 */
async function perDtype(rounds: number): Promise<{ tps: Record<string, number[]>; ratio: Record<string, number[]>; p2p: Record<string, number[]>; p2pRatio: Record<string, number[]> }> {
  const dtypes = Object.keys(DTYPE_NAMES).map(Number) as DType[];
  const tps: Record<string, number[]> = {};
  const pairs: XferPair[] = [];
  try {
    for (const d of dtypes) pairs.push(await xferPair({ ...LLAMA, dtype: d }, TOKENS, DTYPE_PER_REQ, `d${d}`, true));
    for (let r = 0; r < rounds; r++) {
      const sum = dtypes.map(() => ({ chunks: 0, seconds: 0 }));
      for (let s = 0; s < DTYPE_SLICES; s++) {
        const k = r * DTYPE_SLICES + s;
        for (let j = 0; j < dtypes.length; j++) {
          const i = (j + k) % dtypes.length;
          const f = await pairs[i]!.run(dtypeReqs(dtypes[i]!));
          sum[i]!.chunks += f.chunks;
          sum[i]!.seconds += f.seconds;
        }
      }
      dtypes.forEach((d, i) => (tps[DTYPE_NAMES[d]] ??= []).push(Math.round((sum[i]!.chunks * TOKENS) / sum[i]!.seconds)));
    }
  } finally {
    for (const p of pairs) p.close();
  }
  const ratios = (t: Record<string, number[]>) => Object.fromEntries(Object.entries(t).map(([n, xs]) => [n, xs.map((x, i) => Number((x / t.f32![i]!).toFixed(2)))]));
  const ratio = ratios(tps);
  for (const d of dtypes) {
    const n = DTYPE_NAMES[d];
    console.log(`  xfer ${n.padEnd(5)} ${(chunkBytes({ ...LLAMA, dtype: d }, TOKENS) / 2 ** 20).toFixed(1)} MiB chunks: ${tps[n]!.join(', ')} tokens/s; ÷ f32 of the same round: ${ratio[n]!.join(', ')}`);
  }
  const p2p = await p2pPerDtype(rounds);
  const p2pRatio = ratios(p2p);
  for (const [n, xs] of Object.entries(p2p)) console.log(`  P2P  ${n.padEnd(5)} fetches of ${P2P_TOKENS} tokens (${P2P_FETCHES_PER_ROUND} a round): ${xs.join(', ')} tokens/s; ÷ f32 of the same round: ${p2pRatio[n]!.join(', ')}`);
  return { tps, ratio, p2p, p2pRatio };
}

async function main(): Promise<void> {
  const opts = parseOptions(process.argv.slice(2));
  if (opts.only === 'dtype') {
    console.log(`xfer per KV dtype: Llama-3-8B shape, ${TOKENS} tokens a chunk, ${DTYPE_PER_REQ} per request, ${opts.rounds} rounds of ${DTYPE_SLICES} slices, each slice ${DTYPE_REQS} requests at f32 and the same bytes at each other dtype`);
    const d = await perDtype(opts.rounds);
    console.log(JSON.stringify({ bench: 'xfer', dtype_tokens_per_s: d.tps, dtype_ratio_vs_f32: d.ratio, p2p_dtype_tokens_per_s: d.p2p, p2p_dtype_ratio_vs_f32: d.p2pRatio }));
    return;
  }
  const large = chunkBytes(LLAMA, TOKENS);
  const small = chunkBytes(BUILTIN, TOKENS);
  console.log(`xfer benchmark: sender and receiver in separate processes, loopback TCP`);
  console.log(`  large chunks: ${(large / 2 ** 20).toFixed(1)} MiB (Llama-3-8B shape), ${LARGE_PER_REQ} per request, ${LARGE_REQS} requests`);
  console.log(`  small chunks: ${(small / 2 ** 10).toFixed(1)} KiB (built-in model), ${SMALL_PER_REQ} per request, ${SMALL_REQS} requests`);
  console.log(`  ${LANES} requests in flight on the sender; raw TCP and xfer runs interleaved, best of three each`);
  const total = large * LARGE_PER_REQ * LARGE_REQS;
  // Interleave baseline and xfer, best of three each, so both see the same machine state.
  const tcpRuns: { gbps: number; sinkCpuPerGb: number }[] = [];
  const xfRuns: XferFigures[] = [];
  for (let i = 0; i < 3; i++) {
    tcpRuns.push(await tcpBaseline(total, large));
    xfRuns.push(await xferRun(LLAMA, TOKENS, LARGE_PER_REQ, LARGE_REQS, `l${i}`));
  }
  const tcp = tcpRuns.map((x) => x.gbps);
  const xf = xfRuns.map((x) => x.gbps);
  const tcpGbps = Math.max(...tcp);
  const xferGbps = Math.max(...xf);
  // CPU per byte moves less with machine load than throughput does: the median of the three
  const median = (v: number[]) => [...v].sort((a, b) => a - b)[1]!;
  const recvCpu = median(xfRuns.map((x) => x.recvCpuPerGb));
  const sinkCpu = median(tcpRuns.map((x) => x.sinkCpuPerGb));
  const fullGcs = median(xfRuns.map((x) => x.recvFullGcs));
  const smallRun = await xferRun(BUILTIN, TOKENS, SMALL_PER_REQ, SMALL_REQS, 's');
  console.log(`  per KV dtype (${TOKENS}-token chunks, ${DTYPE_PER_REQ} per request, ${opts.rounds} rounds of ${DTYPE_SLICES} slices, each slice ${DTYPE_REQS} requests at f32 and the same bytes at each other dtype):`);
  const dt = await perDtype(opts.rounds);
  console.log(`  raw TCP (2 processes)   : ${tcp.map((x) => x.toFixed(2)).join(', ')} Gbit/s`);
  console.log(`  xfer 32 MiB chunks      : ${xf.map((x) => x.toFixed(2)).join(', ')} Gbit/s (${((xferGbps / tcpGbps) * 100).toFixed(0)}% of raw TCP; target >= 80%)`);
  console.log(`  xfer built-in chunks    : ${smallRun.chunksPerS.toFixed(0)} chunks/s (${smallRun.gbps.toFixed(2)} Gbit/s)`);
  console.log(`  receiver CPU per GB     : ${xfRuns.map((x) => x.recvCpuPerGb.toFixed(3)).join(', ')} s (raw TCP sink: ${tcpRuns.map((x) => x.sinkCpuPerGb.toFixed(3)).join(', ')} s)`);
  console.log(`  receiver full GCs       : ${xfRuns.map((x) => x.recvFullGcs).join(', ')} per ${(total / 2 ** 30).toFixed(1)} GiB`);
  console.log(
    JSON.stringify({
      bench: 'xfer',
      xfer_gbps: Number(xferGbps.toFixed(3)),
      tcp_gbps: Number(tcpGbps.toFixed(3)),
      small_chunks_per_s: Math.round(smallRun.chunksPerS),
      recv_cpu_s_per_gb: Number(recvCpu.toFixed(3)),
      tcp_sink_cpu_s_per_gb: Number(sinkCpu.toFixed(3)),
      recv_full_gcs: fullGcs,
      dtype_tokens_per_s: dt.tps,
      dtype_ratio_vs_f32: dt.ratio,
      p2p_dtype_tokens_per_s: dt.p2p,
      p2p_dtype_ratio_vs_f32: dt.p2pRatio,
    }),
  );
}

await main();

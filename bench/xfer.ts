// npm run bench -- xfer
// Sender → receiver throughput of the xfer library between two processes, against raw loopback
// TCP between two processes measured in the same run.
//   large: Llama-3-8B-shaped chunks (32 layers, 8 KV heads, head dim 128, f16, 256 tokens = 32 MiB)
//   small: the built-in model's chunks (4 layers, 2 KV heads, head dim 32, f32, 256 tokens = 512 KiB)
// The receiver consumes (take + release) each request as soon as it is complete, as a decoder
// would, so its buffer is recycled. Also reported: the receiver's CPU time per GB received and its
// garbage collections during the measured transfer, beside the raw TCP sink's CPU per GB.
// Last line: {"bench":"xfer","xfer_gbps":…,"tcp_gbps":…,"small_chunks_per_s":…,"recv_cpu_s_per_gb":…,
//             "tcp_sink_cpu_s_per_gb":…,"recv_full_gcs":…}
import { DType, chunkBytes, type KvLayout } from '../src/common/chunk.js';
import { LANES, tcpBaseline, xferRun, type XferFigures } from './_xfer_run.js';

const LLAMA: KvLayout = { dtype: DType.f16, numLayers: 32, numKvHeads: 8, headDim: 128 };
const BUILTIN: KvLayout = { dtype: DType.f32, numLayers: 4, numKvHeads: 2, headDim: 32 };
const TOKENS = 256;
const LARGE_PER_REQ = 4; // 128 MiB per request
const LARGE_REQS = 12; // 1.5 GiB measured
const SMALL_PER_REQ = 8;
const SMALL_REQS = 400;

async function main(): Promise<void> {
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
    }),
  );
}

await main();

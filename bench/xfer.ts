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
import net from 'node:net';
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { DType, chunkBytes, type KvLayout } from '../src/common/chunk.js';
import { freePortRange } from '../src/common/ports.js';

const here = fileURLToPath(import.meta.url);
const PEER = join(dirname(here), '..', 'src', 'xfer', 'peer.js');

const LLAMA: KvLayout = { dtype: DType.f16, numLayers: 32, numKvHeads: 8, headDim: 128 };
const BUILTIN: KvLayout = { dtype: DType.f32, numLayers: 4, numKvHeads: 2, headDim: 32 };
const TOKENS = 256;
const LARGE_PER_REQ = 4; // 128 MiB per request
const LARGE_REQS = 12; // 1.5 GiB measured
const SMALL_PER_REQ = 8;
const SMALL_REQS = 400;
/** requests in flight at once on the sender (a busy prefiller overlaps requests) */
const LANES = 2;

// ---- raw TCP baseline: a sink process that reads and discards, a source that writes ---------

if (process.argv[2] === 'tcp-sink') {
  const srv = net.createServer((s) => {
    let got = 0;
    const want = Number(process.argv[4]);
    const cpu0 = process.cpuUsage();
    s.on('data', (d) => {
      got += d.length;
      if (got >= want) {
        const u = process.cpuUsage(cpu0);
        process.send!({ cpuMicros: u.user + u.system });
        s.end('done');
      }
    });
  });
  srv.listen(Number(process.argv[3]), '127.0.0.1', () => process.send!({ ready: true }));
  process.on('disconnect', () => process.exit(0));
} else if (process.argv[2] === 'tcp-source') {
  const port = Number(process.argv[3]);
  const total = Number(process.argv[4]);
  const size = Number(process.argv[5]);
  const buf = Buffer.alloc(size, 7);
  const s = net.connect({ port, host: '127.0.0.1', noDelay: true }, async () => {
    const t0 = process.hrtime.bigint();
    for (let sent = 0; sent < total; sent += size) {
      if (!s.write(buf)) await new Promise((r) => s.once('drain', r));
    }
    s.once('data', () => {
      const secs = Number(process.hrtime.bigint() - t0) / 1e9;
      process.send!({ seconds: secs }, () => process.exit(0));
    });
  });
} else {
  await main();
}

interface Peer {
  child: ChildProcess;
  call(op: string, args?: Record<string, unknown>): Promise<any>;
}

function startPeer(cfg: Record<string, unknown>): Promise<Peer> {
  const child = fork(PEER, [JSON.stringify(cfg)], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'], env: { ...process.env, KVC_LOG_LEVEL: 'warn' } });
  let next = 1;
  const waiting = new Map<number, (m: any) => void>();
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('peer did not start within 20 s')), 20_000);
    child.on('message', (m: any) => {
      if ('ready' in m) {
        clearTimeout(t);
        if (!m.ready) return reject(new Error(m.error));
        resolve({
          child,
          call: (op, args = {}) =>
            new Promise((res, rej) => {
              const id = next++;
              const timer = setTimeout(() => rej(new Error(`${op} timed out after 300 s`)), 300_000);
              waiting.set(id, (r) => {
                clearTimeout(timer);
                r.ok ? res(r.result) : rej(new Error(r.error));
              });
              child.send({ id, op, ...args });
            }),
        });
      } else waiting.get(m.id)?.(m);
    });
  });
}

async function tcpBaseline(total: number, size: number): Promise<{ gbps: number; sinkCpuPerGb: number }> {
  const port = await freePortRange(1);
  const sink = fork(here, ['tcp-sink', String(port), String(total)], { stdio: 'inherit' });
  try {
    await new Promise<void>((r, j) => {
      const t = setTimeout(() => j(new Error('tcp sink did not start')), 10_000);
      sink.once('message', () => (clearTimeout(t), r()));
    });
    const sinkCpu = new Promise<number>((r) => sink.once('message', (m: any) => r(m.cpuMicros)));
    const source = fork(here, ['tcp-source', String(port), String(total), String(size)], { stdio: 'inherit' });
    const { seconds } = await new Promise<{ seconds: number }>((r, j) => {
      const t = setTimeout(() => (source.kill('SIGKILL'), j(new Error('tcp baseline timed out'))), 120_000);
      source.once('message', (m: any) => (clearTimeout(t), r(m)));
    });
    return { gbps: (total * 8) / seconds / 1e9, sinkCpuPerGb: (await sinkCpu) / 1e6 / (total / 1e9) };
  } finally {
    sink.kill('SIGKILL');
  }
}

interface XferFigures {
  gbps: number;
  chunksPerS: number;
  bytes: number;
  /** receiver process CPU seconds per GB received, and its full GCs, during the measured part */
  recvCpuPerGb: number;
  recvFullGcs: number;
}

async function xferRun(layout: KvLayout, perReq: number, reqs: number, tag: string): Promise<XferFigures> {
  const port = await freePortRange(2);
  const chunk = chunkBytes(layout, TOKENS);
  const recv = await startPeer({
    role: 'receiver',
    host: '127.0.0.1',
    initPort: port,
    allocPort: port + 1,
    bufferBytes: Math.max(64 << 20, (LANES + 1) * perReq * chunk),
    layout,
    chunkSize: TOKENS,
    modelId: 'bench',
    autoRelease: true,
  });
  const send = await startPeer({ role: 'sender', layout, chunkSize: TOKENS, modelId: 'bench', bufferBytes: Math.max(16 << 20, LANES * perReq * chunk) });
  try {
    const specs = (n: number, p: string) =>
      Array.from({ length: n }, (_, i) => ({ req_id: `${tag}-${p}-${i}`, receiver_host: '127.0.0.1', receiver_init_port: port, receiver_alloc_port: port + 1 }));
    const tokens = Array(perReq).fill(TOKENS);
    // warm-up: first-touch of the receiver's pooled buffers and the connection
    await send.call('sendRepeated', { specs: specs(2 * LANES, 'warm'), tokens, seed: 1, lanes: LANES });
    const u0 = await recv.call('usage');
    const r = await send.call('sendRepeated', { specs: specs(reqs, 'run'), tokens, seed: 1000, lanes: LANES });
    const u1 = await recv.call('usage');
    const st = await recv.call('stats');
    if (st.chunksRejected) throw new Error(`${st.chunksRejected} chunks rejected during the benchmark`);
    return {
      gbps: (r.bytes * 8) / r.seconds / 1e9,
      chunksPerS: r.chunks / r.seconds,
      bytes: r.bytes,
      recvCpuPerGb: (u1.cpuMicros - u0.cpuMicros) / 1e6 / (r.bytes / 1e9),
      recvFullGcs: u1.gcFull - u0.gcFull,
    };
  } finally {
    recv.child.kill('SIGKILL');
    send.child.kill('SIGKILL');
  }
}

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
    xfRuns.push(await xferRun(LLAMA, LARGE_PER_REQ, LARGE_REQS, `l${i}`));
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
  const smallRun = await xferRun(BUILTIN, SMALL_PER_REQ, SMALL_REQS, 's');
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

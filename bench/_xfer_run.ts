// Raw loopback TCP and xfer transfers between two child processes, for the benchmarks that
// compare against them in the same run (bench/xfer.ts, and the move part of bench/controller.ts).
//   tcpBaseline  a source process writes one buffer repeatedly, a sink process reads and discards;
//   xferRun      an xfer sender and receiver (src/xfer/peer.ts) in two processes, the receiver
//                consuming each request as soon as it is complete, as a decoder would.
// This module is also the program of the raw TCP processes (`tcp-sink`, `tcp-source`).
import net from 'node:net';
import { execFileSync, fork, type ChildProcess } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { chunkBytes, type KvLayout } from '../src/common/chunk.js';
import { freePortRange } from '../src/common/ports.js';

const here = fileURLToPath(import.meta.url);
const isMain = process.argv[1] === here;
const PEER = join(dirname(here), '..', 'src', 'xfer', 'peer.js');
/** requests in flight at once on the xfer sender (a busy prefiller overlaps requests) */
export const LANES = 2;

if (isMain && process.argv[2] === 'tcp-sink') {
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
} else if (isMain && process.argv[2] === 'tcp-source') {
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
}

export interface Peer {
  child: ChildProcess;
  call(op: string, args?: Record<string, unknown>): Promise<any>;
}

export function startPeer(cfg: Record<string, unknown>): Promise<Peer> {
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

export async function tcpBaseline(total: number, size: number): Promise<{ gbps: number; sinkCpuPerGb: number }> {
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

export interface XferFigures {
  gbps: number;
  chunksPerS: number;
  chunks: number;
  seconds: number;
  bytes: number;
  /** receiver process CPU seconds per GB received, and its full GCs, during the measured part */
  recvCpuPerGb: number;
  recvFullGcs: number;
}

/** A warm xfer sender and receiver pair (two processes) for one layout: runs of repeated requests. */
export interface XferPair {
  /** `reqs` requests of `perReq` chunks (fresh keys), LANES in flight, timed in the sender process. */
  run(reqs: number): Promise<XferFigures>;
  close(): void;
}

/**
 * Starts a receiver and a sender process for `layout`, connected and warmed (first touch of the
 * receiver's pooled buffers, the connection, the code paths) by 2 × LANES requests. `pin`: the
 * sender on CPU 0 and the receiver on CPU 1 (taskset, every thread), as a deployment places a
 * prefiller and a decoder on CPU sets of their own (`kvc engine --cpus`); unpinned on a 2-core
 * machine, the scheduler sometimes runs both ends on one core (a loopback wake-up pulls the woken
 * process next to its waker) and a pair's rate halves for as long as that lasts.
 */
export async function xferPair(layout: KvLayout, tokensPerChunk: number, perReq: number, tag: string, pin = false): Promise<XferPair> {
  const port = await freePortRange(2);
  const chunk = chunkBytes(layout, tokensPerChunk);
  const recv = await startPeer({
    role: 'receiver',
    host: '127.0.0.1',
    initPort: port,
    allocPort: port + 1,
    bufferBytes: Math.max(64 << 20, (LANES + 1) * perReq * chunk),
    layout,
    chunkSize: tokensPerChunk,
    modelId: 'bench',
    autoRelease: true,
  });
  const send = await startPeer({ role: 'sender', layout, chunkSize: tokensPerChunk, modelId: 'bench', bufferBytes: Math.max(16 << 20, LANES * perReq * chunk) }).catch((e) => {
    recv.child.kill('SIGKILL');
    throw e;
  });
  const close = () => {
    recv.child.kill('SIGKILL');
    send.child.kill('SIGKILL');
  };
  if (pin && availableParallelism() >= 2) {
    try {
      execFileSync('taskset', ['-a', '-p', '-c', '0', String(send.child.pid)], { stdio: 'ignore', timeout: 30_000 });
      execFileSync('taskset', ['-a', '-p', '-c', '1', String(recv.child.pid)], { stdio: 'ignore', timeout: 30_000 });
    } catch (e) {
      close();
      throw new Error(`cannot pin the xfer pair with taskset: ${(e as Error).message}`);
    }
  }
  let n = 0;
  const specs = (k: number) =>
    Array.from({ length: k }, () => ({ req_id: `${tag}-${n++}`, receiver_host: '127.0.0.1', receiver_init_port: port, receiver_alloc_port: port + 1 }));
  const tokens = Array(perReq).fill(tokensPerChunk);
  const run = async (reqs: number, seed: number): Promise<XferFigures> => {
    const u0 = await recv.call('usage');
    const r = await send.call('sendRepeated', { specs: specs(reqs), tokens, seed, lanes: LANES });
    const u1 = await recv.call('usage');
    const st = await recv.call('stats');
    if (st.chunksRejected) throw new Error(`${st.chunksRejected} chunks rejected during the benchmark`);
    return {
      gbps: (r.bytes * 8) / r.seconds / 1e9,
      chunksPerS: r.chunks / r.seconds,
      chunks: r.chunks,
      seconds: r.seconds,
      bytes: r.bytes,
      recvCpuPerGb: (u1.cpuMicros - u0.cpuMicros) / 1e6 / (r.bytes / 1e9),
      recvFullGcs: u1.gcFull - u0.gcFull,
    };
  };
  try {
    await run(2 * LANES, 1);
  } catch (e) {
    close();
    throw e;
  }
  return { run: (reqs) => run(reqs, 1000), close };
}

/** One measured run on a fresh, warmed pair. */
export async function xferRun(layout: KvLayout, tokensPerChunk: number, perReq: number, reqs: number, tag: string): Promise<XferFigures> {
  const pair = await xferPair(layout, tokensPerChunk, perReq, tag);
  try {
    return await pair.run(reqs);
  } finally {
    pair.close();
  }
}

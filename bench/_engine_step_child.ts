// Child process of `npm run bench -- engine` for the per-step HTTP cost: serves ONE engine tree
// (this repository's, or another built checkout given by its root, e.g. the tree before a change)
// and times that engine's model forward in process while it serves, so the bench can subtract
// the forward's own time from the HTTP step time of the same run, tree by tree.
//
// The engine's model object is what its scheduler calls (`model.forward`), in both trees; the
// child wraps that method to add up wall and process CPU time spent inside it. Process CPU
// outside the forward is the main thread's (scheduling, sampling, detokenizing, SSE, socket
// writes, GC) plus what the kernel's second thread burns there: it spins briefly after its last
// job before it sleeps in Atomics.wait (worker_ctl.ts SPIN_MS), a real cost of the step.
//
// The forward alone is also timed outside HTTP ({cmd:'direct'}): the same shapes (8 sequences of a
// 32-token prompt, then 127 decode steps of 8 rows) run in a plain loop through the model itself
// (LlamaModel.forward, both trees) on the engine's paged KV while the engine is idle. That is
// the figure the HTTP step is compared with: the scheduler's forward call may do per-step work
// of sampling inside it (this tree computes the rows' greedy argmax right after the LM head), which
// "HTTP step − forward call" would count as forward.
//
// And per step: the gap from the end of one 8-row decode forward call to the start of the next,
// plus the time that first call spent in sampling work done inside it (a tree's argmaxRows after
// the LM head, or the argmax the LM-head product takes chunk by chunk, which the
// kernel adds up in `argmaxMs` (`llama.kernel`, `llama.gemm` in trees before the kernel's rename) for the main thread; 0 for a tree with neither). Measured within each step, a few hundred per run,
// its median does not swing with the machine's speed from one second to the next, which the
// difference of two ~10 ms step times measured seconds apart does (±0.5 ms per step here).
//
// Messages (IPC): {cmd:'start', root} → {url}; {cmd:'gaps'} → {median, count} (ms, of the gaps
// since the previous 'gaps'); {cmd:'stats'} → {cpu, fwdCpu, fwdWall, forwards}
// (µs, µs, ms, calls so far); {cmd:'direct', prompt, tokens} → {ms, cpu} (wall and process CPU
// ms per decode step); {cmd:'close'} → exits. The engine runs without a connector.
import { pathToFileURL } from 'node:url';
import { join } from 'node:path';
import { argmaxJs } from '../src/engine/model/kernels/kernel.js';

/** The part of an engine (of either tree) the child touches. */
interface ChildEngine {
  url: string;
  model: {
    forward(...a: unknown[]): unknown;
    llama: { forward(segs: Segment[], kv: unknown, opts: { transientLogits: boolean }): Float32Array[]; kernel?: ChildKernel; gemm?: ChildKernel };
  };
  kv: { allocate(id: number, tokens: number): void; free(id: number): void };
  close(): Promise<void>;
}
/** The kernel's sampling counters, as both trees have them. */
type ChildKernel = { argmaxRows?(...a: unknown[]): void; argmaxMs?: number };
type Segment = { seqId: number; tokens: number[]; startPos: number; wantLogits: boolean };
type Msg = { cmd: 'start'; root: string } | { cmd: 'stats' } | { cmd: 'gaps' } | { cmd: 'direct'; prompt: number; tokens: number } | { cmd: 'close' };

let engine: ChildEngine | null = null;
const cpuMicros = () => {
  const u = process.cpuUsage();
  return u.user + u.system;
};
const inside = { cpu: 0, wall: 0, calls: 0 };
const gaps: number[] = [];
/** End of the last forward call if it was an 8-row decode step (else 0), and its in-call sampling ms. */
let lastDecodeEnd = 0;
let lastSampling = 0;
let sampling = 0;
const send = (m: unknown) => process.send!(m);

/** Wall and CPU ms per 8-row decode forward, in a plain loop (sequence ids far from the engine's). */
function direct(promptLen: number, tokens: number): { ms: number; cpu: number } {
  const e = engine!;
  const llama = e.model.llama;
  const fwd = (segs: Segment[], kv: unknown) => llama.forward(segs, kv, { transientLogits: true });
  const ids = Array.from({ length: 8 }, (_, i) => 900_000 + i);
  for (const id of ids) e.kv.allocate(id, promptLen + tokens);
  try {
    let next = fwd(ids.map((id, i) => ({ seqId: id, tokens: Array.from({ length: promptLen }, (_, j) => 1000 + ((j * 7919 + i * 104729) % 30000)), startPos: 0, wantLogits: true })), e.kv).map(argmaxJs);
    // Only the forward calls are timed: the argmax feeding the next step is sampling, not forward.
    let ms = 0;
    let cpu = 0;
    for (let s = 0; s < tokens - 1; s++) {
      const segs = ids.map((id, i) => ({ seqId: id, tokens: [next[i]!], startPos: promptLen + s, wantLogits: true }));
      const c0 = cpuMicros();
      const t0 = performance.now();
      const out = fwd(segs, e.kv);
      ms += performance.now() - t0;
      cpu += cpuMicros() - c0;
      next = out.map(argmaxJs);
    }
    return { ms: ms / (tokens - 1), cpu: cpu / 1000 / (tokens - 1) };
  } finally {
    for (const id of ids) e.kv.free(id);
  }
}

process.on('message', (m: Msg) => {
  void (async () => {
    try {
      if (m.cmd === 'start') {
        const mod = (await import(pathToFileURL(join(m.root, 'dist/src/engine/server.js')).href)) as { startEngine(o: Record<string, unknown>): Promise<ChildEngine> };
        // Only options both trees know (an older tree has no logRequests/logStats; stdout is dropped).
        const e = await mod.startEngine({ model: 'builtin:tiny', maxNumSeqs: 8, maxNumBatchedTokens: 512, host: '127.0.0.1', port: 0 });
        const forward = e.model.forward.bind(e.model);
        const kernel = (e.model.llama.kernel ?? e.model.llama.gemm)!;
        e.model.forward = (...a: unknown[]) => {
          const segs = a[0] as Segment[];
          const decode8 = segs.length === 8 && segs.every((s) => s.tokens.length === 1);
          const c0 = cpuMicros();
          const t0 = performance.now();
          if (decode8 && lastDecodeEnd) gaps.push(t0 - lastDecodeEnd + lastSampling);
          sampling = 0;
          const am0 = kernel.argmaxMs ?? 0;
          try {
            return forward(...a);
          } finally {
            sampling += (kernel.argmaxMs ?? 0) - am0;
            const t1 = performance.now();
            inside.wall += t1 - t0;
            inside.cpu += cpuMicros() - c0;
            inside.calls++;
            lastDecodeEnd = decode8 ? t1 : 0;
            lastSampling = sampling;
          }
        };
        // Sampling work inside the forward call (argmax after the LM head) counts as step cost.
        const rowsArgmax = kernel.argmaxRows?.bind(kernel);
        if (rowsArgmax) {
          kernel.argmaxRows = (...a: unknown[]) => {
            const t = performance.now();
            try {
              rowsArgmax(...a);
            } finally {
              sampling += performance.now() - t;
            }
          };
        }
        engine = e;
        send({ url: e.url });
      } else if (m.cmd === 'gaps') {
        const xs = gaps.splice(0).sort((x, y) => x - y);
        send({ median: xs.length ? xs[Math.floor(xs.length / 2)]! : 0, count: xs.length });
      } else if (m.cmd === 'direct') {
        send(direct(m.prompt, m.tokens));
      } else if (m.cmd === 'stats') {
        send({ cpu: cpuMicros(), fwdCpu: inside.cpu, fwdWall: inside.wall, forwards: inside.calls });
      } else {
        await engine?.close();
        process.exit(0);
      }
    } catch (e) {
      send({ error: (e as Error).stack ?? String(e) });
    }
  })();
});

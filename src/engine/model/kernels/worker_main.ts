// Second GEMM thread. It instantiates the same kernel module on the same shared WASM memory and
// computes the column range the main thread hands it through a small shared control block.
// Splitting columns never changes any element's summation order, so results stay bitwise equal.
import { parentPort, workerData } from 'node:worker_threads';
import { CTL, SPIN_MS, takeChunk } from './worker_ctl.js';

const { module, memory, ctl } = workerData as { module: WebAssembly.Module; memory: WebAssembly.Memory; ctl: SharedArrayBuffer };
const c = new Int32Array(ctl);
const inst = new WebAssembly.Instance(module, { env: { mem: memory } });
type Kernel = (...args: number[]) => void;
// Indexed by CTL.PACKED (wasm_kernel.ts FMT_CODE): dense, the strip-packed weight formats, then
// attendrows and swiglurows (whose ranges are rows), the fused gate|up + SwiGLU product, then
// argmaxrows (rows of logits), then gemmpq4 (Q4 weights; in relaxed-SIMD modules only).
const kernels = ['gemm', 'gemmp', 'gemmpbf16', 'gemmpf16', 'gemmpq8', 'attendrows', 'swiglurows', 'gemmpglu', 'argmaxrows', 'gemmpq4'].map((n) => inst.exports[n] as Kernel);
const argmaxcols = inst.exports.argmaxcols as Kernel;
// Read the job counter BEFORE announcing readiness: the main thread posts the first job only
// after 'ready', so that job is always seen as new.
let seen = Atomics.load(c, CTL.SEQ);
parentPort!.postMessage('ready');
for (;;) {
  // Spin briefly before sleeping: a prefill posts its next job within a fraction of a
  // millisecond (the JS between two GEMMs), and waking from Atomics.wait takes tens of µs on a
  // virtual machine — per job, on both sides of the hand-off. Bounded, so an idle engine sleeps;
  // not at all once the forward pass has ended (PARK): between decode steps the spin only
  // burned a core for 0.3 ms per step.
  const until = performance.now() + SPIN_MS;
  while (Atomics.load(c, CTL.SEQ) === seen && Atomics.load(c, CTL.STOP) === 0 && Atomics.load(c, CTL.PARK) === 0 && performance.now() < until);
  // Bounded wait so a stop request is noticed even if no notify arrives.
  Atomics.wait(c, CTL.SEQ, seen, 1000);
  if (Atomics.load(c, CTL.STOP) !== 0) break;
  const seq = Atomics.load(c, CTL.SEQ);
  if (seq === seen) continue;
  seen = seq;
  if (Atomics.compareExchange(c, CTL.CLAIM, (seq - 1) | 0, seq) !== ((seq - 1) | 0)) continue; // main took it
  const a = CTL.ARGS;
  // Pull chunks until none is left (the main thread pulls from the same counter).
  const n1 = c[a + 9]!;
  const unit = c[CTL.CHUNK]!;
  const gemm = kernels[c[CTL.PACKED]!]!;
  const amSlot = c[CTL.AM_SLOT]!;
  for (let r = takeChunk(c, n1, unit); r; r = takeChunk(c, n1, unit)) {
    gemm(c[a]!, c[a + 1]!, c[a + 2]!, c[a + 3]!, c[a + 4]!, c[a + 5]!, c[a + 6]!, c[a + 7]!, r[0], r[1]);
    // An LM head whose argmax is taken per chunk: this chunk's columns, still in this core's cache.
    if (amSlot !== 0) argmaxcols(c[a + 2]!, c[a + 5]!, c[CTL.AM_N]!, c[a + 3]!, amSlot, 0, 0, 0, r[0], r[1]);
  }
  Atomics.store(c, CTL.DONE, seq);
  Atomics.notify(c, CTL.DONE);
}

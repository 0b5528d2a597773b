// The kernel's second thread, seen from the calling thread: starts the worker (worker_main.ts) on
// the kernel module and its shared memory, and shares one job at a time with it through the
// control block (worker_ctl.ts): both threads pull chunks of the job from one counter, so a job
// takes as long as the slower thread's last chunk. A worker that fails or stops answering is
// dropped; its work is redone here, with the same bits.
import { Worker } from 'node:worker_threads';
import { CTL, SPIN_MS, takeChunk } from './worker_ctl.js';

/** A worker that has not finished its part of a job by then is considered broken. */
const WORKER_TIMEOUT_MS = 30_000;

export class WorkerHost {
  private worker: Worker | null = null;
  private readonly ctl = new Int32Array(new SharedArrayBuffer(CTL.SIZE * 4));
  private seq = 0;

  /** The worker thread is there to share jobs. */
  get running(): boolean {
    return this.worker !== null;
  }

  /** Starts the thread on `module` instantiated over `memory`; on failure the host stays single-threaded. */
  async start(module: WebAssembly.Module, memory: WebAssembly.Memory): Promise<void> {
    const w = new Worker(new URL('./worker_main.js', import.meta.url), { workerData: { module, memory, ctl: this.ctl.buffer } });
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('GEMM worker did not start within 10 s')), 10_000);
        w.once('message', () => {
          clearTimeout(timer);
          resolve();
        });
        w.once('error', (e) => {
          clearTimeout(timer);
          reject(e);
        });
      });
    } catch {
      void w.terminate();
      return; // single-threaded: same results, just slower
    }
    if (Atomics.load(this.ctl, CTL.STOP) === 1) {
      void w.terminate(); // stopped while it was starting
      return;
    }
    w.on('error', () => this.stop());
    w.on('exit', () => {
      if (this.worker === w) this.worker = null;
    });
    w.unref(); // never keeps the process alive
    this.worker = w;
  }

  /** Stops the thread (jobs then run on the calling thread alone). */
  stop(): void {
    const w = this.worker;
    this.worker = null;
    Atomics.store(this.ctl, CTL.STOP, 1);
    Atomics.notify(this.ctl, CTL.SEQ);
    if (w) void w.terminate();
  }

  /** No job is coming soon: the worker sleeps now instead of spinning for the next one. */
  park(): void {
    if (this.worker) Atomics.store(this.ctl, CTL.PARK, 1);
  }

  /**
   * Computes kernel `code` (`fn` here, the same export in the worker) over the range [0, n1) in
   * chunks of whole `unit`s, pulled by both threads from a shared counter (takeChunk). `args`
   * are the kernel's first 8 arguments; the chunk's bounds are the last two.
   */
  share(code: number, fn: (...a: number[]) => void, args: number[], n1: number, unit: number, argmax?: { slot: number; n: number; post: (n0: number, n1: number) => void }): void {
    const A = args;
    const c = this.ctl;
    c[CTL.PACKED] = code;
    c[CTL.AM_SLOT] = argmax ? argmax.slot : 0;
    c[CTL.AM_N] = argmax ? argmax.n : 0;
    const post = argmax?.post;
    for (let i = 0; i < 8; i++) c[CTL.ARGS + i] = A[i]!;
    c[CTL.ARGS + 8] = 0;
    c[CTL.ARGS + 9] = n1;
    c[CTL.CHUNK] = unit;
    Atomics.store(c, CTL.NEXT, 0);
    Atomics.store(c, CTL.PARK, 0);
    const seq = (this.seq = (this.seq + 1) | 0);
    Atomics.store(c, CTL.SEQ, seq);
    Atomics.notify(c, CTL.SEQ);
    for (let r = takeChunk(c, n1, unit); r; r = takeChunk(c, n1, unit)) {
      fn(A[0]!, A[1]!, A[2]!, A[3]!, A[4]!, A[5]!, A[6]!, A[7]!, r[0], r[1]);
      post?.(r[0], r[1]);
    }
    // The worker never joined this job: every chunk was computed here.
    if (Atomics.compareExchange(c, CTL.CLAIM, (seq - 1) | 0, seq) === ((seq - 1) | 0)) return;
    // The worker is on its last chunk (at most 1/16 of the job): spin for it first.
    const until = performance.now() + SPIN_MS;
    while (Atomics.load(c, CTL.DONE) !== seq && performance.now() < until);
    const deadline = Date.now() + WORKER_TIMEOUT_MS;
    for (;;) {
      const done = Atomics.load(c, CTL.DONE);
      if (done === seq) return;
      const left = deadline - Date.now();
      if (left <= 0) {
        // Broken worker: recompute everything here (same bits) and continue single-threaded.
        this.stop();
        fn(A[0]!, A[1]!, A[2]!, A[3]!, A[4]!, A[5]!, A[6]!, A[7]!, 0, n1);
        post?.(0, n1); // one chunk over everything: its candidates replace any the worker left
        return;
      }
      Atomics.wait(c, CTL.DONE, done, Math.min(left, 1000));
    }
  }
}

// Layout of the Int32 control block shared by the main thread and the GEMM worker.
export const CTL = {
  /** Job counter: bumped by the main thread for each job. */
  SEQ: 0,
  /** Last job finished by the worker. */
  DONE: 1,
  /** Non-zero: the worker exits. */
  STOP: 2,
  /**
   * Last job claimed. Job s is claimable while CLAIM == s-1; whoever wins the compare-exchange
   * (the worker, or the main thread once its own half is done) computes the second half. So a
   * worker starved of CPU never makes a call slower than doing it all on the main thread.
   */
  CLAIM: 3,
  /** 10 kernel arguments: A, W, C, M, K, N, m0, m1, n0, n1. */
  ARGS: 4,
  /**
   * Start of the range not yet taken (takeChunk): both threads pull chunks from [0, n1) until
   * none is left, so a worker that wakes late still takes its share and a slow one never holds
   * the main thread back. Which thread computes a column (or row) changes no bits.
   */
  NEXT: 14,
  /** The unit chunks are made of: the strip width for columns, whole attention groups (ATT_GROUP rows) for attendrows, 1 row for swiglurows. */
  CHUNK: 15,
  /**
   * Which kernel export the job runs: 0 dense (gemm), 1 gemmp, 2 gemmpbf16, 3 gemmpf16, 4 gemmpq8,
   * 5 attendrows (its range [n0, n1) is query rows, not columns), 6 swiglurows (rows), 7 gemmpglu
   * (the gate|up product with SwiGLU fused; columns of the packed weight), 8 argmaxrows (rows of
   * logits), 9 gemmpq4.
   */
  PACKED: 16,
  /**
   * Non-zero: the main thread has no job coming soon (a forward pass ended; the next one starts
   * after the scheduler has sampled, streamed and admitted), so the worker sleeps at once instead
   * of spinning SPIN_MS for a job that will not come. Cleared before every job is posted.
   */
  PARK: 17,
  /**
   * Non-zero: the job is an LM-head product whose greedy argmax is taken chunk by chunk
   * (wasm_kernel.ts, matmul with argmaxOut): the address of the chunks' candidates, where each thread, right
   * after computing a chunk, runs argmaxcols over it (wat/argmax.ts). 0 for every other job.
   */
  AM_SLOT: 18,
  /** The product's columns that are logits (the rest of each row, up to its padded width, is not). */
  AM_N: 19,
  SIZE: 20,
} as const;

/**
 * The next chunk [n0, n) of a shared job over [0, n1), or null when all is taken: ~1/16 of the
 * job, and once less than a quarter of that is left, a quarter of what is left (guided
 * self-scheduling), in whole units. The chunks shrink towards the end, so the thread that
 * finishes first waits at most a small last chunk for the other; none is larger than 1/16, so a
 * thread preempted in the middle of one (a loaded machine) holds the call back by little.
 */
export function takeChunk(c: Int32Array, n1: number, unit: number): [number, number] | null {
  const cap = Math.ceil(n1 / (16 * unit)) * unit;
  for (;;) {
    const n0 = Atomics.load(c, CTL.NEXT);
    if (n0 >= n1) return null;
    const n = Math.min(n1, n0 + Math.max(unit, Math.min(cap, Math.ceil((n1 - n0) / (4 * unit)) * unit)));
    if (Atomics.compareExchange(c, CTL.NEXT, n0, n) === n0) return [n0, n];
  }
}

/**
 * How long (ms) a thread spins on the control block before sleeping in Atomics.wait: the worker
 * for the next job, the main thread for the worker's last chunk. Waking from Atomics.wait costs
 * tens of µs on a virtual machine, and a 512-token prefill hands off ~50 jobs.
 */
export const SPIN_MS = 0.3;

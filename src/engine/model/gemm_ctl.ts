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
   * Next column chunk to take (Atomics.add): both threads pull chunks of CHUNK columns from
   * [n0, n1) until none is left, so a worker that wakes late still takes its share and a slow
   * one never holds the main thread back. Which thread computes a column changes no bits.
   */
  NEXT: 14,
  /** Columns per chunk (a multiple of the strip width), or rows for attendrows. */
  CHUNK: 15,
  /**
   * Which kernel export the job runs: 0 dense (gemm), 1 gemmp, 2 gemmpbf16, 3 gemmpf16, 4 gemmpq8,
   * 5 attendrows (its range [n0, n1) is query rows, not columns).
   */
  PACKED: 16,
  SIZE: 17,
} as const;

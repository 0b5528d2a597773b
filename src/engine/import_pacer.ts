// Paces KV imports (received or cached chunks verified and copied into the paged KV) against the
// scheduler's steps, for the whole engine rather than per request. While sequences are running,
// the import work between two steps is one slice: it starts with the first chunk after a step and
// lasts IMPORT_SLICE_MS of wall time (plus the chunk under way) and belongs to one import; the
// others wait. After each step one waiting import is let go (oldest first), and an import that
// ends hands what is left of the slice to the next one. So with several imports in flight (a burst of
// long prompts arriving at a decoder) the work between two decode steps is still about one slice,
// not one slice per import; with nothing running, imports go at full speed.
//
// The scheduler calls stepped() after every step and idle() when it has nothing to run, so an
// import never waits for a step that will not come.

/**
 * Longest stretch of import work between two steps (ms). A 4,000-token prefix imported as one
 * block held the decoding sequences for 20–30 ms on a loaded machine; 2 ms bounds a decode step's
 * wait to that plus one chunk's copy, while the copies stay large enough to be cheap per byte.
 */
export const IMPORT_SLICE_MS = 2;

export interface ImportPacerOptions {
  /** Longest import work between two steps (ms; default IMPORT_SLICE_MS). */
  sliceMs?: number;
  /** True while the scheduler has sequences to step (imports then wait for steps). */
  busy: () => boolean;
  /** Clock of the slices (default performance.now; tests drive it). */
  now?: () => number;
  /** Told each time an import waits for a step (kvc_engine_kv_import_slices_total). */
  onSlice?: () => void;
}

export class ImportPacer {
  /** Imports waiting for a step or for the slice, in the order they get it. */
  private readonly waiting: (() => void)[] = [];
  /** When import work began since the last step (null: not yet). */
  private sliceStart: number | null = null;
  /** The import the current slice belongs to (null: none since the last step, or it ended). */
  private owner: object | null = null;
  private readonly sliceMs: number;
  private readonly now: () => number;

  constructor(private readonly o: ImportPacerOptions) {
    this.sliceMs = o.sliceMs ?? IMPORT_SLICE_MS;
    this.now = o.now ?? (() => performance.now());
  }

  private spent(): boolean {
    return this.sliceStart !== null && this.now() - this.sliceStart >= this.sliceMs;
  }

  /**
   * Resolves when the import `who` may verify and copy its next chunk: at once while it holds a
   * slice with time left (or nothing is running), otherwise after the next step, oldest import
   * first. An import that already had a slice keeps its place at the head: the older request's
   * prefix is finished first, which is what its time to first token needs.
   */
  async next(who: object): Promise<void> {
    let queued = this.owner === who;
    while (this.o.busy() && (this.owner === who ? this.spent() : this.owner !== null || this.spent() || (!queued && this.waiting.length > 0))) {
      if (this.owner === who) this.owner = null;
      this.o.onSlice?.();
      await new Promise<void>((r) => (queued ? this.waiting.unshift(r) : this.waiting.push(r)));
      queued = true;
    }
    this.owner = who;
    this.sliceStart ??= this.now();
  }

  /** The import `who` ended (done, failed or cancelled): the rest of its slice goes to the next one. */
  done(who: object): void {
    if (this.owner !== who) return;
    this.owner = null;
    if (!this.spent()) this.waiting.shift()?.();
  }

  /** A step ran: a new slice of import work may start, for the oldest waiting import. */
  stepped(): void {
    this.sliceStart = null;
    this.owner = null;
    this.waiting.shift()?.();
  }

  /** The scheduler has nothing to run (or stops): no import waits for a step. */
  idle(): void {
    this.sliceStart = null;
    this.owner = null;
    for (const r of this.waiting.splice(0)) r();
  }
}

// Stop strings over streamed text. Stop strings are matched on the full output text; while a
// stop string could still be forming at the end, those characters are held back from the
// stream, so a client never sees part of a stop string.

/**
 * Tracks the visible output text of one choice: what has been emitted to the client and
 * whether a stop string ended it.
 */
export class StopMatcher {
  private full = '';
  private emitted = 0;
  private readonly holdBack: number;
  stopped = false;

  /** `includeStop`: the matched stop string stays in the text (vLLM's include_stop_str_in_output). */
  constructor(
    private readonly stops: string[],
    private readonly includeStop = false,
  ) {
    this.holdBack = stops.reduce((m, s) => Math.max(m, s.length - 1), 0);
  }

  /** Adds decoded text; returns what may be sent now. Sets `stopped` when a stop string appeared. */
  add(delta: string): string {
    if (this.stopped || !delta) return '';
    const searchFrom = Math.max(0, this.full.length - this.holdBack);
    this.full += delta;
    let cut = -1;
    let len = 0;
    for (const s of this.stops) {
      const i = this.full.indexOf(s, searchFrom);
      if (i >= 0 && (cut < 0 || i < cut)) {
        cut = i;
        len = s.length;
      }
    }
    if (cut >= 0) {
      this.stopped = true;
      this.full = this.full.slice(0, this.includeStop ? cut + len : cut);
      return this.take(this.full.length);
    }
    return this.take(this.full.length - this.holdBack);
  }

  /** At the end of generation: releases the held-back tail. */
  finish(): string {
    return this.take(this.full.length);
  }

  get text(): string {
    return this.full;
  }

  private take(upTo: number): string {
    if (upTo <= this.emitted) return '';
    const out = this.full.slice(this.emitted, upTo);
    this.emitted = upTo;
    return out;
  }
}

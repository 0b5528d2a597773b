// What the proxy itself knows of each backend's load: requests it has in flight there, and the
// prompt tokens it expects that backend still has to compute for them (the uncached part of
// each prompt it sent, released once that prefill is done). Kept as plain counters on the
// request path; the kv-aware router (router.ts) reads them for every decision.
import type { Backend } from './backend.js';

export class BackendLoad {
  /** Requests in flight on the backend (prefill calls on a prefiller; decodes on a decoder). */
  inFlight = 0;
  /** Prompt tokens the backend still has to compute for the requests in flight. */
  queuedTokens = 0;
}

export class LoadBook {
  private readonly loads = new Map<Backend, BackendLoad>();

  of(b: Backend): BackendLoad {
    let l = this.loads.get(b);
    if (!l) this.loads.set(b, (l = new BackendLoad()));
    return l;
  }

  /** A request starts on `b` with `tokens` prompt tokens to compute there; returns its release. */
  begin(b: Backend, tokens: number): { prefilled(): void; end(): void } {
    const l = this.of(b);
    l.inFlight++;
    l.queuedTokens += tokens;
    let queued = tokens;
    let ended = false;
    const prefilled = () => {
      l.queuedTokens -= queued;
      queued = 0;
    };
    return {
      prefilled,
      end: () => {
        if (ended) return;
        ended = true;
        prefilled();
        l.inFlight--;
      },
    };
  }
}

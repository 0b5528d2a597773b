// The engine's half of the hit-rate ledger (src/protocol/ledger.ts, docs/ledger.md): after a
// request's KV was loaded, which of its prompt chunks this engine computes, and why each was not
// reused. The engine decides `partial` (the prompt's unfinished last chunk) and `mismatch` (a chunk
// found under its key but stored with another KV layout or token count); the controller, asked
// once per request, names the others from its index and stored history. Without a controller the
// engine's own history of what it stored tells `evicted` from `cold`.
import type { ChunkSpan } from '../common/keys.js';
import { StoredHistory } from '../common/stored_history.js';
import { logger } from '../common/log.js';
import type { MissReason, ReasonCounts } from '../protocol/ledger.js';

const log = logger('engine.ledger');

/** Time the engine waits for the controller's reasons; past it, the chunks count as `unexplained`. */
export const MISS_LOOKUP_TIMEOUT_MS = 2000;
/** Keys a controller-less engine remembers as stored (two generations, common/stored_history.ts). */
export const LOCAL_HISTORY_KEYS = 1 << 18;

/** What one request's load found, and the reasons of the chunks it computes (settled later). */
export interface PendingLedger {
  /** Prompt tokens reused from this engine's cache (its tiers and P2P), not from a transfer. */
  reused: number;
  /** Prompt tokens this engine computes. */
  computed: number;
  /** Computed chunks by reason; never rejects. */
  chunks: Promise<ReasonCounts>;
}

export type AskReasons = (keys: readonly string[], timeoutMs: number) => Promise<MissReason[]>;

export class LedgerKeeper {
  /** This engine's own stores, for the reasons when there is no controller to ask. */
  private readonly local = new StoredHistory(LOCAL_HISTORY_KEYS);

  constructor(
    private readonly chunkSize: number,
    private readonly ask: AskReasons | null,
    private readonly count: (reason: MissReason, n: number) => void,
  ) {}

  /** Records keys this instance stored (its store's admit events). */
  stored(keys: readonly string[]): void {
    for (const k of keys) this.local.add(Number.parseInt(k.slice(0, 8), 16), Number.parseInt(k.slice(8), 16));
  }

  /**
   * The ledger of a load that imported `loaded` tokens (of them `received` from a transfer) of a
   * prompt of `promptLength`; `rejected` is the index of the span whose chunk was found but refused
   * (and why), if the load stopped there. A span is computed when none of its tokens was imported
   * (the prompt's last token, always recomputed, does not make its chunk a miss).
   */
  settle(
    spans: readonly ChunkSpan[],
    promptLength: number,
    loaded: number,
    received: number,
    rejected: { index: number; why: 'mismatch' | 'corrupt' | 'stale' } | null,
    heldHere: (key: string) => boolean,
  ): PendingLedger {
    const counts: ReasonCounts = {};
    const add = (r: MissReason, n = 1) => {
      counts[r] = (counts[r] ?? 0) + n;
      this.count(r, n);
    };
    const ask: ChunkSpan[] = [];
    /** Full chunks after the first computed one that this engine holds: computed only because the prefix broke before them. */
    let inherit = 0;
    let first: MissReason | null = null;
    spans.forEach((s, i) => {
      if (s.start < loaded) return;
      const full = s.end - s.start >= this.chunkSize;
      if (!full) add('partial');
      else if (rejected?.index === i) {
        // A corrupt copy, or one its index listed and could not read: the holder did not have it.
        first ??= rejected.why === 'mismatch' ? 'mismatch' : 'stale_index';
        add(first);
      } else if (first !== null || ask.length > 0 ? heldHere(s.key) : false) inherit++;
      else ask.push(s);
    });
    const base = { reused: loaded - received, computed: promptLength - loaded };
    // Chunks held here but cut off by an earlier miss take that miss's reason.
    const inherited = (r: MissReason | undefined) => {
      if (inherit > 0) add(r ?? 'unexplained', inherit);
    };
    if (ask.length === 0) {
      inherited(first ?? undefined);
      return { ...base, chunks: Promise.resolve(counts) };
    }
    const keys = ask.map((s) => s.key);
    const local = () => {
      const rs = keys.map((k): MissReason => (this.local.has(Number.parseInt(k.slice(0, 8), 16), Number.parseInt(k.slice(8), 16)) ? 'evicted' : 'cold'));
      for (const r of rs) add(r);
      inherited(first ?? rs[0]);
      return counts;
    };
    if (!this.ask) return { ...base, chunks: Promise.resolve(local()) };
    const chunks = this.ask(keys, MISS_LOOKUP_TIMEOUT_MS).then(
      (reasons) => {
        for (const r of reasons) add(r);
        inherited(first ?? reasons[0]);
        return counts;
      },
      (e: unknown) => {
        log.debug(`reasons of ${keys.length} computed chunks unknown: ${(e as Error).message}`);
        add('unexplained', keys.length + inherit);
        return counts;
      },
    );
    return { ...base, chunks };
  }
}

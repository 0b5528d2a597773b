// Synthetic request traces in Mooncake's format (harness/trace_model.ts), generated
// deterministically from a seed, so that `npm run bench -- trace` has traces of its own (its
// default) and a cache policy is checked on more than one shape of traffic. Pure: no I/O.
//
// Model: conversation c belongs to tenant t with probability ∝ 1/(t+1)^skew (Zipf) and starts at a
// uniform time in [0, duration). It has 1 + a geometric number of further turns (mean `turns` in
// all); turn k's prompt is the tenant's `systemBlocks`-block system prompt, the whole previous
// prompt with its partial last block completed (the previous answer), and 1..`turnBlocks` new
// blocks, the last one partial. Turns are `think` seconds apart on average (exponential). Hash ids:
// a full block shared by two prompts at the same position gets the same id (same prefix, same
// tokens), anything else a new one; a prompt's partial last block always gets an id of its own.
// output_length is 20..300 tokens. Lines are in arrival order.
import { mulberry32, TRACE_BLOCK_TOKENS } from './trace_model.js';

export interface TraceShape {
  /** Tenants (system prompts). */
  tenants: number;
  conversations: number;
  /** Mean turns per conversation (>= 1). */
  turns: number;
  /** 512-token blocks of each system prompt. */
  systemBlocks: number;
  /** Most new blocks a turn adds (>= 1). */
  turnBlocks: number;
  /** Seconds over which conversations start. */
  duration: number;
  /** Mean seconds between a conversation's turns. */
  think: number;
  /** Zipf exponent of tenant popularity. */
  skew: number;
}

/**
 * The named shapes `--trace generated:NAME` replays, each sized so that the bench's default
 * `--sample-conversations 0.05` keeps about a hundred conversations:
 * - `tenants`: few tenants with long system prompts and long conversations (reuse comes mostly from
 *   a conversation's earlier turns and the popular system prompts);
 * - `sessions`: many tenants with short system prompts, short conversations whose turns add long
 *   new text (pasted documents), arriving faster: reuse is scarcer and a cache turns over faster.
 */
export const TRACE_SHAPES: Record<string, TraceShape> = {
  tenants: { tenants: 4, conversations: 1600, turns: 8, systemBlocks: 6, turnBlocks: 3, duration: 3600, think: 45, skew: 1.2 },
  sessions: { tenants: 64, conversations: 4000, turns: 4, systemBlocks: 2, turnBlocks: 8, duration: 3600, think: 120, skew: 0.8 },
};

export interface TraceLine {
  timestamp: number;
  input_length: number;
  output_length: number;
  hash_ids: number[];
}

/** The trace of a shape and seed (the same lines for the same arguments). */
export function generateTrace(s: TraceShape, seed: number): TraceLine[] {
  if (!(s.tenants >= 1 && s.conversations >= 1 && s.turns >= 1 && s.turnBlocks >= 1 && s.systemBlocks >= 0 && s.duration > 0 && s.think >= 0 && s.skew >= 0)) {
    throw new Error(`trace shape: expected tenants, conversations, turns, turn blocks >= 1, system blocks, think, skew >= 0 and duration > 0, found ${JSON.stringify(s)}`);
  }
  const r = mulberry32(seed);
  let nextId = 0;
  const weights = Array.from({ length: s.tenants }, (_, t) => 1 / (t + 1) ** s.skew);
  const wsum = weights.reduce((a, b) => a + b, 0);
  const tenantOf = () => {
    let x = r() * wsum;
    for (let t = 0; t < weights.length; t++) if ((x -= weights[t]!) < 0) return t;
    return weights.length - 1;
  };
  const system = weights.map(() => Array.from({ length: s.systemBlocks }, () => nextId++));
  const lines: TraceLine[] = [];
  const exp = (mean: number) => -Math.log(1 - r()) * mean;
  // Turns: 1 + geometric with mean turns − 1.
  const pMore = 1 - 1 / s.turns;
  for (let c = 0; c < s.conversations; c++) {
    const tenant = tenantOf();
    let t = r() * s.duration * 1000;
    let full = [...system[tenant]!];
    for (;;) {
      const added = 1 + Math.floor(r() * s.turnBlocks);
      const newFull = Array.from({ length: added - 1 }, () => nextId++);
      const partialTokens = 1 + Math.floor(r() * (TRACE_BLOCK_TOKENS - 1));
      const ids = [...full, ...newFull, nextId++];
      lines.push({ timestamp: Math.round(t), input_length: (ids.length - 1) * TRACE_BLOCK_TOKENS + partialTokens, output_length: 20 + Math.floor(r() * 281), hash_ids: ids });
      // The next turn resends this prompt with its last block completed by the answer.
      full = [...full, ...newFull, nextId++];
      if (r() >= pMore) break;
      t += exp(s.think * 1000);
    }
  }
  // A stable sort: equal timestamps keep generation order, so the file is the same on every run.
  lines.sort((a, b) => a.timestamp - b.timestamp);
  return lines;
}

/** The trace as file text: one JSON object a line. */
export function traceText(lines: readonly TraceLine[]): string {
  return lines.map((l) => JSON.stringify(l)).join('\n') + '\n';
}

// The pure part of the trace replay (`npm run bench -- trace`): reading a Mooncake-format trace,
// grouping it into conversations, sampling and windowing it, turning each request into token ids,
// and the two references a deployment is measured against (one pooled LRU cache, an infinite
// cache), simulated on exactly the requests that are replayed. No I/O but the caller's text.
//
// Trace format (one JSON object a line): {"timestamp": ms, "input_length": n, "output_length": m,
// "hash_ids": [...]}, one hash id per 512-token prefix block of the prompt, the last block partial
// when input_length is not a multiple of 512; equal ids at the same position mean the same tokens
// in that block and every block before it.

/** Prompt tokens per hash block in the trace format. */
export const TRACE_BLOCK_TOKENS = 512;

export interface TraceRequest {
  /** Line number in the file (1-based), for messages. */
  line: number;
  timestamp: number;
  inputLength: number;
  outputLength: number;
  hashIds: number[];
}

/** Parses a whole trace; a bad line stops with a message naming the line and the field. */
export function parseTrace(text: string, file: string): TraceRequest[] {
  const out: TraceRequest[] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i]!.trim();
    if (raw === '') continue;
    const where = `${file}:${i + 1}`;
    let o: unknown;
    try {
      o = JSON.parse(raw);
    } catch (e) {
      throw new Error(`${where}: not JSON (${(e as Error).message})`);
    }
    if (!o || typeof o !== 'object' || Array.isArray(o)) throw new Error(`${where}: expected a JSON object a line`);
    const r = o as Record<string, unknown>;
    const nonNegInt = (f: string): number => {
      const v = r[f];
      if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw new Error(`${where}: ${f}: expected an integer >= 0, found ${JSON.stringify(v)}`);
      return v;
    };
    const timestamp = r.timestamp;
    if (typeof timestamp !== 'number' || !Number.isFinite(timestamp) || timestamp < 0) throw new Error(`${where}: timestamp: expected ms >= 0, found ${JSON.stringify(timestamp)}`);
    const inputLength = nonNegInt('input_length');
    const outputLength = nonNegInt('output_length');
    if (inputLength === 0) throw new Error(`${where}: input_length: expected > 0`);
    const h = r.hash_ids;
    if (!Array.isArray(h) || !h.every((x) => typeof x === 'number' && Number.isInteger(x) && x >= 0)) throw new Error(`${where}: hash_ids: expected an array of integers >= 0`);
    const blocks = Math.ceil(inputLength / TRACE_BLOCK_TOKENS);
    if (h.length !== blocks) throw new Error(`${where}: hash_ids: expected ${blocks} ids for input_length ${inputLength} (one per ${TRACE_BLOCK_TOKENS}-token block), found ${h.length}`);
    if (out.length && timestamp < out[out.length - 1]!.timestamp) throw new Error(`${where}: timestamp: ${timestamp} is earlier than the line before (${out[out.length - 1]!.timestamp}); expected arrival order`);
    out.push({ line: i + 1, timestamp, inputLength, outputLength, hashIds: h as number[] });
  }
  if (out.length === 0) throw new Error(`${file}: no requests`);
  return out;
}

/** Tokens of block `b` of a request, in the trace's own 512-token units (the last may be fewer). */
function traceBlockTokens(r: TraceRequest, b: number): number {
  return b < r.hashIds.length - 1 ? TRACE_BLOCK_TOKENS : r.inputLength - TRACE_BLOCK_TOKENS * (r.hashIds.length - 1);
}

/**
 * Conversation of every request (the index of its first turn). The next turn of a chat resends the
 * previous prompt (and answer) and adds to it, so a request continues a conversation when an
 * earlier request's whole full-block prefix P (every block but a partial last one, at least one
 * block) is a prefix of its own hash ids — unless P is *shared*: in the whole trace, prompts
 * continue P with two or more different full blocks (a tenant's system prompt that many
 * conversations start with). A prefix is named by its length and its last block's id (equal ids
 * at the same position mean the same prefix). The parent is the most recent such request; the
 * conversation the parent's. Consequence: a first turn that adds less than one full block to a
 * shared prefix cannot be told from another conversation's and starts a conversation of its own.
 */
export function conversations(reqs: readonly TraceRequest[]): number[] {
  // Full-block continuations of every prefix: "length:last id" → the first next id seen, or -1 once two differ.
  const next = new Map<string, number>();
  for (const r of reqs) {
    const full = Math.floor(r.inputLength / TRACE_BLOCK_TOKENS);
    for (let p = 1; p < full; p++) {
      const k = `${p}:${r.hashIds[p - 1]}`;
      const was = next.get(k);
      if (was === undefined) next.set(k, r.hashIds[p]!);
      else if (was !== r.hashIds[p]) next.set(k, -1);
    }
  }
  const root: number[] = [];
  const byFirst = new Map<number, number[]>();
  for (let i = 0; i < reqs.length; i++) {
    const r = reqs[i]!;
    let parent = -1;
    const cands = byFirst.get(r.hashIds[0]!) ?? [];
    for (let k = cands.length - 1; k >= 0 && parent < 0; k--) {
      const q = reqs[cands[k]!]!;
      const full = Math.floor(q.inputLength / TRACE_BLOCK_TOKENS);
      if (full < 1 || full > r.hashIds.length || next.get(`${full}:${q.hashIds[full - 1]}`) === -1) continue;
      let same = true;
      for (let b = 0; b < full && same; b++) same = q.hashIds[b] === r.hashIds[b];
      if (same) parent = cands[k]!;
    }
    root.push(parent < 0 ? i : root[parent]!);
    let list = byFirst.get(r.hashIds[0]!);
    if (!list) byFirst.set(r.hashIds[0]!, (list = []));
    list.push(i);
  }
  return root;
}

/** Deterministic PRNG (mulberry32): uniform in [0, 1), the same sequence for the same seed. */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A 32-bit hash of an integer with a seed (murmur3's finalizer): deterministic sampling. */
function mix32(x: number, seed: number): number {
  let h = (x ^ Math.imul(seed, 0x9e3779b1)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/**
 * Keeps a fraction `f` (0 < f <= 1) of the conversations, whole (every turn), chosen by a seeded
 * hash of the conversation's first request, in trace order.
 */
export function sampleConversations(reqs: readonly TraceRequest[], f: number, seed: number): TraceRequest[] {
  if (!(f > 0 && f <= 1)) throw new Error(`--sample-conversations: expected a fraction in (0, 1], found ${f}`);
  if (f === 1) return [...reqs];
  const root = conversations(reqs);
  const limit = f * 2 ** 32;
  return reqs.filter((_, i) => mix32(root[i]!, seed) < limit);
}

/** `START:COUNT` of a request list; COUNT may run past the end (then to the end). */
export function parseWindow(v: string): { start: number; count: number } {
  const m = /^(\d+):(\d+)$/.exec(v);
  if (!m || Number(m[2]) === 0) throw new Error(`--window: expected START:COUNT (integers, COUNT > 0), found "${v}"`);
  return { start: Number(m[1]), count: Number(m[2]) };
}

export function applyWindow<T>(reqs: readonly T[], w: { start: number; count: number }): T[] {
  if (w.start >= reqs.length) throw new Error(`--window: START ${w.start} is past the last request (${reqs.length} requests after sampling)`);
  return reqs.slice(w.start, w.start + w.count);
}

/**
 * Send times (ms from the first request) keeping the trace's own arrival pattern, scaled so that
 * the requests arrive at `rate` a second on average: gaps are multiplied by
 * (n − 1) / (rate × span). A window whose requests all share one timestamp is sent evenly at `rate`.
 */
export function sendTimes(reqs: readonly TraceRequest[], rate: number): number[] {
  if (!(rate > 0)) throw new Error(`--rate: expected requests a second > 0, found ${rate}`);
  const t0 = reqs[0]!.timestamp;
  const span = reqs[reqs.length - 1]!.timestamp - t0;
  if (reqs.length < 2) return [0];
  if (span === 0) return reqs.map((_, i) => (1000 * i) / rate);
  const scale = (reqs.length - 1) / rate / (span / 1000);
  return reqs.map((r) => (r.timestamp - t0) * scale);
}

/** One replayed request: its chunks (one per trace block), with the tokens of each. */
export interface ReplayRequest {
  /** Position in the window. */
  index: number;
  at: number;
  /** Chunk identities for the simulation: the hash id of a full block; hash id and length for a partial last one. */
  chunks: string[];
  /** Tokens of each chunk (blockTokens, the last one fewer when partial). */
  chunkTokens: number[];
  maxTokens: number;
  /** Blocks of the trace request dropped to fit the model's context. */
  droppedBlocks: number;
}

export interface MapOptions {
  /** Tokens each 512-token block becomes (the deployment's chunk size). */
  blockTokens: number;
  /** Longest prompt the model takes (context − max tokens); whole blocks beyond it are dropped. */
  maxPromptTokens: number;
  /** Cap on the tokens generated per request (the trace's output_length, at most this). */
  maxOutputTokens: number;
}

/**
 * Maps trace requests to replayed ones: block b of a request becomes `blockTokens` tokens (a partial
 * last block proportionally fewer, at least one), and a prompt longer than `maxPromptTokens` keeps
 * only its leading blocks that fit (the prefix structure is kept; the dropped tail is counted).
 */
export function mapRequests(reqs: readonly TraceRequest[], times: readonly number[], o: MapOptions): ReplayRequest[] {
  return reqs.map((r, index) => {
    const chunks: string[] = [];
    const chunkTokens: number[] = [];
    let total = 0;
    for (let b = 0; b < r.hashIds.length; b++) {
      const n = Math.max(1, Math.round((o.blockTokens * traceBlockTokens(r, b)) / TRACE_BLOCK_TOKENS));
      if (total + n > o.maxPromptTokens) break;
      chunks.push(n === o.blockTokens ? String(r.hashIds[b]) : `${r.hashIds[b]}/${n}`);
      chunkTokens.push(n);
      total += n;
    }
    if (chunks.length === 0) throw new Error(`trace line ${r.line}: the first block alone (${chunkTokens[0] ?? o.blockTokens} tokens) does not fit in ${o.maxPromptTokens} prompt tokens`);
    return { index, at: times[index]!, chunks, chunkTokens, maxTokens: Math.max(1, Math.min(r.outputLength, o.maxOutputTokens)), droppedBlocks: r.hashIds.length - chunks.length };
  });
}

/**
 * The token ids of one block: `n` ids (n ≤ blockTokens) drawn from a generator seeded by the hash
 * id, so equal hash ids give equal tokens and a partial block is the start of the full one.
 * Ids in [lo, hi): clear of the tokenizer's special ids.
 */
export function blockTokenIds(hashId: number, n: number, seed: number, lo = 100, hi = 31_000): number[] {
  const r = mulberry32(mix32(hashId, seed));
  const out: number[] = new Array(n);
  for (let i = 0; i < n; i++) out[i] = lo + Math.floor(r() * (hi - lo));
  return out;
}

/** The prompt of a replayed request as token ids. */
export function promptIds(r: ReplayRequest, seed: number): number[] {
  const out: number[] = [];
  for (let c = 0; c < r.chunks.length; c++) out.push(...blockTokenIds(Number.parseInt(r.chunks[c]!, 10), r.chunkTokens[c]!, seed));
  return out;
}

export const promptTokens = (r: ReplayRequest): number => r.chunkTokens.reduce((a, b) => a + b, 0);

/** Distinct chunks of a window (the unit of --tier-fraction). */
export function distinctChunks(reqs: readonly ReplayRequest[]): number {
  const s = new Set<string>();
  for (const r of reqs) for (const c of r.chunks) s.add(c);
  return s.size;
}

export interface SimResult {
  sent: number;
  computed: number;
  /** Per request: prompt tokens computed (for plots over time). */
  perRequest: number[];
  /**
   * Computed chunks by the ledger's reason (docs/ledger.md), as the deployment's engines name them:
   * `partial` (a prompt's unfinished last chunk), else the reason of the miss that broke the
   * prefix, `cold` (never stored before) or `evicted` (stored before, held no more). A prompt
   * reused whole but for its last token computes no chunk.
   */
  reasons: { cold: number; evicted: number; partial: number };
}

/**
 * One cache seen by every request: a request reuses its longest leading run of chunks the cache
 * holds and computes the rest (at least one token, as the engine always computes the prompt's last
 * token); then every chunk of its prompt is stored or made most recent, head last (so a prefix is
 * evicted from its tail, as the engines' tiers do). `capacity` in chunks; Infinity for the
 * infinite cache (the trace's ceiling).
 */
export function simulate(reqs: readonly ReplayRequest[], capacity: number): SimResult {
  if (!(capacity >= 0)) throw new Error(`cache capacity: expected chunks >= 0, found ${capacity}`);
  // A Map iterates in insertion order: delete + set makes a key the most recent; the first key is the LRU.
  const lru = new Map<string, true>();
  const seen = new Set<string>();
  let sent = 0;
  let computed = 0;
  const perRequest: number[] = [];
  const reasons = { cold: 0, evicted: 0, partial: 0 };
  for (const r of reqs) {
    const total = promptTokens(r);
    let reused = 0;
    let run = 0;
    for (; run < r.chunks.length && lru.has(r.chunks[run]!); run++) reused += r.chunkTokens[run]!;
    const comp = Math.max(1, total - reused);
    sent += total;
    computed += comp;
    perRequest.push(comp);
    // The ledger's rule (docs/ledger.md): a chunk held nowhere has its own reason (cold: never
    // stored; evicted: stored before); one still held but after the break takes the reason of the
    // miss that broke the prefix.
    const own = (k: string) => (seen.has(k) ? 'evicted' : 'cold');
    const first = run < r.chunks.length ? own(r.chunks[run]!) : null;
    for (let c = run; c < r.chunks.length; c++) {
      const k = r.chunks[c]!;
      if (k.includes('/')) reasons.partial++;
      else reasons[lru.has(k) ? first! : own(k)]++;
    }
    for (const k of r.chunks) seen.add(k);
    if (capacity === 0) continue;
    for (let c = r.chunks.length - 1; c >= 0; c--) {
      const k = r.chunks[c]!;
      lru.delete(k);
      lru.set(k, true);
    }
    while (lru.size > capacity) lru.delete(lru.keys().next().value!);
  }
  return { sent, computed, perRequest, reasons };
}

/**
 * The size of the one pooled LRU cache that computes what a deployment computed: the smallest
 * capacity in chunks (0..the window's distinct chunks) whose simulated computed ÷ sent is at most
 * `ratio`, by bisection (LRU's computed ÷ sent falls as it grows). A cluster that caches like one
 * cache of its total size gives that size; one that loses reuse to copies or to eviction order
 * gives less. Null when even an infinite cache computes more (the deployment reused more than any
 * LRU of the window could, or computed below the ceiling).
 */
export function pooledEquivalent(reqs: readonly ReplayRequest[], ratio: number): number | null {
  const at = (c: number) => {
    const s = simulate(reqs, c);
    return s.computed / s.sent;
  };
  let hi = distinctChunks(reqs);
  if (at(hi) > ratio) return null;
  let lo = 0;
  if (at(lo) <= ratio) return 0;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (at(mid) <= ratio) hi = mid;
    else lo = mid;
  }
  return hi;
}

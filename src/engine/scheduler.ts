// Continuous batching over the paged KV cache.
//
// A request becomes a Sequence. Sequences wait in a FIFO queue (bounded: a full queue is a
// 503) until a slot (--max-num-seqs) and room in the paged KV for prompt + max_tokens are
// free; KV is reserved up front, so an admitted sequence always runs to completion and no
// request ever fails for lack of memory. Each engine step builds ONE model forward over
// the decode rows of every running sequence plus prefill chunks of sequences still reading
// their prompt, within a token budget (--max-num-batched-tokens). Between steps the loop
// yields to the event loop, so HTTP stays responsive while the model computes. A step's prompt
// tokens are also bounded by time (STEP_TARGET_MS): the forward is synchronous, so one step of
// 512 prompt tokens on a slow or shared CPU would hold every decoding sequence, every health
// probe and every HTTP request for seconds.
//
// The model's forward is batch-invariant (each row's arithmetic does not depend on what else
// is in the batch), so greedy output is identical alone or among other requests, and a
// prompt computed in chunks or loaded from the cache gives the same tokens.
import { setImmediate as yieldToLoop } from 'node:timers/promises';
import { ERRORS, kvcError, unavailable } from '../common/errors.js';
import { logger } from '../common/log.js';
import { threadCpuMicros } from '../common/thread_cpu.js';
import { ImportPacer } from './import_pacer.js';
import type { PendingLedger } from './ledger.js';
import type { KvcConnectorV1 } from './connector.js';
import type { EngineMetrics } from './metrics.js';
import type { PagedKvCache } from './model/kv_cache.js';
import type { Sampler } from './sampler.js';
import { SETTINGS } from '../common/flags.js';

const log = logger('engine.scheduler');

/**
 * Wall time one step should take at most. The prompt tokens of a step are cut so that, at the
 * cost per token measured on recent steps, the step fits in this; --max-num-batched-tokens stays
 * the upper bound. 200 ms keeps an engine that prefills long prompts answering its health probes
 * (≥ 1 s timeouts) and bounds what a colocated decode row waits behind a prompt chunk, while a
 * 200 ms chunk (≥ 100 tokens of the built-in model on one core) keeps the GEMMs efficient.
 */
export const STEP_TARGET_MS = SETTINGS.stepTargetMs.default!;
/** Fewest prompt tokens a step takes when a prompt is waiting (progress, and GEMMs not too thin). */
export const MIN_PREFILL_TOKENS = 32;
/** Weight of the newest step in the running cost per token (exponential average). */
const COST_EWMA = 0.5;

export interface ForwardSegment {
  seqId: number;
  tokens: number[];
  startPos: number;
  wantLogits: boolean;
}

/** The part of the model the scheduler drives. */
export interface Forwarder {
  forward(segments: ForwardSegment[], kv: PagedKvCache): Float32Array[];
  /** Greedy sampling's argmax, if the model has a faster one than the JS loop (same answer). */
  argmax?(logits: Float32Array): number;
}

export type FinishReason = 'stop' | 'length' | 'abort' | 'error';

export interface SequenceEvents {
  /** A token was generated (called synchronously inside the step). */
  onToken(token: number): void;
  /** The sequence ended; its KV is already released. `error` is set for reason 'error'. */
  onFinish(reason: FinishReason, error?: Error): void;
}

export interface SequenceInit {
  requestId: string;
  prompt: number[];
  maxTokens: number;
  sampler: Sampler;
  /** Token ids that end generation (EOS); empty with ignore_eos. */
  stopTokenIds: ReadonlySet<number>;
  kvTransferParams: Record<string, unknown> | undefined;
  /** vLLM's cache_salt: part of the chunk keys, so this prompt's KV is shared only with the same salt. */
  cacheSalt?: string;
  /** vLLM's priority: a lower value is admitted first; equal values keep arrival order. Default 0. */
  priority?: number;
  events: SequenceEvents;
}

type State = 'waiting' | 'loading' | 'running' | 'finished';

export class Sequence {
  readonly id: number;
  readonly arrival = performance.now();
  readonly output: number[] = [];
  state: State = 'waiting';
  /** Prompt/output positions whose KV is in the paged cache. */
  computed = 0;
  /** Prompt tokens loaded (cache or transfer) rather than computed. */
  loadedTokens = 0;
  /** Of loadedTokens, how many came from a transfer (the rest from the cache instance). */
  receivedTokens = 0;
  /** When it left the waiting queue (0 while waiting). */
  admittedAt = 0;
  /** The hit-rate ledger of its load (docs/ledger.md); null without a connector or when the load failed. */
  ledger: PendingLedger | null = null;
  firstTokenAt = 0;
  lastTokenAt = 0;
  finishReason: FinishReason | null = null;
  /** Settles when the connector has stored/sent this prompt's KV; resolves to kv_transfer_params to answer with. */
  kvDone: Promise<Record<string, unknown> | undefined> = Promise.resolve(undefined);

  constructor(
    id: number,
    readonly init: SequenceInit,
  ) {
    this.id = id;
  }

  get prompt(): number[] {
    return this.init.prompt;
  }
  /** KV positions this sequence can ever need: the last sampled token is never fed back. */
  get kvNeed(): number {
    return this.init.prompt.length + this.init.maxTokens - 1;
  }
  get prefilling(): boolean {
    return this.computed < this.init.prompt.length;
  }
}

export interface SchedulerOptions {
  model: Forwarder;
  kv: PagedKvCache;
  metrics: EngineMetrics;
  connector: KvcConnectorV1 | null;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  maxQueue: number;
  /** Wall time a step should take at most (default STEP_TARGET_MS; 0: tokens-only budget). */
  stepTargetMs?: number;
  /** Clock for the step-time budget (default performance.now; tests drive it). */
  now?: () => number;
  /** Longest KV import work between two steps (ms; default IMPORT_SLICE_MS, src/engine/import_pacer.ts). */
  importSliceMs?: number;
  /** Clock of the import slices (default performance.now; tests drive it). */
  importNow?: () => number;
  /** Told of every sequence that ended, after its KV was released (the request log line). */
  onFinished?: (seq: Sequence) => void;
}

/**
 * The prompts of running sequences in the order a step's prompt budget serves them. Prompts whose
 * rest fits in the step go first (priority, then arrival): a short request that arrives during a
 * burst of long prompts is computed in the next step instead of after all of them (on a prefiller,
 * that is the difference between reaching its decoder at once and being held for seconds, then
 * released together with every other short request of the burst, which makes the decoder's steps
 * several times longer for every stream). They never take the last MIN_PREFILL_TOKENS of the
 * budget while a longer prompt is waiting, so the oldest long prompt always progresses. The
 * other prompts follow in admission order (FIFO), as before.
 */
export function prefillOrder(active: readonly Sequence[], budget: number): Sequence[] {
  const prompts = active.filter((s) => s.state === 'running' && s.prefilling);
  const rest = (s: Sequence) => s.prompt.length - s.computed;
  const long = prompts.filter((s) => rest(s) > budget);
  const fitting = prompts.filter((s) => rest(s) <= budget).sort((a, b) => (a.init.priority ?? 0) - (b.init.priority ?? 0) || a.id - b.id);
  let left = budget - (long.length ? Math.min(MIN_PREFILL_TOKENS, budget) : 0);
  const first: Sequence[] = [];
  const later = new Set(long);
  for (const s of fitting) {
    if (rest(s) <= left) {
      first.push(s);
      left -= rest(s);
    } else later.add(s);
  }
  return [...first, ...prompts.filter((s) => later.has(s))];
}

export class Scheduler {
  private readonly waiting: Sequence[] = [];
  /** Admitted sequences in admission order (loading or running). */
  private readonly active: Sequence[] = [];
  private nextId = 1;
  private wake: (() => void) | null = null;
  private closed = false;
  private readonly done: Promise<void>;
  /** Steps run so far (for tests and logs). */
  steps = 0;
  /** End of the last step that had decode rows, while decoding goes on without a pause (0: none). */
  private lastDecodeEnd = 0;
  /**
   * This thread's CPU time at lastDecodeEnd (µs; src/common/thread_cpu.ts): a gap measured in it
   * is neither stretched by other processes holding the CPU nor inflated by this process's other
   * threads (V8's background GC, the kernel's helper), which do not hold up the next step.
   */
  private lastDecodeCpu = 0;
  /** Running wall time per computed token (ms) over recent steps with prompt tokens (0: none yet). */
  private msPerToken = 0;
  private readonly stepTargetMs: number;
  private readonly now: () => number;
  /** Paces every KV import of this engine against its steps (one slice of import work between two steps). */
  private readonly imports: ImportPacer;

  constructor(private readonly o: SchedulerOptions) {
    this.stepTargetMs = o.stepTargetMs ?? STEP_TARGET_MS;
    this.now = o.now ?? (() => performance.now());
    this.imports = new ImportPacer({
      sliceMs: o.importSliceMs,
      now: o.importNow,
      busy: () => this.active.some((s) => s.state === 'running'),
      onSlice: () => o.metrics.importSlices.inc(),
    });
    this.done = this.loop();
  }

  /** Largest number of KV positions a single sequence can be given. */
  get capacityTokens(): number {
    return this.o.kv.capacityTokens;
  }
  get numWaiting(): number {
    return this.waiting.length;
  }
  get numActive(): number {
    return this.active.length;
  }

  /** Queues a request. Throws a 503 KvcError when the queue is full or the engine is stopping. */
  submit(init: SequenceInit): Sequence {
    if (this.closed) throw unavailable('the engine is shutting down');
    // Admit first, so that the queue bound counts only requests that really have to wait.
    this.admit();
    if (this.waiting.length >= this.o.maxQueue) {
      throw unavailable(`the engine's queue is full (${this.o.maxQueue} requests waiting); retry later`);
    }
    const seq = new Sequence(this.nextId++, init);
    this.o.connector?.arrived(init.kvTransferParams);
    // Ordered by priority (lower first), then arrival: insert after every waiting sequence of
    // the same or a lower value. All at 0 (the default) this is the FIFO queue.
    const p = init.priority ?? 0;
    let at = this.waiting.length;
    while (at > 0 && (this.waiting[at - 1]!.init.priority ?? 0) > p) at--;
    this.waiting.splice(at, 0, seq);
    this.o.metrics.promptTokens.inc(init.prompt.length);
    this.admit();
    this.poke();
    return seq;
  }

  /** Ends a sequence early (client gone, stop string seen). Frees its KV at once. */
  cancel(seq: Sequence, reason: FinishReason = 'abort'): void {
    if (seq.state === 'finished') return;
    if (seq.state === 'waiting') {
      const i = this.waiting.indexOf(seq);
      if (i >= 0) this.waiting.splice(i, 1);
      this.o.connector?.endedUnloaded(seq.init.kvTransferParams);
    }
    // A loading sequence keeps its blocks until the load returns (it may be writing them).
    this.finish(seq, reason, undefined, seq.state !== 'loading');
  }

  private finish(seq: Sequence, reason: FinishReason, err?: Error, freeNow = true): void {
    if (seq.state === 'finished') return;
    const wasLoading = seq.state === 'loading';
    seq.state = 'finished';
    seq.finishReason = reason;
    const i = this.active.indexOf(seq);
    if (i >= 0 && (freeNow || !wasLoading)) {
      this.active.splice(i, 1);
      this.o.kv.free(seq.id);
    }
    const now = performance.now();
    if (seq.firstTokenAt) this.o.metrics.e2e.observe((now - seq.arrival) / 1000);
    this.o.metrics.vllm.finished(reason, { arrival: seq.arrival, admitted: seq.admittedAt, firstToken: seq.firstTokenAt, lastToken: seq.lastTokenAt, now });
    this.updateGauges();
    this.poke();
    try {
      seq.init.events.onFinish(reason, err);
    } catch (e) {
      log.error(`finish callback of ${seq.init.requestId} threw: ${(e as Error).message}`);
    }
    try {
      this.o.onFinished?.(seq);
    } catch (e) {
      log.error(`finished-sequence hook of ${seq.init.requestId} threw: ${(e as Error).message}`);
    }
  }

  private poke(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  private updateGauges(): void {
    const m = this.o.metrics;
    m.running.set(this.active.length);
    m.waiting.set(this.waiting.length);
    m.kvBlocks.set({ state: 'used' }, this.o.kv.usedBlocks);
    m.kvBlocks.set({ state: 'total' }, this.o.kv.totalBlocks);
    m.kvResidentBytes.set(this.o.kv.residentBytes);
    m.kvUsage.set(this.o.kv.usedBlocks / this.o.kv.totalBlocks);
  }

  /** Moves waiting sequences in queue order (priority, then arrival) into the active set while slots and KV allow. */
  private admit(): void {
    while (this.waiting.length && this.active.length < this.o.maxNumSeqs) {
      const seq = this.waiting[0]!;
      if (!this.o.kv.canAllocate(seq.kvNeed)) break; // in order: later requests do not overtake
      this.waiting.shift();
      seq.admittedAt = performance.now();
      this.o.kv.allocate(seq.id, seq.kvNeed);
      this.active.push(seq);
      const conn = this.o.connector;
      if (!conn) {
        seq.state = 'running';
        continue;
      }
      seq.state = 'loading';
      conn
        .load(
          {
            seqId: seq.id,
            requestId: seq.init.requestId,
            prompt: seq.prompt,
            kvTransferParams: seq.init.kvTransferParams,
            cacheSalt: seq.init.cacheSalt,
            cancelled: () => seq.state === 'finished',
            pace: () => this.imports.next(seq),
            paceDone: () => this.imports.done(seq),
          },
          this.o.kv,
        )
        .then(
          (r) => r,
          (e: unknown) => {
            log.warn(`request ${seq.init.requestId}: KV load failed: ${(e as Error).message}`);
            return { tokens: 0, receivedTokens: 0, ledger: null };
          },
        )
        .then(({ tokens, receivedTokens, ledger }) => {
          if (seq.state === 'finished') {
            // Cancelled while loading: release now that nothing writes the blocks any more.
            const i = this.active.indexOf(seq);
            if (i >= 0) this.active.splice(i, 1);
            this.o.kv.free(seq.id);
            this.updateGauges();
          } else {
            seq.computed = tokens;
            seq.loadedTokens = tokens;
            seq.receivedTokens = receivedTokens;
            seq.ledger = ledger;
            seq.state = 'running';
          }
          this.poke();
        });
    }
    this.updateGauges();
  }

  private async loop(): Promise<void> {
    while (!this.closed) {
      this.admit();
      const ran = this.step();
      if (ran) {
        // One slice of KV import may run now (the oldest waiting import first), then HTTP
        // handlers, timers and store I/O, before the next step.
        this.imports.stepped();
        await yieldToLoop();
        continue;
      }
      this.imports.idle();
      if (this.closed) break;
      this.lastDecodeEnd = 0; // idle: the next decode step starts a new run of intervals
      await new Promise<void>((r) => {
        this.wake = r;
      });
    }
    this.imports.idle();
  }

  /** Runs one forward over decode rows + prefill chunks. Returns false when there was nothing to run. */
  private step(): boolean {
    const segs: ForwardSegment[] = [];
    const rows: { seq: Sequence; n: number; logits: boolean }[] = [];
    let budget = this.o.maxNumBatchedTokens;
    // Decode rows first: one token each, they keep inter-token latency low.
    for (const seq of this.active) {
      if (seq.state !== 'running' || seq.prefilling) continue;
      const last = seq.output[seq.output.length - 1]!;
      segs.push({ seqId: seq.id, tokens: [last], startPos: seq.computed, wantLogits: true });
      rows.push({ seq, n: 1, logits: true });
      budget--;
    }
    const decodeRows = segs.length;
    // Then prompt chunks (prefillOrder: prompts that finish in this step first, then the oldest),
    // within what is left of the budget and of the step's time (at the measured cost per token;
    // the first prompt step measures it).
    if (this.stepTargetMs > 0 && this.msPerToken > 0) {
      const byTime = Math.floor(this.stepTargetMs / this.msPerToken) - decodeRows;
      budget = Math.min(budget, Math.max(MIN_PREFILL_TOKENS, byTime));
    } else if (this.stepTargetMs > 0) {
      budget = Math.min(budget, 4 * MIN_PREFILL_TOKENS);
    }
    for (const seq of prefillOrder(this.active, budget)) {
      if (budget <= 0) break;
      const n = Math.min(budget, seq.prompt.length - seq.computed);
      const end = seq.computed + n;
      const logits = end === seq.prompt.length;
      segs.push({ seqId: seq.id, tokens: seq.prompt.slice(seq.computed, end), startPos: seq.computed, wantLogits: logits });
      rows.push({ seq, n, logits });
      budget -= n;
    }
    if (!segs.length) {
      this.lastDecodeEnd = 0;
      return false;
    }
    this.steps++;
    let out: Float32Array[];
    const t0 = performance.now();
    const c0 = this.now();
    if (this.lastDecodeEnd && decodeRows > 0) {
      this.o.metrics.decodeStepGap.observe((t0 - this.lastDecodeEnd) / 1000);
      this.o.metrics.decodeStepGapCpu.observe((threadCpuMicros() - this.lastDecodeCpu) / 1e6);
    }
    let stepTokens = 0;
    let decodes = 0;
    for (const r of rows) {
      stepTokens += r.n;
      if (!r.seq.prefilling) decodes++;
    }
    try {
      out = this.o.model.forward(segs, this.o.kv);
      if (stepTokens > decodeRows) {
        // Only steps with prompt tokens teach the cost: decode-only steps are cheap per row and
        // would make the next prompt chunk too long.
        const perToken = (this.now() - c0) / stepTokens;
        this.msPerToken = this.msPerToken ? COST_EWMA * perToken + (1 - COST_EWMA) * this.msPerToken : perToken;
      }
      const phase = decodes === rows.length ? 'decode' : decodes === 0 ? 'prefill' : 'mixed';
      this.o.metrics.stepSeconds[phase].observe((performance.now() - t0) / 1000);
      this.o.metrics.stepTokens[phase].observe(stepTokens);
      this.stepTimes(decodeRows > 0);
    } catch (e) {
      // A bug in the model must not take the server down: fail the sequences of this step.
      log.error(`forward failed: ${(e as Error).stack ?? (e as Error).message}`);
      for (const r of rows) this.finish(r.seq, 'error', e as Error);
      return true;
    }
    // Per-token bookkeeping shares the step's clock reading and one counter update per step.
    const now = performance.now();
    let emitted = 0;
    let li = 0;
    for (const r of rows) {
      const seq = r.seq;
      const logits = r.logits ? out[li++] : undefined;
      if (seq.state === 'finished') continue; // cancelled by a callback earlier in this loop
      const wasPrefill = seq.prefilling;
      seq.computed += r.n;
      if (wasPrefill) this.o.metrics.tokensComputed.inc(r.n);
      if (!logits) continue;
      if (wasPrefill) {
        this.o.metrics.prefillRequests.inc();
        const conn = this.o.connector;
        if (conn) {
          seq.kvDone = conn.save(
            { seqId: seq.id, requestId: seq.init.requestId, prompt: seq.prompt, kvTransferParams: seq.init.kvTransferParams, cacheSalt: seq.init.cacheSalt, cancelled: () => seq.state === 'finished', loadedTokens: seq.loadedTokens },
            this.o.kv,
          );
        }
      }
      const token = seq.init.sampler.sample(logits, this.o.model.argmax);
      // A row that overflowed (a key past the KV dtype's range, an activation past f32's) is NaN
      // through and through: the kernels are total (a NaN score makes its attention row NaN), and
      // argmax would answer token 0 for it. No token is meaningful, so the request ends with a
      // 400 naming the position; the other rows of the step are independent and go on.
      if (!Number.isFinite(logits[token])) {
        this.finish(seq, 'error', kvcError(ERRORS.numeric_overflow, `the model's activations overflowed at position ${seq.prompt.length + seq.output.length - 1}: its logits are ${logits[token]}, so no next token is meaningful (the prompt drives them past the range of the KV dtype or of f32)`));
        continue;
      }
      emitted++;
      this.emit(seq, token, now);
    }
    if (emitted) this.o.metrics.generatedTokens.inc(emitted);
    return true;
  }

  /**
   * For steps with decode rows, the interval since the previous such step (what a decoding
   * sequence waits per token, whatever ran in between); remembers when (and at what process CPU
   * time) this one ended, for the next gap.
   */
  private stepTimes(hadDecode: boolean): void {
    const now = performance.now();
    if (!hadDecode) {
      this.lastDecodeEnd = 0;
      return;
    }
    const cpu = threadCpuMicros();
    if (this.lastDecodeEnd) {
      this.o.metrics.decodeStepInterval.observe((now - this.lastDecodeEnd) / 1000);
      this.o.metrics.decodeStepIntervalCpu.observe((cpu - this.lastDecodeCpu) / 1e6);
    }
    this.lastDecodeEnd = now;
    this.lastDecodeCpu = cpu;
  }

  private emit(seq: Sequence, token: number, now: number): void {
    const m = this.o.metrics;
    if (!seq.firstTokenAt) {
      seq.firstTokenAt = now;
      m.ttft.observe((now - seq.arrival) / 1000);
      m.vllm.ttft.observe((now - seq.arrival) / 1000);
    } else {
      m.itl.observe((now - seq.lastTokenAt) / 1000);
      m.vllm.itl.observe((now - seq.lastTokenAt) / 1000);
    }
    seq.lastTokenAt = now;
    seq.output.push(token);
    try {
      seq.init.events.onToken(token);
    } catch (e) {
      log.error(`token callback of ${seq.init.requestId} threw: ${(e as Error).message}`);
      this.finish(seq, 'error', e as Error);
      return;
    }
    if (seq.state === 'finished') return; // a stop string ended it inside the callback
    if (seq.init.stopTokenIds.has(token)) this.finish(seq, 'stop');
    else if (seq.output.length >= seq.init.maxTokens) this.finish(seq, 'length');
  }

  /** Stops admitting, aborts everything queued or running, and waits for the loop to exit. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const seq of [...this.waiting]) this.cancel(seq, 'abort');
    for (const seq of [...this.active]) this.cancel(seq, 'abort');
    this.poke();
    await this.done;
  }
}

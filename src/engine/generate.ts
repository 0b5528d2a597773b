// One generation request end to end: submit one sequence per choice (`n`, or `best_of` of which
// the n most likely are kept) to the scheduler, turn tokens into text (stop strings, incremental
// detokenization, logprobs), and answer as OpenAI JSON or as an SSE stream that ends with
// `data: [DONE]`. A client that disconnects cancels its sequences, which frees their KV.
import type { FastifyReply, FastifyRequest } from 'fastify';
import { KvcError, asKvcError, unavailable } from '../common/errors.js';
import { logger } from '../common/log.js';
import { chatLogprobs, completionLogprobs, tokenNamer, type LogprobEntry } from './logprobs.js';
import type { EngineMetrics } from './metrics.js';
import type { Tokenizer } from './model/tokenizer.js';
import type { SamplingParams } from './sampler.js';
import { Sampler } from './sampler.js';
import type { FinishReason, Scheduler, Sequence } from './scheduler.js';
import { promptSources } from './request_log.js';
import { SseWriter } from './sse_writer.js';
import { StopMatcher } from './stop.js';
import { forwardedLedger, predictedOf, type KvcLedger, type MissReason } from '../protocol/ledger.js';

const log = logger('engine.http');

/** How long an answer waits for the connector to finish storing/sending the prompt's KV. */
const KV_DONE_TIMEOUT_MS = 120_000;

export interface GenerationRequest {
  kind: 'completion' | 'chat';
  endpoint: string;
  requestId: string;
  modelName: string;
  prompt: number[];
  maxTokens: number;
  /** Choices answered. */
  n: number;
  /** Sequences generated (>= n); the n with the highest cumulative logprob are answered. */
  bestOf: number;
  /** The base sampling parameters; choice i samples with seed + i when a seed is given. */
  sampling: SamplingParams;
  /** Alternatives per token in the answer's logprobs; null: no logprobs in the answer. */
  logprobs: number | null;
  /** Logprobs name tokens "token_id:<id>" rather than by their text. */
  tokensAsIds: boolean;
  stop: string[];
  includeStopStr: boolean;
  stopTokenIds: Set<number>;
  /** Completions' `echo`: the prompt text that starts every choice's text. */
  echo: string | null;
  kvTransferParams: Record<string, unknown> | undefined;
  stream: boolean;
  includeUsage: boolean;
  /** stream_options.continuous_usage_stats (with include_usage): every chunk carries the usage so far. */
  continuousUsage: boolean;
  /** vLLM's cache_salt (chunk keys of this prompt are salted with it). */
  cacheSalt?: string;
  /** vLLM's priority: lower is admitted first (default 0). */
  priority: number;
}

export interface GenerationContext {
  scheduler: Scheduler;
  tokenizer: Tokenizer;
  metrics: EngineMetrics;
  /** This engine's cache instance (the ledger's `instance`), null without one. */
  kvcInstanceId?: string | null;
  /** kv_producer: the ledger goes back in kv_transfer_params (the proxy forwards it to the decoder). */
  producer?: boolean;
}

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /**
   * cached_tokens: KV reused from an earlier request (OpenAI's meaning: a cache read);
   * kv_transfer_tokens: KV this request's prefiller sent (docs/api.md "Usage").
   */
  prompt_tokens_details: { cached_tokens: number; kv_transfer_tokens: number };
  /** The hit-rate ledger (docs/ledger.md); absent on an engine without a cache connector. */
  kvc?: KvcLedger;
}

/**
 * usage.kvc of a request: this engine's ledger, plus the prefiller's when the prompt was computed
 * there (forwarded in kv_transfer_params.kvc_ledger): tokens and chunk counts add up, so the sum
 * over responses equals the engines' own counters. The reasons are awaited (bounded by the
 * engine's MISS_LOOKUP_TIMEOUT_MS, usually answered long before the first token).
 */
async function ledgerOf(seq: Sequence, params: Record<string, unknown> | undefined, instance: string | null): Promise<KvcLedger | undefined> {
  const own = seq.ledger;
  if (!own) return undefined;
  const chunks = { ...(await own.chunks) };
  const fwd = forwardedLedger(params);
  if (!fwd) return { predicted_cached_tokens: predictedOf(params), reused_tokens: own.reused, computed_tokens: own.computed, computed_chunks: chunks, instance };
  for (const [k, v] of Object.entries(fwd.computed_chunks)) chunks[k as MissReason] = (chunks[k as MissReason] ?? 0) + v;
  return { predicted_cached_tokens: fwd.predicted_cached_tokens, reused_tokens: fwd.reused_tokens + own.reused, computed_tokens: fwd.computed_tokens + own.computed, computed_chunks: chunks, instance: fwd.instance };
}

/** The state of one generated sequence (one choice, or a best_of candidate). */
interface Choice {
  index: number;
  sampler: Sampler;
  stops: StopMatcher;
  seq: Sequence;
  text: string;
  /** Characters the decoder produced so far (text_offset of the next token, before the echo). */
  decoded: number;
  entries: LogprobEntry[];
  /** Entries not yet sent in a stream chunk. */
  pending: LogprobEntry[];
  /** Characters of `text` already streamed. */
  sent: number;
  /**
   * A token's stream event without logprobs, split around its text: prefix + JSON string of the
   * text + suffix is what JSON.stringify gives for the whole chunk object (built once from that
   * object, so key order and escaping are JSON.stringify's own).
   */
  eventHead: string;
  eventTail: string;
  finished: Promise<{ reason: FinishReason; error?: Error }>;
}

function promptDetails(seq: Sequence): Usage['prompt_tokens_details'] {
  const { cached, received } = promptSources(seq);
  return { cached_tokens: cached, kv_transfer_tokens: received };
}

async function kvParams(seq: Sequence, requestId: string): Promise<Record<string, unknown> | undefined> {
  let t: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      seq.kvDone,
      new Promise<undefined>((r) => {
        t = setTimeout(() => {
          log.warn(`request ${requestId}: KV store/transfer still running after ${KV_DONE_TIMEOUT_MS} ms; answering without it`);
          r(undefined);
        }, KV_DONE_TIMEOUT_MS);
      }),
    ]);
  } finally {
    clearTimeout(t);
  }
}

/** Runs the request and writes the whole answer (JSON or SSE). Throws KvcError before anything is sent. */
export async function runGeneration(ctx: GenerationContext, g: GenerationRequest, req: FastifyRequest, reply: FastifyReply): Promise<void> {
  const created = Math.floor(Date.now() / 1000);
  const id = `${g.kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${g.requestId}`;
  const object = g.kind === 'chat' ? 'chat.completion' : 'text_completion';
  const chunkObject = g.kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
  const tok = ctx.tokenizer;
  const echoLen = g.echo?.length ?? 0;
  let stream: ((s: string) => void) | null = null;
  let clientGone = false;

  const name = tokenNamer(tok, g.tokensAsIds);
  const formatLogprobs = (entries: LogprobEntry[]) =>
    g.logprobs === null ? null : g.kind === 'chat' ? chatLogprobs(entries, name) : completionLogprobs(entries, name);
  const choiceChunk = (c: Choice, delta: string, finish: string | null) => {
    const lp = formatLogprobs(c.pending);
    c.pending = [];
    return g.kind === 'chat'
      ? { index: c.index, delta: finish === null ? { content: delta } : delta ? { content: delta } : {}, logprobs: lp, finish_reason: finish }
      : { index: c.index, text: delta, logprobs: lp, finish_reason: finish };
  };
  const sse = (body: unknown) => stream?.(`data: ${JSON.stringify(body)}\n\n`);
  /** A chunk of choice `c`; with continuous usage stats it carries the usage so far (that choice's tokens, as vLLM counts). */
  const chunkOf = (c: Choice, choice: unknown) => {
    const body: Record<string, unknown> = { id, object: chunkObject, created, model: g.modelName, choices: [choice] };
    if (g.continuousUsage) {
      const completion = c.seq?.output.length ?? 0;
      body.usage = { prompt_tokens: g.prompt.length, completion_tokens: completion, total_tokens: g.prompt.length + completion };
    }
    return body;
  };
  /** The event of one token's text (choiceChunk(c, delta, null) when logprobs are off). */
  const tokenEvent = (c: Choice, delta: string) => {
    if (g.logprobs !== null || g.continuousUsage) return sse(chunkOf(c, choiceChunk(c, delta, null)));
    stream?.(c.eventHead + JSON.stringify(delta) + c.eventTail);
  };
  /** Splits the event of a token's text around the text (see Choice.eventHead). */
  const splitEvent = (c: Choice) => {
    // U+0000 is written by JSON.stringify as the escape below, which no other part of the
    // object can contain unescaped after the text (only constant keys and nulls follow it).
    const mark = '\u0000';
    const whole = `data: ${JSON.stringify({ id, object: chunkObject, created, model: g.modelName, choices: [choiceChunk(c, mark, null)] })}\n\n`;
    const at = whole.lastIndexOf(JSON.stringify(mark));
    c.eventHead = whole.slice(0, at);
    c.eventTail = whole.slice(at + JSON.stringify(mark).length);
  };

  const choices: Choice[] = [];
  try {
    for (let i = 0; i < g.bestOf; i++) choices.push(submitChoice(i));
  } catch (e) {
    // The queue filled up part way: the choices already queued are withdrawn, nothing was sent.
    for (const c of choices) ctx.scheduler.cancel(c.seq, 'abort');
    throw e;
  }

  function submitChoice(index: number): Choice {
    const seed = g.sampling.seed === null ? null : g.sampling.seed + index;
    const sampler = new Sampler({ ...g.sampling, seed }, g.prompt);
    const dec = tok.streamDecoder(g.prompt);
    let resolveFinish!: (v: { reason: FinishReason; error?: Error }) => void;
    const finished = new Promise<{ reason: FinishReason; error?: Error }>((r) => {
      resolveFinish = r;
    });
    const c = { index, sampler, stops: new StopMatcher(g.stop, g.includeStopStr), text: '', decoded: 0, entries: [], pending: [], sent: 0, eventHead: '', eventTail: '', finished } as unknown as Choice;
    if (g.stream && g.logprobs === null) splitEvent(c);
    // Streams only when every candidate is answered (best_of > n is refused with stream).
    const streams = g.bestOf === g.n;
    // Throws a 503 KvcError (queue full, shutting down) before anything was sent.
    c.seq = ctx.scheduler.submit({
      requestId: g.bestOf > 1 ? `${g.requestId}-${index}` : g.requestId,
      prompt: g.prompt,
      maxTokens: g.maxTokens,
      sampler,
      stopTokenIds: g.stopTokenIds,
      // One transfer carries the prompt's KV once: the first sequence loads it, the others
      // compute the prompt themselves.
      kvTransferParams: index === 0 ? g.kvTransferParams : undefined,
      cacheSalt: g.cacheSalt,
      priority: g.priority,
      events: {
        onToken(token) {
          if (g.stopTokenIds.has(token)) return; // EOS ends the text; it is counted, not shown
          const piece = dec.push(token);
          if (sampler.last) {
            const e: LogprobEntry = { lp: sampler.last, text: piece || tok.tokenText(token), offset: echoLen + c.decoded };
            c.entries.push(e);
            c.pending.push(e);
          }
          c.decoded += piece.length;
          const visible = c.stops.add(piece);
          if (visible) {
            c.text += visible;
            if (streams) {
              c.sent += visible.length;
              tokenEvent(c, visible);
            }
          }
          if (c.stops.stopped) ctx.scheduler.cancel(c.seq, 'stop');
        },
        onFinish(reason, error) {
          if (reason === 'stop' || reason === 'length') {
            if (!c.stops.stopped) c.text += c.stops.add(dec.flush());
            c.text += c.stops.finish();
          }
          resolveFinish({ reason, error });
        },
      },
    });
    return c;
  }

  // A client that goes away (closed socket, aborted stream) cancels the sequences.
  const onGone = () => {
    if (clientGone || reply.raw.writableFinished) return;
    clientGone = true;
    for (const c of choices) ctx.scheduler.cancel(c.seq, 'abort');
  };
  reply.raw.on('close', onGone);
  // The socket may have closed between the body being read and the listener being attached
  // (its 'close' event already fired): check now, or the sequences would run to the end unseen.
  if (reply.raw.destroyed || reply.raw.socket?.destroyed === true) onGone();

  if (g.stream) {
    reply.hijack();
    const out = new SseWriter(reply.raw);
    out.start({ 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive', 'x-request-id': g.requestId });
    stream = (chunk) => out.write(chunk);
    if (g.echo) for (const c of choices) sse(chunkOf(c, choiceChunk(c, g.echo, null)));
    if (g.kind === 'chat') {
      for (const c of choices) sse(chunkOf(c, { index: c.index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }));
    }
  }

  // Every choice ends on its own; the answer (or the streams' last chunks) follows the last one.
  let params: Record<string, unknown> | undefined;
  const outcomes = await Promise.all(
    choices.map(async (c) => {
      const { reason, error } = await c.finished;
      const ok = reason === 'stop' || reason === 'length';
      if (ok && c.index === 0) params = await kvParams(c.seq, g.requestId);
      return { c, reason, error };
    }),
  );
  const failed = outcomes.find((o) => o.reason === 'abort' || o.reason === 'error');
  const finishOf = (r: FinishReason) => (r === 'length' ? 'length' : 'stop');

  // best_of: keep the n candidates with the highest cumulative logprob, in that order.
  const answered = g.bestOf > g.n ? [...outcomes].sort((a, b) => b.c.sampler.cumulativeLogprob - a.c.sampler.cumulativeLogprob).slice(0, g.n) : outcomes;
  const completionTokens = choices.reduce((s, c) => s + c.seq.output.length, 0);
  const usage: Usage = {
    prompt_tokens: g.prompt.length,
    completion_tokens: completionTokens,
    total_tokens: g.prompt.length + completionTokens,
    prompt_tokens_details: promptDetails(choices[0]!.seq),
  };
  const kvc = await ledgerOf(choices[0]!.seq, g.kvTransferParams, ctx.kvcInstanceId ?? null);
  if (kvc) {
    usage.kvc = kvc;
    if (ctx.producer && g.kvTransferParams) params = { ...(params ?? {}), kvc_ledger: kvc };
  }
  const outcome = failed === undefined ? 'ok' : failed.reason === 'abort' ? 'cancelled' : 'error';
  ctx.metrics.requests.inc({ endpoint: g.endpoint, outcome });
  req.outcomeCounted = true; // request_outcome.ts: the onResponse hook must not count it again

  const failure = (o: { reason: FinishReason; error?: Error }) =>
    o.reason === 'error' ? (o.error instanceof KvcError ? o.error : asKvcError(o.error ?? new Error('generation failed'))) : unavailable('the engine is shutting down; request aborted');

  if (g.stream) {
    const raw = reply.raw;
    if (clientGone || raw.destroyed) return;
    if (failed) {
      sse(failure(failed).toJSON());
    } else {
      for (const { c, reason } of outcomes) {
        // The text not streamed yet (held back for stop strings, or the decoder's tail).
        const tail = c.text.slice(c.sent);
        const final = chunkOf(c, choiceChunk(c, tail, finishOf(reason)));
        if (params && c.index === 0) final.kv_transfer_params = params;
        sse(final);
      }
      if (g.includeUsage) sse({ id, object: chunkObject, created, model: g.modelName, choices: [], usage });
    }
    stream!('data: [DONE]\n\n');
    raw.end();
    return;
  }

  if (failed) {
    if (failed.reason === 'abort' && clientGone) return;
    throw failure(failed);
  }
  const body: Record<string, unknown> = {
    id,
    object,
    created,
    model: g.modelName,
    choices: answered.map(({ c, reason }, index) => {
      const text = (g.echo ?? '') + c.text;
      const logprobs = formatLogprobs(c.entries);
      return g.kind === 'chat'
        ? { index, message: { role: 'assistant', content: text }, logprobs, finish_reason: finishOf(reason) }
        : { index, text, logprobs, finish_reason: finishOf(reason) };
    }),
    usage,
  };
  if (params) body.kv_transfer_params = params;
  void reply.header('x-request-id', g.requestId).send(body);
}

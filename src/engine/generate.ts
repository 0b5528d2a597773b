// One generation request end to end: submit to the scheduler, turn tokens into text (stop
// strings, incremental detokenization), and answer as OpenAI JSON or as an SSE stream that
// ends with `data: [DONE]`. A client that disconnects cancels its sequence, which frees its KV.
import type { FastifyReply, FastifyRequest } from 'fastify';
import { KvcError, asKvcError, unavailable } from '../common/errors.js';
import { logger } from '../common/log.js';
import type { EngineMetrics } from './metrics.js';
import type { Tokenizer } from './model/tokenizer.js';
import type { SamplingParams } from './sampler.js';
import { Sampler } from './sampler.js';
import type { FinishReason, Scheduler, Sequence } from './scheduler.js';
import { StopMatcher } from './stop.js';

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
  sampling: SamplingParams;
  stop: string[];
  stopTokenIds: Set<number>;
  kvTransferParams: Record<string, unknown> | undefined;
  stream: boolean;
  includeUsage: boolean;
}

export interface GenerationContext {
  scheduler: Scheduler;
  tokenizer: Tokenizer;
  metrics: EngineMetrics;
}

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

function usageOf(seq: Sequence): Usage {
  const p = seq.prompt.length;
  const c = seq.output.length;
  return { prompt_tokens: p, completion_tokens: c, total_tokens: p + c, prompt_tokens_details: { cached_tokens: seq.loadedTokens } };
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
  const dec = ctx.tokenizer.streamDecoder(g.prompt);
  const stops = new StopMatcher(g.stop);
  let text = '';
  let stream: ((s: string) => void) | null = null;
  let clientGone = false;

  const choiceChunk = (delta: string, finish: string | null) =>
    g.kind === 'chat'
      ? { index: 0, delta: finish === null ? { content: delta } : delta ? { content: delta } : {}, logprobs: null, finish_reason: finish }
      : { index: 0, text: delta, logprobs: null, finish_reason: finish };
  const sse = (body: unknown) => stream?.(`data: ${JSON.stringify(body)}\n\n`);

  let resolveFinish!: (v: { reason: FinishReason; error?: Error }) => void;
  const finished = new Promise<{ reason: FinishReason; error?: Error }>((r) => {
    resolveFinish = r;
  });
  // Throws a 503 KvcError (queue full, shutting down) before anything was sent.
  const s = ctx.scheduler.submit({
    requestId: g.requestId,
    prompt: g.prompt,
    maxTokens: g.maxTokens,
    sampler: new Sampler(g.sampling),
    stopTokenIds: g.stopTokenIds,
    kvTransferParams: g.kvTransferParams,
    events: {
      onToken(token) {
        if (g.stopTokenIds.has(token)) return; // EOS ends the text; it is counted, not shown
        const visible = stops.add(dec.push(token));
        if (visible) {
          text += visible;
          sse({ id, object: chunkObject, created, model: g.modelName, choices: [choiceChunk(visible, null)] });
        }
        if (stops.stopped) ctx.scheduler.cancel(s, 'stop');
      },
      onFinish(reason, error) {
        resolveFinish({ reason, error });
      },
    },
  });

  // A client that goes away (closed socket, aborted stream) cancels the sequence.
  const onGone = () => {
    if (clientGone || reply.raw.writableFinished) return;
    clientGone = true;
    ctx.scheduler.cancel(s, 'abort');
  };
  reply.raw.on('close', onGone);
  // The socket may have closed between the body being read and the listener being attached
  // (its 'close' event already fired): check now, or the sequence would run to the end unseen.
  if (reply.raw.destroyed || reply.raw.socket?.destroyed === true) onGone();

  if (g.stream) {
    reply.hijack();
    const raw = reply.raw;
    raw.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive', 'x-request-id': g.requestId });
    stream = (chunk) => {
      if (!raw.destroyed) raw.write(chunk);
    };
    if (g.kind === 'chat') sse({ id, object: chunkObject, created, model: g.modelName, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] });
  }

  const { reason, error } = await finished;
  let tail = '';
  if (reason === 'stop' || reason === 'length') {
    if (!stops.stopped) tail = stops.add(dec.flush()) + stops.finish();
    text += tail;
  }
  const finishReason = reason === 'length' ? 'length' : 'stop';
  const params = reason === 'stop' || reason === 'length' ? await kvParams(s, g.requestId) : undefined;
  const usage = usageOf(s);
  const outcome = reason === 'abort' ? 'cancelled' : reason === 'error' ? 'error' : 'ok';
  ctx.metrics.requests.inc({ endpoint: g.endpoint, outcome });
  req.outcomeCounted = true; // request_outcome.ts: the onResponse hook must not count it again

  if (g.stream) {
    const raw = reply.raw;
    if (clientGone || raw.destroyed) return;
    if (reason === 'abort' || reason === 'error') {
      const e = reason === 'error' ? asKvcError(error ?? new Error('generation failed')) : unavailable('the engine is shutting down; request aborted');
      sse(e.toJSON());
    } else {
      const final: Record<string, unknown> = { id, object: chunkObject, created, model: g.modelName, choices: [choiceChunk(tail, finishReason)] };
      if (params) final.kv_transfer_params = params;
      sse(final);
      if (g.includeUsage) sse({ id, object: chunkObject, created, model: g.modelName, choices: [], usage });
    }
    stream!('data: [DONE]\n\n');
    raw.end();
    return;
  }

  if (reason === 'abort') {
    if (clientGone) return;
    throw unavailable('the engine is shutting down; request aborted');
  }
  if (reason === 'error') throw error instanceof KvcError ? error : asKvcError(error ?? new Error('generation failed'));
  const choice =
    g.kind === 'chat'
      ? { index: 0, message: { role: 'assistant', content: text }, logprobs: null, finish_reason: finishReason }
      : { index: 0, text, logprobs: null, finish_reason: finishReason };
  const body: Record<string, unknown> = { id, object, created, model: g.modelName, choices: [choice], usage };
  if (params) body.kv_transfer_params = params;
  void reply.header('x-request-id', g.requestId).send(body);
}

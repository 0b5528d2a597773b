// POST /v1/completions and /v1/chat/completions: the body is checked (completions.schema.ts and
// PromptRules), turned into a GenerationRequest, and run by generate.ts (JSON or SSE answer).
import { randomBytes } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { requireObject } from '../../common/http.js';
import { parseBody } from '../../common/validate.js';
import { runGeneration, type GenerationContext, type GenerationRequest } from '../generate.js';
import type { RouteContext } from './context.js';
import { badRequest } from '../../common/errors.js';
import type { SamplingParams } from '../sampler.js';
import { REQUEST_ID, chatRequest, completionRequest, refuseUnknownFields, type ChatRequest, type CompletionRequest } from './completions.schema.js';
import { PromptRules } from './prompt_rules.js';
import { GEN_LIMIT } from '../../protocol/context_limit.js';
import { PROMPT_IDS_KEY, promptIdsOf } from '../../protocol/prompt_ids.js';

type Body = ChatRequest | CompletionRequest;
/**
 * The request id: an `X-Request-Id` of word characters (up to 128), else the body's `request_id`
 * (vLLM's field; the header wins there too), else a generated one.
 */
function requestIdOf(req: FastifyRequest, b: Body): string {
  const h = req.headers['x-request-id'];
  return typeof h === 'string' && REQUEST_ID.test(h) ? h : (b.request_id ?? randomBytes(12).toString('hex'));
}

const stopStrings = (stop: string | string[] | null | undefined) => (stop === null || stop === undefined ? [] : typeof stop === 'string' ? [stop] : stop).filter((x) => x.length > 0);

export async function completionRoutes(app: FastifyInstance, ctx: RouteContext): Promise<void> {
  const rules = new PromptRules(ctx);
  const { modelName, maxModelLen } = ctx;
  const tok = ctx.model.tokenizer;
  const gen: GenerationContext = { scheduler: ctx.scheduler, tokenizer: tok, metrics: ctx.metrics, kvcInstanceId: ctx.kvcInstanceId, producer: ctx.kvProducer };
  // EOS of the model config and of the tokenizer end generation unless `ignore_eos`.
  const eosIds = new Set<number>(ctx.model.config.eosTokenIds);
  if (tok.eosTokenId !== null) eosIds.add(tok.eosTokenId);
  const stopIds = (b: Body) => {
    const s = new Set<number>(b.ignore_eos ? [] : eosIds);
    for (const id of b.stop_token_ids ?? []) s.add(id);
    return s;
  };
  const vocab = ctx.model.config.vocabSize;
  const logitBias = (b: Body): Map<number, number> | null => {
    if (!b.logit_bias) return null;
    const m = new Map<number, number>();
    for (const [k, v] of Object.entries(b.logit_bias)) {
      const id = Number(k);
      if (id >= vocab) throw badRequest(`field \`logit_bias\`: token id ${k} is out of range for a vocabulary of ${vocab}`);
      m.set(id, v);
    }
    return m;
  };
  /** The fields both endpoints map the same way; `logprobs` null: none in the answer. */
  const common = (req: FastifyRequest, b: Body, maxTokens: number, logprobs: number | null) => {
    const n = b.n ?? 1;
    const bestOf = 'best_of' in b && b.best_of != null ? b.best_of : n;
    if (bestOf < n) throw badRequest(`field \`best_of\`: expected an integer >= n (${n}), found ${bestOf}`);
    if (bestOf > n && b.stream) throw badRequest('field `best_of`: best_of > n cannot be streamed (set stream to false)');
    // include_usage only shapes a stream: given without one it would do nothing.
    if (b.stream_options != null && b.stream !== true) throw badRequest('field `stream_options`: only allowed with `stream: true`');
    // vLLM applies continuous usage only with include_usage; asked without it, it would do nothing.
    if (b.stream_options?.continuous_usage_stats && !b.stream_options.include_usage) {
      throw badRequest('field `stream_options.continuous_usage_stats`: needs `include_usage: true` (usage in every chunk is an addition to the final usage chunk)');
    }
    const minTokens = b.min_tokens ?? 0;
    if (minTokens > maxTokens) throw badRequest(`field \`min_tokens\`: ${minTokens} is more than max_tokens (${maxTokens})`);
    for (const [i, id] of (b.stop_token_ids ?? []).entries()) {
      if (id >= vocab) throw badRequest(`field \`stop_token_ids[${i}]\`: token id ${id} is out of range for a vocabulary of ${vocab}`);
    }
    const stopTokenIds = stopIds(b);
    const sampling: SamplingParams = {
      temperature: b.temperature ?? 1,
      topP: b.top_p ?? 1,
      topK: b.top_k ?? -1,
      minP: b.min_p ?? 0,
      seed: b.seed ?? null,
      presencePenalty: b.presence_penalty ?? 0,
      frequencyPenalty: b.frequency_penalty ?? 0,
      repetitionPenalty: b.repetition_penalty ?? 1,
      logitBias: logitBias(b),
      minTokens,
      minTokensStopIds: stopTokenIds,
      // best_of ranks candidates by their cumulative logprob, so they are computed then too.
      logprobs: logprobs ?? (bestOf > n ? 0 : null),
    };
    return {
      requestId: requestIdOf(req, b),
      modelName,
      maxTokens,
      n,
      bestOf,
      sampling,
      logprobs,
      tokensAsIds: b.return_tokens_as_token_ids ?? false,
      stop: stopStrings(b.stop),
      includeStopStr: b.include_stop_str_in_output ?? false,
      stopTokenIds,
      kvTransferParams: b.kv_transfer_params ?? undefined,
      stream: b.stream ?? false,
      includeUsage: b.stream_options?.include_usage ?? false,
      continuousUsage: b.stream_options?.continuous_usage_stats ?? false,
      cacheSalt: b.cache_salt ?? undefined,
      priority: b.priority ?? 0,
    };
  };
  /** The paged KV must be able to hold every choice at once (they run side by side). */
  const checkChoicesFit = (b: Body, prompt: number[], maxTokens: number) => {
    const seqs = 'best_of' in b && b.best_of != null ? Math.max(b.best_of, b.n ?? 1) : (b.n ?? 1);
    const need = seqs * (prompt.length + maxTokens - 1);
    if (seqs > 1 && need > ctx.kv.capacityTokens) {
      throw badRequest(`field \`${'best_of' in b && b.best_of != null && b.best_of > (b.n ?? 1) ? 'best_of' : 'n'}\`: ${seqs} sequences of prompt + max_tokens need ${need} KV positions; this engine's KV cache holds ${ctx.kv.capacityTokens}`, 'kv_capacity_exceeded');
    }
  };

  app.post('/v1/completions', async (req: FastifyRequest, reply: FastifyReply) => {
    const body = requireObject(req.body);
    refuseUnknownFields(completionRequest, body);
    const b = parseBody(completionRequest, body);
    rules.checkModel(b.model);
    // A one-element array of a prompt is that prompt (clients batch; this engine takes one).
    const p = Array.isArray(b.prompt) && b.prompt.length === 1 && (typeof b.prompt[0] === 'string' || Array.isArray(b.prompt[0])) ? b.prompt[0]! : b.prompt;
    let prompt: number[];
    const given = promptIdsOf(b.kv_transfer_params);
    if (typeof p === 'string' && given) {
      // The proxy had this text tokenized once and sends its ids (src/protocol/prompt_ids.ts).
      prompt = given;
      rules.checkIds(prompt, `kv_transfer_params.${PROMPT_IDS_KEY}`);
    } else if (typeof p === 'string') {
      rules.boundText(p, 'prompt', maxModelLen, GEN_LIMIT);
      prompt = await tok.encodeAsync(p, b.add_special_tokens === false ? { addBos: false } : {}, rules.offThread());
    } else {
      prompt = p as number[];
      rules.checkIds(prompt, 'prompt');
    }
    const maxTokens = rules.plan(prompt, 'prompt', b.max_tokens, 'max_tokens', Math.min(16, maxModelLen - prompt.length));
    if (b.echo && b.logprobs != null) throw badRequest('field `echo`: echo with logprobs would need prompt logprobs, which this engine does not compute');
    checkChoicesFit(b, prompt, maxTokens);
    const echo = b.echo ? (typeof p === 'string' ? p : tok.decode(prompt)) : null;
    const g: GenerationRequest = { kind: 'completion', endpoint: '/v1/completions', prompt, echo, ...common(req, b, maxTokens, b.logprobs ?? null) };
    await runGeneration(gen, g, req, reply);
    return reply;
  });

  app.post('/v1/chat/completions', async (req: FastifyRequest, reply: FastifyReply) => {
    const body = requireObject(req.body);
    refuseUnknownFields(chatRequest, body);
    const b = parseBody(chatRequest, body);
    rules.checkModel(b.model);
    // The proxy's ids of the rendered messages, when it sends them (src/protocol/prompt_ids.ts).
    const given = promptIdsOf(b.kv_transfer_params);
    if (given) rules.checkIds(given, `kv_transfer_params.${PROMPT_IDS_KEY}`);
    const prompt = given ?? (await rules.encodeChat(b.messages, maxModelLen, GEN_LIMIT, b.add_special_tokens ?? undefined));
    const field = b.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens';
    const maxTokens = rules.plan(prompt, 'messages', b.max_completion_tokens ?? b.max_tokens, field, maxModelLen - prompt.length);
    if (b.top_logprobs != null && !b.logprobs) throw badRequest('field `top_logprobs`: requires `logprobs: true`');
    checkChoicesFit(b, prompt, maxTokens);
    const g: GenerationRequest = { kind: 'chat', endpoint: '/v1/chat/completions', prompt, echo: null, ...common(req, b, maxTokens, b.logprobs ? (b.top_logprobs ?? 0) : null) };
    await runGeneration(gen, g, req, reply);
    return reply;
  });
}

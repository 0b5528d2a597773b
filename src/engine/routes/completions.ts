// POST /v1/completions and /v1/chat/completions: the body is checked (completions.schema.ts and
// PromptRules), turned into a GenerationRequest, and run by generate.ts (JSON or SSE answer).
import { randomBytes } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { requireObject } from '../../common/http.js';
import { parseBody } from '../../common/validate.js';
import { runGeneration, type GenerationContext, type GenerationRequest } from '../generate.js';
import type { RouteContext } from './context.js';
import { chatRequest, completionRequest } from './completions.schema.js';
import { GEN_LIMIT, PromptRules } from './prompt_rules.js';

type SamplingFields = { temperature?: number | null; top_p?: number | null; top_k?: number | null; seed?: number | null };
type StopFields = { ignore_eos?: boolean | null; stop_token_ids?: number[] | null; stop?: string | string[] | null };

/** An `X-Request-Id` of word characters (up to 128) is used as the request id, else one is generated. */
function requestIdOf(req: FastifyRequest): string {
  const h = req.headers['x-request-id'];
  return typeof h === 'string' && /^[\w.:-]{1,128}$/.test(h) ? h : randomBytes(12).toString('hex');
}

const sampling = (b: SamplingFields) => ({ temperature: b.temperature ?? 1, topP: b.top_p ?? 1, topK: b.top_k ?? -1, seed: b.seed ?? null });

const stopStrings = (stop: string | string[] | null | undefined) => (stop === null || stop === undefined ? [] : typeof stop === 'string' ? [stop] : stop).filter((x) => x.length > 0);

export async function completionRoutes(app: FastifyInstance, ctx: RouteContext): Promise<void> {
  const rules = new PromptRules(ctx);
  const { modelName, maxModelLen } = ctx;
  const tok = ctx.model.tokenizer;
  const gen: GenerationContext = { scheduler: ctx.scheduler, tokenizer: tok, metrics: ctx.metrics };
  // EOS of the model config and of the tokenizer end generation unless `ignore_eos`.
  const eosIds = new Set<number>(ctx.model.config.eosTokenIds);
  if (tok.eosTokenId !== null) eosIds.add(tok.eosTokenId);
  const stopIds = (b: StopFields) => {
    const s = new Set<number>(b.ignore_eos ? [] : eosIds);
    for (const id of b.stop_token_ids ?? []) s.add(id);
    return s;
  };
  /** The fields both endpoints map the same way. */
  const common = (req: FastifyRequest, b: SamplingFields & StopFields & { kv_transfer_params?: Record<string, unknown> | null; stream?: boolean | null; stream_options?: { include_usage?: boolean | null } | null }) => ({
    requestId: requestIdOf(req),
    modelName,
    sampling: sampling(b),
    stop: stopStrings(b.stop),
    stopTokenIds: stopIds(b),
    kvTransferParams: b.kv_transfer_params ?? undefined,
    stream: b.stream ?? false,
    includeUsage: b.stream_options?.include_usage ?? false,
  });

  app.post('/v1/completions', async (req: FastifyRequest, reply: FastifyReply) => {
    const b = parseBody(completionRequest, requireObject(req.body));
    rules.checkModel(b.model);
    // A one-element array of a prompt is that prompt (clients batch; this engine takes one).
    const p = Array.isArray(b.prompt) && b.prompt.length === 1 && (typeof b.prompt[0] === 'string' || Array.isArray(b.prompt[0])) ? b.prompt[0]! : b.prompt;
    let prompt: number[];
    if (typeof p === 'string') {
      rules.boundText(p, 'prompt', maxModelLen, GEN_LIMIT);
      prompt = tok.encode(p);
    } else {
      prompt = p as number[];
      rules.checkIds(prompt, 'prompt');
    }
    const maxTokens = rules.plan(prompt, 'prompt', b.max_tokens, 'max_tokens', Math.min(16, maxModelLen - prompt.length));
    const g: GenerationRequest = { kind: 'completion', endpoint: '/v1/completions', prompt, maxTokens, ...common(req, b) };
    await runGeneration(gen, g, req, reply);
    return reply;
  });

  app.post('/v1/chat/completions', async (req: FastifyRequest, reply: FastifyReply) => {
    const b = parseBody(chatRequest, requireObject(req.body));
    rules.checkModel(b.model);
    const prompt = rules.encodeChat(b.messages, maxModelLen, GEN_LIMIT);
    const field = b.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens';
    const maxTokens = rules.plan(prompt, 'messages', b.max_completion_tokens ?? b.max_tokens, field, maxModelLen - prompt.length);
    const g: GenerationRequest = { kind: 'chat', endpoint: '/v1/chat/completions', prompt, maxTokens, ...common(req, b) };
    await runGeneration(gen, g, req, reply);
    return reply;
  });
}

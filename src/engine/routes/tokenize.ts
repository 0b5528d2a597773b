// POST /tokenize ({prompt, add_special_tokens?} or {messages}) and POST /detokenize ({tokens}).
import type { FastifyInstance } from 'fastify';
import { requireObject } from '../../common/http.js';
import { parseBody } from '../../common/validate.js';
import type { TokenizeReply } from '../../protocol/tokenize.js';
import type { RouteContext } from './context.js';
import { PromptRules, TOK_LIMIT } from './prompt_rules.js';
import { detokenizeRequest, tokenizeChatRequest, tokenizePromptRequest } from './tokenize.schema.js';

export async function tokenizeRoutes(app: FastifyInstance, ctx: RouteContext): Promise<void> {
  const rules = new PromptRules(ctx);
  const { maxModelLen } = ctx;
  const tok = ctx.model.tokenizer;

  app.post('/tokenize', async (req): Promise<TokenizeReply> => {
    const body = requireObject(req.body);
    let tokens: number[];
    // `count` may exceed max_model_len (a client asks how long a text is); only text whose
    // length alone proves it beyond max_model_len is refused before tokenizing.
    if ('messages' in body) {
      const b = parseBody(tokenizeChatRequest, body);
      rules.checkModel(b.model);
      tokens = await rules.encodeChat(b.messages, maxModelLen + 1, TOK_LIMIT, b.add_special_tokens);
    } else {
      const b = parseBody(tokenizePromptRequest, body);
      rules.checkModel(b.model);
      rules.boundText(b.prompt, 'prompt', maxModelLen + 1, TOK_LIMIT);
      tokens = await tok.encodeAsync(b.prompt, b.add_special_tokens === false ? { addBos: false } : {}, rules.offThread());
    }
    return { tokens, count: tokens.length, max_model_len: maxModelLen };
  });

  app.post('/detokenize', async (req) => {
    const b = parseBody(detokenizeRequest, requireObject(req.body));
    rules.checkModel(b.model);
    rules.checkIds(b.tokens, 'tokens');
    return { prompt: tok.decode(b.tokens) };
  });
}

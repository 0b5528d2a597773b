// The checks every prompt-taking route applies before any work is queued: the model name, token
// ids within the vocabulary, text refused by its length alone before it is tokenized, the chat
// template, and the length rules of max_model_len and of the paged KV budget.
import { badRequest, ERRORS, kvcError } from '../../common/errors.js';
import { ChatTemplateError, type ChatMessage } from '../model/tokenizer.js';
import type { RouteContext } from './context.js';
import { messageText, type ChatMessageBody } from './messages.schema.js';
import { answerOverContext, promptOverContext } from '../../protocol/context_limit.js';

/** /tokenize refuses only text beyond max_model_len (generation's limit is GEN_LIMIT, src/protocol/context_limit.ts). */
export const TOK_LIMIT = 'more than the model can take';

export class PromptRules {
  constructor(private readonly ctx: RouteContext) {}

  /**
   * Whether a long text is tokenized on the tokenizer's worker thread: while sequences are
   * admitted (their steps would wait for it here). An idle engine tokenizes inline, at once.
   */
  offThread(): boolean {
    return this.ctx.scheduler.numActive > 0;
  }

  /** An absent `model` means the served one; any other name is a 404. */
  checkModel(name: string | undefined): void {
    const served = this.ctx.modelName;
    if (name !== undefined && name !== served) throw kvcError(ERRORS.model_not_found, `The model \`${name}\` does not exist. This engine serves \`${served}\`.`);
  }

  checkIds(ids: number[], field: string): void {
    const vocab = this.ctx.model.config.vocabSize;
    for (let i = 0; i < ids.length; i++) {
      if (ids[i]! >= vocab) throw badRequest(`field \`${field}[${i}]\`: token id ${ids[i]} is out of range for a vocabulary of ${vocab}`);
    }
  }

  /**
   * Refuses text whose character count alone proves it has at least `limit` tokens, before
   * spending the CPU on tokenizing it (tokenizer.minTokens is a sound lower bound, or 0).
   */
  boundText(text: string, field: string, limit: number, what: string): void {
    const min = this.ctx.model.tokenizer.minTokens(text);
    if (min >= limit) {
      throw kvcError(
        ERRORS.context_length_exceeded,
        `field \`${field}\`: ${text.length} characters are at least ${min} tokens; ${what} (this model's maximum context length is ${this.ctx.maxModelLen} tokens)`,
      );
    }
  }

  /**
   * Chat messages → prompt ids; refuses a rendered prompt that certainly reaches `limit` tokens.
   * `addSpecialTokens` (vLLM's field): true adds BOS when the template did not write it, false
   * never adds one; unset: BOS only when the template did not write it and the tokenizer adds it.
   */
  async encodeChat(messages: ChatMessageBody[], limit: number, what: string, addSpecialTokens?: boolean): Promise<number[]> {
    const tok = this.ctx.model.tokenizer;
    // OpenAI's `developer` role (its clients send it for system prompts on newer models) is the
    // system role for every model that has no separate one: chat templates know only `system`.
    const msgs: ChatMessage[] = messages.map((m) => ({ role: m.role === 'developer' ? 'system' : m.role, content: messageText(m), ...(m.name !== undefined ? { name: m.name } : {}) }));
    let text: string;
    try {
      text = tok.applyChatTemplate(msgs);
    } catch (e) {
      if (e instanceof ChatTemplateError) throw badRequest(`field \`messages\`: ${e.message.replace(/^messages: /, '')}`);
      throw e;
    }
    this.boundText(text, 'messages', limit, what);
    return tok.encodeChatTextAsync(text, addSpecialTokens, this.offThread());
  }

  /**
   * Length rules shared by both generation endpoints; returns max_tokens to use. Without an
   * explicit max_tokens, `defaultMax` is further capped by what the paged KV can hold for this
   * prompt (prompt + max_tokens - 1 positions), so a default never asks for more than exists.
   */
  plan(prompt: number[], field: string, maxTokens: number | null | undefined, maxField: string, defaultMax: number): number {
    const { maxModelLen, kv } = this.ctx;
    if (prompt.length === 0) throw badRequest(`field \`${field}\`: the prompt is empty (0 tokens)`);
    const over = promptOverContext({ field, promptTokens: prompt.length, maxModelLen });
    if (over) throw kvcError(ERRORS.context_length_exceeded, over);
    if (prompt.length > kv.capacityTokens) {
      throw kvcError(ERRORS.kv_capacity_exceeded, `field \`${field}\`: the prompt has ${prompt.length} tokens; this engine's KV cache holds ${kv.capacityTokens} tokens`);
    }
    const mt = maxTokens ?? Math.min(defaultMax, kv.capacityTokens + 1 - prompt.length);
    const tooLong = answerOverContext({ field, promptTokens: prompt.length, maxField, maxTokens: mt, maxModelLen });
    if (tooLong) throw kvcError(ERRORS.context_length_exceeded, tooLong);
    if (prompt.length + mt - 1 > kv.capacityTokens) {
      throw kvcError(ERRORS.kv_capacity_exceeded, `field \`${maxField}\`: prompt + ${mt} tokens need more KV than this engine has (${kv.capacityTokens} tokens)`);
    }
    return mt;
  }
}

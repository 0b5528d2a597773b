// Tokenizer: a checkpoint's tokenizer.json read by @huggingface/tokenizers, plus the chat template
// from tokenizer_config.json rendered by @huggingface/jinja, plus an incremental decoder so that
// streamed deltas never split a multi-byte character (byte-fallback tokens) or lose the leading
// space that SentencePiece-style decoders strip from the first token of a string.
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { Template } from '@huggingface/jinja';
import { logger } from '../../common/log.js';
import { EncodeThread, OFF_THREAD_MIN_CHARS, type TokenizerOrigin } from './tokenize_thread.js';

/** Integers below this are V8 small integers (31-bit), cheap Map keys. */
const SMALL_INT = 1 << 30;
/** Windows remembered before the memory starts over (~100 bytes each). */
const WINDOW_MEMO_MAX = 1 << 16;

/** appendedText's kinds of vocabulary ids, ordered so one comparison asks "adds text of its own". */
const KIND_UNSEEN = 0;
/** Special, no such piece, or an empty piece: adds nothing itself. */
const KIND_NONE = 1;
/** A byte piece: adds a byte, joined with its neighbours into UTF-8. */
const KIND_BYTE = 2;
/** A non-empty ordinary piece: adds its text. */
const KIND_TEXT = 3;

/** A byte-fallback piece: ByteFallback turns it into that byte, joined with neighbouring bytes. */
const BYTE_PIECE = /^<0x[0-9A-Fa-f]{2}>$/;

/**
 * GPT-2's byte-level alphabet, character → byte: the printable bytes ("!".."~", "¡".."¬",
 * "®".."ÿ") stand for themselves, every other byte b for U+0100 + its rank among those others
 * (so a space, 0x20, is "Ġ", U+0120). Byte-level vocabularies spell their pieces in it.
 */
const BYTE_OF_CHAR: Map<number, number> = (() => {
  const m = new Map<number, number>();
  let next = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    m.set(printable ? b : 0x100 + next++, b);
  }
  return m;
})();

/**
 * Strict UTF-8: a piece whose bytes are not whole characters on their own has no text of its own.
 * A leading U+FEFF is text like any other (TextDecoder would drop it as a byte-order mark).
 */
const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** The text a byte-level piece stands for, when its bytes are whole UTF-8 characters; null otherwise. */
function byteLevelText(piece: string): string | null {
  const bytes = new Uint8Array(piece.length);
  for (let i = 0; i < piece.length; i++) {
    const b = BYTE_OF_CHAR.get(piece.charCodeAt(i));
    if (b === undefined) return null;
    bytes[i] = b;
  }
  try {
    return UTF8.decode(bytes);
  } catch {
    return null;
  }
}

/** Whether a tokenizer.json decoder is exactly SentencePiece's chain (see Tokenizer.appendedText). */
function isSentencePieceDecoder(d: unknown): boolean {
  const want = [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }];
  if (typeof d !== 'object' || d === null || (d as { type?: unknown }).type !== 'Sequence') return false;
  return JSON.stringify((d as { decoders?: unknown }).decoders) === JSON.stringify(want);
}

const log = logger('engine.tokenizer');

export class TokenizerError extends Error {
  override name = 'TokenizerError';
}

/** A chat template could not be applied to the given messages (a client error: 400). */
export class ChatTemplateError extends Error {
  override name = 'ChatTemplateError';
}

export interface ChatMessage {
  role: string;
  content: string;
  /** The participant's name; templates that know it render it. */
  name?: string;
}

/** Llama-2's chat format: the built-in model's (its vocabulary is Llama-2's); never a fallback for a checkpoint without one. */
export const LLAMA2_CHAT_TEMPLATE =
  "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}" +
  '{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}' +
  '{% for message in loop_messages %}' +
  "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}" +
  "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}" +
  "{% else %}{% set content = message['content'] %}{% endif %}" +
  "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}" +
  "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}" +
  '{% endfor %}';

async function readJson(file: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e) {
    throw new TokenizerError(`${file}: cannot read (${(e as Error).message})`);
  }
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch (e) {
    throw new TokenizerError(`${file}: not valid JSON (${(e as Error).message})`);
  }
}

function tokenContent(v: unknown): string | null {
  if (typeof v === 'string') return v;
  if (v && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string') return (v as { content: string }).content;
  return null;
}

type Json = Record<string, unknown>;

/** A normalizer that never makes the text shorter (in UTF-16 units), or false. */
function nonShrinkingNormalizer(n: unknown): boolean {
  if (n === null || n === undefined) return true;
  const o = n as Json;
  switch (o.type) {
    case 'Sequence':
      return Array.isArray(o.normalizers) && o.normalizers.every(nonShrinkingNormalizer);
    case 'Prepend':
      return true;
    case 'Replace': {
      const pat = (o.pattern as Json | undefined)?.String;
      return typeof pat === 'string' && typeof o.content === 'string' && o.content.length >= pat.length;
    }
    default:
      // NFKC/NFKD (an astral letter can become one BMP letter), Lowercase, Strip, regex
      // replacements...: may shrink the text, so no bound.
      return false;
  }
}

/** A pre-tokenizer that keeps every character (splits, maps to ≥ as many units), or false. */
function nonShrinkingPreTokenizer(p: unknown): boolean {
  if (p === null || p === undefined) return true;
  const o = p as Json;
  switch (o.type) {
    case 'Sequence':
      return Array.isArray(o.pretokenizers) && o.pretokenizers.every(nonShrinkingPreTokenizer);
    case 'Metaspace': // spaces → ▁ (same length), optional prepended ▁
    case 'ByteLevel': // one character per UTF-8 byte: never fewer than UTF-16 units
    case 'Digits':
      return true;
    case 'Split':
    case 'Punctuation':
      return o.behavior !== 'Removed';
    default:
      return false; // Whitespace, WhitespaceSplit, Bert...: drop whitespace
  }
}

/**
 * The most UTF-16 units of input one token can stand for, when that is bounded: the pipeline
 * never shrinks the text, the model is BPE, and an unknown character cannot fuse with its
 * neighbours into one token. Then encode(text) has at least ceil(text.length / result) tokens.
 * null when no such bound holds (the caller must tokenize to know).
 */
export function maxCharsPerToken(tj: Json): number | null {
  if (!nonShrinkingNormalizer(tj.normalizer) || !nonShrinkingPreTokenizer(tj.pre_tokenizer)) return null;
  const model = tj.model as Json | undefined;
  if (!model || model.type !== 'BPE' || typeof model.vocab !== 'object' || model.vocab === null || Array.isArray(model.vocab)) return null;
  const vocab = model.vocab as Record<string, unknown>;
  if (model.fuse_unk === true) {
    const allBytes = model.byte_fallback === true && Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`).every((t) => t in vocab);
    if (!allBytes) return null;
  }
  let max = 1;
  for (const piece of Object.keys(vocab)) if (piece.length > max) max = piece.length;
  for (const t of (tj.added_tokens as { content?: unknown }[] | undefined) ?? []) {
    if (typeof t.content === 'string' && t.content.length > max) max = t.content.length;
  }
  return max;
}

export class Tokenizer {
  readonly bosTokenId: number | null;
  readonly eosTokenId: number | null;
  readonly bosToken: string | null;
  readonly eosToken: string | null;
  readonly addBosDefault: boolean;
  readonly vocabSize: number;
  /** appendedText's memory: one KIND_* per vocabulary id (null: not SentencePiece's decoder chain). */
  private readonly pieceKind: Uint8Array | null;
  /** appendedText's text per KIND_TEXT id. */
  private readonly pieceText: string[];
  /** decodeWindow's memory: window key → text. */
  private readonly windows = new Map<number, string>();
  /** See maxCharsPerToken (null: no bound from the character count). */
  readonly maxCharsPerToken: number | null;
  /** What fromJson built this from, until startEncodeThread hands it to the worker (null: not from JSON). */
  private origin: TokenizerOrigin | null = null;
  /** The worker that encodes long texts (startEncodeThread), or null: every text is encoded inline. */
  private thread: EncodeThread | null = null;
  private template: Template | null = null;
  private readonly specialIds: Set<number>;
  /** Ids of added tokens (special or not): their text is their content, not a vocabulary spelling. */
  private readonly addedIds: Set<number>;

  private constructor(
    private readonly hf: HfTokenizer,
    config: Record<string, unknown>,
    chatTemplateSource: string | null,
    maxChars: number | null = null,
    /** The decoder is SentencePiece's chain (isSentencePieceDecoder): appendedText() may answer. */
    appends = false,
    /** The decoder is byte-level (GPT-2 style): a piece's characters stand for bytes ("Ġ" a space). */
    private readonly byteLevel = false,
  ) {
    this.maxCharsPerToken = maxChars;
    this.bosToken = tokenContent(config.bos_token);
    this.eosToken = tokenContent(config.eos_token);
    this.bosTokenId = this.bosToken !== null ? (hf.token_to_id(this.bosToken) ?? null) : null;
    this.eosTokenId = this.eosToken !== null ? (hf.token_to_id(this.eosToken) ?? null) : null;
    this.addBosDefault = config.add_bos_token === undefined ? this.bosTokenId !== null : config.add_bos_token === true;
    this.vocabSize = hf.get_vocab(true).size;
    this.pieceKind = appends || byteLevel ? new Uint8Array(this.vocabSize) : null;
    this.pieceText = appends || byteLevel ? new Array<string>(this.vocabSize).fill('') : [];
    const added = [...hf.get_added_tokens_decoder()];
    this.specialIds = new Set(added.filter(([, t]) => t.special).map(([id]) => id));
    this.addedIds = new Set(added.map(([id]) => id));
    if (chatTemplateSource !== null) this.useChatTemplate(chatTemplateSource, 'chat_template');
  }

  /** The chat template's source, or null: the model has none (chat requests are refused, naming how to give one). */
  chatTemplateSource: string | null = null;

  /** Uses `source` as the chat template (`--chat-template`, chat_template.jinja); `origin` names it in a parse error. */
  useChatTemplate(source: string, origin: string): void {
    try {
      this.template = new Template(source);
    } catch (e) {
      throw new TokenizerError(`${origin} does not parse: ${(e as Error).message}`);
    }
    this.chatTemplateSource = source;
  }

  /** Loads `<dir>/tokenizer.json` and `<dir>/tokenizer_config.json` (the latter optional). */
  static async load(dir: string): Promise<Tokenizer> {
    const tj = await readJson(join(dir, 'tokenizer.json'));
    let cfg: Record<string, unknown> = {};
    try {
      cfg = await readJson(join(dir, 'tokenizer_config.json'));
    } catch (e) {
      if (!/cannot read/.test((e as Error).message)) throw e;
    }
    const tok = Tokenizer.fromJson(tj, cfg, join(dir, 'tokenizer.json'));
    // transformers saves a checkpoint's template as chat_template.jinja beside the tokenizer; it
    // is the checkpoint's template when present (as in transformers and vLLM).
    const jinja = join(dir, 'chat_template.jinja');
    if (existsSync(jinja)) tok.useChatTemplate(await readFile(jinja, 'utf8'), jinja);
    return tok;
  }

  /**
   * A tokenizer from an already-parsed tokenizer.json object and tokenizer_config.json object
   * (GGUF files carry their vocabulary as metadata; gguf_tokenizer.ts builds these from it).
   * `source` names the origin in error messages.
   */
  static fromJson(tj: Record<string, unknown>, cfg: Record<string, unknown>, source: string): Tokenizer {
    let hf: HfTokenizer;
    const appends = isSentencePieceDecoder(tj.decoder);
    try {
      // Never clean up spaces in decoded text (" ." → ".", " n't" → "n't"): the library does so by
      // default and Llama 3's tokenizer_config.json asks for it, but generated text must be the
      // tokens' exact text (as vLLM streams it), and the incremental decoder's windows, cleaned
      // one by one, would drop characters (" n't" streamed as "nt").
      hf = new HfTokenizer(tj, { ...cfg, clean_up_tokenization_spaces: false });
    } catch (e) {
      throw new TokenizerError(`${source}: unsupported tokenizer (${(e as Error).message})`);
    }
    let tpl = cfg.chat_template;
    if (Array.isArray(tpl)) tpl = (tpl as { name?: string; template?: string }[]).find((t) => t.name === 'default')?.template;
    const byteLevel = (tj.decoder as Json | null | undefined)?.type === 'ByteLevel';
    const tok = new Tokenizer(hf, cfg, typeof tpl === 'string' ? tpl : null, maxCharsPerToken(tj), appends, byteLevel);
    tok.origin = { tj, cfg, source };
    return tok;
  }

  /**
   * Starts the worker thread that encodeAsync uses for long texts (tokenize_thread.ts); the engine
   * does so at start, before serving. A tokenizer not built from JSON, or whose worker fails to
   * start (logged), keeps encoding inline.
   */
  async startEncodeThread(): Promise<void> {
    if (this.thread || !this.origin) return;
    try {
      this.thread = await EncodeThread.start(this.origin);
      this.origin = null; // the worker has its own copy
    } catch (e) {
      // Serving works without it: texts are then tokenized on the main thread, as logged.
      log.warn(`tokenizer worker thread did not start (${(e as Error).message}); tokenizing on the main thread`);
    }
  }

  /** Texts encoded on the worker thread so far (0 without one). */
  get encodedOffThread(): number {
    return this.thread?.encoded ?? 0;
  }

  async stopEncodeThread(): Promise<void> {
    const t = this.thread;
    this.thread = null;
    await t?.close();
  }

  /**
   * encode(), on the worker thread when `offThread` (the engine has sequences whose steps a long
   * tokenization would hold up), the worker runs, and the text is long enough to be worth it; the
   * same ids either way. Should the worker fail, the text is encoded here (logged once).
   */
  async encodeAsync(text: string, opts: { addBos?: boolean }, offThread: boolean): Promise<number[]> {
    if (!offThread || !this.thread || text.length < OFF_THREAD_MIN_CHARS) return this.encode(text, opts);
    try {
      return await this.thread.encode(text, opts.addBos ?? this.addBosDefault);
    } catch (e) {
      if (this.thread) log.warn(`${(e as Error).message}; tokenizing on the main thread from now on`);
      this.thread = null;
      return this.encode(text, opts);
    }
  }

  /**
   * A lower bound on encode(text).length known from the character count alone, without
   * tokenizing (0 when the tokenizer gives no such bound).
   */
  minTokens(text: string): number {
    return this.maxCharsPerToken === null ? 0 : Math.ceil(text.length / this.maxCharsPerToken);
  }

  /** Text → ids. Special-token text in the input (e.g. "<s>") maps to its id. */
  encode(text: string, opts: { addBos?: boolean } = {}): number[] {
    const ids = this.hf.encode(text, { add_special_tokens: false }).ids;
    const addBos = opts.addBos ?? this.addBosDefault;
    if (addBos && this.bosTokenId !== null && ids[0] !== this.bosTokenId) return [this.bosTokenId, ...ids];
    return ids;
  }

  /**
   * decode(ids.slice(from, to)), remembered for windows of one or two ids. The incremental
   * decoder asks for such windows twice per generated token (the previous token alone, then with
   * the new one), and the tokenizer library's decode is several µs of allocation-heavy work each
   * time: at batch 8 that was most of the text work of a decode step. A window's text depends on
   * its ids only, so a remembered one is the same string.
   */
  decodeWindow(ids: readonly number[], from: number, to: number): string {
    const n = to - from;
    const v = this.vocabSize;
    // Keys stay small integers (V8 hashes those without allocating): a pair is (a + 1)·V + b,
    // remembered only while that fits (vocabularies up to ~32k); single ids always.
    if (n === 1 || (n === 2 && (v + 1) * v < SMALL_INT)) {
      const a = ids[from]!;
      const key = n === 1 ? a : (a + 1) * v + ids[from + 1]!;
      let s = this.windows.get(key);
      if (s === undefined) {
        s = this.decode(ids.slice(from, to));
        if (this.windows.size >= WINDOW_MEMO_MAX) this.windows.clear();
        this.windows.set(key, s);
      }
      return s;
    }
    return this.decode(ids.slice(from, to));
  }

  /**
   * The text token `id` adds at the end of a decoded window whose last id is `prev`, when that is
   * knowable from the two ids alone; null otherwise. It answers for two decoders. Byte-level
   * (GPT-2 style; below, in the code). With SentencePiece's decoder chain (Replace ▁ → space,
   * ByteFallback, Fuse, Strip one leading space) the
   * text of ids is strip1(concat(piece(id) with ▁ as space)), byte pieces (<0xNN>) first joined
   * into UTF-8 with their neighbours. So when `prev` adds text of its own before the strip (a
   * byte piece, or a non-empty piece) and `id` is neither special nor a byte piece, `id` adds
   * exactly its piece with ▁ as space: the strip touched only the window's first character, and
   * no byte run crosses `id`. The incremental decoder uses this instead of decoding the pair (a
   * memo miss costs ~13 µs in the library, and most generated pairs are new). Right after a
   * model forward the caches are cold, so the answer comes from one byte per id (`pieceKind`)
   * and one string. test/unit/tokenizer_stream.test.ts checks it against the library's decode.
   */
  appendedText(prev: number, id: number): string | null {
    if (!this.pieceKind) return null;
    // Byte-level: the text of ids is the UTF-8 of their pieces' bytes, nothing stripped. The
    // incremental decoder asks only after a window whose text was complete (it emitted it, so it
    // did not end inside a character), and UTF-8 decodes the same from a character boundary on:
    // a piece whose bytes are whole characters adds exactly their text, whatever came before.
    if (this.byteLevel) return this.kindOf(id) < KIND_TEXT ? null : this.pieceText[id]!;
    if (this.kindOf(prev) < KIND_BYTE || this.kindOf(id) < KIND_TEXT) return null;
    return this.pieceText[id]!;
  }

  /** What a vocabulary id is to appendedText (learnt on first use, from the library's vocabulary). */
  private kindOf(id: number): number {
    const kinds = this.pieceKind!;
    if (!(id >= 0 && id < kinds.length)) return KIND_NONE;
    const k = kinds[id]!;
    if (k !== KIND_UNSEEN) return k;
    const piece = this.hf.id_to_token(id);
    let kind = KIND_NONE;
    if (this.byteLevel) {
      // Added tokens, and pieces that are not whole characters, go through the library's decode.
      const text = typeof piece === 'string' && !this.addedIds.has(id) ? byteLevelText(piece) : null;
      if (text !== null && text.length > 0) {
        kind = KIND_TEXT;
        this.pieceText[id] = text;
      }
    } else if (typeof piece === 'string' && !this.isSpecial(id)) {
      if (BYTE_PIECE.test(piece)) kind = KIND_BYTE;
      else if (piece.length > 0) {
        kind = KIND_TEXT;
        this.pieceText[id] = piece.replaceAll('▁', ' ');
      }
    }
    kinds[id] = kind;
    return kind;
  }

  decode(ids: number[], opts: { skipSpecialTokens?: boolean } = {}): string {
    // The tokenizer library throws on an empty list; nothing decodes to nothing (an empty
    // /detokenize, or the incremental decoder's first window after a special-token-only prompt).
    if (ids.length === 0) return '';
    return this.hf.decode(ids, { skip_special_tokens: opts.skipSpecialTokens ?? true });
  }

  /**
   * One token as text on its own, for logprobs: its vocabulary piece with SentencePiece's word
   * marker as a space and a byte-fallback piece (<0x41>) as that byte when it is ASCII; a
   * byte-level piece as the text of its bytes.
   */
  tokenText(id: number): string {
    const piece = this.hf.id_to_token(id);
    if (piece === undefined || piece === null) return '';
    // Byte-level pieces map each character back to a byte; a piece ending inside a multi-byte
    // character shows U+FFFD for the partial bytes.
    if (this.byteLevel) return this.hf.decode([id], { skip_special_tokens: false });
    const byte = /^<0x([0-9A-Fa-f]{2})>$/.exec(piece);
    if (byte) {
      const b = parseInt(byte[1]!, 16);
      return b < 0x80 ? String.fromCharCode(b) : piece;
    }
    return piece.replace(/\u2581/g, ' ');
  }

  isSpecial(id: number): boolean {
    return this.specialIds.has(id);
  }

  /** Renders the chat template (with the generation prompt) into the prompt text. */
  applyChatTemplate(messages: ChatMessage[], opts: { addGenerationPrompt?: boolean } = {}): string {
    if (this.template === null) {
      throw new ChatTemplateError(
        'messages: this model has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja in its directory); start the engine with --chat-template <file or template>, or send the prompt to /v1/completions',
      );
    }
    try {
      return this.template.render({
        messages,
        bos_token: this.bosToken ?? '',
        eos_token: this.eosToken ?? '',
        add_generation_prompt: opts.addGenerationPrompt ?? true,
      });
    } catch (e) {
      throw new ChatTemplateError(`messages: chat template failed: ${(e as Error).message}`);
    }
  }

  /** Chat messages → prompt ids. The template supplies BOS itself, so none is added here. */
  encodeChat(messages: ChatMessage[]): number[] {
    return this.encodeChatText(this.applyChatTemplate(messages));
  }

  /**
   * A rendered chat prompt (applyChatTemplate) → ids, adding BOS only if the template did not
   * (and `addSpecial` or, unset, the tokenizer's default asks for it).
   */
  encodeChatText(text: string, addSpecial?: boolean): number[] {
    return this.encode(text, this.chatBos(text, addSpecial));
  }

  /** encodeChatText through encodeAsync. */
  encodeChatTextAsync(text: string, addSpecial: boolean | undefined, offThread: boolean): Promise<number[]> {
    return this.encodeAsync(text, this.chatBos(text, addSpecial), offThread);
  }

  private chatBos(text: string, addSpecial?: boolean): { addBos: boolean } {
    const startsWithBos = this.bosToken !== null && this.bosToken !== '' && text.startsWith(this.bosToken);
    return { addBos: !startsWithBos && (addSpecial ?? this.addBosDefault) };
  }

  /** A streaming detokenizer for one sequence; `context` = prompt ids give correct leading spaces. */
  streamDecoder(context: number[] = []): IncrementalDecoder {
    return new IncrementalDecoder(this, context);
  }
}

/**
 * Incremental detokenization (the approach vLLM uses): decode a short window of previous tokens
 * plus the new ones and emit only the text beyond the window's own decoding. Text ending in
 * U+FFFD (an incomplete UTF-8 sequence from byte-fallback tokens) is held back until complete.
 */
export class IncrementalDecoder {
  private ids: number[];
  private prefixOffset: number;
  private readOffset: number;
  /** All text emitted so far. */
  text = '';

  constructor(
    private readonly tok: Tokenizer,
    context: number[] = [],
  ) {
    const ctx = context.filter((id) => !tok.isSpecial(id)).slice(-6);
    this.ids = ctx;
    this.prefixOffset = 0;
    this.readOffset = ctx.length;
  }

  /** Adds generated ids; returns the new text they complete (possibly ''). */
  push(...newIds: number[]): string {
    let out = '';
    for (const id of newIds) {
      if (this.tok.isSpecial(id)) continue;
      this.ids.push(id);
      // The usual case: one new token after a complete window (Tokenizer.appendedText).
      const last = this.ids.length - 1;
      if (this.readOffset === last && this.readOffset > this.prefixOffset) {
        const add = this.tok.appendedText(this.ids[last - 1]!, id);
        if (add !== null) {
          if (add.length > 0 && !add.endsWith('\uFFFD')) {
            out += add;
            this.prefixOffset = this.readOffset;
            this.readOffset = this.ids.length;
          }
          continue;
        }
      }
      const prefix = this.tok.decodeWindow(this.ids, this.prefixOffset, this.readOffset);
      const full = this.tok.decodeWindow(this.ids, this.prefixOffset, this.ids.length);
      if (full.length > prefix.length && !full.endsWith('\uFFFD')) {
        out += full.slice(prefix.length);
        this.prefixOffset = this.readOffset;
        this.readOffset = this.ids.length;
      }
    }
    this.text += out;
    return out;
  }

  /** Whatever is still held back (an incomplete character at the very end), emitted as is. */
  flush(): string {
    const prefix = this.tok.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const full = this.tok.decode(this.ids.slice(this.prefixOffset));
    const rest = full.length > prefix.length ? full.slice(prefix.length) : '';
    this.prefixOffset = this.readOffset = this.ids.length;
    this.text += rest;
    return rest;
  }
}

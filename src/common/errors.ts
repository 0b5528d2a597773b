// One error type for the whole stack, rendered as the OpenAI error shape
// {"error": {"message", "type", "param", "code"}} (`param`: the request field at fault, else null). Every code a process answers with is an entry of
// ERRORS below (code, HTTP status, OpenAI error type), so a code always comes with the same
// status and type whichever process sends it. Anything thrown that is not a KvcError is a bug
// on our side and becomes a 500 `internal` with the thrown message.

export type ErrorType =
  | 'invalid_request_error'
  | 'not_found_error'
  | 'conflict_error'
  | 'payload_too_large'
  | 'upstream_error'
  | 'unavailable_error'
  | 'timeout_error'
  | 'internal_error';

/** One catalog entry: the code a client sees, with its HTTP status and error type. */
export interface ErrorEntry<C extends string = string> {
  readonly code: C;
  readonly status: number;
  readonly type: ErrorType;
}

type CatalogInput = Record<string, { status: number; type: ErrorType }>;
// Each entry keeps its literal status so the shorthands below can accept only codes of their status.
type Catalog<T extends CatalogInput> = { readonly [K in keyof T & string]: ErrorEntry<K> & { readonly status: T[K]['status'] } };

/** Builds the catalog so that each entry's `code` is its key: one spelling per code. */
function catalog<T extends CatalogInput>(entries: T): Catalog<T> {
  const out: Record<string, ErrorEntry> = {};
  for (const [code, e] of Object.entries(entries)) out[code] = Object.freeze({ code, status: e.status, type: e.type });
  return Object.freeze(out) as Catalog<T>;
}

const bad = { status: 400, type: 'invalid_request_error' } as const;
const missing = { status: 404, type: 'not_found_error' } as const;
const clash = { status: 409, type: 'conflict_error' } as const;

/**
 * Every error code of the stack. Throw one with `kvcError(ERRORS.<code>, message)`; the message
 * names the field (or thing) and what was expected. A new code is added here, never written
 * as a loose string at the throw site.
 */
export const ERRORS = catalog({
  // 400: the request is wrong; the message names the field and what was expected.
  /** A field has the wrong type, range or form (the default 400). */
  invalid_field: bad,
  /** The body is not JSON, is empty, or is not a JSON object. */
  invalid_json: bad,
  /** The body is not sent as application/json. */
  invalid_content_type: bad,
  /** A move whose destination equals its source. */
  same_position: bad,
  /** The prompt (plus max_tokens) exceeds the model's context length. */
  context_length_exceeded: bad,
  /** The prompt (plus max_tokens) needs more KV than the engine's cache holds. */
  kv_capacity_exceeded: bad,
  /** The prompt drove the model's activations out of range: its logits are NaN or infinite, so no token is meaningful. */
  numeric_overflow: bad,
  /** A request field this server knows and does not implement (tools, response_format json, …). */
  unsupported_field: bad,
  /** A request field this server does not know (a typo gets a did-you-mean). */
  unknown_field: bad,
  /** The JSON body nests arrays/objects deeper than the server's depth limit. */
  json_too_deep: bad,
  /** The request URL cannot be decoded (or a path parameter is too long). */
  invalid_url: bad,
  /** The HTTP request itself is malformed (the parser refused it). */
  bad_http: bad,

  // 401: credentials missing or wrong (docs/security.md).
  /** No or a wrong client API key (`Authorization: Bearer <key>`). */
  invalid_api_key: { status: 401, type: 'invalid_request_error' },
  /** No or a wrong deployment secret on an internal channel. */
  invalid_deployment_secret: { status: 401, type: 'invalid_request_error' },
  /** An authenticated internal message whose timestamp is outside the replay window (--replay-window). */
  stale_timestamp: { status: 401, type: 'invalid_request_error' },
  /** An authenticated internal message whose nonce was already received within the replay window. */
  replayed_nonce: { status: 401, type: 'invalid_request_error' },

  // 404: the thing named does not exist.
  /** Generic 404. */
  not_found: missing,
  /** No route for this method and path. */
  route_not_found: missing,
  /** The `model` field names a model this engine does not serve. */
  model_not_found: missing,
  /** No registered cache instance has this id (or a worker at this address). */
  unknown_instance: missing,
  /** The storage location is not configured on the instance. */
  unknown_location: missing,
  /** No controller event has this id. */
  unknown_event: missing,

  // 409: the request is valid but the current state does not allow it.
  /** Generic 409. */
  conflict: clash,
  /** The destination store has no room for the chunks. */
  store_full: clash,
  /** A chunk left its location while the operation ran. */
  chunk_gone: clash,
  /** Source and destination instances have different worker layouts. */
  worker_mismatch: clash,
  /** Source and destination serve different models or chunk sizes. */
  incompatible_instances: clash,
  /** The destination instance has no distributed_url to receive chunks on. */
  no_distributed_url: clash,

  // 408, 413, 429, 431: limits on what one client may send (docs/limits.md).
  /** The whole request was not received within the server's request timeout. */
  request_timeout: { status: 408, type: 'timeout_error' },
  /** The request body exceeds the server's body limit. */
  body_too_large: { status: 413, type: 'payload_too_large' },
  /** Too many open connections from one client address. */
  too_many_connections: { status: 429, type: 'invalid_request_error' },
  /** The receiver already remembers its maximum of nonces within the replay window; retry later. */
  nonce_memory_full: { status: 429, type: 'invalid_request_error' },
  /** The request headers (or URL) exceed the size limit. */
  headers_too_large: { status: 431, type: 'invalid_request_error' },

  // 500: a bug on our side, never caused by what a client sent.
  internal: { status: 500, type: 'internal_error' },

  // 5xx caused by another process.
  /** An upstream process failed or answered something unusable. */
  upstream_failed: { status: 502, type: 'upstream_error' },
  /** The process (or every upstream) cannot take the request now; retry later. */
  unavailable: { status: 503, type: 'unavailable_error' },
  /** An upstream process did not answer within its deadline. */
  timeout: { status: 504, type: 'timeout_error' },
});

export type ErrorCode = keyof typeof ERRORS;

/** The catalog codes whose HTTP status is `S`. */
export type CodeWithStatus<S extends number> = { [K in ErrorCode]: (typeof ERRORS)[K]['status'] extends S ? K : never }[ErrorCode];

export class KvcError extends Error {
  constructor(
    readonly status: number,
    readonly type: ErrorType,
    message: string,
    readonly code: string | null = null,
  ) {
    super(message);
    this.name = 'KvcError';
  }

  /** True when this error is the catalog entry `entry`. */
  is(entry: ErrorEntry): boolean {
    return this.code === entry.code && this.status === entry.status;
  }

  /** The request field at fault (OpenAI's `param`): the one the message names first, else null. */
  get param(): string | null {
    return this.status >= 400 && this.status < 500 ? paramOf(this.message) : null;
  }

  toJSON(): { error: { message: string; type: ErrorType; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

// Every 400 names its field first: "field `x.y`: …" (request schemas) or "x.y: …" (controller
// positions, config keys); that name is the error's `param`.
const FIELD_FIRST = /^field `([^`]+)`|^([A-Za-z_][\w.]*(?:\[\d+\])*(?:\.[A-Za-z_]\w*)*): /;

/** The field a message names first, or null. */
export function paramOf(message: string): string | null {
  const m = FIELD_FIRST.exec(message);
  return m ? (m[1] ?? m[2] ?? null) : null;
}

/** The error of catalog entry `entry` with `message` (status, type and code come from the entry). */
export function kvcError(entry: ErrorEntry, message: string): KvcError {
  return new KvcError(entry.status, entry.type, message, entry.code);
}

// Shorthands by status, for the generic entry of each. The optional code is checked against the
// catalog at compile time (only codes of that status), so a shorthand can never pair a code with
// another status or type; throw sites name a specific code with kvcError(ERRORS.<code>, message).

/** 400: the message must name the field and say what was expected. */
export const badRequest = (message: string, code: CodeWithStatus<400> = 'invalid_field') => kvcError(ERRORS[code], message);
export const notFound = (message: string, code: CodeWithStatus<404> = 'not_found') => kvcError(ERRORS[code], message);
export const conflict = (message: string, code: CodeWithStatus<409> = 'conflict') => kvcError(ERRORS[code], message);
export const tooLarge = (message: string) => kvcError(ERRORS.body_too_large, message);
export const upstreamFailed = (message: string) => kvcError(ERRORS.upstream_failed, message);
export const unavailable = (message: string) => kvcError(ERRORS.unavailable, message);
export const timedOut = (message: string) => kvcError(ERRORS.timeout, message);

/** The catalog entry for `code` (e.g. a code read from another process's error body), if it is one. */
export function catalogEntry(code: unknown): ErrorEntry | undefined {
  return typeof code === 'string' && Object.hasOwn(ERRORS, code) ? ERRORS[code as ErrorCode] : undefined;
}

/** Converts anything thrown into a KvcError; unknown errors keep their message but become 500. */
export function asKvcError(err: unknown): KvcError {
  if (err instanceof KvcError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return kvcError(ERRORS.internal, message);
}

/** Short description of a JS value for "expected X, found Y" messages. */
export function describeValue(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return `an array of ${v.length}`;
  if (typeof v === 'string') return v.length > 40 ? `a string "${v.slice(0, 40)}…"` : `the string "${v}"`;
  if (typeof v === 'object') return 'an object';
  if (typeof v === 'undefined') return 'nothing';
  return `${typeof v} ${String(v)}`;
}

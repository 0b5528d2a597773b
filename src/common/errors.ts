// One error type for the whole stack, rendered as the OpenAI error shape
// {"error": {"message", "type", "code"}} (DESIGN §9). Anything thrown that is
// not a KvcError is a bug on our side and becomes a 500 with a generic message.

export type ErrorType =
  | 'invalid_request_error'
  | 'not_found_error'
  | 'conflict_error'
  | 'payload_too_large'
  | 'upstream_error'
  | 'unavailable_error'
  | 'timeout_error'
  | 'internal_error';

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

  toJSON(): { error: { message: string; type: ErrorType; code: string | null } } {
    return { error: { message: this.message, type: this.type, code: this.code } };
  }
}

/** 400: the message must name the field and say what was expected. */
export const badRequest = (message: string, code = 'invalid_field') =>
  new KvcError(400, 'invalid_request_error', message, code);
export const notFound = (message: string, code = 'not_found') => new KvcError(404, 'not_found_error', message, code);
export const conflict = (message: string, code = 'conflict') => new KvcError(409, 'conflict_error', message, code);
export const tooLarge = (message: string) => new KvcError(413, 'payload_too_large', message, 'body_too_large');
export const upstreamFailed = (message: string) => new KvcError(502, 'upstream_error', message, 'upstream_failed');
export const unavailable = (message: string) => new KvcError(503, 'unavailable_error', message, 'unavailable');
export const timedOut = (message: string) => new KvcError(504, 'timeout_error', message, 'timeout');

/** Converts anything thrown into a KvcError; unknown errors keep their message but become 500. */
export function asKvcError(err: unknown): KvcError {
  if (err instanceof KvcError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new KvcError(500, 'internal_error', message, 'internal');
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

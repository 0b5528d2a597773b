// Upstream HTTP calls of the proxy and how their failures are classified.
//
// Three outcomes matter to the request flow:
//   - the backend answered 2xx                         → use the answer
//   - the backend answered 4xx (not 408/429)          → the client's request is at fault:
//     pass status and body through unchanged, trying another backend would fail the same way
//   - refused / reset / timed out / 5xx / 408 / 429   → the backend failed: mark it down and,
//     for a prefiller, try the next one
// A request cancelled because the client went away is neither: it just stops.
import { EventEmitter } from 'node:events';
import type { Dispatcher } from 'undici';
import type { Backend } from './backend.js';

/** The client's own request was rejected upstream; relayed as is. */
export class PassThrough extends Error {
  override name = 'PassThrough';
  constructor(
    readonly status: number,
    readonly body: Buffer,
    readonly contentType: string,
  ) {
    super(`upstream answered ${status}`);
  }
}

/** The backend failed (network, timeout, 5xx); `timeout` tells 504 from 502. */
export class BackendFailure extends Error {
  override name = 'BackendFailure';
  constructor(
    readonly backend: Backend,
    message: string,
    readonly timeout = false,
  ) {
    super(`${backend.name}: ${message}`);
  }
}

/**
 * Cancellation of one client request's upstream calls. undici accepts an EventEmitter with
 * `aborted` and an 'abort' event as a signal; it is much cheaper per call than an
 * AbortController's EventTarget, and a request makes three upstream calls.
 */
export class CancelSignal extends EventEmitter {
  aborted = false;
  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    this.emit('abort');
  }
}

/** The client disconnected; nothing is sent back. */
export class Cancelled extends Error {
  override name = 'Cancelled';
}

export interface CallOptions {
  method: 'GET' | 'POST';
  path: string;
  body?: unknown;
  signal?: CancelSignal;
  /** Time allowed until the response headers arrive, ms. */
  headersTimeoutMs: number;
  /** Longest silence between body bytes, ms. */
  bodyTimeoutMs: number;
}

// Shared, never modified: undici only reads request headers.
const NO_HEADERS: Record<string, string> = {};
const JSON_HEADERS: Record<string, string> = { 'content-type': 'application/json' };

const TIMEOUT_CODES = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'UND_ERR_CONNECT_TIMEOUT']);

/** Maps an error thrown by undici (or our abort) to Cancelled or BackendFailure. */
export function classify(err: unknown, backend: Backend, signal?: CancelSignal): Error {
  if (err instanceof PassThrough || err instanceof BackendFailure || err instanceof Cancelled) return err;
  if (signal?.aborted) return new Cancelled('client disconnected');
  const e = err as { code?: string; message?: string; cause?: { code?: string; message?: string } };
  const code = e.code ?? e.cause?.code ?? '';
  const timeout = TIMEOUT_CODES.has(code);
  const msg = e.cause?.message && e.cause.message !== e.message ? `${e.message} (${e.cause.message})` : (e.message ?? String(err));
  return new BackendFailure(backend, `${code ? code + ': ' : ''}${msg}`, timeout);
}

/**
 * Sends one request and returns the response with the body still unread (the caller streams
 * or reads it). Non-2xx answers are turned into PassThrough / BackendFailure here, with their
 * body consumed so the connection goes back to the pool.
 */
export async function call(backend: Backend, o: CallOptions): Promise<Dispatcher.ResponseData> {
  let res: Dispatcher.ResponseData;
  try {
    res = await backend.pool.request({
      method: o.method,
      path: o.path,
      headers: o.body === undefined ? NO_HEADERS : JSON_HEADERS,
      body: o.body === undefined ? undefined : JSON.stringify(o.body),
      signal: o.signal,
      headersTimeout: o.headersTimeoutMs,
      bodyTimeout: o.bodyTimeoutMs,
    });
  } catch (err) {
    throw classify(err, backend, o.signal);
  }
  if (res.statusCode >= 200 && res.statusCode < 300) return res;
  let body: Buffer;
  try {
    body = Buffer.from(await res.body.arrayBuffer());
  } catch (err) {
    throw classify(err, backend, o.signal);
  }
  const ct = String(res.headers['content-type'] ?? 'application/json');
  if (res.statusCode >= 400 && res.statusCode < 500 && res.statusCode !== 408 && res.statusCode !== 429) {
    throw new PassThrough(res.statusCode, body, ct);
  }
  throw new BackendFailure(backend, `HTTP ${res.statusCode}: ${body.toString('utf8', 0, Math.min(body.length, 300))}`);
}

/** call() + read the JSON body. */
export async function callJson(backend: Backend, o: CallOptions): Promise<unknown> {
  const res = await call(backend, o);
  try {
    return await res.body.json();
  } catch (err) {
    const c = classify(err, backend, o.signal);
    if (c instanceof BackendFailure && !(err as { code?: string }).code) {
      throw new BackendFailure(backend, `answered a body that is not JSON (${(err as Error).message})`);
    }
    throw c;
  }
}

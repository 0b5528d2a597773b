// Upstream HTTP calls of the proxy and how their failures are classified.
//
// Outcomes that matter to the request flow:
//   - the backend answered 2xx                         → use the answer
//   - the backend answered 4xx (not 408/429)          → the client's request is at fault:
//     pass status and body through unchanged, trying another backend would fail the same way
//   - the backend answered 5xx / 408 / 429            → this call failed, but the backend is alive
//     (it answered): try the next backend where that is possible, and have its health probed;
//     only the probe decides whether it is down (a request can make a healthy engine fail)
//   - refused / reset / timed out / aborted as hung   → the backend failed: mark it down and try
//     the next one; `beforeResponse` says nothing came back yet (safe to send elsewhere)
// A request cancelled because the client went away is neither: it just stops.
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import type { Dispatcher } from 'undici';
import type { Backend, InflightCall } from './backend.js';

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

/**
 * The backend failed (network, timeout, 5xx); `timeout` tells 504 from 502. `answered` is the
 * HTTP status when the backend did answer (it is alive: not a reason to mark it down), null for
 * a connection-level failure. `beforeResponse`: no response byte arrived (the call can be sent
 * to another backend without the client noticing).
 */
export class BackendFailure extends Error {
  override name = 'BackendFailure';
  readonly answered: number | null;
  readonly beforeResponse: boolean;
  constructor(
    readonly backend: Backend,
    message: string,
    readonly timeout = false,
    o: { answered?: number | null; beforeResponse?: boolean } = {},
  ) {
    super(`${backend.name}: ${message}`);
    this.answered = o.answered ?? null;
    this.beforeResponse = o.beforeResponse ?? this.answered === null;
  }

  /** True when this failure says the backend itself is unreachable, hung or dead. */
  get backendDown(): boolean {
    return this.answered === null;
  }
}

/** A dispatch() call that a client disconnect cancels (see CancelSignal.watch). */
export interface Cancellable {
  cancel(): void;
}

/**
 * Cancellation of one client request's upstream calls. undici's request() accepts an
 * EventEmitter with `aborted` and an 'abort' event as a signal, much cheaper than an
 * AbortController's EventTarget. The dispatch() handlers (three calls per request) do not
 * subscribe to the event: they put themselves on a plain list, which abort() walks first. A
 * request's calls run one after another, so the list holds one entry: a push and a pop, where an
 * EventEmitter listener costs an on() and an off() per call.
 */
export class CancelSignal extends EventEmitter {
  aborted = false;
  private readonly watching: Cancellable[] = [];

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    for (const c of this.watching.splice(0)) c.cancel();
    this.emit('abort');
  }

  /** Cancels `c` when the request is aborted (at once if it already is). */
  watch(c: Cancellable): void {
    if (this.aborted) c.cancel();
    else this.watching.push(c);
  }

  unwatch(c: Cancellable): void {
    const w = this.watching;
    const i = w.lastIndexOf(c);
    if (i < 0) return;
    const last = w.pop()!;
    if (i < w.length) w[i] = last;
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
  /**
   * Another backend this call waits on (a prefill waits on its decoder's xfer receiver): the call
   * is aborted too when that one is found hung or dead, with its failure.
   */
  dependsOn?: Backend;
  /** Headers added to the backend's own (e.g. an internal call's signature). */
  headers?: Record<string, string>;
}


const TIMEOUT_CODES = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'UND_ERR_CONNECT_TIMEOUT']);

/** Maps an error thrown by undici (or our abort) to Cancelled or BackendFailure. */
export function classify(err: unknown, backend: Backend, signal?: CancelSignal, beforeResponse = true): Error {
  if (err instanceof PassThrough || err instanceof BackendFailure || err instanceof Cancelled) return err;
  if (signal?.aborted) return new Cancelled('client disconnected');
  const e = err as { code?: string; message?: string; cause?: { code?: string; message?: string } };
  const code = e.code ?? e.cause?.code ?? '';
  const timeout = TIMEOUT_CODES.has(code);
  const msg = e.cause?.message && e.cause.message !== e.message ? `${e.message} (${e.cause.message})` : (e.message ?? String(err));
  return new BackendFailure(backend, `${code ? code + ': ' : ''}${msg}`, timeout, { beforeResponse });
}

/**
 * Registers a call in flight on `backend` (and on the backend it waits on): `c.kill` aborts it
 * when either is found hung. The call object itself is registered, not a closure, in a list
 * without hashing: three calls per client request make this part of the per-request path.
 */
function track(backend: Backend, c: InflightCall, waitsOn: Backend | undefined): void {
  backend.inflight.add(c, 0);
  waitsOn?.inflight.add(c, 1);
}

function untrack(backend: Backend, c: InflightCall, waitsOn: Backend | undefined): void {
  backend.inflight.delete(c, 0);
  waitsOn?.inflight.delete(c, 1);
}

/**
 * Sends one request and returns the response with the body still unread (the caller streams
 * or reads it). Non-2xx answers are turned into PassThrough / BackendFailure here, with their
 * body consumed so the connection goes back to the pool.
 */
export async function call(backend: Backend, o: CallOptions, pool = backend.pool): Promise<Dispatcher.ResponseData> {
  // Our own signal: aborted by the client's, or by the health loop finding the backend hung.
  const local = new CancelSignal();
  let killed = null as Error | null;
  const onClient = () => local.abort();
  o.signal?.once('abort', onClient);
  if (o.signal?.aborted) local.abort();
  const inflight: InflightCall = {
    kill: (err) => {
      killed = err;
      local.abort();
    },
    at: [-1, -1],
  };
  track(backend, inflight, o.dependsOn);
  const release = () => {
    untrack(backend, inflight, o.dependsOn);
    o.signal?.off('abort', onClient);
  };
  let res: Dispatcher.ResponseData;
  try {
    res = await pool.request({ ...dispatchOptions(o, backend), signal: local });
  } catch (err) {
    release();
    throw killed ?? classify(err, backend, o.signal);
  }
  backend.lastProgress = performance.now();
  if (res.statusCode >= 200 && res.statusCode < 300) {
    // Tracked until the caller has read the body (a hung backend can stall it too).
    res.body.once('close', release);
    return res;
  }
  let body: Buffer;
  try {
    body = Buffer.from(await res.body.arrayBuffer());
  } catch (err) {
    throw killed ?? classify(err, backend, o.signal, false);
  } finally {
    release();
  }
  throw answerFailure(backend, res.statusCode, body, String(res.headers['content-type'] ?? 'application/json'));
}

/**
 * What a non-2xx answer means: the engine's own 4xx (a bad field, an unknown model) is relayed to
 * the client unchanged; anything else (5xx, 408, 429) is this backend failing.
 */
function answerFailure(backend: Backend, status: number, body: Buffer, ct: string): Error {
  if (status >= 400 && status < 500 && status !== 408 && status !== 429) return new PassThrough(status, body, ct);
  return new BackendFailure(backend, `HTTP ${status}: ${body.toString('utf8', 0, Math.min(body.length, 300))}`, false, { answered: status, beforeResponse: false });
}

const CONTENT_TYPE = Buffer.from('content-type');

/** True when a raw header name (Buffer or string) is content-type, in any letter case, without decoding it. */
function isContentType(name: Buffer | string): boolean {
  if (typeof name === 'string') return name.length === 12 && name.toLowerCase() === 'content-type';
  if (name.length !== 12) return false;
  for (let i = 0; i < 12; i++) {
    const c = name[i]!;
    // ASCII letters only differ from their lower case by 0x20; '-' (0x2d) has no other case.
    if ((c >= 0x41 && c <= 0x5a ? c | 0x20 : c) !== CONTENT_TYPE[i]) return false;
  }
  return true;
}

/** The content-type of raw undici headers (alternating names and values), or null. */
function findContentType(raw: Buffer[] | string[] | null): string | null {
  if (raw) {
    for (let i = 0; i + 1 < raw.length; i += 2) {
      if (isContentType(raw[i]!)) return String(raw[i + 1]);
    }
  }
  return null;
}

/** The content-type of raw undici headers; JSON when there is none. */
function contentType(raw: Buffer[] | string[] | null): string {
  return findContentType(raw) ?? 'application/json';
}

/**
 * What the dispatch() handlers below share: the status and headers of the answer, its buffered
 * body (a JSON answer, or a failed stream's error body), and the abort that a client disconnect
 * (the request's CancelSignal) triggers on the upstream call.
 */
abstract class CallHandler implements Dispatcher.DispatchHandler, InflightCall, Cancellable {
  protected status = 0;
  protected rawHeaders: Buffer[] | string[] | null = null;
  protected chunks: Buffer[] = [];
  private abortCall: ((err?: Error) => void) | null = null;
  private killedBy: Error | null = null;
  readonly at: [number, number] = [-1, -1];

  constructor(
    protected readonly backend: Backend,
    private readonly signal: CancelSignal | undefined,
    protected readonly reject: (e: Error) => void,
    private readonly dependsOn?: Backend,
  ) {
    signal?.watch(this);
    track(backend, this, dependsOn);
  }

  /** The client went away (the request's CancelSignal). */
  cancel(): void {
    this.abortCall?.(new Cancelled('client disconnected'));
  }

  /** The backend (or one this call waits on) was found hung or dead. */
  kill(err: Error): void {
    this.killedBy = err;
    this.abortCall?.(err);
  }

  protected done(): void {
    this.signal?.unwatch(this);
    untrack(this.backend, this, this.dependsOn);
  }

  protected body(): Buffer {
    return this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks);
  }

  protected failure(): Error {
    return answerFailure(this.backend, this.status, this.body(), contentType(this.rawHeaders));
  }

  onConnect(abort: (err?: Error) => void): void {
    this.abortCall = abort;
    if (this.signal?.aborted) abort(new Cancelled('client disconnected'));
    else if (this.killedBy) abort(this.killedBy);
  }

  onError(err: Error): void {
    this.done();
    this.reject(this.killedBy ?? classify(err, this.backend, this.signal, this.status === 0));
  }
}

/**
 * A 2xx answer read whole: its status, content-type and body bytes, as they came.
 */
export interface WholeAnswer {
  status: number;
  contentType: string;
  body: Buffer;
}

/**
 * The handler behind callJson() and callWhole(): collects the body's buffers and settles one
 * promise, with the same outcomes as call() + reading the body. Written against undici's
 * dispatch() rather than request(): no AsyncResource, no body stream and no consume machinery
 * for an answer read whole (tokenize and prefill, two per client request, and the non-streamed
 * decode). `parse` turns a 2xx answer into the value (JSON for callJson).
 */
class WholeHandler<T> extends CallHandler {
  constructor(
    backend: Backend,
    signal: CancelSignal | undefined,
    private readonly parse: (h: WholeHandler<T>) => T,
    private readonly resolve: (v: T) => void,
    reject: (e: Error) => void,
    dependsOn?: Backend,
  ) {
    super(backend, signal, reject, dependsOn);
  }

  onHeaders(statusCode: number, rawHeaders: Buffer[]): boolean {
    this.backend.lastProgress = performance.now();
    if (statusCode >= 200) {
      this.status = statusCode;
      this.rawHeaders = rawHeaders;
    }
    return true;
  }

  onData(chunk: Buffer): boolean {
    this.backend.lastProgress = performance.now();
    this.chunks.push(chunk);
    return true;
  }

  onComplete(): void {
    this.done();
    if (this.status < 200 || this.status >= 300) {
      this.reject(this.failure());
      return;
    }
    let v: T;
    try {
      v = this.parse(this);
    } catch (err) {
      this.reject(err as Error);
      return;
    }
    this.resolve(v);
  }

  /** The status, content-type and bytes of the answer (after onComplete). */
  whole(): WholeAnswer {
    return { status: this.status, contentType: contentType(this.rawHeaders), body: this.body() };
  }

  /** The answer parsed as JSON, or a BackendFailure saying it is not JSON. */
  json(): unknown {
    try {
      return JSON.parse(this.body().toString('utf8'));
    } catch (err) {
      throw new BackendFailure(this.backend, `answered a body that is not JSON (${(err as Error).message})`, false, { answered: this.status });
    }
  }
}

const asJson = (h: WholeHandler<unknown>) => h.json();
const asWhole = (h: WholeHandler<WholeAnswer>) => h.whole();

/** undici dispatch options of one upstream call. */
function dispatchOptions(o: CallOptions, b: Backend): Dispatcher.DispatchOptions {
  return {
    method: o.method,
    path: o.path,
    headers: o.headers ? { ...(o.body === undefined ? b.getHeaders : b.postHeaders), ...o.headers } : o.body === undefined ? b.getHeaders : b.postHeaders,
    body: o.body === undefined ? undefined : JSON.stringify(o.body),
    headersTimeout: o.headersTimeoutMs,
    bodyTimeout: o.bodyTimeoutMs,
  };
}

/** One request whose answer is a small JSON body: the parsed body, or the errors of call(). */
export function callJson(backend: Backend, o: CallOptions): Promise<unknown> {
  return new Promise((resolve, reject) => {
    backend.pool.dispatch(dispatchOptions(o, backend), new WholeHandler(backend, o.signal, asJson, resolve, reject, o.dependsOn));
  });
}

/**
 * One request whose 2xx answer is read whole and relayed as is (the non-streamed decode): its
 * status, content-type and bytes, or the errors of call(). A failure after the answer's headers
 * has `beforeResponse` false.
 */
export function callWhole(backend: Backend, o: CallOptions): Promise<WholeAnswer> {
  return new Promise((resolve, reject) => {
    backend.pool.dispatch(dispatchOptions(o, backend), new WholeHandler(backend, o.signal, asWhole, resolve, reject, o.dependsOn));
  });
}

/** Where callStream() delivers a 2xx answer. */
export interface StreamSink {
  /** The 2xx status and content-type arrived (before any data). */
  start(statusCode: number, contentType: string | null): void;
  /** A piece of the body; false pauses the upstream until the call's resume(). */
  data(piece: Buffer): boolean;
}

export interface StreamCall {
  /** Settles when the answer ended (resolves) or failed, before or after start (rejects, classified). */
  done: Promise<void>;
  /** Continues a body paused by a sink that returned false. */
  resume: () => void;
}

/**
 * A request whose 2xx answer is relayed piece by piece to `sink` (the decoder's stream),
 * through undici's dispatch() with no body stream in between. A non-2xx answer is read whole
 * and rejected as PassThrough / BackendFailure, like call().
 */
class StreamHandler extends CallHandler {
  private started = false;
  private resumeBody: (() => void) | null = null;
  readonly resume = () => this.resumeBody?.();

  constructor(
    backend: Backend,
    signal: CancelSignal | undefined,
    private readonly sink: StreamSink,
    private readonly resolve: () => void,
    reject: (e: Error) => void,
  ) {
    super(backend, signal, reject);
  }

  onHeaders(statusCode: number, rawHeaders: Buffer[], resume: () => void): boolean {
    this.backend.lastProgress = performance.now();
    if (statusCode < 200) return true;
    this.status = statusCode;
    this.rawHeaders = rawHeaders;
    this.resumeBody = resume;
    if (statusCode < 300) {
      this.started = true;
      this.sink.start(statusCode, findContentType(rawHeaders));
    }
    return true;
  }

  onData(chunk: Buffer): boolean {
    this.backend.lastProgress = performance.now();
    if (this.started) return this.sink.data(chunk);
    this.chunks.push(chunk);
    return true;
  }

  onComplete(): void {
    this.done();
    if (this.started) this.resolve();
    else this.reject(this.failure());
  }
}

export function callStream(backend: Backend, o: CallOptions, sink: StreamSink): StreamCall {
  let handler!: StreamHandler;
  const done = new Promise<void>((resolve, reject) => {
    handler = new StreamHandler(backend, o.signal, sink, resolve, reject);
    backend.pool.dispatch(dispatchOptions(o, backend), handler);
  });
  return { done, resume: handler.resume };
}

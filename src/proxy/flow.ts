// The disaggregated request flow (DESIGN §8, spec §4.3):
//   1. tokenize on a decoder (round-robin; the first decoder that answers serves the request),
//   2. prefill on a prefiller (round-robin) with max_tokens=1, stream=false and
//      kv_transfer_params.disagg_spec naming that decoder's xfer receiver; the prefiller answers
//      once its KV is on the decoder. A prefiller that fails is marked down and the next one is
//      tried; with none left the decoder prefills by itself,
//   3. forward the client's request to the decoder and relay its answer (SSE or JSON) unchanged,
//      so the client sees one engine's OpenAI response.
// A client that disconnects aborts whatever upstream call is running.
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { badRequest, timedOut, upstreamFailed, unavailable, KvcError } from '../common/errors.js';
import { requireObject } from '../common/http.js';
import { logger } from '../common/log.js';
import type { Backend, RoundRobin } from './backend.js';
import type { ProxyMetrics } from './metrics.js';
import type { TtftStats } from './stats.js';
import type { DecoderEndpoint } from './topology.js';
import { BackendFailure, Cancelled, CancelSignal, PassThrough, call, callJson } from './upstream.js';

const log = logger('proxy');

export type Kind = 'completion' | 'chat';
export const PATHS: Record<Kind, string> = { completion: '/v1/completions', chat: '/v1/chat/completions' };

export interface Timeouts {
  tokenizeMs: number;
  prefillMs: number;
  /** Until the decoder's response headers (a non-streamed answer comes whole). */
  decodeMs: number;
  /** Longest silence between two pieces of the decoder's stream. */
  idleMs: number;
}

export interface FlowDeps {
  prefillers: RoundRobin;
  decoders: RoundRobin;
  decoderEndpoint: (b: Backend) => DecoderEndpoint;
  metrics: ProxyMetrics;
  stats: TtftStats;
  timeouts: Timeouts;
  onBackendDown: (b: Backend, reason: string) => void;
}

const isIds = (p: unknown): p is number[] =>
  Array.isArray(p) && p.length > 0 && p.every((t) => Number.isInteger(t) && (t as number) >= 0);

/** One prompt per request: a string or token ids, also as a one-element list (OpenAI's batch form). */
export function promptForm(p: unknown): { text: string } | { ids: number[] } | null {
  if (typeof p === 'string') return { text: p };
  if (isIds(p)) return { ids: p };
  if (Array.isArray(p) && p.length === 1) {
    if (typeof p[0] === 'string') return { text: p[0] };
    if (isIds(p[0])) return { ids: p[0] };
  }
  return null;
}

/** Checks the few fields the proxy itself relies on; the engine validates the rest. */
export function checkRequest(kind: Kind, body: Record<string, unknown>): void {
  if (kind === 'completion') {
    if (promptForm(body.prompt) === null) throw badRequest('field `prompt`: expected a string or an array of token ids (one prompt per request)');
  } else if (!Array.isArray(body.messages) || body.messages.length === 0) {
    throw badRequest('field `messages`: expected a non-empty array of messages');
  }
  if (body.stream !== undefined && typeof body.stream !== 'boolean') throw badRequest('field `stream`: expected a boolean');
  for (const f of ['max_tokens', 'max_completion_tokens'] as const) {
    const v = body[f];
    if (v !== undefined && v !== null && !(Number.isInteger(v) && (v as number) >= 1)) {
      throw badRequest(`field \`${f}\`: expected an integer >= 1`);
    }
  }
  if (body.n !== undefined && body.n !== 1) throw badRequest('field `n`: only 1 is supported through the proxy');
}

interface PrefillResult {
  prefiller: Backend | null;
  reqId: string;
  ms: number;
  /** kv_transfer_params the prefiller returned, if any, forwarded to the decoder. */
  params: Record<string, unknown> | null;
}

export class Flow {
  constructor(private d: FlowDeps) {}

  async handle(kind: Kind, req: FastifyRequest, reply: FastifyReply): Promise<void> {
    const t0 = performance.now();
    const endpoint = PATHS[kind];
    const m = this.d.metrics;
    m.inFlight.inc();
    const abort = new CancelSignal();
    const onClose = () => {
      if (!reply.raw.writableFinished) {
        abort.abort();
        m.cancelled.inc();
      }
    };
    reply.raw.once('close', onClose);
    let status = 200;
    try {
      const body = requireObject(req.body);
      checkRequest(kind, body);
      // A client may not steer transfers: the proxy owns kv_transfer_params.
      delete body.kv_transfer_params;
      const stream = body.stream === true;
      const decoder = await this.tokenize(kind, body, abort);
      const pre = await this.prefill(kind, body, decoder, abort);
      this.d.stats.record(pre.prefiller ? pre.prefiller.name : 'decoder-only', pre.ms);
      if (pre.prefiller) m.prefill.labels(pre.prefiller.name).observe(pre.ms / 1000);
      status = await this.decode(kind, body, stream, decoder, pre, reply, abort, t0);
    } catch (err) {
      status = this.fail(err, reply);
    } finally {
      reply.raw.off('close', onClose);
      m.inFlight.dec();
      m.requests.labels(endpoint, String(status)).inc();
      m.e2e.labels(endpoint).observe((performance.now() - t0) / 1000);
    }
  }

  /** Renders an error to the client (if it is still there) and returns the status used. */
  private fail(err: unknown, reply: FastifyReply): number {
    if (err instanceof Cancelled) return 499;
    if (err instanceof PassThrough) {
      if (!reply.sent && !reply.raw.headersSent) void reply.code(err.status).header('content-type', err.contentType).send(err.body);
      return err.status;
    }
    let e: KvcError;
    if (err instanceof KvcError) e = err;
    else if (err instanceof BackendFailure) e = err.timeout ? timedOut(err.message) : upstreamFailed(err.message);
    else {
      log.error(`request failed: ${(err as Error).stack ?? String(err)}`);
      e = upstreamFailed(`proxy error: ${(err as Error).message}`);
    }
    if (!reply.sent && !reply.raw.headersSent) void reply.code(e.status).send(e.toJSON());
    return e.status;
  }

  private down(b: Backend, reason: string): void {
    if (b.markDown(reason)) this.d.onBackendDown(b, reason);
  }

  /**
   * Tokenizes on the decoders in round-robin order; the first that answers is the request's
   * decoder. The count lets a prompt longer than the model's context be refused before any
   * prefill work.
   */
  private async tokenize(kind: Kind, body: Record<string, unknown>, signal: CancelSignal): Promise<Backend> {
    const candidates = this.d.decoders.order();
    if (candidates.length === 0) candidates.push(this.d.decoders.pick());
    const tokBody: Record<string, unknown> = { model: body.model };
    const form = kind === 'completion' ? promptForm(body.prompt) : null;
    if (form && 'text' in form) tokBody.prompt = form.text;
    if (kind === 'chat') tokBody.messages = body.messages;
    let last: BackendFailure | null = null;
    for (const dec of candidates) {
      try {
        if (form && 'ids' in form) return dec; // already token ids
        const r = (await callJson(dec, {
          method: 'POST',
          path: '/tokenize',
          body: tokBody,
          signal,
          headersTimeoutMs: this.d.timeouts.tokenizeMs,
          bodyTimeoutMs: this.d.timeouts.tokenizeMs,
        })) as { count?: unknown; max_model_len?: unknown };
        if (typeof r.count === 'number' && typeof r.max_model_len === 'number' && r.count > r.max_model_len) {
          throw badRequest(`field \`${kind === 'chat' ? 'messages' : 'prompt'}\`: ${r.count} tokens exceed the model's context of ${r.max_model_len}`);
        }
        return dec;
      } catch (err) {
        if (!(err instanceof BackendFailure)) throw err;
        last = err;
        this.d.metrics.decoderFailures.labels(dec.name).inc();
        this.down(dec, err.message);
      }
    }
    if (last?.timeout) throw timedOut(`no decoder answered: ${last.message}`);
    throw last ? upstreamFailed(`no decoder answered: ${last.message}`) : unavailable('no decoder configured');
  }

  private async prefill(kind: Kind, body: Record<string, unknown>, decoder: Backend, signal: CancelSignal): Promise<PrefillResult> {
    const ep = this.d.decoderEndpoint(decoder);
    for (const p of this.d.prefillers.order()) {
      const reqId = `kvc-${randomUUID()}`;
      const pbody: Record<string, unknown> = {
        ...body,
        max_tokens: 1,
        stream: false,
        kv_transfer_params: {
          disagg_spec: {
            req_id: reqId,
            receiver_host: ep.host,
            receiver_init_port: ep.initPort,
            receiver_alloc_port: ep.allocPort,
          },
        },
      };
      delete pbody.stream_options;
      delete pbody.max_completion_tokens;
      const t = performance.now();
      try {
        const r = (await callJson(p, {
          method: 'POST',
          path: PATHS[kind],
          body: pbody,
          signal,
          headersTimeoutMs: this.d.timeouts.prefillMs,
          bodyTimeoutMs: this.d.timeouts.prefillMs,
        })) as { kv_transfer_params?: unknown };
        const params =
          r && typeof r.kv_transfer_params === 'object' && r.kv_transfer_params && !Array.isArray(r.kv_transfer_params)
            ? (r.kv_transfer_params as Record<string, unknown>)
            : null;
        return { prefiller: p, reqId, ms: performance.now() - t, params };
      } catch (err) {
        if (!(err instanceof BackendFailure)) throw err;
        this.d.metrics.prefillFailures.labels(p.name).inc();
        log.warn(`prefill ${reqId} failed: ${err.message}; trying the next prefiller`);
        this.down(p, err.message);
      }
    }
    this.d.metrics.decoderOnly.inc();
    log.warn(`no prefiller available; ${decoder.name} prefills the request itself`);
    return { prefiller: null, reqId: `kvc-${randomUUID()}`, ms: 0, params: null };
  }

  private async decode(
    kind: Kind,
    body: Record<string, unknown>,
    stream: boolean,
    decoder: Backend,
    pre: PrefillResult,
    reply: FastifyReply,
    signal: CancelSignal,
    t0: number,
  ): Promise<number> {
    const ep = this.d.decoderEndpoint(decoder);
    const dbody: Record<string, unknown> = { ...body };
    if (pre.prefiller) {
      dbody.kv_transfer_params = {
        ...(pre.params ?? {}),
        disagg_spec: {
          req_id: pre.reqId,
          receiver_host: ep.host,
          receiver_init_port: ep.initPort,
          receiver_alloc_port: ep.allocPort,
        },
      };
    }
    const endpoint = PATHS[kind];
    let res;
    try {
      res = await call(decoder, {
        method: 'POST',
        path: endpoint,
        body: dbody,
        signal,
        headersTimeoutMs: this.d.timeouts.decodeMs,
        bodyTimeoutMs: this.d.timeouts.idleMs,
      });
    } catch (err) {
      if (err instanceof BackendFailure) {
        this.d.metrics.decoderFailures.labels(decoder.name).inc();
        this.down(decoder, err.message);
      }
      throw err;
    }
    const ct = String(res.headers['content-type'] ?? (stream ? 'text/event-stream' : 'application/json'));
    if (!stream) {
      let buf: Buffer;
      try {
        buf = Buffer.from(await res.body.arrayBuffer());
      } catch (err) {
        this.d.metrics.decoderFailures.labels(decoder.name).inc();
        throw err instanceof Error && signal.aborted ? new Cancelled('client disconnected') : new BackendFailure(decoder, `response cut off: ${(err as Error).message}`);
      }
      this.d.metrics.ttft.labels(endpoint).observe((performance.now() - t0) / 1000);
      void reply.code(res.statusCode).header('content-type', ct).send(buf);
      return res.statusCode;
    }
    // Streamed: relay the decoder's SSE bytes as they come, honouring the client's backpressure.
    reply.hijack();
    const raw = reply.raw;
    raw.writeHead(res.statusCode, { 'content-type': ct, 'cache-control': 'no-cache', connection: 'keep-alive' });
    let first = true;
    try {
      // Pieces that arrive in the same event-loop turn leave in one write (cork until
      // setImmediate): one syscall instead of one per SSE event, without delaying any of them.
      let corked = false;
      const flush = () => {
        corked = false;
        raw.uncork();
      };
      for await (const piece of res.body) {
        if (first) {
          first = false;
          this.d.metrics.ttft.labels(endpoint).observe((performance.now() - t0) / 1000);
        }
        if (!corked) {
          corked = true;
          raw.cork();
          setImmediate(flush);
        }
        if (!raw.write(piece)) await new Promise<void>((r) => { raw.once('drain', r); raw.once('close', r); });
        if (raw.destroyed) throw new Cancelled('client disconnected');
      }
      raw.end();
      return res.statusCode;
    } catch (err) {
      if (signal.aborted || err instanceof Cancelled) {
        res.body.destroy();
        return 499;
      }
      // Headers are gone already: end the stream with an OpenAI-shaped error event.
      this.d.metrics.decoderFailures.labels(decoder.name).inc();
      const e = upstreamFailed(`${decoder.name}: stream broken: ${(err as Error).message}`);
      log.warn(e.message);
      if (!raw.destroyed) raw.end(`data: ${JSON.stringify(e.toJSON())}\n\n`);
      return 502;
    }
  }
}

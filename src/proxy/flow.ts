// The disaggregated request flow (docs/proxy.md):
//   1. tokenize a text prompt on a prefiller (on the decoders when none is up) and choose the
//      decoder round-robin; the ids go to the prefiller and the decoder in kv_transfer_params
//      (src/protocol/prompt_ids.ts), so the text is tokenized once and never on a decoder's CPU,
//   2. prefill on a prefiller (round-robin) with max_tokens=1, stream=false and
//      kv_transfer_params.disagg_spec naming that decoder's xfer receiver; the prefiller answers
//      once its KV is on the decoder. A prefiller that fails is marked down and the next one is
//      tried; with none left the decoder prefills by itself,
//   3. forward the client's request to the decoder and relay its answer (SSE or JSON) unchanged,
//      so the client sees one engine's OpenAI response.
// A client that disconnects aborts whatever upstream call is running; a transfer the request will
// not use (client gone, prefill failed, another decoder) is released on its decoder at once
// (POST /xfer/release), not left to the reservation TTL. The request rules live in
// request_rules.ts, the SSE reading in sse.ts.
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { timedOut, upstreamFailed, unavailable, KvcError } from '../common/errors.js';
import { requireObject } from '../common/http.js';
import { deploymentSecret } from '../common/auth.js';
import { logger } from '../common/log.js';
import { signedHeaders } from '../common/replay.js';
import { XFER_RELEASE_PATH, type XferReleaseReply } from '../protocol/xfer_release.js';
import { kvTransferParams, kvTransferParamsSchema, type DisaggSpec } from '../protocol/disagg_spec.js';
import { KEEPER_KEY, KEEPER_SPLIT_KEY } from '../protocol/keeper.js';
import { PROMPT_IDS_KEY } from '../protocol/prompt_ids.js';
import { chooseKeeperSplit, type KeeperChoice, type Room } from './keeper.js';
import { tokenizeLengthSchema } from '../protocol/tokenize.js';
import { RoundRobin, type Backend } from './backend.js';
import type { LoadBook } from './load.js';
import { memoLabels, type ProxyMetrics } from './metrics.js';
import type { PrefixClient } from './prefix_client.js';
import type { Route, Router } from './router.js';
import type { RoutingMetrics } from './routing_metrics.js';
import type { TtftStats } from './stats.js';
import type { DecoderEndpoint } from './topology.js';
import { ClientRelay } from './relay.js';
import { checkContext, checkRequest, PATHS, prefillBody, promptForm, type Kind } from './request_rules.js';
import { FirstContent } from './sse.js';
import { BackendFailure, Cancelled, CancelSignal, PassThrough, callJson, callStream, callWhole } from './upstream.js';

const log = logger('proxy');
/** How long the proxy waits for a decoder to answer a transfer release (it never holds a client up). */
const RELEASE_TIMEOUT_MS = 5000;


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
  /** A backend answered 5xx: alive, but have its health probed (only the probe marks it down). */
  onBackendSuspect?: (b: Backend) => void;
  /** Where each request goes (router.ts), with the load it reads and the controller lookup. */
  router: Router;
  load: LoadBook;
  /** The controller's routing lookup; null without --controller-url (nothing is looked up). */
  prefix: PrefixClient | null;
  routing: RoutingMetrics;
  /** A backend's CPU tier room from its last /health (kvc_room), when known: who keeps a prompt (keeper.ts). */
  roomOf: (b: Backend) => Room | undefined;
}

interface PrefillResult {
  prefiller: Backend | null;
  reqId: string;
  ms: number;
  /** kv_transfer_params the prefiller returned, if any, forwarded to the decoder. */
  params: Record<string, unknown> | null;
  /** Which of the prefiller and the decoder keeps the prompt's chunks, and where a split gives the rest to the other (keeper.ts). */
  keeper: KeeperChoice;
  /** The router chose to prefill on the decoder (not a fallback after prefillers failed). */
  local: boolean;
}

/**
 * No prefiller computed this request's KV: the decoder prefills it. `local` when the router chose
 * that (conditional disaggregation), not a fallback after the prefillers failed.
 */
function noPrefill(local: boolean, reqId = `kvc-${randomUUID()}`): PrefillResult {
  return { prefiller: null, reqId, ms: 0, params: null, local, keeper: { keeper: 'prefiller', split: null } };
}

/** One decode attempt: the request, where it goes, what the prefill left, and whom to answer. */
interface DecodeCall {
  kind: Kind;
  body: Record<string, unknown>;
  stream: boolean;
  decoder: Backend;
  pre: PrefillResult;
  reply: FastifyReply;
  signal: CancelSignal;
  /** When the proxy received the request (performance.now()). */
  t0: number;
  /** Called once the decoder's prefill is over (its first token), for the load book. */
  prefilled: () => void;
  /** kv_transfer_params with the prompt's ids (Tokenized.ids). */
  ids: Record<string, unknown> | null;
}

interface Tokenized {
  decoder: Backend;
  /** The prompt's token ids as the engine will see them (chat: templated); null when the engine did not list them. */
  tokens: number[] | null;
  count: number;
  /** The request's cache_salt (vLLM's field): the controller's index is looked up with it. */
  salt?: string;
  /** kv_transfer_params carrying the ids of a text prompt an engine tokenized for the proxy (none for a prompt of ids). */
  ids: Record<string, unknown> | null;
}

/** The statistics line of requests whose decoder prefilled alone (no prefiller was left). */
export const DECODER_ONLY = 'decoder-only';
/** The statistics line of requests the router sent straight to their decoder (conditional disaggregation). */
export const DECODER_LOCAL = 'decoder-local';

/**
 * Texts of at least this many characters are tokenized on a prefiller (Flow.tokenize): about 250
 * tokens and up, several ms of tokenizer CPU; a shorter text costs its decoder less than the
 * round trip to another engine is worth, and stays where the decoder's turn puts it.
 */
export const LONG_TEXT_CHARS = 1024;

/** The characters of the prompt's text (completions) or of the messages (chat, their JSON). */
function textChars(kind: Kind, body: Record<string, unknown>, form: ReturnType<typeof promptForm>): number {
  if (kind === 'chat') return JSON.stringify(body.messages ?? null).length;
  return form && 'text' in form ? form.text.length : 0;
}

/** The keeper fields of kv_transfer_params (src/protocol/keeper.ts) for a choice. */
function keeperParams(k: KeeperChoice): Record<string, unknown> {
  return k.split === null ? { [KEEPER_KEY]: k.keeper } : { [KEEPER_KEY]: k.keeper, [KEEPER_SPLIT_KEY]: k.split };
}

/** kv_transfer_params carrying the router's prediction for the ledger (src/protocol/ledger.ts), or none without a lookup. */
function predicted(tokens: number | null): Record<string, unknown> | null {
  return tokens === null ? null : { kvc_predicted_cached_tokens: tokens };
}

/** The disagg_spec naming a decoder's xfer receiver for one request. */
function specFor(reqId: string, ep: DecoderEndpoint): DisaggSpec {
  return { req_id: reqId, receiver_host: ep.host, receiver_init_port: ep.initPort, receiver_alloc_port: ep.allocPort };
}

export class Flow {
  private readonly prefillHist: (prefiller: string) => { observe(v: number): void };
  private readonly prefillFailures: (prefiller: string) => { inc(): void };
  private readonly decoderFailures: (decoder: string) => { inc(): void };
  private readonly ttft: (endpoint: string) => { observe(v: number): void };
  private readonly e2e: (endpoint: string) => { observe(v: number): void };
  private readonly requests: (endpoint: string, status: string) => { inc(): void };
  /** The prefillers in a turn of their own for tokenizing (the router's turn for prefills is not moved by it). */
  private readonly tokenizers: RoundRobin;

  constructor(private d: FlowDeps) {
    this.tokenizers = new RoundRobin(d.prefillers.backends);
    const m = d.metrics;
    this.prefillHist = memoLabels(m.prefill);
    this.prefillFailures = memoLabels(m.prefillFailures);
    this.decoderFailures = memoLabels(m.decoderFailures);
    this.ttft = memoLabels(m.ttft);
    this.e2e = memoLabels(m.e2e);
    this.requests = memoLabels(m.requests);
  }

  async handle(kind: Kind, req: FastifyRequest, reply: FastifyReply): Promise<void> {
    const t0 = performance.now();
    const endpoint = PATHS[kind];
    const m = this.d.metrics;
    m.live.requests++;
    const abort = new CancelSignal();
    const onClose = () => {
      // (Not counted twice: a stalled stream's cancellation counts itself and aborts first.)
      if (!reply.raw.writableFinished && !abort.aborted) {
        abort.abort();
        m.cancelled.inc();
      }
    };
    reply.raw.once('close', onClose);
    // The client may be gone before the listener was attached: its 'close' has fired already.
    // The socket says so; the request stream does not (it is destroyed as soon as its body has
    // been read, so testing it would cancel every request that reaches here a tick late).
    if (reply.raw.destroyed || req.raw.socket?.destroyed === true) onClose();
    let status = 200;
    /** Every transfer a prefill attempt named (its req_id, the decoder it went to), and the one a decoder used. */
    const transfers: { reqId: string; decoder: Backend }[] = [];
    let used: string | null = null;
    try {
      const body = requireObject(req.body);
      checkRequest(kind, body);
      const stream = body.stream === true;
      const tok = await this.tokenize(kind, body, abort);
      const routing = this.route(tok);
      const route = routing instanceof Promise ? await routing : routing;
      let decoder = route.decoder;
      const tried = new Set<Backend>();
      let pre: PrefillResult;
      try {
        pre =
          route.where === 'remote'
            ? await this.prefill(kind, body, decoder, route, tok.ids, abort, transfers)
            : noPrefill(route.where !== 'local_no_prefiller');
      } catch (err) {
        // The decoder the KV was going to was found hung or dead during the prefill: another
        // decoder serves the request and prefills it itself.
        const next = err instanceof BackendFailure && err.backend === decoder && this.retryable(err, reply) ? this.d.decoders.order().find((d) => d !== decoder) : undefined;
        if (!next) throw err;
        log.warn(`${(err as Error).message} during the prefill; the request goes to ${next.name}`);
        tried.add(decoder);
        decoder = next;
        pre = noPrefill(false);
      }
      if (!pre.prefiller && !pre.local) this.noPrefiller(decoder);
      // The ledger (docs/ledger.md): what the router expected the decoder to hold when it prefills.
      if (!pre.prefiller) {
        const params = { ...tok.ids, ...(route.cached !== null ? predicted(this.d.router.cachedOn(decoder, route.cached)) : null) };
        if (Object.keys(params).length) body.kv_transfer_params = params;
      }
      if (pre.prefiller) {
        this.d.stats.record(pre.prefiller.name, pre.ms);
        this.prefillHist(pre.prefiller.name).observe(pre.ms / 1000);
      }
      // A decoder that cannot be reached, or is found hung, before anything went back to the
      // client: the request goes to the next healthy decoder, which prefills it itself (the KV
      // was sent to the failed one).
      for (;;) {
        tried.add(decoder);
        // The decoder computes what it does not hold when it prefills, else only its recomputed tail.
        const work = this.d.load.begin(decoder, pre.prefiller ? 1 : route.decoderUncached);
        try {
          status = await this.decode({ kind, body, stream, decoder, pre, reply, signal: abort, t0, prefilled: work.prefilled, ids: tok.ids });
          // Answered whole: the decoder took the transfer (and freed it) when it loaded the prompt.
          if (pre.prefiller && status === 200) used = pre.reqId;
          break;
        } catch (err) {
          const next = this.retryable(err, reply) ? this.d.decoders.order().find((d) => !tried.has(d)) : undefined;
          if (!next) throw err;
          log.warn(`${(err as Error).message}; retrying the request on ${next.name}`);
          delete body.kv_transfer_params;
          if (tok.ids) body.kv_transfer_params = { ...tok.ids };
          decoder = next;
          pre = noPrefill(false, pre.reqId);
        } finally {
          work.end();
        }
      }
    } catch (err) {
      status = this.fail(err, reply);
    } finally {
      reply.raw.off('close', onClose);
      // Transfers this request will not use hold room on their decoder until its TTL: free them now.
      for (const t of transfers) if (t.reqId !== used) this.releaseTransfer(t.decoder, t.reqId);
      m.live.requests--;
      this.requests(endpoint, String(status)).inc();
      this.e2e(endpoint).observe((performance.now() - t0) / 1000);
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

  /**
   * A failed call's consequence for its backend: a connection-level failure (refused, reset,
   * timed out, found hung) marks it down; an answer (5xx) only asks for a health probe, since the
   * request may be what failed and a client's input must never take a backend out of rotation.
   */
  private down(b: Backend, err: BackendFailure): void {
    if (err.backendDown) {
      if (b.markDown(err.message)) this.d.onBackendDown(b, err.message);
    } else this.d.onBackendSuspect?.(b);
  }

  /** A decode failure that another decoder may serve: nothing reached the client, the backend is unreachable or hung. */
  private retryable(err: unknown, reply: FastifyReply): boolean {
    return err instanceof BackendFailure && err.backendDown && err.beforeResponse && !reply.sent && !reply.raw.headersSent;
  }

  /**
   * Counts the prompt's tokens and chooses the request's decoder (round-robin: the decoders are
   * asked in turn, the first that answers serves the request). A long text prompt (at least
   * LONG_TEXT_CHARS) is tokenized by a prefiller when one is up, in a turn of its own: it computes
   * the prompt anyway, and a decoder's CPU belongs to its running streams (a 3,000-token text is
   * 75–100 ms of tokenizer CPU); the decoder is then the first of the decoders' turn. The count
   * lets a request that cannot fit the model's context (the prompt, or the prompt plus
   * max_tokens, against the smaller of the tokenizing engine's and the decoder's context) be
   * refused before any prefill work, with the engine's own rule and code; the ids go on to the
   * prefiller and the decoder (`ids`), which do not tokenize the text again. Token ids are
   * counted as sent, against the context the decoder's /health gave.
   */
  private async tokenize(kind: Kind, body: Record<string, unknown>, signal: CancelSignal): Promise<Tokenized> {
    const candidates = this.d.decoders.orderOrAny();
    const tokBody: Record<string, unknown> = { model: body.model };
    const form = kind === 'completion' ? promptForm(body.prompt) : null;
    if (form && 'text' in form) tokBody.prompt = form.text;
    if (kind === 'chat') tokBody.messages = body.messages;
    // The engine tokenizes the prompt with the same special tokens the request asks for.
    if (body.add_special_tokens !== undefined) tokBody.add_special_tokens = body.add_special_tokens;
    const salt = typeof body.cache_salt === 'string' && body.cache_salt !== '' ? body.cache_salt : undefined;
    const ask = async (b: Backend, decoder: Backend): Promise<Tokenized> => {
      const reply = await callJson(b, {
        method: 'POST',
        path: '/tokenize',
        body: tokBody,
        signal,
        headersTimeoutMs: this.d.timeouts.tokenizeMs,
        bodyTimeoutMs: this.d.timeouts.tokenizeMs,
      });
      // A reply of another shape skips the length check; the decoder still enforces it.
      const r = tokenizeLengthSchema.safeParse(reply);
      if (r.success) checkContext(kind, body, r.data.count, Math.min(r.data.max_model_len, decoder.maxModelLen ?? Infinity));
      // The token ids route the request (kv-aware); the controller validates them on lookup.
      const ids = (reply as { tokens?: unknown } | null)?.tokens;
      const tokens = Array.isArray(ids) && ids.length > 0 ? (ids as number[]) : null;
      return { decoder, tokens, count: tokens ? tokens.length : r.success ? r.data.count : 0, salt, ids: tokens ? { [PROMPT_IDS_KEY]: tokens } : null };
    };
    if (form && 'ids' in form) {
      const dec = candidates[0];
      if (!dec) throw unavailable('no decoder configured');
      // Already token ids: no call; the context is known from the decoder's health probe.
      if (dec.maxModelLen !== null) checkContext(kind, body, form.ids.length, dec.maxModelLen);
      return { decoder: dec, tokens: form.ids, count: form.ids.length, salt, ids: null };
    }
    const first = candidates[0];
    if (first && textChars(kind, body, form) >= LONG_TEXT_CHARS) {
      for (const p of this.tokenizers.order()) {
        try {
          return await ask(p, first);
        } catch (err) {
          if (!(err instanceof BackendFailure)) throw err;
          // The prefill would have failed there too: the next prefiller, else the decoders, tokenize.
          this.prefillFailures(p.name).inc();
          this.down(p, err);
        }
      }
    }
    let last: BackendFailure | null = null;
    for (const dec of candidates) {
      try {
        return await ask(dec, dec);
      } catch (err) {
        if (!(err instanceof BackendFailure)) throw err;
        last = err;
        this.decoderFailures(dec.name).inc();
        this.down(dec, err);
      }
    }
    if (last?.timeout) throw timedOut(`no decoder answered: ${last.message}`);
    throw last ? upstreamFailed(`no decoder answered: ${last.message}`) : unavailable('no decoder configured');
  }

  /**
   * Looks the prompt up on the controller's index (when there is one) and asks the router where
   * the request goes. A failed lookup routes on load alone; it never fails the request. Without a
   * lookup the decision is synchronous (no promise on the per-request path).
   */
  private route(tok: Tokenized): Route | Promise<Route> {
    const t = performance.now();
    if (!this.d.prefix || !tok.tokens || !tok.tokens.length) return this.decide(tok, null, false, t);
    return this.lookupAndDecide(this.d.prefix, tok.tokens, tok, t);
  }

  private async lookupAndDecide(prefix: PrefixClient, tokens: number[], tok: Tokenized, t: number): Promise<Route> {
    try {
      const cached = (await prefix.lookup(tokens, tok.salt)).instances;
      this.d.routing.lookedUp(true);
      return this.decide(tok, cached, false, t);
    } catch (err) {
      this.d.routing.lookedUp(false);
      log.warn(`routing lookup failed (${(err as Error).message}); routing on load alone`);
      return this.decide(tok, null, true, t);
    }
  }

  private decide(tok: Tokenized, cached: Record<string, number> | null, lookupFailed: boolean, t: number): Route {
    const route = this.d.router.route({ promptTokens: tok.count, tokenizer: tok.decoder, cached, lookupFailed });
    this.d.routing.decisionSeconds.observe((performance.now() - t) / 1000);
    const computes = route.prefillers[0] ?? route.decoder;
    this.d.routing.routed(route.reason, route.where, computes.name, tok.count, cached || lookupFailed ? route.cachedTokens : null);
    return route;
  }

  private noPrefiller(decoder: Backend): void {
    // A deployment without prefillers (colocated engines, --num-prefillers 0) is not degraded:
    // nothing to count or warn about.
    if (this.d.prefillers.backends.length === 0) return;
    this.d.metrics.decoderOnly.inc();
    log.warn(`no prefiller available; ${decoder.name} prefills the request itself`);
  }

  /**
   * Tells `decoder` that transfer `reqId` will not be used (POST /xfer/release, signed): it frees
   * the reservation now and refuses the transfer if it arrives later (a prefiller still finishing
   * the prompt). In the background: the client is never held up; a decoder that does not answer
   * frees it at its TTL.
   */
  private releaseTransfer(decoder: Backend, reqId: string): void {
    const body = { req_id: reqId };
    const releases = this.d.metrics.xferReleases;
    callJson(decoder, {
      method: 'POST',
      path: XFER_RELEASE_PATH,
      body,
      headers: signedHeaders(deploymentSecret(), 'POST', XFER_RELEASE_PATH, body),
      headersTimeoutMs: RELEASE_TIMEOUT_MS,
      bodyTimeoutMs: RELEASE_TIMEOUT_MS,
    }).then(
      (r) => releases.inc({ result: (r as XferReleaseReply | null)?.reservation ?? 'none' }),
      (err: unknown) => {
        releases.inc({ result: 'failed' });
        log.warn(`releasing transfer ${reqId} on ${decoder.name} failed (${(err as Error).message}); it is freed at its TTL`);
      },
    );
  }

  private async prefill(kind: Kind, body: Record<string, unknown>, decoder: Backend, route: Route, ids: Record<string, unknown> | null, signal: CancelSignal, transfers: { reqId: string; decoder: Backend }[]): Promise<PrefillResult> {
    const ep = this.d.decoderEndpoint(decoder);
    const order = route.prefillers;
    if (order.length) {
      // One copy of the client's body serves every attempt; only req_id changes between them.
      // The prefiller only computes the prompt's KV: one sequence of one token. Fields about
      // the answer's shape are the decoder's (it validates every field of the client's body).
      const pbody = prefillBody(body);
      // What the index says the decoder holds: the same for every prefiller tried.
      const onDecoder = route.cached === null ? null : this.d.router.cachedOn(decoder, route.cached);
      for (const p of order) {
        const reqId = `kvc-${randomUUID()}`;
        const onPrefiller = route.cached === null ? null : this.d.router.cachedOn(p, route.cached);
        const keeper = chooseKeeperSplit(route.promptTokens, this.d.roomOf(p), this.d.roomOf(decoder), onPrefiller === null || onDecoder === null ? undefined : { p: onPrefiller, d: onDecoder });
        transfers.push({ reqId, decoder });
        pbody.kv_transfer_params = kvTransferParams(specFor(reqId, ep), { ...ids, ...predicted(onPrefiller), ...keeperParams(keeper) });
        const t = performance.now();
        const live = this.d.metrics.live.prefills;
        live.set(p.name, (live.get(p.name) ?? 0) + 1);
        const work = this.d.load.begin(p, this.d.router.work(p, route.promptTokens, route.cached, route.best));
        try {
          const r = (await callJson(p, {
            method: 'POST',
            path: PATHS[kind],
            body: pbody,
            signal,
            headersTimeoutMs: this.d.timeouts.prefillMs,
            bodyTimeoutMs: this.d.timeouts.prefillMs,
            // The prefill waits on the decoder's xfer receiver: a decoder found hung ends it too.
            dependsOn: decoder,
          })) as { kv_transfer_params?: unknown };
          // The prefiller's own params are forwarded to the decoder; anything but an object is dropped.
          const returned = kvTransferParamsSchema.safeParse(r?.kv_transfer_params);
          const params = returned.success ? returned.data : null;
          this.d.routing.keeper(keeper);
          return { prefiller: p, reqId, ms: performance.now() - t, params, local: false, keeper };
        } catch (err) {
          if (!(err instanceof BackendFailure) || err.backend === decoder) throw err; // (the decoder failed, not the prefiller)
          this.prefillFailures(p.name).inc();
          log.warn(`prefill ${reqId} failed: ${err.message}; trying the next prefiller`);
          this.down(p, err);
        } finally {
          live.set(p.name, live.get(p.name)! - 1);
          work.end();
        }
      }
    }
    return noPrefill(false);
  }

  private async decode(c: DecodeCall): Promise<number> {
    const { kind, body, stream, decoder, pre, reply, signal, t0, prefilled, ids } = c;
    if (pre.prefiller) {
      // The client's body is not used after this: extend it instead of copying it.
      const ep = this.d.decoderEndpoint(decoder);
      body.kv_transfer_params = kvTransferParams(specFor(pre.reqId, ep), { ...ids, ...pre.params, ...keeperParams(pre.keeper) });
    }
    const endpoint = PATHS[kind];
    const tDecode = performance.now();
    /** First token reached the client: end-to-end TTFT, and the decoder's own TTFT when it prefilled alone. */
    const firstToken = () => {
      const now = performance.now();
      prefilled();
      this.ttft(endpoint).observe((now - t0) / 1000);
      if (!pre.prefiller) this.d.stats.record(pre.local ? DECODER_LOCAL : DECODER_ONLY, now - tDecode);
    };
    const opts = {
      method: 'POST' as const,
      path: endpoint,
      body,
      signal,
      headersTimeoutMs: this.d.timeouts.decodeMs,
      bodyTimeoutMs: this.d.timeouts.idleMs,
    };
    const failed = (err: unknown) => {
      if (err instanceof BackendFailure) {
        this.decoderFailures(decoder.name).inc();
        this.down(decoder, err);
      }
      return err;
    };
    if (!stream) {
      let res;
      try {
        res = await callWhole(decoder, opts);
      } catch (err) {
        // Cut off after its headers: the decoder answered, so it is counted, not marked down.
        if (err instanceof BackendFailure && !err.beforeResponse && err.answered === null) {
          this.decoderFailures(decoder.name).inc();
          throw new BackendFailure(decoder, `response cut off: ${err.message}`);
        }
        throw failed(err);
      }
      // A non-streamed answer comes whole: when its first token was made is not seen here, so it
      // stays out of the TTFT histogram and statistics (docs/metrics.md); its prefill is over.
      prefilled();
      void reply.code(res.status).header('content-type', res.contentType).send(res.body);
      return res.status;
    }
    // Streamed: relay the decoder's SSE bytes as they come (undici dispatch, no body stream in
    // between; relay.ts gathers the pieces of one event-loop turn into one write), pausing the
    // decoder while the client's socket is full.
    const idleMs = this.d.timeouts.idleMs;
    const relay = new ClientRelay(reply, new FirstContent(), idleMs, {
      firstToken,
      cancel: () => signal.abort(),
      stalled: () => {
        log.warn(`client stopped reading a stream for ${idleMs} ms; cancelling its decode on ${decoder.name}`);
        this.d.metrics.cancelled.inc();
      },
      resume: () => upstream.resume(),
    });
    const upstream = callStream(decoder, opts, relay);
    try {
      await upstream.done;
      // A stream without any text (e.g. an empty completion): its first "token" is its end.
      if (relay.waitingForContent) firstToken();
      relay.end();
      return relay.status;
    } catch (err) {
      if (relay.status === 0) throw failed(err); // nothing sent yet: a 502/504 or the engine's 4xx
      if (signal.aborted || err instanceof Cancelled) return 499;
      // Headers are gone already: end the stream with an OpenAI-shaped error event.
      this.decoderFailures(decoder.name).inc();
      const e = upstreamFailed(`${decoder.name}: stream broken: ${(err as Error).message}`);
      log.warn(e.message);
      relay.end(`data: ${JSON.stringify(e.toJSON())}\n\n`);
      return 502;
    } finally {
      relay.close();
    }
  }
}

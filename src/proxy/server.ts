// The proxy process: HTTP front (completions, chat, models, health, metrics), the xfer notify
// port, the backend health loop and the 5-second TTFT statistics.
import { performance } from 'node:perf_hooks';
import type { FastifyInstance } from 'fastify';
import { createHttpServer } from '../common/http.js';
import { ERRORS, badRequest, kvcError } from '../common/errors.js';
import { formatLine, logFormat, logger } from '../common/log.js';
import { Backend, RoundRobin } from './backend.js';
import { Flow, type Timeouts } from './flow.js';
import { LoadBook } from './load.js';
import { PrefixClient } from './prefix_client.js';
import { Router, type RoutingOptions } from './router.js';
import { RoutingMetrics } from './routing_metrics.js';
import { engineHealthSchema } from '../protocol/engine_health.js';
import { LedgerMetrics } from './ledger_metrics.js';
import { KeySettingsCheck } from './key_settings.js';
import { ProxyMetrics } from './metrics.js';
import { NotifyReceiver, type XferNotice } from './notify.js';
import { TtftStats } from './stats.js';
import type { Room } from './keeper.js';
import type { DecoderEndpoint, Topology } from './topology.js';
import { BackendFailure, PassThrough, call } from './upstream.js';
import { deploymentSecretWhere, requireBearer, requireSecret } from '../common/auth.js';
import { KVC_VERSION } from '../common/version.js';
import { PID_HEADER } from '../protocol/process_header.js';

const log = logger('proxy');

export interface ProxyOptions {
  host: string;
  port: number;
  topology: Topology;
  /** xfer notify PULL socket; null disables it (unit tests without xfer). */
  notify: { host: string; port: number } | null;
  timeouts: Timeouts;
  healthIntervalMs: number;
  /**
   * A health probe not answered within this is failed; two failed probes in a row mark a backend
   * down (unless it sent bytes within this time: busy, not dead). Default: the interval, clamped
   * to [1 s, 5 s]. A hung backend is so found within interval + 2 × timeout.
   */
  healthTimeoutMs?: number;
  statsIntervalMs: number;
  /** Clients must send `Authorization: Bearer <key>` on /v1/*; the proxy sends it to the engines too (null: open). */
  apiKey?: string | null;
  /** Where the statistics lines go (stdout by default, independent of KVC_LOG_LEVEL). */
  statsSink?: (line: string) => void;
  /** Routing mode and conditional-disaggregation rules (default: round-robin, always disaggregate). */
  routing?: RoutingOptions;
  /** The controller's HTTP URL for the routing lookup; required by kv-aware routing. */
  controllerUrl?: string | null;
  /** Bound on one routing lookup (default 50 ms); a late lookup routes on load alone. */
  lookupTimeoutMs?: number;
}

export const DEFAULT_ROUTING: RoutingOptions = { mode: 'round-robin', maxLocalPrefillTokens: null, maxPrefillQueue: null };

export const DEFAULT_TIMEOUTS: Timeouts = { tokenizeMs: 10_000, prefillMs: 120_000, decodeMs: 300_000, idleMs: 60_000 };

export class ProxyServer {
  readonly app: FastifyInstance;
  readonly metrics = new ProxyMetrics();
  readonly prefillers: Backend[];
  readonly decoders: Backend[];
  readonly stats: TtftStats;
  private notifyRx: NotifyReceiver | null = null;
  private timers: NodeJS.Timeout[] = [];
  private probing = new Set<Backend>();
  private decoderEp = new Map<Backend, DecoderEndpoint>();
  /** Recent notices by req_id, for the log line of a failed transfer. */
  readonly notices = { ok: 0, failed: 0 };
  readonly routing: RoutingMetrics;
  /** The engines' ledger counters, summed from their /health (docs/ledger.md). */
  readonly ledger: LedgerMetrics;
  /** Engines' key settings against the controller's (src/proxy/key_settings.ts); null without a controller. */
  private readonly keyCheck: KeySettingsCheck | null;
  readonly load = new LoadBook();
  readonly router: Router;
  private readonly prefix: PrefixClient | null;
  /** Backend → the kvc_instance_id its /health names (the controller index's name for it). */
  readonly instanceIds = new Map<Backend, string>();
  /** Backends whose /health says their cache instance fetches by P2P (kvc_p2p). */
  readonly p2pBackends = new Set<Backend>();
  /** Backend → its CPU tier's room from its last /health (kvc_room): who keeps a prompt (keeper.ts). */
  readonly rooms = new Map<Backend, Room>();
  private readonly decoderRR: RoundRobin;

  constructor(readonly opts: ProxyOptions) {
    this.prefillers = opts.topology.prefillers.map((e, i) => new Backend('prefiller', i, e, 128, opts.apiKey ?? null));
    this.decoders = opts.topology.decoders.map((e, i) => {
      const b = new Backend('decoder', i, e, 128, opts.apiKey ?? null);
      this.decoderEp.set(b, e);
      return b;
    });
    for (const b of [...this.prefillers, ...this.decoders]) this.metrics.backendUp.labels(b.role, b.name).set(1);
    for (const p of this.prefillers) this.metrics.live.prefills.set(p.name, 0);
    this.stats = new TtftStats(this.prefillers.map((p) => p.name));
    const routing = opts.routing ?? DEFAULT_ROUTING;
    if (routing.mode === 'kv-aware' && !opts.controllerUrl) {
      throw new Error('--routing kv-aware needs --controller-url (the controller whose index says where prefixes are cached)');
    }
    this.routing = new RoutingMetrics(this.metrics.registry);
    this.ledger = new LedgerMetrics(this.metrics.registry);
    this.keyCheck = opts.controllerUrl ? new KeySettingsCheck(opts.controllerUrl, this.metrics.registry) : null;
    this.prefix = opts.controllerUrl ? new PrefixClient(opts.controllerUrl, opts.lookupTimeoutMs ?? 50) : null;
    const prefillRR = new RoundRobin(this.prefillers);
    const decoderRR = new RoundRobin(this.decoders);
    this.decoderRR = decoderRR;
    this.router = new Router(routing, prefillRR, decoderRR, this.load, (b) => this.instanceIds.get(b), (b) => this.p2pBackends.has(b));
    this.routing.watchRecent(() => [...this.router.recentShares()].map(([b, n]) => [b.name, n]));
    const flow = new Flow({
      prefillers: prefillRR,
      decoders: decoderRR,
      router: this.router,
      load: this.load,
      prefix: this.prefix,
      routing: this.routing,
      roomOf: (b) => this.rooms.get(b),
      decoderEndpoint: (b) => this.decoderEp.get(b)!,
      metrics: this.metrics,
      stats: this.stats,
      timeouts: opts.timeouts,
      onBackendDown: (b, reason) => {
        this.metrics.backendUp.labels(b.role, b.name).set(0);
        log.warn(`${b.name} marked down: ${reason}`);
      },
      onBackendSuspect: (b) => this.probe(b, true),
    });
    this.app = createHttpServer({ name: 'proxy' });
    requireBearer(this.app, { key: opts.apiKey ?? null, applies: (_m, p) => p.startsWith('/v1/') || p === '/tokenize' || p === '/detokenize', what: 'API key', name: 'proxy' });
    // The one administrative call: it changes how later requests are routed, so it needs the
    // deployment secret (as the controller's mutations do; open without one).
    requireSecret(this.app, { applies: (m, p) => m === 'POST' && p === '/routing/reset', name: 'proxy', channel: 'proxy-http', bearer: true, where: deploymentSecretWhere });
    this.app.post('/routing/reset', async (req) => this.resetRouting(req.body, req.socket.remoteAddress ?? '?'));
    this.app.post('/v1/completions', (req, reply) => flow.handle('completion', req, reply));
    this.app.post('/v1/chat/completions', (req, reply) => flow.handle('chat', req, reply));
    this.app.get('/v1/models', async (_req, reply) => this.models(reply));
    const health = async (_req: unknown, reply: import('fastify').FastifyReply) => {
      const anyDecoder = this.decoders.some((d) => d.up);
      const allUp = anyDecoder && this.prefillers.every((p) => p.up) && this.decoders.every((d) => d.up);
      void reply.header(PID_HEADER, String(process.pid));
      void reply.code(anyDecoder ? 200 : 503).send({
        status: allUp ? 'ok' : anyDecoder ? 'degraded' : 'unavailable',
        prefillers: this.prefillers.map((b) => b.status()),
        decoders: this.decoders.map((b) => b.status()),
        xfer_notices: this.notices,
      });
    };
    this.app.get('/health', health);
    // vLLM's liveness aliases (GET and POST /ping) and its version route.
    this.app.get('/ping', health);
    this.app.post('/ping', health);
    this.app.get('/version', async () => ({ version: KVC_VERSION }));
    // The decoders' tokenizer (every engine of a deployment serves the same model).
    this.app.post('/tokenize', async (req, reply) => this.toDecoder('/tokenize', req.body, reply));
    this.app.post('/detokenize', async (req, reply) => this.toDecoder('/detokenize', req.body, reply));
    this.app.get('/metrics', async (_req, reply) => {
      void reply.header('content-type', this.metrics.registry.contentType).send(await this.metrics.registry.metrics());
    });
  }

  /**
   * POST /routing/reset: forgets the router's memory (the share window and the rotation of equal
   * costs, docs/routing.md), e.g. after clearing every cache or between benchmark phases, so that
   * what earlier traffic did no longer steers the next requests. It takes no fields.
   */
  private resetRouting(body: unknown, from: string): { forgotten_decisions: number } {
    if (body !== undefined && body !== null) {
      if (typeof body !== 'object' || Array.isArray(body)) throw badRequest('POST /routing/reset: expected an empty JSON object or no body');
      const fields = Object.keys(body);
      if (fields.length) throw badRequest(`POST /routing/reset: takes no fields, found ${fields.map((f) => JSON.stringify(f.slice(0, 64))).join(', ')}`, 'unknown_field');
    }
    const n = this.router.forget();
    log.info(`routing memory reset by ${from}: ${n} recent decisions forgotten`);
    return { forgotten_decisions: n };
  }

  /**
   * Relays a body to the first decoder that answers (round-robin order), its answer as is: a
   * 4xx of the engine (a bad field) goes back unchanged; a decoder down or failing is skipped.
   */
  private async toDecoder(path: '/tokenize' | '/detokenize', body: unknown, reply: import('fastify').FastifyReply): Promise<void> {
    let last = 'no decoder configured';
    for (const b of this.decoderRR.orderOrAny()) {
      try {
        const ms = this.opts.timeouts.tokenizeMs;
        const res = await call(b, { method: 'POST', path, body, headersTimeoutMs: ms, bodyTimeoutMs: ms });
        void reply.header('content-type', String(res.headers['content-type'] ?? 'application/json')).send(Buffer.from(await res.body.arrayBuffer()));
        return;
      } catch (err) {
        if (err instanceof PassThrough) {
          void reply.code(err.status).header('content-type', err.contentType).send(err.body);
          return;
        }
        last = `${b.name}: ${(err as Error).message}`;
      }
    }
    throw kvcError(ERRORS.unavailable, `no decoder answered ${path}: ${last}`);
  }

  /** The model list of the first backend that answers (decoders first: they serve the output). */
  private async models(reply: import('fastify').FastifyReply): Promise<void> {
    let last = 'no backend configured';
    for (const b of [...this.decoders.filter((d) => d.up), ...this.prefillers.filter((p) => p.up)]) {
      try {
        const res = await call(b, { method: 'GET', path: '/v1/models', headersTimeoutMs: 5_000, bodyTimeoutMs: 5_000 });
        void reply.header('content-type', 'application/json').send(Buffer.from(await res.body.arrayBuffer()));
        return;
      } catch (err) {
        if (err instanceof PassThrough) throw kvcError(ERRORS.upstream_failed, `${b.name} answered ${err.status} to GET /v1/models`);
        last = (err as Error).message;
      }
    }
    throw kvcError(ERRORS.upstream_failed, `no backend answered GET /v1/models: ${last}`);
  }

  private onNotice(n: XferNotice): void {
    this.metrics.notices.labels(n.ok ? 'true' : 'false').inc();
    if (n.ok) {
      this.notices.ok++;
      if (n.num_tokens) this.metrics.transferredTokens.inc(n.num_tokens);
      if (n.num_chunks) this.metrics.transferredChunks.inc(n.num_chunks);
      log.debug(`xfer ${n.req_id}: ${n.num_chunks ?? '?'} chunks, ${n.num_tokens ?? '?'} tokens from ${n.prefiller ?? '?'}`);
    } else {
      this.notices.failed++;
      log.warn(`xfer ${n.req_id} from ${n.prefiller ?? '?'} failed: ${n.error ?? 'no reason given'} (the decoder recomputes)`);
    }
  }

  get healthTimeoutMs(): number {
    return this.opts.healthTimeoutMs ?? Math.max(1_000, Math.min(5_000, this.opts.healthIntervalMs));
  }

  /** Probes every backend's GET /health (see probe()). */
  private probeAll(): void {
    for (const b of [...this.prefillers, ...this.decoders]) this.probe(b);
  }

  /**
   * One health probe, on the backend's own probe connection: two failures in a row (one after a
   * 5xx answer: `suspect`) mark it down,
   * one success brings it back. A probe that times out while the backend keeps sending bytes on
   * other calls does not count (busy, not dead). Marking a backend down aborts the calls still in
   * flight on it, so requests stalled on a hung engine fail over (or end) instead of waiting.
   */
  probe(b: Backend, suspect = false): void {
    if (this.probing.has(b)) return;
    this.probing.add(b);
    const timeout = this.healthTimeoutMs;
    const started = performance.now();
    call(b, { method: 'GET', path: '/health', headersTimeoutMs: timeout, bodyTimeoutMs: timeout }, b.probePool)
      .then(async (res) => {
        // The engine names its cache instance here; routing needs it to read the index.
        const h = engineHealthSchema.safeParse(await res.body.json().catch(() => null));
        // An engine whose key settings differ from the deployment's is routed as holding nothing.
        const id = h.success && (!this.keyCheck || this.keyCheck.accepts(b.name, h.data.kvc_key_settings)) ? h.data.kvc_instance_id : undefined;
        if (id && this.instanceIds.get(b) !== id) {
          this.instanceIds.set(b, id);
          log.info(`${b.name} serves cache instance "${id}"`);
        } else if (!id && this.instanceIds.has(b)) this.instanceIds.delete(b);
        b.maxModelLen = h.success ? (h.data.max_model_len ?? null) : null;
        if (h.success && h.data.kvc_computed_chunks) this.ledger.observe(b.name, h.data.kvc_computed_chunks);
        if (h.success && h.data.kvc_room && id) {
          this.rooms.set(b, h.data.kvc_room);
          this.metrics.backendRoom.labels(b.name).set(h.data.kvc_room.free_tokens);
        } else if (this.rooms.delete(b)) this.metrics.backendRoom.remove(b.name);
        if (h.success && h.data.kvc_p2p === true && id) this.p2pBackends.add(b);
        else this.p2pBackends.delete(b);
        if (b.markUp()) {
          this.metrics.backendUp.labels(b.role, b.name).set(1);
          log.info(`${b.name} is back up`);
        }
      })
      .catch((err: unknown) => {
        const reason = err instanceof BackendFailure || err instanceof PassThrough ? err.message : String(err);
        if (err instanceof BackendFailure && err.timeout && b.lastProgress > started) {
          log.debug(`${b.name}: health probe timed out but the backend is sending data: busy, not down`);
          return;
        }
        b.probeFailures++;
        // After a 5xx answer (suspect), one failed probe confirms it: the backend is down.
        if ((!b.up || suspect || b.probeFailures >= 2) && b.markDown(`health probe: ${reason}`)) {
          this.metrics.backendUp.labels(b.role, b.name).set(0);
          const n = b.abortInflight(new BackendFailure(b, `marked down by the health probe (${reason})`, true));
          log.warn(`${b.name} marked down: health probe: ${reason}${n ? `; ${n} call(s) in flight on it aborted` : ''}`);
        }
      })
      .finally(() => this.probing.delete(b));
  }

  async start(): Promise<void> {
    if (this.opts.notify) {
      this.notifyRx = new NotifyReceiver((n) => this.onNotice(n));
      await this.notifyRx.bind(this.opts.notify.host, this.opts.notify.port);
    }
    try {
      await this.app.listen({ host: this.opts.host, port: this.opts.port });
    } catch (e) {
      this.notifyRx?.close();
      throw new Error(`cannot listen on ${this.opts.host}:${this.opts.port} (--host/--port): ${(e as Error).message}`);
    }
    // The statistics are the proxy's output, not log events: stdout whatever KVC_LOG_LEVEL says
    // (wrapped as a JSON log object under KVC_LOG_FORMAT=json, so a log shipper reads them too).
    const stdoutSink = (line: string) =>
      void process.stdout.write(logFormat() === 'json' ? formatLine('json', new Date(), 'info', 'proxy.stats', line) : line + '\n');
    const sink = this.opts.statsSink ?? stdoutSink;
    const intervalS = Math.round(this.opts.statsIntervalMs / 100) / 10;
    this.timers.push(
      setInterval(() => {
        const lines = this.stats.flush(intervalS);
        const hit = this.routing.flushHitRate(intervalS);
        if (hit) lines.push(hit);
        const misses = this.ledger.flushLine(intervalS);
        if (misses) lines.push(misses);
        lines.forEach(sink);
      }, this.opts.statsIntervalMs),
    );
    // Learn every backend's cache instance now rather than one health interval later, and the
    // deployment's key settings to compare them with.
    await this.keyCheck?.refresh();
    this.probeAll();
    this.timers.push(setInterval(() => this.probeAll(), this.opts.healthIntervalMs));
    for (const t of this.timers) t.unref();
  }

  get port(): number {
    const a = this.app.server.address();
    return typeof a === 'object' && a ? a.port : this.opts.port;
  }

  async stop(): Promise<void> {
    for (const t of this.timers) clearInterval(t);
    this.notifyRx?.close();
    await this.app.close();
    await Promise.all([...this.prefillers, ...this.decoders].map((b) => b.close()));
    await this.prefix?.close();
  }
}

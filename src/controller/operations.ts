// What the controller's HTTP operations do: resolve positions against the registry, compute
// chunk keys from tokens (src/common/keys.ts, with the instance's model id and chunk size and
// the controller's PYTHONHASHSEED), ask the source how much of it it holds (num_tokens), then
// run the command asynchronously under an event.
//
// Safety of moves lives in the instance worker (src/kvc/worker_ops.ts): the source sends
// chunks peer to peer, the destination verifies, stores and pins each one and acknowledges it,
// then confirms at a final commit that it still holds every one; only then, and only if its
// deadline has not passed and this controller's request is still open, does the source delete
// its copies. Any failure leaves the source as it was and marks the event failed.
import { randomUUID } from 'node:crypto';
import { ERRORS, KvcError, asKvcError, kvcError } from '../common/errors.js';
import { chunkKeys, type ChunkSpan } from '../common/keys.js';
import { logger } from '../common/log.js';
import { DTYPE_NAMES } from '../common/dtype.js';
import { EventLog, type EventKind, type EventRecord } from './events.js';
import { keyHalves, type KeyHalves } from '../common/keys.js';
import type { ClearReply, ClearRequest, CompressRequest, DecompressRequest, EventReply, LookupReply, MoveRequest, PinRequest, WorkerInfo } from '../protocol/controller_api.js';
import type { LocationName } from '../protocol/worker_api.js';
import type { Registry, WorkerRec } from './registry.js';
import { callWorker, workerName } from './worker_rpc.js';

const log = logger('controller.ops');

export interface OperationTimeouts {
  /** Deadline of a short command to a worker (lookup, pin, unpin, health). */
  commandMs: number;
  /** Deadline of a move/copy/clear executed by a worker. */
  transferMs: number;
}


export class Operations {
  /** lookup()'s key scratch: lookup is synchronous, so one buffer serves every call without garbage. */
  private readonly lookupKeys: KeyHalves = { count: 0, hi: new Uint32Array(64), lo: new Uint32Array(64), ends: new Uint32Array(64) };

  constructor(
    readonly registry: Registry,
    readonly events: EventLog,
    private readonly seed: bigint,
    private readonly timeouts: OperationTimeouts,
  ) {}

  /** Workers of an instance, in worker id order; 404 when the instance is unknown. */
  workersOf(instanceId: string, field: string): WorkerRec[] {
    const byWorker = this.registry.instances.get(instanceId);
    if (!byWorker || byWorker.size === 0) {
      const known = [...this.registry.instances.keys()];
      throw kvcError(ERRORS.unknown_instance, `${field}: unknown instance "${instanceId}" (registered: ${known.length ? known.join(', ') : 'none'})`);
    }
    return [...byWorker.values()].sort((a, b) => a.workerId - b.workerId);
  }

  private checkLocation(workers: WorkerRec[], location: string, field: string): void {
    for (const w of workers) {
      if (!w.locations.includes(location)) {
        throw kvcError(ERRORS.unknown_location, `${field}: location "${location}" is not configured on instance "${w.instanceId}" (configured: ${w.locations.join(', ') || 'none'})`);
      }
    }
  }

  spans(w: WorkerRec, tokens: readonly number[]): ChunkSpan[] {
    return chunkKeys(tokens, { modelId: w.modelId, chunkSize: w.chunkSize, seed: this.seed, kvDtype: w.kvDtype });
  }

  /** Tokens covered by the first `n` chunks. */
  private tokensOf(spans: ChunkSpan[], n: number): number {
    return n > 0 ? spans[n - 1]!.end : 0;
  }

  /** Asks every worker how many leading keys it holds in `location`; returns the minimum. */
  private async heldPrefix(workers: WorkerRec[], keys: string[], location: string): Promise<number> {
    const counts = await Promise.all(
      workers.map((w) => callWorker(w, 'lookup', { keys, location: location as LocationName }, this.timeouts.commandMs)),
    );
    return Math.min(...counts.map((c) => c.count));
  }

  /** Runs `work` under `ev` in the background: running, then finished or failed. */
  private runEvent(ev: EventRecord, work: () => Promise<number>): void {
    this.events.start(ev);
    void (async () => {
      try {
        const done = await work();
        this.events.finish(ev, done);
        log.info(`${ev.event_id} finished (${ev.num_tokens} tokens, ${done} chunks)`);
      } catch (e) {
        const msg = e instanceof KvcError ? e.message : (e as Error).message;
        this.events.fail(ev, msg);
        log.warn(`${ev.event_id} failed: ${msg}`);
      }
    })();
  }

  /** Runs `work` under `ev` and waits for it: finished, or failed with the error thrown again. */
  private async runEventNow(ev: EventRecord, work: () => Promise<number>): Promise<void> {
    this.events.start(ev);
    try {
      const done = await work();
      this.events.finish(ev, done);
      log.info(`${ev.event_id} finished (${done} chunks)`);
    } catch (e) {
      const err = asKvcError(e);
      this.events.fail(ev, err.message);
      log.warn(`${ev.event_id} failed: ${err.message}`);
      throw err;
    }
  }

  private finishedNow(kind: EventKind, request: Record<string, unknown>): EventRecord {
    const ev = this.events.create(kind, 0, 0, request);
    this.events.finish(ev, 0);
    return ev;
  }

  async move(req: MoveRequest): Promise<EventReply> {
    const [srcId, srcLoc] = req.old_position;
    const [dstId, dstLoc] = req.new_position;
    const kind: EventKind = req.copy ? 'copy' : 'move';
    const srcWorkers = this.workersOf(srcId, 'old_position[0]');
    this.checkLocation(srcWorkers, srcLoc, 'old_position[1]');
    const dstWorkers = this.workersOf(dstId, 'new_position[0]');
    this.checkLocation(dstWorkers, dstLoc, 'new_position[1]');
    if (srcId === dstId && srcLoc === dstLoc) throw kvcError(ERRORS.same_position, 'new_position: equals old_position; nothing to move');
    const cross = srcId !== dstId;
    // Pair source and destination workers by worker id (tensor-parallel ranks hold matching shards).
    const pairs = srcWorkers.map((s) => {
      const d = dstWorkers.find((x) => x.workerId === s.workerId);
      if (!d) throw kvcError(ERRORS.worker_mismatch, `new_position[0]: instance "${dstId}" has no worker ${s.workerId} to receive the shard of instance "${srcId}"`);
      if (d.modelId !== s.modelId || d.chunkSize !== s.chunkSize || d.kvDtype !== s.kvDtype) {
        throw kvcError(ERRORS.incompatible_instances, `new_position[0]: instance "${dstId}" serves model "${d.modelId}" with chunk size ${d.chunkSize} and KV ${DTYPE_NAMES[d.kvDtype]}, instance "${srcId}" model "${s.modelId}" with chunk size ${s.chunkSize} and KV ${DTYPE_NAMES[s.kvDtype]}; their chunks are not interchangeable`);
      }
      if (cross && !d.distributedUrl) throw kvcError(ERRORS.no_distributed_url, `new_position[0]: instance "${dstId}" has no distributed_url; it cannot receive chunks from another instance`);
      return { s, d };
    });
    const request = { old_position: req.old_position, new_position: req.new_position, copy: req.copy, tokens: req.tokens.length };
    if (req.tokens.length === 0) {
      const ev = this.finishedNow(kind, request);
      return { event_id: ev.event_id, num_tokens: 0 };
    }
    const spans = this.spans(srcWorkers[0]!, req.tokens);
    const keys = spans.map((s) => s.key);
    const n = await this.heldPrefix(srcWorkers, keys, srcLoc);
    const numTokens = this.tokensOf(spans, n);
    const ev = this.events.create(kind, numTokens, n, request);
    if (n === 0) {
      this.events.finish(ev, 0);
      return { event_id: ev.event_id, num_tokens: 0 };
    }
    const moveKeys = keys.slice(0, n);
    this.runEvent(ev, async () => {
      const results = await Promise.all(
        pairs.map(({ s, d }) =>
          callWorker(
            s,
            'move',
            {
              event_id: ev.event_id,
              keys: moveKeys,
              location: srcLoc as LocationName,
              copy: req.copy,
              target: cross ? { instance_id: d.instanceId, location: dstLoc, distributed_url: d.distributedUrl } : { location: dstLoc },
              deadline_ms: this.timeouts.transferMs,
            },
            // The worker enforces the deadline itself (and checks it, and that this request is
            // still open, right before deleting the source); allow it time to report the failure.
            // Giving up here closes the request, which cancels the move on the worker.
            this.timeouts.transferMs + 5000,
          ),
        ),
      );
      return Math.min(...results.map((r) => r.moved));
    });
    return { event_id: ev.event_id, num_tokens: numTokens };
  }

  /** Pins the held prefix of `tokens` on every worker of the instance. */
  pin(req: PinRequest): Promise<EventReply> {
    return this.setPinned(req, 'pin');
  }

  /** Unpins the held prefix of `tokens` on every worker of the instance. */
  unpin(req: PinRequest): Promise<EventReply> {
    return this.setPinned(req, 'unpin');
  }

  private setPinned(req: PinRequest, kind: 'pin' | 'unpin'): Promise<EventReply> {
    const request = { instance_id: req.instance_id, location: req.location, tokens: req.tokens.length };
    return this.onHeldPrefix(req, kind, request, (w, keys) => callWorker(w, kind, { keys, location: req.location as LocationName }, this.timeouts.commandMs));
  }

  /**
   * /compress and /decompress: re-encodes the held prefix of `tokens` at the location in place
   * (worker /recode), under an event like /move. Lookups keep finding the chunks: the key does
   * not depend on the codec.
   */
  recode(req: CompressRequest | DecompressRequest, kind: 'compress' | 'decompress'): Promise<EventReply> {
    const codec = kind === 'compress' ? req.method! : 'naive';
    const request = { instance_id: req.instance_id, location: req.location, method: req.method ?? null, tokens: req.tokens.length };
    return this.onHeldPrefix(req, kind, request, (w, keys) =>
      callWorker(w, 'recode', { keys, location: req.location as LocationName, codec, deadline_ms: this.timeouts.transferMs }, this.timeouts.transferMs + 5000),
    );
  }

  /**
   * The shape of /pin, /unpin, /compress, /decompress: the prefix of `tokens` every worker of the
   * instance holds at the location (asked before the event is scheduled), then `each` on every
   * worker with those keys under one event; the event's count is the smallest worker count.
   */
  private async onHeldPrefix(
    req: { instance_id: string; location: string; tokens: number[] },
    kind: EventKind,
    request: Record<string, unknown>,
    each: (w: WorkerRec, keys: string[]) => Promise<{ count: number }>,
  ): Promise<EventReply> {
    const workers = this.workersOf(req.instance_id, 'instance_id');
    this.checkLocation(workers, req.location, 'location');
    if (req.tokens.length === 0) {
      const ev = this.finishedNow(kind, request);
      return { event_id: ev.event_id, num_tokens: 0 };
    }
    const spans = this.spans(workers[0]!, req.tokens);
    const keys = spans.map((s) => s.key);
    const n = await this.heldPrefix(workers, keys, req.location);
    const numTokens = this.tokensOf(spans, n);
    const ev = this.events.create(kind, numTokens, n, request);
    if (n === 0) {
      this.events.finish(ev, 0);
      return { event_id: ev.event_id, num_tokens: 0 };
    }
    this.runEvent(ev, async () => {
      const results = await Promise.all(workers.map((w) => each(w, keys.slice(0, n))));
      return Math.min(...results.map((r) => r.count));
    });
    return { event_id: ev.event_id, num_tokens: numTokens };
  }

  /**
   * Clears a location of an instance; pinned chunks stay unless `include_pinned`. Answers once
   * the workers have cleared (a clear is local to each worker, bounded by the transfer deadline),
   * with what was removed and what was kept: `num_chunks` / `num_tokens` (LMCache's field, whole
   * chunks of `chunk_size` tokens) count the removed chunks, `kept_chunks` the pinned ones that
   * stayed.
   */
  async clear(req: ClearRequest): Promise<ClearReply> {
    const workers = this.workersOf(req.instance_id, 'instance_id');
    this.checkLocation(workers, req.location, 'location');
    let chunks = 0;
    for (const w of workers) chunks += this.registry.index.count(w.holders.get(req.location)!);
    const ev = this.events.create('clear', 0, chunks, { instance_id: req.instance_id, location: req.location, include_pinned: req.include_pinned ?? false });
    let removed = 0;
    let kept = 0;
    await this.runEventNow(ev, async () => {
      const results = await Promise.all(
        workers.map((w) => callWorker(w, 'clear', { location: req.location as LocationName, include_pinned: req.include_pinned ?? false }, this.timeouts.transferMs)),
      );
      for (const r of results) {
        removed += r.removed;
        kept += r.kept;
      }
      return removed;
    });
    return { event_id: ev.event_id, num_tokens: removed * workers[0]!.chunkSize, num_chunks: removed, kept_chunks: kept };
  }

  /** Index-only lookup: per instance, the location with the longest cached prefix. */
  lookup(tokens: ArrayLike<number>, salt?: string): LookupReply {
    // The event id only names the answer (LMCache's field); a lookup schedules nothing to poll.
    const out: LookupReply = { event_id: `lookup-${randomUUID()}`, layout_info: {}, num_tokens: 0, layout_detail: {} };
    if (tokens.length === 0) return out;
    // Keys depend on (model, chunk size): compute them once per distinct pair among live workers.
    const groups = new Map<string, WorkerRec>();
    for (const w of this.registry.workers()) {
      const g = `${w.chunkSize}\u0000${w.kvDtype}\u0000${w.modelId}`;
      if (!groups.has(g)) groups.set(g, w);
    }
    // instance → location → worker id → matched tokens
    const matched = new Map<string, Map<string, Map<number, number>>>();
    for (const rep of groups.values()) {
      const k = keyHalves(tokens, { modelId: rep.modelId, chunkSize: rep.chunkSize, seed: this.seed, salt, kvDtype: rep.kvDtype }, this.lookupKeys);
      this.registry.index.prefixMatches(
        k.hi,
        k.lo,
        k.count,
        (h, n) => {
          const ref = this.registry.holder(h);
          if (!ref || ref.worker.chunkSize !== rep.chunkSize || ref.worker.modelId !== rep.modelId || ref.worker.kvDtype !== rep.kvDtype) return;
          let byLoc = matched.get(ref.worker.instanceId);
          if (!byLoc) matched.set(ref.worker.instanceId, (byLoc = new Map()));
          let byWorker = byLoc.get(ref.location);
          if (!byWorker) byLoc.set(ref.location, (byWorker = new Map()));
          byWorker.set(ref.worker.workerId, k.ends[n - 1]!);
        },
      );
    }
    for (const [instanceId, byLoc] of matched) {
      const nWorkers = this.registry.instances.get(instanceId)?.size ?? 0;
      const locations: Record<string, number> = {};
      let best = '';
      let bestTokens = 0;
      for (const [loc, byWorker] of byLoc) {
        // An instance holds a prefix only when every one of its workers holds its shard of it.
        const t = byWorker.size < nWorkers ? 0 : Math.min(...byWorker.values());
        if (t === 0) continue;
        locations[loc] = t;
        if (t > bestTokens) [best, bestTokens] = [loc, t];
      }
      if (bestTokens === 0) continue;
      out.layout_info[instanceId] = [best, bestTokens];
      out.layout_detail[instanceId] = { location: best, matched_tokens: bestTokens, locations };
      out.num_tokens = Math.max(out.num_tokens, bestTokens);
    }
    return out;
  }

  /**
   * The routing lookup (src/protocol/prefix_lookup.ts): per instance, the cached prefix of its
   * best location, from the index alone (no worker is asked, so the answer costs microseconds).
   */
  prefixByInstance(tokens: ArrayLike<number>, salt?: string): { num_tokens: number; instances: Record<string, number> } {
    const r = this.lookup(tokens, salt);
    const instances: Record<string, number> = {};
    for (const id in r.layout_info) instances[id] = r.layout_info[id]![1];
    return { num_tokens: r.num_tokens, instances };
  }

  /**
   * Asks every worker of the instance for its health, each with a deadline. LMCache's fields:
   * `event_id` and `error_codes` (worker id → 0 when it answered, else the HTTP status of the
   * failure: 503 unreachable, 504 no answer in time); kvc adds `healthy` and each worker's answer
   * or error.
   */
  async health(instanceId: string): Promise<Record<string, unknown>> {
    const workers = this.workersOf(instanceId, 'instance_id');
    const results = await Promise.all(
      workers.map(async (w) => {
        const t = performance.now();
        try {
          const { worker_id, ...rest } = await callWorker(w, 'health', undefined, this.timeouts.commandMs);
          return { worker_id, error_code: 0, latency_ms: Math.round((performance.now() - t) * 1000) / 1000, ...rest };
        } catch (e) {
          const err = asKvcError(e);
          return { worker_id: w.workerId, error_code: err.status, error: err.message };
        }
      }),
    );
    const error_codes = Object.fromEntries(results.map((r) => [r.worker_id, r.error_code]));
    return { event_id: `health-${randomUUID()}`, error_codes, instance_id: instanceId, healthy: results.every((r) => r.error_code === 0), workers: results };
  }

  /** LMCache's fields: `event_id` (the client's, else a new one) and `res`, the (first) instance on `ip`; kvc adds every one. */
  queryInstance(ip: string, eventId?: string): { event_id: string; res: string; ip: string; instance_ids: string[] } {
    const ids = new Set<string>();
    for (const w of this.registry.workers()) if (w.ip === ip) ids.add(w.instanceId);
    if (ids.size === 0) throw kvcError(ERRORS.unknown_instance, `ip: no registered instance has a worker on "${ip}"`);
    const sorted = [...ids].sort();
    return { event_id: eventId ?? `query_instance-${randomUUID()}`, res: sorted[0]!, ip, instance_ids: sorted };
  }

  /** LMCache's /query_worker_info: the instance's workers (those of `workerIds` when given; an unknown one is a 404). */
  queryWorkerInfo(instanceId: string, workerIds: number[] | null | undefined): { event_id: string; worker_infos: WorkerInfo[] } {
    let workers = this.workersOf(instanceId, 'instance_id');
    if (workerIds && workerIds.length > 0) {
      const missing = workerIds.filter((id) => !workers.some((w) => w.workerId === id));
      if (missing.length) {
        throw kvcError(ERRORS.unknown_instance, `worker_ids: instance "${instanceId}" has no worker ${missing.join(', ')} (registered: ${workers.map((w) => w.workerId).join(', ')})`);
      }
      workers = workers.filter((w) => workerIds.includes(w.workerId));
    }
    return {
      event_id: `query_worker_info-${randomUUID()}`,
      worker_infos: workers.map((w) => ({
        instance_id: w.instanceId,
        worker_id: w.workerId,
        ip: w.ip,
        port: w.workerPort,
        distributed_url: w.distributedUrl,
        registration_time: w.registeredAt / 1000,
        // lastSeen is Date.now()-based, like registeredAt (describeInstances subtracts it from Date.now()).
        last_heartbeat_time: w.lastSeen / 1000,
      })),
    };
  }

  describeInstances(): Record<string, unknown>[] {
    const now = Date.now();
    return [...this.registry.instances.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([id, byWorker]) => ({
      instance_id: id,
      workers: [...byWorker.values()].map((w) => ({
        worker_id: w.workerId,
        ip: w.ip,
        worker_port: w.workerPort,
        distributed_url: w.distributedUrl,
        model_id: w.modelId,
        chunk_size: w.chunkSize,
        kv_dtype: DTYPE_NAMES[w.kvDtype],
        // chunks: from the index (exact, live); bytes / capacity: from the worker's latest
        // heartbeat (null until one carried them).
        locations: Object.fromEntries([...w.holders].map(([loc, h]) => [loc, {
          chunks: this.registry.index.count(h),
          bytes: w.usage?.[loc]?.bytes ?? null,
          capacity_bytes: w.usage?.[loc]?.capacity_bytes ?? null,
          pinned: w.usage?.[loc]?.pinned ?? null,
        }])),
        pid: w.pid,
        registered_at: new Date(w.registeredAt).toISOString(),
        last_heartbeat_ms_ago: now - w.lastSeen,
        heartbeat_timeout_ms: this.registry.heartbeatTimeoutMs,
        name: workerName(w),
      })),
    }));
  }
}

// Instances, their workers and the global chunk index, fed by the monitor protocol.
//
// instance_id → worker_id → WorkerRec; each (worker, location) is a numbered holder in the
// ChunkIndex. Messages are identified by the ZeroMQ routing id of the sending DEALER, which
// is a random session id chosen at attach time: a restarted engine is a new session and
// replaces the old registration of the same (instance_id, worker_id) at once.
import { logger } from '../common/log.js';
import { ChunkIndex } from './chunk_index.js';
import { describeIssues, isKeyOp, keyOpSchema, MONITOR_PROTOCOL_VERSION, registerMsgSchema, syncMsgSchema, type ControllerMsg } from '../protocol/monitor.js';
import { instanceStatsSchema, type EngineSample, type LocationUsage } from '../protocol/instance_stats.js';
import { deploymentSecret } from '../common/auth.js';
import { NonceMemory, unseal } from '../common/replay.js';
import { dtypeByName, DTYPE_NAMES, type DType } from '../common/dtype.js';
import { StoredHistory } from '../common/stored_history.js';
import { STORED_HISTORY_KEYS } from '../protocol/ledger.js';


const log = logger('controller.registry');

export interface WorkerRec {
  routingId: string;
  instanceId: string;
  workerId: number;
  session: string;
  ip: string;
  workerPort: number;
  distributedUrl: string | null;
  /** The engine's HTTP address, when its registration gave one. */
  engineUrl: string | null;
  chunkSize: number;
  modelId: string;
  seed: string;
  /** The KV element type its chunks hold (DType); chunk keys depend on it. */
  kvDtype: DType;
  locations: string[];
  pid: number;
  registeredAt: number;
  lastSeen: number;
  /** location → holder number in the index. */
  holders: Map<string, number>;
  /** Usage per location from the latest heartbeat that carried it (none before the first). */
  usage: Record<string, LocationUsage> | null;
}

/** An engine's counters as reported by a heartbeat, stamped with the controller's clock (ms). */
export interface TimedEngineSample extends EngineSample {
  t: number;
}

/** Engine samples kept per instance: 30 minutes at the default 2.5 s heartbeat. */
export const ENGINE_SAMPLES_KEPT = 720;

export interface HolderRef {
  worker: WorkerRec;
  location: string;
}

export interface RegistryOptions {
  heartbeatTimeoutMs: number;
  /** The controller's PYTHONHASHSEED, compared with each instance's. */
  seed: bigint;
  /** Registrations must carry this deployment secret's tag (default: the process's secret; null: open). */
  secret?: string | null;
}

export class Registry {
  readonly index = new ChunkIndex();
  /** Keys any instance admitted, bounded (the ledger's "stored before", docs/ledger.md). */
  readonly history = new StoredHistory(STORED_HISTORY_KEYS);
  readonly instances = new Map<string, Map<number, WorkerRec>>();
  private readonly byRouting = new Map<string, WorkerRec>();
  private readonly holderRefs = new Map<number, HolderRef>();
  private nextHolder = 1;
  /** Nonces of the registrations accepted within the replay window (a captured one is refused). */
  private readonly registerNonces = new NonceMemory('monitor');
  /** Counters for /metrics. */
  readonly stats = {
    admitted: 0, evicted: 0, synced: 0, reaped: 0, registrations: 0, badMessages: 0, p2pLookups: 0,
    /** Replica hints queued (src/controller/replica_hints.ts): duplicates, last copies, dropped. */
    replicaHeldElsewhere: 0, replicaLastCopy: 0, replicaHintsDropped: 0,
    /** Registrations refused because a key setting differs from the deployment's (keySettingsDiffer). */
    refusedSettings: 0,
    /** Ledger answers by reason (src/controller/miss_reasons.ts). */
    missReasons: { cold: 0, evicted: 0, not_fetched: 0, stale_index: 0 } as Record<string, number>,
  };
  /**
   * The replica hints (src/controller/replica_hints.ts), told while ops are applied: of each key
   * admitted beside other holders, and of each key evicted that other holders still hold; and
   * when a worker leaves the index (sign-off, reap, re-registration), of each of its keys that
   * other holders still hold.
   */
  replicas: { admittedShared(w: WorkerRec, location: string, hi: number, lo: number): void; evictedLeft(hi: number, lo: number, firstLeft: boolean): void } | null = null;
  /** instance_id → its engine's recent samples, oldest first (bounded by ENGINE_SAMPLES_KEPT). */
  private readonly samples = new Map<string, TimedEngineSample[]>();

  /** "instance/worker" → why its last registration was refused (until it registers). */
  readonly refused = new Map<string, { message: string; at: number }>();

  constructor(private readonly opts: RegistryOptions) {}

  /**
   * The key settings of a model group: the controller's hash seed, and the chunk size and KV dtype
   * of the longest-registered instance of `model` (of any model when null; nulls before any
   * registers). Instances of one model must share them: chunk keys hash the seed, the model id,
   * the KV dtype and chunk-size runs of tokens (docs/controller.md "Registration"). Instances of
   * another model form their own group.
   */
  deploymentSettings(model: string | null = null, exclude?: { instanceId: string; workerId: number }): { seed: string; model_id: string | null; chunk_size: number | null; kv_dtype: string | null; set_by: string | null } {
    let ref: WorkerRec | null = null;
    for (const w of this.byRouting.values()) {
      if (exclude && w.instanceId === exclude.instanceId && w.workerId === exclude.workerId) continue;
      if (model !== null && w.modelId !== model) continue;
      if (!ref || w.registeredAt < ref.registeredAt) ref = w;
    }
    return { seed: String(this.opts.seed), model_id: ref?.modelId ?? model, chunk_size: ref?.chunkSize ?? null, kv_dtype: ref ? DTYPE_NAMES[ref.kvDtype] : null, set_by: ref ? `${ref.instanceId}/${ref.workerId}` : null };
  }

  /** The settings of every model group (one per model id registered), oldest group first. */
  groups(): ReturnType<Registry['deploymentSettings']>[] {
    const models = [...this.byRouting.values()].sort((x, y) => x.registeredAt - y.registeredAt).map((w) => w.modelId);
    return [...new Set(models)].map((mid) => this.deploymentSettings(mid));
  }

  /** Why a registering instance's chunk keys could never match its model group's, or null. */
  private keySettingsDiffer(m: { instance_id: string; worker_id: number; seed: string; model_id: string; chunk_size: number }): string | null {
    const d = this.deploymentSettings(m.model_id, { instanceId: m.instance_id, workerId: m.worker_id });
    const by = d.set_by ? ` (set by ${d.set_by}, the first instance of model "${m.model_id}" registered)` : '';
    const tail = 'its chunk keys could never match the other instances\'; start it with the deployment\'s setting';
    if (m.seed !== d.seed) return `hash seed (PYTHONHASHSEED) ${m.seed} differs from the deployment's ${d.seed} (the controller's PYTHONHASHSEED): ${tail}`;
    if (d.chunk_size !== null && m.chunk_size !== d.chunk_size) return `chunk size (chunk_size) ${m.chunk_size} differs from the deployment's ${d.chunk_size}${by}: ${tail}`;
    return null;
  }

  get heartbeatTimeoutMs(): number {
    return this.opts.heartbeatTimeoutMs;
  }

  get heartbeatIntervalMs(): number {
    return Math.max(50, Math.floor(this.opts.heartbeatTimeoutMs / 4));
  }

  holder(h: number): HolderRef | undefined {
    return this.holderRefs.get(h);
  }

  workers(): WorkerRec[] {
    return [...this.byRouting.values()];
  }

  /** Handles one monitor message; returns the reply to send back, if any. */
  /** The registered worker of a monitor session, if any. */
  worker(routingId: string): WorkerRec | undefined {
    return this.byRouting.get(routingId);
  }

  handle(routingId: string, msg: Record<string, unknown>, now = Date.now()): ControllerMsg | null {
    switch (msg.t) {
      case 'register':
        return this.register(routingId, msg, now);
      case 'hb': {
        const w = this.byRouting.get(routingId);
        if (!w) return { t: 'reregister' };
        w.lastSeen = now;
        // Stats are optional; bad ones are reported, but the heartbeat still counts (liveness
        // must not depend on a figure being well formed).
        if (msg.stats !== undefined) {
          const r = instanceStatsSchema.safeParse(msg.stats);
          if (!r.success) return this.bad(routingId, 'hb', `stats: ${r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`);
          w.usage = r.data.locations;
          if (r.data.engine) this.addSample(w.instanceId, { t: now, ...r.data.engine });
        }
        return { t: 'hb_ack' };
      }
      case 'sync': {
        const w = this.byRouting.get(routingId);
        if (!w) return { t: 'reregister' };
        const r = syncMsgSchema.safeParse(msg);
        if (!r.success) return this.bad(routingId, 'sync', r.error.message);
        w.lastSeen = now;
        if (r.data.reset) this.dropHoldings(w);
        // A (re)registered instance forgot its replica marks (controller_client.ts): its synced
        // keys that others hold are duplicates again.
        const hints = this.replicas;
        const loc = r.data.location;
        this.index.addPacked(r.data.keys, this.holderOf(w, loc), hints ? (hi, lo) => hints.admittedShared(w, loc, hi, lo) : undefined);
        this.history.addPacked(r.data.keys);
        this.stats.synced += r.data.keys.byteLength / 8;
        if (r.data.last) log.debug(`${w.instanceId}/${w.workerId}: sync of ${r.data.location} complete`);
        return null;
      }
      case 'ops': {
        const w = this.byRouting.get(routingId);
        if (!w) return { t: 'reregister' };
        // Validation of a whole batch costs about as much as applying it; ops frames are the hot
        // path of ingest, so check the shape cheaply (isKeyOp) and name the problem with the
        // schema only for a malformed op.
        if (!Array.isArray(msg.ops)) return this.bad(routingId, 'ops', 'ops is not an array');
        w.lastSeen = now;
        for (const op of msg.ops as unknown[]) {
          if (!isKeyOp(op)) {
            const r = keyOpSchema.safeParse(op);
            return this.bad(routingId, 'ops', r.success ? 'malformed op' : r.error.message);
          }
          const [kind, loc, keys] = op;
          const h = this.holderOf(w, loc);
          const r = this.replicas;
          if (kind === 1) {
            this.index.addPacked(keys, h, r ? (hi, lo) => r.admittedShared(w, loc, hi, lo) : undefined);
            this.history.addPacked(keys);
            this.stats.admitted += keys.byteLength / 8;
          } else {
            this.index.removePacked(keys, h, r ? (hi, lo, first) => r.evictedLeft(hi, lo, first) : undefined);
            this.stats.evicted += keys.byteLength / 8;
          }
        }
        return null;
      }
      case 'bye': {
        const w = this.byRouting.get(routingId);
        if (w) {
          log.info(`${w.instanceId}/${w.workerId} signed off`);
          this.dropWorker(w);
        }
        return null;
      }
      default:
        return this.bad(routingId, String(msg.t), 'unknown message type');
    }
  }

  bad(routingId: string, what: string, why: string): ControllerMsg {
    this.stats.badMessages++;
    log.warn(`dropped malformed ${what} message from ${routingId}: ${why}`);
    return { t: 'error', message: `malformed ${what} message: ${why}` };
  }

  private register(routingId: string, msg: Record<string, unknown>, now: number): ControllerMsg {
    const r = registerMsgSchema.safeParse(msg);
    if (!r.success) return this.bad(routingId, 'register', describeIssues(r.error));
    const m = r.data;
    const secret = this.opts.secret === undefined ? deploymentSecret() : this.opts.secret;
    // The seal covers the raw message (before the schema's defaults), as the instance sent it.
    const refused = unseal(secret, this.registerNonces, msg);
    if (refused) {
      this.stats.badMessages++;
      log.warn(`refused registration of ${m.instance_id}/${m.worker_id} (from ${m.ip}:${m.worker_port}): ${refused.reason}: ${refused.message}`);
      return { t: 'error', message: `registration refused (${refused.reason}): ${refused.message}` };
    }
    if (m.v !== MONITOR_PROTOCOL_VERSION) return { t: 'error', message: `monitor protocol version ${m.v} is not supported (controller speaks ${MONITOR_PROTOCOL_VERSION})` };
    const differs = this.keySettingsDiffer(m);
    if (differs) {
      this.stats.refusedSettings++;
      this.refused.set(`${m.instance_id}/${m.worker_id}`, { message: differs, at: now });
      log.error(`refused registration of ${m.instance_id}/${m.worker_id} (from ${m.ip}:${m.worker_port}): ${differs}`);
      return { t: 'error', message: `registration refused: ${differs}` };
    }
    // One KV dtype per model in a deployment: instances of one model share chunks only when they
    // hold the same dtype (it is part of every key), so a second dtype would only split the cache.
    const kvDtype = dtypeByName(m.kv_dtype)!;
    for (const other of this.workers()) {
      if (other.modelId === m.model_id && other.kvDtype !== kvDtype && !(other.instanceId === m.instance_id && other.workerId === m.worker_id)) {
        log.warn(`refused registration of ${m.instance_id}/${m.worker_id}: KV dtype ${m.kv_dtype}, but ${other.instanceId} serves ${m.model_id} with ${DTYPE_NAMES[other.kvDtype]}`);
        this.stats.refusedSettings++;
        this.refused.set(`${m.instance_id}/${m.worker_id}`, { message: `KV dtype ${m.kv_dtype} differs from instance "${other.instanceId}"'s ${DTYPE_NAMES[other.kvDtype]}`, at: now });
        return { t: 'error', message: `registration refused: this instance holds KV as ${m.kv_dtype}, but instance "${other.instanceId}" of model "${m.model_id}" holds ${DTYPE_NAMES[other.kvDtype]}; chunk keys include the KV dtype, so the two would never share a chunk — run every engine of a model with the same --kv-cache-dtype` };
      }
    }
    this.refused.delete(`${m.instance_id}/${m.worker_id}`);
    let byWorker = this.instances.get(m.instance_id);
    const holder = byWorker?.get(m.worker_id);
    // The same (instance_id, worker_id) from another address while the registered one is still
    // heartbeating is a configuration error (two engines with one kvc_instance_id): refuse it
    // rather than let the two replace each other forever. From the same address it is the
    // engine restarted (a new session) and replaces the old registration at once.
    if (holder && holder.routingId !== routingId && now - holder.lastSeen <= this.opts.heartbeatTimeoutMs &&
        (holder.ip !== m.ip || holder.workerPort !== m.worker_port || holder.distributedUrl !== m.distributed_url)) {
      log.warn(`refused registration of ${m.instance_id}/${m.worker_id} from ${m.ip}:${m.worker_port}: already registered from ${holder.ip}:${holder.workerPort}`);
      return { t: 'error', message: `kvc_instance_id "${m.instance_id}" worker ${m.worker_id} is already registered from ${holder.ip}:${holder.workerPort} (distributed_url ${holder.distributedUrl ?? 'none'}); every instance needs its own kvc_instance_id` };
    }
    const previous = holder ?? this.byRouting.get(routingId);
    if (previous) {
      this.dropWorker(previous);
      // Dropping the last worker of an instance removes the instance's map: fetch it again, or
      // the new record would go into the detached one (the instance vanishing for good while its
      // heartbeats are still acknowledged).
      byWorker = this.instances.get(m.instance_id);
    }
    const w: WorkerRec = {
      routingId,
      instanceId: m.instance_id,
      workerId: m.worker_id,
      session: m.session,
      ip: m.ip,
      workerPort: m.worker_port,
      distributedUrl: m.distributed_url,
      engineUrl: m.engine_url ?? null,
      chunkSize: m.chunk_size,
      modelId: m.model_id,
      seed: m.seed,
      kvDtype,
      locations: m.locations,
      pid: m.pid,
      registeredAt: now,
      lastSeen: now,
      holders: new Map(),
      usage: null,
    };
    for (const loc of m.locations) this.holderOf(w, loc);
    if (!byWorker) this.instances.set(m.instance_id, (byWorker = new Map()));
    byWorker.set(m.worker_id, w);
    this.byRouting.set(routingId, w);
    this.stats.registrations++;
    log.info(
      `registered ${m.instance_id}/${m.worker_id} (model ${m.model_id}, chunk ${m.chunk_size}, KV ${m.kv_dtype}, worker ${m.ip}:${m.worker_port}, ` +
        `peer ${m.distributed_url ?? 'none'}, locations ${m.locations.join(',') || 'none'})${previous ? ', replacing its previous session' : ''}`,
    );
    return { t: 'welcome', heartbeat_interval_ms: this.heartbeatIntervalMs };
  }

  private addSample(instanceId: string, sample: TimedEngineSample): void {
    let list = this.samples.get(instanceId);
    if (!list) this.samples.set(instanceId, (list = []));
    list.push(sample);
    if (list.length > ENGINE_SAMPLES_KEPT) list.splice(0, list.length - ENGINE_SAMPLES_KEPT);
  }

  /** The engine samples of every registered instance, oldest first. */
  engineSamples(): Record<string, TimedEngineSample[]> {
    const out: Record<string, TimedEngineSample[]> = {};
    for (const id of this.instances.keys()) out[id] = this.samples.get(id) ?? [];
    return out;
  }

  private holderOf(w: WorkerRec, location: string): number {
    let h = w.holders.get(location);
    if (h === undefined) {
      h = this.nextHolder++;
      w.holders.set(location, h);
      this.holderRefs.set(h, { worker: w, location });
      if (!w.locations.includes(location)) w.locations.push(location);
    }
    return h;
  }

  private dropHoldings(w: WorkerRec): void {
    // Dropping rebuilds the index table: skip it when the worker holds nothing (a first
    // registration, or a re-sync right after one).
    const held = new Set([...w.holders.values()].filter((h) => this.index.count(h) > 0));
    // Keys the worker shared and that are now on one instance only get a last-copy hint, as
    // after an eviction (docs/storage.md "Replica-aware eviction"): on a sign-off or a reap the
    // survivor may hold the deployment's only copy, marked as a replica because the leaver had
    // it first. Also when the worker is dropped to be synced again (a new session replacing the
    // old one, a reset sync): the re-synced worker forgot its own marks at its welcome, and its
    // sync marks every key another instance holds as held elsewhere; without the hint, a
    // survivor whose copy was marked because of the worker would stay marked too, and both
    // copies would leave first (the lockstep loss the marks exist to avoid). With it, the
    // survivor's copy is the first one and the re-synced worker's the duplicate, the order the
    // index now records. The keys come from the rebuild's one walk; the hints are batched and
    // bounded like the others (src/controller/replica_hints.ts).
    const hints = this.replicas;
    this.index.dropHolders(held, hints ? (hi, lo, first) => hints.evictedLeft(hi, lo, first) : undefined);
  }

  dropWorker(w: WorkerRec): void {
    this.dropHoldings(w);
    for (const h of w.holders.values()) this.holderRefs.delete(h);
    this.byRouting.delete(w.routingId);
    const byWorker = this.instances.get(w.instanceId);
    if (byWorker?.get(w.workerId) === w) {
      byWorker.delete(w.workerId);
      if (byWorker.size === 0) {
        this.instances.delete(w.instanceId);
        this.samples.delete(w.instanceId);
      }
    }
  }

  /** Drops every worker silent for longer than the heartbeat timeout; returns them. */
  reap(now = Date.now()): WorkerRec[] {
    const dead = this.workers().filter((w) => now - w.lastSeen > this.opts.heartbeatTimeoutMs);
    for (const w of dead) {
      log.warn(`reaping ${w.instanceId}/${w.workerId}: no heartbeat for ${now - w.lastSeen} ms (timeout ${this.opts.heartbeatTimeoutMs} ms); its ${this.chunkCount(w)} chunks leave the index`);
      this.dropWorker(w);
      this.stats.reaped++;
    }
    return dead;
  }

  chunkCount(w: WorkerRec): number {
    let n = 0;
    for (const h of w.holders.values()) n += this.index.count(h);
    return n;
  }
}

// The instance side of the controller (docs/controller.md), attached by the engine when the cache
// YAML has enable_controller: true:
//   - the worker command port (kvc_worker_port, HTTP; src/kvc/worker_server.ts),
//   - the peer chunk server on distributed_url (src/kvc/worker_peer.ts),
//   - a ZeroMQ DEALER to controller_url that registers, heartbeats, forwards the store's
//     admit/evict events in ordered batches and sends the full key list after every
//     (re)registration; it applies the controller's replica hints to the store
//     (src/protocol/replica_hint.ts).
//
// Connection state: `registering` (register sent every heartbeat interval until a welcome)
// → `live` (full sync, then batched ops and heartbeats). Missing heartbeat acks, a
// `reregister` reply (controller restarted or reaped us) or an ops batch that could not be
// queued all go back to `registering`: events are never dropped silently, they are covered
// by the full sync that follows.
import { randomBytes } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { Dealer } from 'zeromq';
import type { KvLayout } from '../common/chunk.js';
import { DType, DTYPE_NAMES } from '../common/dtype.js';
import type { CacheConfig } from '../common/config.js';
import { logger } from '../common/log.js';
import { SendQueue } from '../common/send_queue.js';
import { decodeMsg, encodeMsg, MONITOR_PROTOCOL_VERSION, packKeys, SYNC_PART_KEYS, unpackKeys, type InstanceMsg, type KeyOp } from '../protocol/monitor.js';
import { replicaHintMsgSchema } from '../protocol/replica_hint.js';
import type { EngineSample, InstanceStats } from '../protocol/instance_stats.js';
import type { KvcStore } from './store.js';
import type { KeyEvent } from './types.js';
import { parseHostPort, startPeerServer, type PeerServer } from './worker_peer.js';
import { startWorkerServer } from './worker_server.js';
import { ControllerQuestions } from './controller_questions.js';
import { DEFAULT_ZMQ_MAX_MESSAGE_BYTES } from '../common/limits.js';
import { deploymentSecret } from '../common/auth.js';
import { seal } from '../common/replay.js';
import { instanceAddresses, urlHost } from '../common/address.js';
import { MISS_CODES, missReasonsMsgSchema, type MissLookupMsg, type MissReason } from '../protocol/ledger.js';
import { p2pHoldersMsgSchema, P2P_LOOKUP_MAX_KEYS, type P2pHolder, type P2pLookupMsg } from '../protocol/p2p_holders.js';

const log = logger('kvc.controller_client');

export interface AttachOptions {
  modelId: string;
  chunkSize: number;
  seed: bigint;
  /** KV layout of the engine's model; incoming chunks must match it. */
  layout?: KvLayout | null;
  /** Tensor-parallel rank; 0 for the single-process engine. */
  workerId?: number;
  /** How often ops are flushed (ms) and the largest batch (keys). */
  flushMs?: number;
  maxBatchKeys?: number;
  /**
   * The engine's counters, sent with every heartbeat for the controller's dashboard. A failure
   * only leaves them out of that heartbeat.
   */
  engineSample?: () => Promise<EngineSample>;
  /**
   * The engine's --host and advertised address: the worker port binds the engine's --host when
   * the cache YAML has no distributed_url, and a wildcard bind is advertised as the engine's
   * address (src/common/address.ts). Default: loopback (an in-process instance).
   */
  engineAddress?: { bindHost: string; advertiseHost: string; advertiseExplicit: boolean };
  /** The engine's HTTP address, registered for the dashboard's prompt tokenization. */
  engineUrl?: string;
}

export interface ControllerAttachment {
  /** Signs off from the controller and stops the worker and peer servers. */
  close(): Promise<void>;
  /** For tests and logs: whether the controller has welcomed this worker. */
  readonly state: 'registering' | 'live' | 'closed';
  readonly workerPort: number;
  readonly peerPort: number | null;
  /** The address registered with the controller (worker port and distributed_url host). */
  readonly advertiseHost: string;
  /**
   * P2P holder query (src/protocol/p2p_holders.ts): which other instances hold the leading
   * `keys`, best first. Rejects at once when the controller connection is not live, and after
   * `timeoutMs` without an answer.
   */
  askHolders(keys: readonly string[], timeoutMs: number): Promise<P2pHolder[]>;
  /**
   * The ledger's question (src/protocol/ledger.ts): why each of these just-computed chunks was not
   * reused, one reason per key. Rejects when the connection is not live or after `timeoutMs`.
   */
  askMissReasons(keys: readonly string[], timeoutMs: number): Promise<MissReason[]>;
}

export async function attachController(store: KvcStore, cfg: CacheConfig, o: AttachOptions): Promise<ControllerAttachment> {
  if (!cfg.controller_url) throw new Error('cache config: controller_url is required when enable_controller is true');
  if (cfg.kvc_worker_port === null) throw new Error('cache config: kvc_worker_port is required when enable_controller is true');
  const workerId = o.workerId ?? 0;
  const peerAddr = cfg.distributed_url ? parseHostPort(cfg.distributed_url) : null;
  // The worker and peer ports bind the host of distributed_url (else the engine's --host); the
  // controller is told the advertised address, which peers on other machines can reach.
  const addr = instanceAddresses(cfg, o.engineAddress ?? { bindHost: '127.0.0.1', advertiseHost: '127.0.0.1', advertiseExplicit: false });
  const bindIp = addr.bindHost;
  const ip = addr.advertiseHost;
  const advertisedUrl = peerAddr ? `${urlHost(ip)}:${peerAddr.port}` : null;

  let worker: FastifyInstance | null = null;
  let peer: PeerServer | null = null;
  try {
    worker = await startWorkerServer(store, { instanceId: cfg.kvc_instance_id, workerId, modelId: o.modelId, chunkSize: o.chunkSize }, bindIp, cfg.kvc_worker_port);
    if (peerAddr) peer = await startPeerServer(store, peerAddr.host, peerAddr.port, { layout: o.layout ?? null, chunkSize: o.chunkSize });
  } catch (e) {
    await worker?.close();
    throw new Error(`cannot start the controller worker of instance "${cfg.kvc_instance_id}": ${(e as Error).message}`);
  }

  const session = randomBytes(8).toString('hex');
  const sock = new Dealer({ routingId: session, linger: 0, maxMessageSize: DEFAULT_ZMQ_MAX_MESSAGE_BYTES, immediate: true, sendHighWaterMark: 10_000, sendTimeout: 2000, reconnectInterval: 100, reconnectMaxInterval: 1000 });
  sock.connect(`tcp://${cfg.controller_url}`);

  type State = 'registering' | 'live' | 'closed';
  let state = 'registering' as State;
  const isClosed = () => state === 'closed';
  let intervalMs = 1000;
  let lastAck = Date.now();
  /** Pending ops with hex keys; packed when flushed. */
  let ops: [0 | 1, string, string[]][] = [];
  let opsKeys = 0;
  let flushTimer: NodeJS.Timeout | null = null;
  let registerInFlight = false;
  let lastError = '';
  const flushMs = o.flushMs ?? 20;
  const maxBatch = o.maxBatchKeys ?? 16_384;

  /** Holder and miss-reason queries awaiting their answer; a lost registration answers none: failQueries ends them at once. */
  const questions = new ControllerQuestions();
  const failQueries = (why: string) => questions.failAll(why);
  const toRegistering = (why: string) => {
    if (state !== 'live') return;
    log.warn(`controller connection lost (${why}); re-registering`);
    failQueries(`controller connection lost (${why})`);
    state = 'registering';
    ops = [];
    opsKeys = 0;
  };
  const out = new SendQueue(
    (f) => sock.send(f),
    (e) => toRegistering(`send failed: ${(e as Error).message}`),
  );
  const send = (m: InstanceMsg | P2pLookupMsg | MissLookupMsg) => out.send(encodeMsg(m));

  // One register per heartbeat interval at most: several `reregister` replies arriving together
  // (heartbeat, ops...) must not each start a registration and a full sync.
  let lastRegisterAt = 0;
  const register = () => {
    if (state !== 'registering' || registerInFlight || Date.now() - lastRegisterAt < intervalMs) return;
    registerInFlight = true;
    lastRegisterAt = Date.now();
    void send(seal(deploymentSecret(), 'monitor', {
      t: 'register',
      v: MONITOR_PROTOCOL_VERSION,
      instance_id: cfg.kvc_instance_id,
      worker_id: workerId,
      session,
      ip,
      worker_port: cfg.kvc_worker_port!,
      distributed_url: advertisedUrl,
      chunk_size: o.chunkSize,
      model_id: o.modelId,
      seed: String(o.seed),
      kv_dtype: DTYPE_NAMES[o.layout?.dtype ?? DType.f32],
      locations: store.locations(),
      pid: process.pid,
      ...(o.engineUrl ? { engine_url: o.engineUrl } : {}),
    })).finally(() => (registerInFlight = false));
  };

  /** The snapshot is taken synchronously, so every later store event comes after it on the socket. */
  const fullSync = () => {
    ops = [];
    opsKeys = 0;
    const locs = store.locations();
    let first = true;
    if (locs.length === 0) return;
    locs.forEach((loc, li) => {
      const keys = store.keys(loc);
      const parts = Math.max(1, Math.ceil(keys.length / SYNC_PART_KEYS));
      for (let p = 0; p < parts; p++) {
        void send({ t: 'sync', location: loc, keys: packKeys(keys.slice(p * SYNC_PART_KEYS, (p + 1) * SYNC_PART_KEYS)), reset: first, last: li === locs.length - 1 && p === parts - 1 });
        first = false;
      }
    });
  };

  const flush = () => {
    if (flushTimer) clearTimeout(flushTimer);
    flushTimer = null;
    if (state !== 'live' || ops.length === 0) return;
    const batch = ops;
    ops = [];
    opsKeys = 0;
    void send({ t: 'ops', ops: batch.map(([k, loc, keys]): KeyOp => [k, loc, packKeys(keys)]) });
  };

  const onEvent = (kind: 0 | 1) => (e: KeyEvent) => {
    if (state !== 'live' || e.keys.length === 0) return;
    const last = ops[ops.length - 1];
    // Merge with the previous op of the same kind and location; order across kinds is kept.
    if (last && last[0] === kind && last[1] === e.location) for (const k of e.keys) last[2].push(k);
    else ops.push([kind, e.location, e.keys.slice()]);
    opsKeys += e.keys.length;
    if (opsKeys >= maxBatch) flush();
    else flushTimer ??= setTimeout(flush, flushMs);
  };
  const onAdmit = onEvent(1);
  const onEvict = onEvent(0);
  store.on('admit', onAdmit);
  store.on('evict', onEvict);

  let hbTimer: NodeJS.Timeout | null = null;
  /** A heartbeat carrying this instance's usage per location and, in an engine, its counters. */
  const heartbeat = async () => {
    const stats: InstanceStats = {
      locations: Object.fromEntries(store.stats().map((b) => [b.location, { bytes: b.usedBytes, capacity_bytes: b.capacityBytes, chunks: b.chunks, pinned: b.pinned }])),
    };
    if (o.engineSample) {
      try {
        stats.engine = await o.engineSample();
      } catch (e) {
        log.debug(`engine figures left out of a heartbeat: ${(e as Error).message}`);
      }
    }
    if (state === 'live') await send({ t: 'hb', stats });
  };
  const tick = () => {
    if (state === 'registering') register();
    else if (state === 'live') {
      if (Date.now() - lastAck > 3 * intervalMs + 1000) toRegistering(`no heartbeat ack for ${Date.now() - lastAck} ms`);
      else void heartbeat();
    }
  };
  const restartHeartbeat = () => {
    if (hbTimer) clearInterval(hbTimer);
    hbTimer = setInterval(tick, intervalMs);
    hbTimer.unref();
  };
  const receiving = (async () => {
    try {
      for await (const [body] of sock) {
        const m = body ? decodeMsg(body) : null;
        if (!m) continue;
        if (m.t === 'welcome') {
          intervalMs = typeof m.heartbeat_interval_ms === 'number' && m.heartbeat_interval_ms > 0 ? m.heartbeat_interval_ms : 1000;
          lastAck = Date.now();
          if (isClosed()) continue;
          const was = state;
          state = 'live';
          lastError = '';
          // Replica marks are the controller's advice from before; it may have restarted (or
          // reaped us) and lost what they rest on. Forget them: the sync that follows makes the
          // controller mark again what others hold.
          store.clearReplicaMarks();
          fullSync();
          // Usage and figures at once, not one heartbeat interval later.
          void heartbeat();
          log.info(`${was === 'live' ? 're-welcomed' : 'registered'} with controller ${cfg.controller_url} as ${cfg.kvc_instance_id}/${workerId}; full key sync sent`);
          restartHeartbeat();
        } else if (m.t === 'hb_ack') {
          lastAck = Date.now();
        } else if (m.t === 'p2p_holders') {
          questions.answer('p2p_holders', m, (x) => p2pHoldersMsgSchema.safeParse(x));
        } else if (m.t === 'miss_reasons') {
          questions.answer('miss_reasons', m, (x) => missReasonsMsgSchema.safeParse(x));
        } else if (m.t === 'replicas') {
          const r = replicaHintMsgSchema.safeParse(m);
          if (r.success) store.markReplicas(r.data.location, unpackKeys(r.data.keys), r.data.held_elsewhere);
          else log.warn(`ignored a malformed replica hint from the controller: ${r.error.issues[0]?.message ?? 'invalid'}`);
        } else if (m.t === 'reregister') {
          if (state === 'live') {
            log.info('controller does not know this worker (restarted or reaped it); re-registering');
            failQueries('the controller does not know this instance (re-registering)');
            state = 'registering';
            ops = [];
            opsKeys = 0;
          }
          register();
        } else if (m.t === 'error') {
          // Said once per distinct message: a refused registration is retried every interval.
          const msg = String(m.message);
          if (msg !== lastError) log.error(`controller refused a message: ${msg}`);
          lastError = msg;
        }
      }
    } catch (e) {
      if (!isClosed()) log.error(`controller connection receive loop stopped: ${(e as Error).message}`);
    }
  })();

  restartHeartbeat();
  register();

  return {
    get state() {
      return state;
    },
    workerPort: cfg.kvc_worker_port,
    peerPort: peer?.port ?? null,
    advertiseHost: ip,
    askHolders(keys, timeoutMs) {
      if (state !== 'live') return Promise.reject(new Error(`the controller connection is ${state}`));
      if (keys.length === 0) return Promise.resolve([]);
      return questions.ask(
        'holder query',
        'p2p_holders',
        timeoutMs,
        (id) => send({ t: 'p2p_lookup', id, keys: packKeys(keys.slice(0, P2P_LOOKUP_MAX_KEYS)) }),
        (a: { holders: P2pHolder[] }) => a.holders,
      );
    },
    askMissReasons(keys, timeoutMs) {
      if (state !== 'live') return Promise.reject(new Error(`the controller connection is ${state}`));
      if (keys.length === 0) return Promise.resolve([]);
      // This instance's admits and evicts so far go first: the answer must see them.
      flush();
      return questions.ask(
        'miss query',
        'miss_reasons',
        timeoutMs,
        (id) => send({ t: 'miss_lookup', id, keys: packKeys(keys) }),
        ({ reasons }: { reasons: Uint8Array }): MissReason[] => {
          if (reasons.length !== keys.length) throw new Error(`miss_reasons answered ${reasons.length} reasons for ${keys.length} keys`);
          return [...reasons].map((c) => MISS_CODES[c] ?? 'unexplained');
        },
      );
    },
    async close() {
      if (state === 'closed') return;
      const wasLive = state === 'live';
      flush();
      failQueries('the cache instance is closing');
      state = 'closed';
      if (hbTimer) clearInterval(hbTimer);
      if (flushTimer) clearTimeout(flushTimer);
      store.off('admit', onAdmit);
      store.off('evict', onEvict);
      if (wasLive) await Promise.race([send({ t: 'bye' }), new Promise((r) => setTimeout(r, 500))]);
      sock.close();
      await receiving;
      await worker?.close();
      await peer?.close();
    },
  };
}

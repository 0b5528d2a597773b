// LMCache compatibility of the cache YAML and connector JSON: LMCache's key names, current and
// older, are read as kvc's (the table is in docs/configuration.md), LMCache keys for features kvc
// does not have are accepted only with the value that means "off" (so an LMCache file that leaves
// them off starts as is) and refused by name with the reason otherwise, and `file://` URLs of
// local_disk become paths. Everything here is
// a pure rewrite of the parsed document; validation happens after it, on kvc's names.
import { fileURLToPath } from 'node:url';

/**
 * LMCache key → kvc key: LMCache's current names (`pd_*`, `controller_pull_url`) and the older
 * `nixl_*` ones it still accepts. A port LMCache lists once per tensor-parallel rank
 * (LIST_PER_RANK) is one value here: kvc runs one worker per instance.
 */
export const CACHE_KEY_ALIASES: Readonly<Record<string, string>> = {
  lmcache_instance_id: 'kvc_instance_id',
  lmcache_worker_port: 'kvc_worker_port',
  lmcache_worker_ports: 'kvc_worker_port',
  controller_pull_url: 'controller_url',
  enable_pd: 'enable_xfer',
  enable_nixl: 'enable_xfer',
  pd_role: 'xfer_role',
  nixl_role: 'xfer_role',
  pd_proxy_host: 'xfer_proxy_host',
  nixl_proxy_host: 'xfer_proxy_host',
  pd_proxy_port: 'xfer_proxy_port',
  nixl_proxy_port: 'xfer_proxy_port',
  pd_peer_host: 'xfer_peer_host',
  nixl_peer_host: 'xfer_peer_host',
  pd_peer_init_port: 'xfer_peer_init_port',
  nixl_peer_init_port: 'xfer_peer_init_port',
  pd_peer_alloc_port: 'xfer_peer_alloc_port',
  nixl_peer_alloc_port: 'xfer_peer_alloc_port',
  pd_buffer_size: 'xfer_buffer_size',
  nixl_buffer_size: 'xfer_buffer_size',
  pd_buffer_device: 'xfer_buffer_device',
  nixl_buffer_device: 'xfer_buffer_device',
  nixl_backends: 'xfer_backends',
};
// nixl_backends is read as xfer_backends ["tcp"] whatever NIXL transports it names (UCX, ...).

/** LMCache keys that hold one value per tensor-parallel rank: a scalar or a one-element list. */
export const LIST_PER_RANK: ReadonlySet<string> = new Set(['lmcache_worker_ports', 'pd_peer_init_port', 'pd_peer_alloc_port', 'p2p_init_ports']);

/**
 * LMCache keys kvc reads by what they mean rather than by a rename: the P2P address
 * (p2p_host + p2p_init_ports: the peer port, kvc's distributed_url) and the transfer channel.
 */
export const CACHE_KEYS_COMPOSED: Readonly<Record<string, string>> = {
  p2p_host: 'with p2p_init_ports: distributed_url "<p2p_host>:<port>" (the peer port P2P fetches and moves use)',
  p2p_init_ports: 'with p2p_host: the port of distributed_url',
  transfer_channel: '"nixl" or "tcp": kvc moves KV over its own TCP transfer (xfer); NIXL itself is not used (CPU engine)',
};
const TRANSFER_CHANNELS = ['nixl', 'tcp'];

/**
 * LMCache keys of features kvc does not implement: the values that leave the feature off (and
 * are therefore honoured as they are), and why any other value is refused.
 */
export const CACHE_KEYS_OFF_ONLY: Readonly<Record<string, { off: readonly unknown[]; reason: string }>> = {
  save_decode_cache: { off: [false], reason: 'decode-phase KV is not stored (only prompt KV is)' },
  enable_blending: { off: [false], reason: 'CacheBlend is not implemented' },
  blend_recompute_ratio: { off: [null], reason: 'CacheBlend is not implemented' },
  blend_min_tokens: { off: [null], reason: 'CacheBlend is not implemented' },
  blend_special_str: { off: [null], reason: 'CacheBlend is not implemented' },
  lookup_url: { off: [null], reason: 'P2P asks the controller named by controller_url which instance holds a chunk; there is no separate lookup server' },
  p2p_lookup_ports: { off: [null], reason: 'P2P asks the controller which instance holds a chunk; an instance serves no lookup port (its peer port is p2p_init_ports / distributed_url)' },
  controller_reply_url: { off: [null], reason: "an instance and the controller talk over one connection to controller_url (the controller's --monitor-port); there is no separate reply port: remove this key" },
  lmcache_worker_ids: { off: [null, 0], reason: 'a kvc instance has one worker, id 0' },
  lmcache_worker_heartbeat_time: { off: [null], reason: 'the heartbeat interval is fixed (the controller reaps a worker after its --heartbeat-timeout)' },
  use_layerwise: { off: [false], reason: 'layer-wise transfer is not implemented (whole chunks move)' },
  enable_async_loading: { off: [false], reason: 'asynchronous loading is not implemented' },
  save_unfull_chunk: { off: [true], reason: 'the last partial chunk is saved unless the connector\'s discard_partial_chunks is true; set that instead' },
  cache_policy: { off: ['LRU', 'lru'], reason: 'eviction is LRU' },
  error_handling: { off: [false], reason: 'a failing tier is never skipped silently' },
  extra_config: { off: [null], reason: 'no extra configuration keys exist' },
  numa_mode: { off: [null], reason: 'NUMA placement is not implemented' },
  external_lookup_client: { off: [null], reason: 'external lookup clients are not implemented' },
  internal_api_server_enabled: { off: [false], reason: 'the internal API server is not implemented (use the controller)' },
};

/** Every LMCache name the cache YAML reads (besides kvc's own keys). */
export const LMCACHE_NAMES = [...Object.keys(CACHE_KEY_ALIASES), ...Object.keys(CACHE_KEYS_COMPOSED), ...Object.keys(CACHE_KEYS_OFF_ONLY)];

/** Connector JSON: LMCache's names for kvc's. */
export const CONNECTOR_ALIASES = {
  connector: { LMCacheConnectorV1: 'KvcConnectorV1' } as Readonly<Record<string, string>>,
  extra: { lmcache_rpc_port: 'kvc_rpc_port' } as Readonly<Record<string, string>>,
};

export interface Rewritten {
  doc: Record<string, unknown>;
  /** One line per alias applied (logged at info level). */
  notes: string[];
}

/**
 * Applies the aliases to a parsed cache document. Throws a message (without the source prefix)
 * for a key given under both names, an LMCache feature switched on, or a bad local_disk URL.
 */
export function rewriteCacheDoc(raw: Record<string, unknown>): Rewritten {
  const doc: Record<string, unknown> = {};
  const notes: string[] = [];
  for (const [k, v0] of Object.entries(raw)) {
    const off = CACHE_KEYS_OFF_ONLY[k];
    const v = Array.isArray(v0) && v0.length === 1 && k === 'lmcache_worker_ids' ? v0[0] : v0;
    if (off) {
      if (off.off.some((o) => o === v)) continue;
      throw new Error(`key "${k}": only ${off.off.map((o) => JSON.stringify(o)).join(' or ')} is accepted (${off.reason}); found ${JSON.stringify(v0)}`);
    }
    if (k in CACHE_KEYS_COMPOSED) continue;
    if (k === 'nixl_backends') {
      // NIXL's own transports (UCX, GDS, ...): kvc moves KV over its TCP transfer instead.
      if (!Array.isArray(v0) || !v0.every((b) => typeof b === 'string')) throw new Error(`key "nixl_backends": expected a list of NIXL backend names; found ${JSON.stringify(v0)}`);
      set('xfer_backends', ['tcp'], k);
      notes.push(`LMCache key "nixl_backends" ${JSON.stringify(v0)}: kvc's transfer runs over TCP; NIXL backends are not used (CPU engine)`);
      continue;
    }
    const to = CACHE_KEY_ALIASES[k];
    if (to) set(to, LIST_PER_RANK.has(k) ? onePerRank(k, v0) : v0, k);
    else set(k, v0, null);
  }
  // transfer_channel: what carries KV between prefiller and decoder; kvc's is its TCP transfer.
  if ('transfer_channel' in raw) {
    const ch = raw.transfer_channel;
    if (ch !== null && !(typeof ch === 'string' && TRANSFER_CHANNELS.includes(ch.toLowerCase()))) {
      throw new Error(`key "transfer_channel": expected ${TRANSFER_CHANNELS.map((c) => `"${c}"`).join(' or ')} (kvc moves KV over its own TCP transfer, xfer); found ${JSON.stringify(ch)}`);
    }
    if (ch !== null) notes.push(`LMCache key "transfer_channel" ${JSON.stringify(ch)} read as kvc's TCP transfer (xfer)${String(ch).toLowerCase() === 'nixl' ? '; NIXL itself is not used (CPU engine)' : ''}`);
  }
  // p2p_host + p2p_init_ports: LMCache's P2P address, kvc's distributed_url (the peer port).
  if ('p2p_host' in raw || 'p2p_init_ports' in raw) {
    const host = raw.p2p_host;
    const ports = raw.p2p_init_ports;
    if (host === undefined || host === null || ports === undefined || ports === null) {
      throw new Error(`keys "p2p_host" and "p2p_init_ports": give both (they make this instance's peer address, distributed_url) or neither; found p2p_host ${JSON.stringify(host ?? null)}, p2p_init_ports ${JSON.stringify(ports ?? null)}`);
    }
    if (typeof host !== 'string' || host === '') throw new Error(`key "p2p_host": expected a host name or address; found ${JSON.stringify(host)}`);
    const port = onePerRank('p2p_init_ports', ports);
    set('distributed_url', `${host}:${String(port)}`, 'p2p_host", "p2p_init_ports');
  }
  function set(key: string, v: unknown, from: string | null) {
    if (key in doc) throw new Error(`key "${key}" is given twice (also as "${from ?? key}")`);
    doc[key] = v;
    if (from) notes.push(`LMCache key "${from}" read as "${key}"`);
  }
  const disk = doc.local_disk;
  if (typeof disk === 'string' && /^[a-z][a-z0-9+.-]*:\/\//i.test(disk)) {
    if (!disk.startsWith('file://')) throw new Error(`key "local_disk": expected a directory or a file:// URL; found ${JSON.stringify(disk)}`);
    let path: string;
    try {
      path = fileURLToPath(disk);
    } catch (e) {
      throw new Error(`key "local_disk": ${(e as Error).message}; found ${JSON.stringify(disk)}`);
    }
    doc.local_disk = path;
    notes.push(`local_disk ${disk} read as the directory ${path}`);
  }
  return { doc, notes };
}

/** A per-rank LMCache value: a scalar, or a list of one (kvc runs one worker: no tensor parallelism). */
function onePerRank(key: string, v: unknown): unknown {
  if (!Array.isArray(v)) return v;
  if (v.length !== 1) throw new Error(`key "${key}": LMCache lists one value per tensor-parallel rank; a kvc instance has one worker, so exactly one is accepted; found ${JSON.stringify(v)}`);
  return v[0];
}

// LMCache compatibility of the cache YAML and connector JSON: LMCache's key names are read as
// kvc's (the mapping is listed in docs/configuration.md), LMCache keys for features kvc does
// not have are accepted only with the value that means "off" (so an LMCache file that leaves
// them off starts as is), and `file://` URLs of local_disk become paths. Everything here is
// a pure rewrite of the parsed document; validation happens after it, on kvc's names.
import { fileURLToPath } from 'node:url';

/** LMCache key → kvc key. */
export const CACHE_KEY_ALIASES: Readonly<Record<string, string>> = {
  lmcache_instance_id: 'kvc_instance_id',
  lmcache_worker_port: 'kvc_worker_port',
  enable_nixl: 'enable_xfer',
  nixl_role: 'xfer_role',
  nixl_proxy_host: 'xfer_proxy_host',
  nixl_proxy_port: 'xfer_proxy_port',
  nixl_peer_host: 'xfer_peer_host',
  nixl_peer_init_port: 'xfer_peer_init_port',
  nixl_peer_alloc_port: 'xfer_peer_alloc_port',
  nixl_buffer_size: 'xfer_buffer_size',
  nixl_buffer_device: 'xfer_buffer_device',
  nixl_backends: 'xfer_backends',
};

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
  use_layerwise: { off: [false], reason: 'layer-wise transfer is not implemented (whole chunks move)' },
  enable_async_loading: { off: [false], reason: 'asynchronous loading is not implemented' },
  save_unfull_chunk: { off: [true], reason: 'the last partial chunk is saved unless the connector\'s discard_partial_chunks is true; set that instead' },
  cache_policy: { off: ['LRU', 'lru'], reason: 'eviction is LRU' },
  remote_serde: { off: ['naive', null], reason: 'chunks are stored as raw bytes (the "naive" serializer); no compressing serializer exists' },
  error_handling: { off: [false], reason: 'a failing tier is never skipped silently' },
  extra_config: { off: [null], reason: 'no extra configuration keys exist' },
  numa_mode: { off: [null], reason: 'NUMA placement is not implemented' },
  external_lookup_client: { off: [null], reason: 'external lookup clients are not implemented' },
  internal_api_server_enabled: { off: [false], reason: 'the internal API server is not implemented (use the controller)' },
  enable_pd: { off: [false], reason: 'use enable_xfer (kvc\'s disaggregated-prefill transfer)' },
};

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
  for (const [k, v] of Object.entries(raw)) {
    const off = CACHE_KEYS_OFF_ONLY[k];
    if (off) {
      if (off.off.some((o) => o === v)) continue;
      throw new Error(`key "${k}": only ${off.off.map((o) => JSON.stringify(o)).join(' or ')} is accepted (${off.reason}); found ${JSON.stringify(v)}`);
    }
    if (k === 'lmcache_worker_ports') {
      // LMCache lists one port per worker; a kvc instance has one worker.
      if (!Array.isArray(v) || v.length !== 1) throw new Error(`key "lmcache_worker_ports": a kvc instance has one worker, so exactly one port is accepted; found ${JSON.stringify(v)}`);
      set('kvc_worker_port', v[0], k);
      continue;
    }
    const to = CACHE_KEY_ALIASES[k];
    if (to) set(to, v, k);
    else set(k, v, null);
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

// Cache instance configuration (YAML at $KVC_CONFIG_FILE) and the engine's transfer-connector
// JSON (--kv-transfer-config); every key, its unit and default: docs/configuration.md. Both are
// validated up front: a wrong type or value stops start-up with one message naming the file, the
// key, what was expected and what was found. LMCache's names are read as kvc's
// (config_aliases.ts); any other unknown key stops start-up too, with the closest known key when
// it looks like a typo — a setting that does nothing is never accepted.
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { describeValue } from './errors.js';
import { CODECS, type CodecName } from './chunk_codec.js';
import { didYouMean } from './did_you_mean.js';
import { CACHE_KEY_ALIASES, CONNECTOR_ALIASES, LMCACHE_NAMES, rewriteCacheDoc } from './config_aliases.js';
import { cacheKeysFromEnv, mergeEnvKeys } from './config_env.js';
import { parseRemoteUrl, RemoteUrlError, type RemoteEndpoint } from './remote_url.js';
import { fieldPath, valueAt } from './validate.js';
import { checkAdvertiseHost } from './address.js';
import { environmentOf } from './environment.js';
import { DEFAULT_CHUNK_SIZE, SETTINGS } from './flags.js';

function advertiseHostOk(h: string): boolean {
  try {
    checkAdvertiseHost('advertise_host', h);
    return true;
  } catch {
    return false;
  }
}

export class ConfigError extends Error {
  override name = 'ConfigError';
}

const hostPort = z
  .string()
  .regex(/^[^\s:]+:\d{1,5}$/, 'expected "host:port"')
  .refine((s) => {
    const p = Number(s.slice(s.lastIndexOf(':') + 1));
    return p > 0 && p < 65536;
  }, 'expected a port between 1 and 65535');
const port = z.number().int('expected an integer port').min(1).max(65535);
const gib = z.number().min(0, 'expected a size in GiB >= 0').refine(Number.isFinite, 'expected a finite number');

export const XFER_BACKENDS = ['tcp'] as const;

// A tier's chunk codec (src/common/chunk_codec.ts): chunks are encoded on admission to the tier.
const serde = z
  .enum(CODECS, `expected ${CODECS.join(' or ')} (LMCache's cachegen and kivi are GPU codecs kvc does not implement; int8 and int8_asym are kvc's 8-bit codecs)`)
  .nullable()
  .default('naive')
  .transform((v): CodecName => v ?? 'naive');

/** Default of xfer_deadline_floor_ms (also what a receiver started without a config uses). */
export const XFER_DEADLINE_FLOOR_DEFAULT_MS = 5000;
export const cacheConfigSchema = z.strictObject({
  chunk_size: z.number().int('expected an integer number of tokens').min(1).max(1 << 20).default(DEFAULT_CHUNK_SIZE),
  local_cpu: z.boolean().default(true),
  max_local_cpu_size: gib.default(SETTINGS.maxLocalCpuSize.default!),
  local_cpu_serde: serde,
  max_local_disk_size: gib.default(0),
  local_disk: z.string().min(1).nullable().default(null),
  local_disk_serde: serde,
  remote_url: z.string().min(1, 'expected a URL like redis://host:6379').nullable().default(null),
  remote_serde: serde,
  // Null = unset: the defaults (REMOTE_DEFAULTS) apply with remote_url; set without it they are refused.
  remote_timeout_ms: z.number().int('expected an integer number of milliseconds').min(1).max(600_000).nullable().default(null),
  remote_write_queue_size: gib.refine((g) => g > 0, 'expected a size in GiB > 0').nullable().default(null),
  enable_controller: z.boolean().default(false),
  kvc_instance_id: z.string().min(1).default('kvc_default_instance'),
  controller_url: hostPort.nullable().default(null),
  kvc_worker_port: port.nullable().default(null),
  distributed_url: hostPort.nullable().default(null),
  // What the instance registers with the controller instead of distributed_url's host (bind) address.
  advertise_host: z.string().nullable().default(null).refine((h) => h === null || advertiseHostOk(h), 'expected the IP address or host name peers reach this instance at (not 0.0.0.0 or ::)'),
  enable_p2p: z.boolean().default(false),
  // Null = unset: P2P_DEFAULTS applies with enable_p2p; set without it, it is refused.
  p2p_timeout_ms: z.number().int('expected an integer number of milliseconds').min(1).max(600_000).nullable().default(null),
  enable_xfer: z.boolean().default(false),
  enable_xpyd: z.boolean().default(false),
  xfer_role: z.enum(['sender', 'receiver']).nullable().default(null),
  xfer_proxy_host: z.string().min(1).nullable().default(null),
  xfer_proxy_port: port.nullable().default(null),
  xfer_peer_host: z.string().min(1).nullable().default(null),
  xfer_peer_init_port: port.nullable().default(null),
  xfer_peer_alloc_port: port.nullable().default(null),
  xfer_buffer_size: z.number().int('expected an integer number of bytes').min(1 << 20, 'expected at least 1 MiB').default(1 << 30),
  xfer_buffer_device: z.string().min(1).default('cpu'),
  // The transfer contract's floor (docs/xfer.md "Every transfer ends"): a reservation that is not
  // complete within transferDeadlineMs(floor, bytes) (src/common/transfer_seam.ts) is abandoned and its room released.
  xfer_deadline_floor_ms: z.number().int('expected an integer number of milliseconds').min(100, 'expected at least 100 ms').max(600_000, 'expected at most 600000 ms').default(XFER_DEADLINE_FLOOR_DEFAULT_MS),
  xfer_backends: z.array(z.string()).default(['tcp']),
});

export type CacheConfig = z.infer<typeof cacheConfigSchema>;
/** Keys that only mean something with a remote tier: set without remote_url they would do nothing. */
const REMOTE_ONLY_KEYS = ['remote_timeout_ms', 'remote_write_queue_size'] as const;
/** What the remote tier uses for a key left unset. */
export const REMOTE_DEFAULTS = { remote_timeout_ms: 500, remote_write_queue_size: 0.25 } as const;
/** What P2P uses for a key left unset (docs/p2p.md). */
export const P2P_DEFAULTS = { p2p_timeout_ms: 1000 } as const;
export const CACHE_CONFIG_KEYS = Object.keys(cacheConfigSchema.shape);

/** Cross-field rules that a per-key schema cannot express. Returns [key, problem] or null. */
function crossCheck(c: CacheConfig): [string, string] | null {
  if (c.enable_controller && !c.controller_url) return ['controller_url', 'required when enable_controller is true'];
  if (c.enable_controller && c.kvc_worker_port === null) return ['kvc_worker_port', 'required when enable_controller is true'];
  if (c.enable_p2p && !c.enable_controller) return ['enable_p2p', 'needs the controller (enable_controller: true and controller_url): it says which instance holds the chunks this one lacks'];
  if (c.p2p_timeout_ms !== null && !c.enable_p2p) return ['p2p_timeout_ms', 'only meaningful with enable_p2p: true; set enable_p2p or remove this key'];
  if (c.max_local_disk_size > 0 && !c.local_disk) return ['local_disk', 'required (a directory) when max_local_disk_size > 0'];
  if (c.local_cpu_serde !== 'naive' && !(c.local_cpu && c.max_local_cpu_size > 0)) return ['local_cpu_serde', 'only meaningful with the CPU tier (local_cpu: true and max_local_cpu_size > 0)'];
  if (c.local_disk_serde !== 'naive' && !(c.max_local_disk_size > 0 && c.local_disk)) return ['local_disk_serde', 'only meaningful with the disk tier (local_disk and max_local_disk_size > 0)'];
  if (c.remote_serde !== 'naive' && c.remote_url === null) return ['remote_serde', 'only meaningful with remote_url; set remote_url or remove this key'];
  if (c.enable_xfer) {
    if (!c.xfer_role) return ['xfer_role', 'required ("sender" or "receiver") when enable_xfer is true'];
    if (c.xfer_role === 'sender') {
      if (!c.xfer_proxy_host) return ['xfer_proxy_host', 'required for xfer_role "sender"'];
      if (c.xfer_proxy_port === null) return ['xfer_proxy_port', 'required for xfer_role "sender"'];
    } else {
      if (!c.xfer_peer_host) return ['xfer_peer_host', 'required for xfer_role "receiver"'];
      if (c.xfer_peer_init_port === null) return ['xfer_peer_init_port', 'required for xfer_role "receiver"'];
      if (c.xfer_peer_alloc_port === null) return ['xfer_peer_alloc_port', 'required for xfer_role "receiver"'];
      const bad = c.xfer_backends.find((b) => !(XFER_BACKENDS as readonly string[]).includes(b));
      if (bad !== undefined) return ['xfer_backends', `unknown backend "${bad}"; supported: ${XFER_BACKENDS.join(', ')}`];
    }
  }
  return null;
}

export interface Loaded<T> {
  config: T;
  /** Problems that did not stop start-up (none are produced now: every problem is an error). */
  warnings: string[];
  /** Aliases applied (LMCache names, file:// paths), for an info log line each. */
  notes: string[];
}

/** Every name the cache YAML accepts: kvc's keys, LMCache's aliases and LMCache's off-only keys. */
const CACHE_NAMES = [...Object.keys(cacheConfigSchema.shape), ...LMCACHE_NAMES];

function validateObject<S extends z.ZodObject>(schema: S, raw: unknown, source: string, rewrite?: (d: Record<string, unknown>) => { doc: Record<string, unknown>; notes: string[] }, names: string[] = Object.keys(schema.shape)): Loaded<z.infer<S>> {
  if (raw === null || raw === undefined) raw = {};
  if (typeof raw !== 'object' || Array.isArray(raw)) {
    throw new ConfigError(`${source}: expected a mapping of keys to values, found ${describeValue(raw)}`);
  }
  let doc = raw as Record<string, unknown>;
  let notes: string[] = [];
  if (rewrite) {
    try {
      ({ doc, notes } = rewrite(doc));
    } catch (e) {
      throw new ConfigError(`${source}: ${(e as Error).message}`);
    }
  }
  const known = new Set(Object.keys(schema.shape));
  const obj: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(doc)) {
    if (!known.has(k)) throw new ConfigError(`${source}: unknown key "${k}"${didYouMean(k, names, '"')}; the keys are listed in docs/configuration.md`);
    obj[k] = v;
  }
  const r = schema.safeParse(obj);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    // Walk the whole path: for `xfer_backends: [1]` the offending value is the element 1, not the array.
    const found = valueAt(obj, issue.path);
    throw new ConfigError(`${source}: key "${fieldPath(issue.path)}": ${issue.message}; found ${describeValue(found)}`);
  }
  return { config: r.data as z.infer<S>, warnings: [], notes: notes.map((n) => `${source}: ${n}`) };
}

/** Validates an already-parsed cache configuration object. `source` names it in messages. */
export function validateCacheConfig(raw: unknown, source = 'cache config'): Loaded<CacheConfig> {
  const loaded = validateObject(cacheConfigSchema, raw, source, rewriteCacheDoc, CACHE_NAMES);
  const bad = crossCheck(loaded.config);
  if (bad) throw new ConfigError(`${source}: key "${bad[0]}": ${bad[1]}`);
  if (loaded.config.remote_url !== null) remoteEndpoint(loaded.config, source);
  else {
    const set = REMOTE_ONLY_KEYS.find((k) => loaded.config[k] !== null);
    if (set) throw new ConfigError(`${source}: key "${set}": only meaningful with remote_url; set remote_url or remove this key`);
  }
  return loaded;
}

/** Hides a password in a URL that may not even parse (for error messages). */
function redactUrl(s: string): string {
  return s.replace(/^([^:/]+:\/\/[^:@/]*):[^@/]*@/, '$1:***@');
}

/**
 * The parsed remote_url of a configuration (null when unset). Throws ConfigError naming
 * remote_url and what was expected, e.g. for an LMCache `lm://` or `s3://` URL.
 */
export function remoteEndpoint(c: Pick<CacheConfig, 'remote_url'>, source = 'cache config'): RemoteEndpoint | null {
  if (c.remote_url === null) return null;
  try {
    return parseRemoteUrl(c.remote_url);
  } catch (e) {
    if (e instanceof RemoteUrlError) throw new ConfigError(`${source}: key "remote_url": ${e.message}; found "${redactUrl(c.remote_url)}"`);
    throw e;
  }
}

/** The parsed YAML document at `path` (not yet validated). */
function readCacheYaml(path: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new ConfigError(`${path}: cannot read cache configuration (${(e as Error).message})`);
  }
  try {
    return parseYaml(text);
  } catch (e) {
    throw new ConfigError(`${path}: not valid YAML (${(e as Error).message.split('\n')[0]})`);
  }
}

const isMapping = (raw: unknown): raw is Record<string, unknown> | null | undefined => raw === null || raw === undefined || (typeof raw === 'object' && !Array.isArray(raw));

/** Reads and validates the YAML file at `path`. */
/** `overrides` (command-line switches such as --enable-p2p) are applied over the file's keys before validation. */
export function loadCacheConfig(path: string, overrides?: Record<string, unknown>): Loaded<CacheConfig> {
  let raw = readCacheYaml(path);
  if (overrides && isMapping(raw)) raw = { ...raw, ...overrides };
  return validateCacheConfig(raw, path);
}

/** The kvc key an LMCache or kvc name sets. */
function canonicalKey(name: string): string {
  if (name === 'p2p_host' || name === 'p2p_init_ports') return 'distributed_url';
  return CACHE_KEY_ALIASES[name] ?? name;
}

/**
 * The cache configuration of an engine: the YAML at $KVC_CONFIG_FILE ($LMCACHE_CONFIG_FILE is read
 * when it is unset; the defaults when neither is set), plus the keys set as LMCACHE_<KEY> /
 * KVC_<KEY> variables (src/common/config_env.ts: a key both set must agree), then `overrides`.
 */
export function cacheConfigFromEnv(env: NodeJS.ProcessEnv = process.env, overrides?: Record<string, unknown>): Loaded<CacheConfig> {
  let p: string | undefined;
  let fromEnv;
  try {
    p = environmentOf(env).get('configFile');
    fromEnv = cacheKeysFromEnv(env, cacheConfigSchema.shape);
  } catch (e) {
    throw new ConfigError((e as Error).message);
  }
  const source = p ?? 'default cache config (KVC_CONFIG_FILE unset)';
  let raw = p === undefined ? {} : readCacheYaml(p);
  let envNotes: string[] = [];
  if (isMapping(raw)) {
    try {
      ({ doc: raw, notes: envNotes } = mergeEnvKeys(raw ?? {}, fromEnv, p ?? 'the defaults', canonicalKey));
    } catch (e) {
      throw new ConfigError(`${source}: ${(e as Error).message}`);
    }
    if (overrides) raw = { ...(raw as object), ...overrides };
  }
  const loaded = validateCacheConfig(raw, source);
  return { ...loaded, notes: [...envNotes, ...loaded.notes] };
}

export const GiB = 1024 ** 3;
export const gibToBytes = (g: number) => Math.floor(g * GiB);

// ---- connector JSON (--kv-transfer-config) ---------------------------------------------------

export const connectorConfigSchema = z.strictObject({
  kv_connector: z.literal('KvcConnectorV1', 'expected "KvcConnectorV1"'),
  kv_role: z.enum(['kv_both', 'kv_producer', 'kv_consumer']),
  kv_connector_extra_config: z
    .strictObject({
      discard_partial_chunks: z.boolean().default(false),
      kvc_rpc_port: z.string().min(1).optional(),
      skip_last_n_tokens: z.number().int('expected an integer').min(0).default(0),
      // How copies of chunks a peer holds (received by xfer, fetched by P2P) enter the CPU tier;
      // unset: evict_first when the engine fetches by P2P (it can get them again), else recent.
      peer_copy_admission: z.enum(['evict_first', 'recent']).optional(),
      // How the prompt's partial last chunk (kept unless discard_partial_chunks) is admitted;
      // unset: evict_first.
      partial_chunk_admission: z.enum(['evict_first', 'recent']).optional(),
    })
    .default({ discard_partial_chunks: false, skip_last_n_tokens: 0 }),
});
export type ConnectorConfig = z.infer<typeof connectorConfigSchema>;

export function parseConnectorConfig(json: string, source = '--kv-transfer-config'): Loaded<ConnectorConfig> {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch (e) {
    throw new ConfigError(`${source}: not valid JSON (${(e as Error).message})`);
  }
  const notes: string[] = [];
  if (raw && typeof raw === 'object' && !Array.isArray(raw)) {
    const o = { ...(raw as Record<string, unknown>) };
    for (const k of Object.keys(o)) {
      if (!(k in connectorConfigSchema.shape)) throw new ConfigError(`${source}: unknown key "${k}"${didYouMean(k, Object.keys(connectorConfigSchema.shape), '"')}`);
    }
    const alias = typeof o.kv_connector === 'string' ? CONNECTOR_ALIASES.connector[o.kv_connector] : undefined;
    if (alias) {
      notes.push(`${source}: kv_connector "${String(o.kv_connector)}" read as "${alias}"`);
      o.kv_connector = alias;
    }
    const extra = o.kv_connector_extra_config;
    if (extra && typeof extra === 'object' && !Array.isArray(extra)) {
      const e: Record<string, unknown> = {};
      for (const [k0, v] of Object.entries(extra as Record<string, unknown>)) {
        const k = CONNECTOR_ALIASES.extra[k0] ?? k0;
        if (!EXTRA_KEYS.includes(k)) throw new ConfigError(`${source}: unknown key "kv_connector_extra_config.${k0}"${didYouMean(k0, EXTRA_KEYS, '"')}`);
        if (k in e) throw new ConfigError(`${source}: key "kv_connector_extra_config.${k}" is given twice (also as "${k0}")`);
        if (k !== k0) notes.push(`${source}: LMCache key "kv_connector_extra_config.${k0}" read as "${k}"`);
        e[k] = v;
      }
      o.kv_connector_extra_config = e;
    }
    raw = o;
  }
  const r = connectorConfigSchema.safeParse(raw);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    const found = valueAt(raw, issue.path);
    throw new ConfigError(`${source}: key "${fieldPath(issue.path)}": ${issue.message}; found ${describeValue(found)}`);
  }
  return { config: r.data, warnings: [], notes };
}

const EXTRA_KEYS = ['discard_partial_chunks', 'kvc_rpc_port', 'skip_last_n_tokens', 'peer_copy_admission', 'partial_chunk_admission'];

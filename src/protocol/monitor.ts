// The monitor channel between cache instances (src/kvc/controller_client.ts) and the controller
// (src/controller/monitor.ts, src/controller/registry.ts).
//
// Transport: ZeroMQ. The controller binds a ROUTER on --monitor-port; every cache worker
// connects a DEALER whose routing id is its session: 16 random hex digits chosen at attach time,
// so a restarted engine is a new connection. The instance id and worker id travel in the
// `register` message, not in the routing id. Each ZeroMQ message is ONE frame holding a
// msgpack-encoded object with a `t` (type) field.
//
// Instance → controller:
//   register  identity + addresses + model/chunk size + locations; answered by `welcome`
//   sync      the full key list of one location, in parts; part 0 carries reset=true
//   ops       batched admits/evicts, in the order the store emitted them
//   hb        heartbeat; answered by `hb_ack`, or `reregister` when the controller does
//             not know the sender (it restarted, or reaped the worker)
//   bye       clean shutdown: the controller drops the worker at once
//   p2p_lookup which other instances hold the chunks that follow (src/protocol/p2p_holders.ts)
//   miss_lookup why the chunks it just computed were not reused (src/protocol/ledger.ts)
// Controller → instance:
//   welcome {heartbeat_interval_ms}, hb_ack, reregister, error {message},
//   p2p_holders (the answer to p2p_lookup), miss_reasons (the answer to miss_lookup),
//   replicas    which of its chunks other instances hold too (src/protocol/replica_hint.ts)
//
// A (re)registration is always followed by a full sync, so a restarted controller rebuilds
// its index without restarting any engine.
import { DTYPE_NAME_LIST } from '../common/dtype.js';
import { decode, encode } from '@msgpack/msgpack';
import { z } from 'zod';
import { instanceStatsSchema } from './instance_stats.js';
import type { P2pHoldersMsg, P2pLookupMsg } from './p2p_holders.js';
import type { ReplicaHintMsg } from './replica_hint.js';
import type { MissLookupMsg, MissReasonsMsg } from './ledger.js';

export const MONITOR_PROTOCOL_VERSION = 1;
/** Alias kept for readers of the monitor code: the version a `register` carries in `v`. */
export const PROTOCOL_VERSION = MONITOR_PROTOCOL_VERSION;

/** Packed keys: 8 bytes each, big-endian (the bytes of the 16-digit hex key). */
export const packedKeysSchema = z
  .custom<Uint8Array>((u) => u instanceof Uint8Array, 'expected packed keys (binary)')
  .refine((u) => u.byteLength % 8 === 0, 'expected packed 8-byte keys');

export const registerMsgSchema = z.object({
  t: z.literal('register'),
  /** With a deployment secret: the sender's clock (ms), a nonce and the seal's tag over the whole message (src/common/replay.ts, channel "monitor"; docs/security.md). */
  ts: z.number().optional(),
  nonce: z.string().optional(),
  auth: z.string().optional(),
  v: z.number(),
  instance_id: z.string().min(1).max(200),
  worker_id: z.number().int().min(0),
  session: z.string().min(1),
  ip: z.string().min(1),
  worker_port: z.number().int().min(1).max(65535),
  distributed_url: z.string().nullable(),
  chunk_size: z.number().int().min(1),
  model_id: z.string().min(1),
  /** PYTHONHASHSEED of the instance, as a decimal string; one that differs from the controller's is refused. */
  seed: z.string(),
  /** The element type of the engine's KV (DTYPE_NAMES): part of every chunk key. Absent from older instances, which hold f32. */
  kv_dtype: z.enum(DTYPE_NAME_LIST, `expected one of ${DTYPE_NAME_LIST.join(', ')}`).default('f32'),
  locations: z.array(z.string().min(1)),
  pid: z.number().int(),
  /**
   * The engine's HTTP address (http://host:port) when the instance is an engine's: the
   * controller's dashboard has it tokenize a typed prompt (POST /tokenize). Absent: unknown.
   */
  engine_url: z.string().url().optional(),
});
export type RegisterMsg = z.input<typeof registerMsgSchema>;

export const syncMsgSchema = z.object({
  t: z.literal('sync'),
  location: z.string().min(1),
  keys: packedKeysSchema,
  /** True on the first part of a full sync: the controller forgets what it knew of this worker. */
  reset: z.boolean(),
  last: z.boolean(),
});
export type SyncMsg = z.infer<typeof syncMsgSchema>;

/** One ordered operation: [1 = admit | 0 = evict, location, packed keys]. */
export const keyOpSchema = z.tuple([z.union([z.literal(0), z.literal(1)]), z.string().min(1), packedKeysSchema]);
export type KeyOp = [0 | 1, string, Uint8Array];

export const opsMsgSchema = z.object({ t: z.literal('ops'), ops: z.array(keyOpSchema) });
export type OpsMsg = { t: 'ops'; ops: KeyOp[] };

/** `stats`: usage per location and, from an engine, its counters (instance_stats.ts). */
export const heartbeatMsgSchema = z.object({ t: z.literal('hb'), stats: instanceStatsSchema.optional() });
export type HeartbeatMsg = z.infer<typeof heartbeatMsgSchema>;
export const byeMsgSchema = z.object({ t: z.literal('bye') });
export type ByeMsg = z.infer<typeof byeMsgSchema>;

export type InstanceMsg = RegisterMsg | SyncMsg | OpsMsg | HeartbeatMsg | ByeMsg;

export const controllerMsgSchema = z.discriminatedUnion('t', [
  z.object({ t: z.literal('welcome'), heartbeat_interval_ms: z.number().positive() }),
  z.object({ t: z.literal('hb_ack') }),
  z.object({ t: z.literal('reregister') }),
  z.object({ t: z.literal('error'), message: z.string() }),
]);
export type ControllerMsg = z.infer<typeof controllerMsgSchema>;

/**
 * Checks one op of an ops batch without zod. Ops frames are the hot path of ingest and
 * validating a whole batch with zod costs about as much as applying it; `keyOpSchema` names the
 * problem once this says an op is malformed.
 */
export function isKeyOp(op: unknown): op is KeyOp {
  return Array.isArray(op) && op.length === 3 && (op[0] === 0 || op[0] === 1) && typeof op[1] === 'string' &&
    op[2] instanceof Uint8Array && op[2].byteLength % 8 === 0;
}

/** `path: message; …` of a failed zod parse: names the bad field. */
export function describeIssues(e: z.ZodError): string {
  return e.issues.map((i) => `${i.path.length ? i.path.join('.') : '(message)'}: ${i.message}`).join('; ');
}

export function encodeMsg(m: InstanceMsg | ControllerMsg | P2pLookupMsg | P2pHoldersMsg | ReplicaHintMsg | MissLookupMsg | MissReasonsMsg): Buffer {
  const u = encode(m);
  return Buffer.from(u.buffer, u.byteOffset, u.byteLength);
}

/** Decodes a frame; returns null for anything that is not an object with a string `t`. */
export function decodeMsg(frame: Uint8Array): Record<string, unknown> | null {
  try {
    const v = decode(frame);
    if (v && typeof v === 'object' && !Array.isArray(v) && typeof (v as { t?: unknown }).t === 'string') {
      return v as Record<string, unknown>;
    }
  } catch {
    /* malformed frame: the caller logs and drops it */
  }
  return null;
}

/** Hex keys → packed binary (8 bytes per key). */
export function packKeys(keys: readonly string[]): Buffer {
  return Buffer.from(keys.join(''), 'hex');
}

/** Packed binary → hex keys. */
export function unpackKeys(packed: Uint8Array): string[] {
  const b = Buffer.from(packed.buffer, packed.byteOffset, packed.byteLength);
  const out: string[] = [];
  for (let o = 0; o + 8 <= b.length; o += 8) out.push(b.toString('hex', o, o + 8));
  return out;
}

/** Keys per sync part / per ops batch: keeps single frames well under a few MB. */
export const SYNC_PART_KEYS = 65_536;

// The monitor protocol between cache instances and the controller (DESIGN §5).
//
// Transport: ZeroMQ. The controller binds a ROUTER on --monitor-port; every cache worker
// connects a DEALER whose routing id is its session: 16 random hex digits chosen at attach time
// (src/kvc/controller_client.ts), so a restarted engine is a new connection. The instance id and
// worker id travel in the `register` message, not in the routing id. Each ZeroMQ message is ONE
// frame holding a msgpack-encoded object with a `t` (type) field.
//
// Instance → controller:
//   register  identity + addresses + model/chunk size + locations; answered by `welcome`
//   sync      the full key list of one location, in parts; part 0 carries reset=true
//   ops       batched admits/evicts, in the order the store emitted them
//   hb        heartbeat; answered by `hb_ack`, or `reregister` when the controller does
//             not know the sender (it restarted, or reaped the worker)
//   bye       clean shutdown: the controller drops the worker at once
// Controller → instance:
//   welcome {heartbeat_interval_ms}, hb_ack, reregister, error {message}
//
// A (re)registration is always followed by a full sync, so a restarted controller rebuilds
// its index without restarting any engine.
import { decode, encode } from '@msgpack/msgpack';
import type { InstanceStats } from '../protocol/instance_stats.js';

export const PROTOCOL_VERSION = 1;

export interface RegisterMsg {
  t: 'register';
  v: number;
  instance_id: string;
  worker_id: number;
  session: string;
  ip: string;
  worker_port: number;
  distributed_url: string | null;
  chunk_size: number;
  model_id: string;
  /** PYTHONHASHSEED of the instance, as a decimal string; a mismatch is logged loudly. */
  seed: string;
  locations: string[];
  pid: number;
}

export interface SyncMsg {
  t: 'sync';
  location: string;
  /** Packed keys: 8 bytes each, big-endian (the bytes of the 16-digit hex key). */
  keys: Uint8Array;
  /** True on the first part of a full sync: the controller forgets what it knew of this worker. */
  reset: boolean;
  last: boolean;
}

/** One ordered operation: [1 = admit | 0 = evict, location, packed keys (see SyncMsg)]. */
export type KeyOp = [0 | 1, string, Uint8Array];

export interface OpsMsg {
  t: 'ops';
  ops: KeyOp[];
}

export interface HeartbeatMsg {
  t: 'hb';
  /** Usage per location and the engine's counters (src/protocol/instance_stats.ts). */
  stats?: InstanceStats;
}

export interface ByeMsg {
  t: 'bye';
}

export type InstanceMsg = RegisterMsg | SyncMsg | OpsMsg | HeartbeatMsg | ByeMsg;

export type ControllerMsg =
  | { t: 'welcome'; heartbeat_interval_ms: number }
  | { t: 'hb_ack' }
  | { t: 'reregister' }
  | { t: 'error'; message: string };

export function encodeMsg(m: InstanceMsg | ControllerMsg): Buffer {
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

/**
 * zeromq v6 allows one send in flight per socket; this serialises sends and never throws.
 * Sends that cannot be queued (peer gone, `immediate` set) are reported to `onDrop`.
 */
export class SendQueue {
  private tail: Promise<void> = Promise.resolve();
  constructor(
    private readonly sendFn: (frames: Buffer | Buffer[]) => Promise<void>,
    private readonly onDrop: (err: unknown) => void,
  ) {}

  send(frames: Buffer | Buffer[]): Promise<void> {
    this.tail = this.tail.then(() => this.sendFn(frames)).catch((e) => this.onDrop(e));
    return this.tail;
  }
}

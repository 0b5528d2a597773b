// The instance worker's command API (kvc_worker_port, HTTP/JSON): the controller
// (src/controller/worker_rpc.ts, callWorker) is its only client, the cache instance
// (src/kvc/worker_server.ts) serves it. Every route is one entry of WORKER_ROUTES: method,
// path, request schema and reply schema, so both sides use the same definition and the
// controller checks every reply it gets.
import { z } from 'zod';
import { CHUNK_KEY_PATTERN } from '../common/keys.js';
import { CODECS } from '../common/chunk_codec.js';

/** The storage locations of a cache instance (tiers), by the names the YAML and the API use. */
export const LOCATIONS = ['LocalCPUBackend', 'LocalDiskBackend'] as const;
export type LocationName = (typeof LOCATIONS)[number];

export function isLocationName(s: string): s is LocationName {
  return (LOCATIONS as readonly string[]).includes(s);
}

export const chunkKeysSchema = z.array(z.string().regex(CHUNK_KEY_PATTERN, 'expected a 16-digit hex chunk key'));
export const locationSchema = z.enum(LOCATIONS, `expected one of ${LOCATIONS.join(', ')}`);

/** POST /lookup, /pin, /unpin: keys in one location. */
export const keysAtSchema = z.strictObject({ keys: chunkKeysSchema, location: locationSchema });
export type KeysAt = z.infer<typeof keysAtSchema>;

/** POST /clear: pinned chunks stay unless include_pinned. */
export const clearRequestSchema = z.strictObject({ location: locationSchema, include_pinned: z.boolean('expected true or false').optional() });
export type ClearRequest = z.infer<typeof clearRequestSchema>;

/** Where a move/copy goes: another location of the same instance, or another instance's distributed_url. */
export const moveTargetSchema = z.strictObject({
  location: z.string().min(1),
  instance_id: z.string().optional(),
  distributed_url: z.string().nullable().optional(),
});

/** POST /move: move or copy `keys` from `location` to `target` within `deadline_ms`. */
export const moveCommandSchema = z.strictObject({
  event_id: z.string().optional(),
  keys: chunkKeysSchema,
  location: locationSchema,
  copy: z.boolean(),
  target: moveTargetSchema,
  deadline_ms: z.number().int().min(1).max(24 * 3600 * 1000),
});
export type MoveCommand = z.infer<typeof moveCommandSchema>;

/** POST /recode: re-encode the held `keys` of `location` with `codec` in place (controller /compress, /decompress). */
export const recodeCommandSchema = z.object({
  keys: chunkKeysSchema,
  location: locationSchema,
  codec: z.enum(CODECS, `expected one of ${CODECS.join(', ')}`),
  deadline_ms: z.number().int().min(1).max(24 * 3600 * 1000),
});
export type RecodeCommand = z.infer<typeof recodeCommandSchema>;

const count = z.number().int().min(0);
export const countReplySchema = z.object({ count });
/** `kept`: the chunks still in the location afterwards (pinned, or held by a transfer). */
export const clearReplySchema = z.object({ removed: count, kept: count });
export const moveReplySchema = z.object({ moved: count });

/** GET /health: who the worker is and how full its locations are. */
export const healthReplySchema = z.object({
  instance_id: z.string(),
  worker_id: z.number().int(),
  model_id: z.string(),
  chunk_size: z.number().int(),
  locations: z.array(
    z.object({ location: z.string(), capacityBytes: count, usedBytes: count, chunks: count, pinned: count }),
  ),
  moves_in_flight: count,
}).loose();
export type WorkerHealth = z.infer<typeof healthReplySchema>;

const none = z.undefined();

export const WORKER_ROUTES = {
  health: { method: 'GET', path: '/health', request: none, reply: healthReplySchema },
  lookup: { method: 'POST', path: '/lookup', request: keysAtSchema, reply: countReplySchema },
  pin: { method: 'POST', path: '/pin', request: keysAtSchema, reply: countReplySchema },
  unpin: { method: 'POST', path: '/unpin', request: keysAtSchema, reply: countReplySchema },
  clear: { method: 'POST', path: '/clear', request: clearRequestSchema, reply: clearReplySchema },
  move: { method: 'POST', path: '/move', request: moveCommandSchema, reply: moveReplySchema },
  recode: { method: 'POST', path: '/recode', request: recodeCommandSchema, reply: countReplySchema },
} as const;

export type WorkerRoute = keyof typeof WORKER_ROUTES;
export type WorkerRequest<R extends WorkerRoute> = z.input<(typeof WORKER_ROUTES)[R]['request']>;
export type WorkerReply<R extends WorkerRoute> = z.infer<(typeof WORKER_ROUTES)[R]['reply']>;

// The controller's HTTP API (served by src/controller/http_api.ts): the bodies an operator or an
// orchestrator sends to `kvc controller`, and the answers of the operations. Request schemas
// name the field and what was expected in their messages; the controller answers a violation
// with a 400 carrying that message.
import { z } from 'zod';
import { tokenIds } from '../common/validate.js';
import { COMPRESSING_CODECS } from '../common/chunk_codec.js';

const str = (what: string) => z.string(`expected a string (${what})`).min(1, `expected a non-empty string (${what})`);
const position = z
  .array(z.string('expected a string'), 'expected a position [instance_id, location] of two strings')
  .length(2, 'expected a position [instance_id, location] of exactly two strings')
  .transform((a) => [a[0]!, a[1]!] as [string, string]);

// Every body is a strict object: an unknown field is a 400 naming it with the closest known name
// (src/common/validate.ts), never dropped. LMCache's current request models (its controller's
// api_server) use the same names except where noted at the field.

const bool = z.boolean('expected true or false');

/**
 * POST /move: moves (or with `copy`, copies) the chunks of `tokens` between positions.
 * `should_copy` is LMCache's current name of `copy` (its older one); both mean the same and may
 * not disagree.
 */
export const moveSchema = z
  .strictObject({
    old_position: position,
    new_position: position,
    tokens: tokenIds.default([]),
    copy: bool.optional(),
    should_copy: bool.optional(),
  })
  .superRefine((b, ctx) => {
    if (b.copy !== undefined && b.should_copy !== undefined && b.copy !== b.should_copy) {
      ctx.addIssue({ code: 'custom', path: ['should_copy'], message: `LMCache's name of \`copy\`: says ${b.should_copy} while \`copy\` says ${b.copy}; send one of them` });
    }
  })
  .transform(({ should_copy, copy, ...rest }) => ({ ...rest, copy: copy ?? should_copy ?? false }));
export type MoveRequest = z.infer<typeof moveSchema>;

/** POST /pin and POST /unpin. */
export const pinSchema = z.strictObject({ tokens: tokenIds, instance_id: str('instance id'), location: str('location name') });
export type PinRequest = z.infer<typeof pinSchema>;

/**
 * POST /compress: re-encodes the held prefix of `tokens` at `location` of `instance_id` with the
 * codec `method` (src/common/chunk_codec.ts), in place. LMCache's names; kvc's methods are its
 * codecs other than naive.
 */
export const compressSchema = z.strictObject({
  instance_id: str('instance id'),
  location: str('location name'),
  method: z.enum(COMPRESSING_CODECS, `expected ${COMPRESSING_CODECS.map((c) => `"${c}"`).join(' or ')} (kvc's 8-bit codecs; LMCache's cachegen and kivi are GPU codecs kvc does not implement)`),
  tokens: tokenIds,
});
export type CompressRequest = z.infer<typeof compressSchema>;

/**
 * POST /decompress: the held prefix of `tokens` at `location` back to naive (the engine's dtype),
 * in place. `method`, when given, names the codec being undone (kvc decodes whatever codec a chunk
 * is in, so it only has to be one kvc knows).
 */
export const decompressSchema = z.strictObject({
  instance_id: str('instance id'),
  location: str('location name'),
  method: z.enum(COMPRESSING_CODECS, `expected ${COMPRESSING_CODECS.map((c) => `"${c}"`).join(' or ')} (the codec to undo)`).optional(),
  tokens: tokenIds,
});
export type DecompressRequest = z.infer<typeof decompressSchema>;

/** POST /lookup. `cache_salt` (kvc's addition): the prompt was served with vLLM's cache_salt. */
export const lookupSchema = z.strictObject({ tokens: tokenIds, cache_salt: str('cache salt').optional() });

const NO_KEEP_FRACTION =
  'not supported by kvc: a clear removes every unpinned chunk of the location (none is kept by recency); to keep chunks, pin them first (POST /pin) and clear without include_pinned';

/**
 * POST /clear: pinned chunks stay unless include_pinned (docs/controller.md). LMCache's
 * `keep_fraction` (keep that share of the chunks) is refused with the reason, so a clear never
 * removes more than the client asked; `keep_fraction: 0` (keep none) is what kvc does and is taken.
 */
export const clearSchema = z.strictObject({
  instance_id: str('instance id'),
  location: str('location name'),
  include_pinned: bool.default(false),
  keep_fraction: z
    .number('expected a number in [0, 1]')
    .min(0, 'expected a number in [0, 1]')
    .max(1, 'expected a number in [0, 1]')
    .refine((f) => f === 0, NO_KEEP_FRACTION)
    .nullish(),
});
export type ClearRequest = z.infer<typeof clearSchema>;

/**
 * POST /clear's answer, once the workers have cleared: what was removed (`num_chunks`, and
 * `num_tokens`: LMCache's field, whole chunks of chunk_size tokens) and the pinned chunks that
 * stayed (`kept_chunks`).
 */
export interface ClearReply {
  event_id: string;
  num_tokens: number;
  num_chunks: number;
  kept_chunks: number;
}

/** POST /health. */
export const healthSchema = z.strictObject({ instance_id: str('instance id') });
/** POST /check_finish. */
export const checkFinishSchema = z.strictObject({ event_id: str('event id') });
/** POST /query_instance. LMCache's request also carries an `event_id`, echoed in the answer. */
export const queryInstanceSchema = z.strictObject({ ip: str('ip address'), event_id: str('event id').optional() });
/** POST /query_worker_info: the workers of an instance (all, or those of `worker_ids`). */
export const queryWorkerInfoSchema = z.strictObject({
  instance_id: str('instance id'),
  worker_ids: z.array(z.number('expected an integer worker id').int('expected an integer worker id').min(0, 'expected an integer worker id'), 'expected an array of worker ids').nullish(),
});
/** GET /events?limit=N: the most recent events (query string, so the number is coerced). */
export const eventsQuerySchema = z.strictObject({
  limit: z.coerce.number('expected an integer from 1 to 1000').int('expected an integer from 1 to 1000').min(1, 'expected an integer from 1 to 1000').max(1000, 'expected an integer from 1 to 1000').default(50),
});

/** Answer of /move, /pin and /unpin: the event to poll with /check_finish. */
export const eventReplySchema = z.object({ event_id: z.string(), num_tokens: z.number().int() });
export type EventReply = z.infer<typeof eventReplySchema>;

/**
 * Answer of /lookup. LMCache's fields: `event_id` and `layout_info` (instance id → [location,
 * matched tokens], the location with the longest prefix). kvc adds `num_tokens` (the longest match
 * over all instances) and `layout_detail` (per instance, every location's prefix).
 */
export const lookupReplySchema = z.object({
  event_id: z.string(),
  layout_info: z.record(z.string(), z.tuple([z.string(), z.number().int()])),
  num_tokens: z.number().int(),
  layout_detail: z.record(
    z.string(),
    z.object({ location: z.string(), matched_tokens: z.number().int(), locations: z.record(z.string(), z.number().int()) }),
  ),
});
export type LookupReply = z.infer<typeof lookupReplySchema>;

/** One worker in /query_worker_info's answer (LMCache's WorkerInfo fields; times in seconds since the epoch). */
export interface WorkerInfo {
  instance_id: string;
  worker_id: number;
  ip: string;
  port: number;
  distributed_url: string | null;
  registration_time: number;
  last_heartbeat_time: number;
}

/**
 * POST /dashboard/tokenize: the dashboard's prompt → token ids, by the engine of `instance_id`
 * (its /tokenize), so an action can take a typed prompt. Answers that engine's {tokens, count}.
 */
export const dashboardTokenizeSchema = z.strictObject({ instance_id: str('instance id'), prompt: z.string('expected a string').min(1, 'expected a non-empty prompt') });

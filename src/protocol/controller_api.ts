// The controller's HTTP API (served by src/controller/http_api.ts): the bodies an operator or an
// orchestrator sends to `kvc controller`, and the answers of the operations. Request schemas
// name the field and what was expected in their messages; the controller answers a violation
// with a 400 carrying that message.
import { z } from 'zod';
import { tokenIds } from '../common/validate.js';

const str = (what: string) => z.string(`expected a string (${what})`).min(1, `expected a non-empty string (${what})`);
const position = z
  .array(z.string('expected a string'), 'expected a position [instance_id, location] of two strings')
  .length(2, 'expected a position [instance_id, location] of exactly two strings')
  .transform((a) => [a[0]!, a[1]!] as [string, string]);

/** POST /move: moves (or with `copy`, copies) the chunks of `tokens` between positions. */
export const moveSchema = z.object({
  old_position: position,
  new_position: position,
  tokens: tokenIds.default([]),
  copy: z.boolean('expected true or false').default(false),
});
export type MoveRequest = z.infer<typeof moveSchema>;

/** POST /pin and POST /unpin. */
export const pinSchema = z.object({ tokens: tokenIds, instance_id: str('instance id'), location: str('location name') });
export type PinRequest = z.infer<typeof pinSchema>;

/** POST /lookup. */
export const lookupSchema = z.object({ tokens: tokenIds });

/** POST /clear. */
export const clearSchema = z.object({ instance_id: str('instance id'), location: str('location name') });
export type ClearRequest = z.infer<typeof clearSchema>;

/** POST /health. */
export const healthSchema = z.object({ instance_id: str('instance id') });
/** POST /check_finish. */
export const checkFinishSchema = z.object({ event_id: str('event id') });
/** POST /query_instance. */
export const queryInstanceSchema = z.object({ ip: str('ip address') });
/** GET /events?limit=N: the most recent events (query string, so the number is coerced). */
export const eventsQuerySchema = z.strictObject({
  limit: z.coerce.number('expected an integer from 1 to 1000').int('expected an integer from 1 to 1000').min(1, 'expected an integer from 1 to 1000').max(1000, 'expected an integer from 1 to 1000').default(50),
});

/** Answer of /move, /pin and /unpin: the event to poll with /check_finish. */
export const eventReplySchema = z.object({ event_id: z.string(), num_tokens: z.number().int() });
export type EventReply = z.infer<typeof eventReplySchema>;

/** Answer of /lookup. */
export const lookupReplySchema = z.object({
  /** Longest match over all instances. */
  num_tokens: z.number().int(),
  layout_info: z.record(
    z.string(),
    z.object({ location: z.string(), matched_tokens: z.number().int(), locations: z.record(z.string(), z.number().int()) }),
  ),
});
export type LookupReply = z.infer<typeof lookupReplySchema>;

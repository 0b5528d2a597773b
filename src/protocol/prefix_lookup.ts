// The routing lookup: the proxy asks the controller, in one call for a request's token ids,
// how long a prefix every registered cache instance holds (its best location). Sender: the
// proxy's kv-aware router (src/proxy/prefix_client.ts); receiver: the controller's HTTP API
// (POST /prefix_lookup, src/controller/http_api.ts). Instances that hold nothing of the prompt
// are absent from `instances` (absent = 0 cached tokens).
import { z } from 'zod';
import { tokenIds } from '../common/validate.js';

export const PREFIX_LOOKUP_PATH = '/prefix_lookup';

export const prefixLookupRequestSchema = z.strictObject({
  /** The prompt exactly as the engine will see it (chat: the templated token ids). */
  tokens: tokenIds,
  /** The request's cache_salt (its chunk keys are salted with it, src/common/keys.ts). */
  cache_salt: z.string('expected a string').min(1, 'expected a non-empty string').optional(),
});

/** A binary-body lookup's cache_salt travels in this header (the body holds token ids only). */
export const CACHE_SALT_HEADER = 'x-kvc-cache-salt';
export type PrefixLookupRequest = z.infer<typeof prefixLookupRequestSchema>;

export const prefixLookupReplySchema = z.object({
  /** Longest cached prefix over all instances, in tokens. */
  num_tokens: z.number().int().min(0),
  /** kvc_instance_id → cached prefix tokens on that instance (its best location). */
  instances: z.record(z.string(), z.number().int().min(0)),
});
export type PrefixLookupReply = z.infer<typeof prefixLookupReplySchema>;

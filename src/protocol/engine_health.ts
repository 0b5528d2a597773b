// An engine's GET /health answer. The proxy's health loop reads it to learn which cache
// instance (kvc_instance_id, the name the controller's index uses) serves behind each backend
// address, so kv-aware routing needs no second list of names that could disagree with the
// engines' own configuration. Sender: the engine (src/engine/routes/status.ts); receiver: the
// proxy (src/proxy/server.ts). Engines without a cache instance answer `kvc_instance_id: null`.
import { z } from 'zod';

export const engineHealthSchema = z.object({
  status: z.literal('ok'),
  kvc_instance_id: z.string().min(1).nullable().optional(),
});
export type EngineHealth = z.infer<typeof engineHealthSchema>;

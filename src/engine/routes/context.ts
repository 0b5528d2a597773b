// What the route groups of src/engine/routes/ are given: the parts they serve from and the
// limits every request is checked against.
import type { KeySettings } from '../../protocol/engine_health.js';
import type { EngineMetrics } from '../metrics.js';
import type { PagedKvCache } from '../model/kv_cache.js';
import type { EngineModel } from '../runtime.js';
import type { Scheduler } from '../scheduler.js';

export interface RouteContext {
  /** The name clients send in `model`; any other name is a 404. */
  modelName: string;
  maxModelLen: number;
  model: EngineModel;
  kv: PagedKvCache;
  scheduler: Scheduler;
  metrics: EngineMetrics;
  /** The cache instance's kvc_instance_id when it is registered with a controller, else null. */
  kvcInstanceId: string | null;
  /** The cache instance fetches chunks it lacks from other instances (enable_p2p with a controller). */
  kvcP2p: boolean;
  /** The connector is a kv_producer (a prefiller): its ledger goes back in kv_transfer_params. */
  kvProducer: boolean;
  /** The engine has a cache connector (its responses carry usage.kvc, its /health the ledger's counters). */
  hasConnector: boolean;
  /** The connector's key settings (model id, chunk size, seed, KV dtype), null without one. */
  keySettings: KeySettings | null;
  /** Its CPU tier's room for chunks it would keep (LruIndex.room), null without a CPU tier. */
  room: () => { freeBytes: number; freeTokens: number; capacityTokens: number; tailAgeMs: number | null } | null;
}

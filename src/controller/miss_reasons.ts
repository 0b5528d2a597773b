// The controller's half of the hit-rate ledger (src/protocol/ledger.ts, docs/ledger.md): why the
// chunks an instance just computed were not reused, from the index and the stored history alone.
// Asked before the instance stores those chunks (its earlier admits and evicts are flushed ahead
// of the query on the same connection), so the answer reflects the deployment as the request found it.
import { describeIssues, type ControllerMsg } from '../protocol/monitor.js';
import { MISS_CODES, missLookupMsgSchema, type MissReason, type MissReasonsMsg } from '../protocol/ledger.js';
import type { Registry } from './registry.js';

const CODE = Object.fromEntries(MISS_CODES.map((r, i) => [r, i])) as Record<MissReason, number>;

export function answerMissLookup(registry: Registry, routingId: string, msg: Record<string, unknown>): ControllerMsg | MissReasonsMsg {
  const w = registry.worker(routingId);
  if (!w) return { t: 'reregister' };
  const r = missLookupMsgSchema.safeParse(msg);
  if (!r.success) return registry.bad(routingId, 'miss_lookup', describeIssues(r.error));
  w.lastSeen = Date.now();
  const keys = r.data.keys;
  const n = keys.byteLength >>> 3;
  const dv = new DataView(keys.buffer, keys.byteOffset, keys.byteLength);
  const own = new Set(w.holders.values());
  const reasons = new Uint8Array(n);
  const ids: number[] = [];
  /** The reason of the first key held nowhere: the prompt's prefix broke there. */
  let broke: MissReason | null = null;
  for (let i = 0; i < n; i++) {
    const hi = dv.getUint32(8 * i);
    const lo = dv.getUint32(8 * i + 4);
    ids.length = 0;
    registry.index.holdersOf(hi, lo, ids);
    let reason: MissReason;
    if (ids.some((h) => own.has(h))) reason = 'stale_index';
    // Held elsewhere, but after a chunk held nowhere: no fetch could have used it (a prompt's KV
    // is imported as one unbroken prefix), so it takes the reason of the miss that broke the
    // prefix, as a chunk the asker holds itself there does (docs/ledger.md).
    else if (ids.some((h) => registry.holder(h) !== undefined)) reason = broke ?? 'not_fetched';
    else {
      // Held nowhere: its own reason (a chunk never stored is cold whatever came before it).
      reason = registry.history.has(hi, lo) ? 'evicted' : 'cold';
      broke ??= reason;
    }
    reasons[i] = CODE[reason];
    registry.stats.missReasons[reason]++;
  }
  return { t: 'miss_reasons', id: r.data.id, reasons };
}

// The controller's answer to a P2P holder query (src/protocol/p2p_holders.ts; docs/p2p.md):
// which other instances hold the leading chunks of the asker's key list, from the chunk index
// alone. The keys are the asker's own (it computed them exactly as it stores them), so the
// controller does not recompute anything: an instance of another model or chunk size cannot hold
// the same keys, and is skipped anyway so that a bad answer is impossible.
import { describeIssues, type ControllerMsg } from '../protocol/monitor.js';
import { P2P_MAX_HOLDERS, p2pLookupMsgSchema, type P2pHolder, type P2pHoldersMsg } from '../protocol/p2p_holders.js';
import type { Registry, WorkerRec } from './registry.js';

/**
 * Answers one `p2p_lookup` monitor message. Only a registered (so authenticated) session may ask
 * where chunks are: an unknown one is told to re-register.
 */
export function answerP2pLookup(registry: Registry, routingId: string, msg: Record<string, unknown>): ControllerMsg | P2pHoldersMsg {
  const w = registry.worker(routingId);
  if (!w) return { t: 'reregister' };
  const r = p2pLookupMsgSchema.safeParse(msg);
  if (!r.success) return registry.bad(routingId, 'p2p_lookup', describeIssues(r.error));
  w.lastSeen = Date.now();
  registry.stats.p2pLookups++;
  return { t: 'p2p_holders', id: r.data.id, holders: p2pHolders(registry, w, r.data.keys) };
}

/** Holders of the leading keys of `packed`, longest run first (a CPU location first on a tie). */
export function p2pHolders(registry: Registry, asker: WorkerRec, packed: Uint8Array): P2pHolder[] {
  const n = packed.byteLength >>> 3;
  const hi = new Uint32Array(n);
  const lo = new Uint32Array(n);
  const dv = new DataView(packed.buffer, packed.byteOffset, packed.byteLength);
  for (let i = 0; i < n; i++) {
    hi[i] = dv.getUint32(8 * i);
    lo[i] = dv.getUint32(8 * i + 4);
  }
  const best = new Map<string, P2pHolder>();
  registry.index.prefixMatches(hi, lo, n, (h, chunks) => {
    const ref = registry.holder(h);
    if (!ref) return;
    const w = ref.worker;
    if (!servesAs(w, asker) || !w.distributedUrl) return;
    const prev = best.get(w.instanceId);
    const cpu = ref.location === 'LocalCPUBackend';
    if (prev && (prev.chunks > chunks || (prev.chunks === chunks && !cpu))) return;
    best.set(w.instanceId, { instance_id: w.instanceId, peer_url: w.distributedUrl, location: ref.location, chunks });
  });
  return [...best.values()]
    .sort((a, b) => b.chunks - a.chunks || Number(b.location === 'LocalCPUBackend') - Number(a.location === 'LocalCPUBackend') || a.instance_id.localeCompare(b.instance_id))
    .slice(0, P2P_MAX_HOLDERS);
}

/** Another instance's worker whose chunks the asker can use (same rank, model and chunk size). */
function servesAs(w: WorkerRec, asker: WorkerRec): boolean {
  return w.instanceId !== asker.instanceId && w.workerId === asker.workerId && w.modelId === asker.modelId && w.chunkSize === asker.chunkSize;
}

// The controller's answer to a P2P holder query (src/protocol/p2p_holders.ts; docs/p2p.md):
// which other instances hold the leading chunks of the asker's key list, from the chunk index
// alone. The keys are the asker's own (it computed them exactly as it stores them), so the
// controller does not recompute anything: an instance of another model or chunk size cannot hold
// the same keys, and is skipped anyway so that a bad answer is impossible.
import { describeIssues, type ControllerMsg } from '../protocol/monitor.js';
import { P2P_LEADING_HOLDERS, P2P_MAX_HOLDERS, p2pLookupMsgSchema, type P2pHolder, type P2pHoldersMsg } from '../protocol/p2p_holders.js';
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

/**
 * Holders of the leading keys of `packed`, longest run first (a CPU location first on a tie): up
 * to P2P_LEADING_HOLDERS alternatives for the first run. Then, past the longest of those, the
 * runs that continue it: an instance may hold the later chunks of a prefix without its head
 * (its head was evicted first, docs/storage.md), and the asker can use them once the head has
 * arrived from elsewhere. Keys the asker holds itself are stepped over (it reads them from its own
 * tiers), and the chain stops at the first key nobody else holds: a prompt's KV is imported as one
 * unbroken prefix, so nothing after a gap could be used.
 */
export function p2pHolders(registry: Registry, asker: WorkerRec, packed: Uint8Array): P2pHolder[] {
  const n = packed.byteLength >>> 3;
  const hi = new Uint32Array(n);
  const lo = new Uint32Array(n);
  const dv = new DataView(packed.buffer, packed.byteOffset, packed.byteLength);
  for (let i = 0; i < n; i++) {
    hi[i] = dv.getUint32(8 * i);
    lo[i] = dv.getUint32(8 * i + 4);
  }
  const out = runsFrom(registry, asker, hi, lo, 0, n).slice(0, P2P_LEADING_HOLDERS);
  if (!out.length) return out;
  const own = new Set(asker.holders.values());
  const ids: number[] = [];
  const askerHolds = (i: number) => {
    ids.length = 0;
    return registry.index.holdersOf(hi[i]!, lo[i]!, ids).some((h) => own.has(h));
  };
  let at = out[0]!.chunks;
  while (out.length < P2P_MAX_HOLDERS) {
    while (at < n && askerHolds(at)) at++;
    if (at >= n) break;
    const next = runsFrom(registry, asker, hi, lo, at, n)[0];
    if (!next) break;
    out.push({ ...next, from: at });
    at += next.chunks;
  }
  return out;
}

/** The other instances' runs of keys [from, n), one per instance, best first. */
function runsFrom(registry: Registry, asker: WorkerRec, hi: Uint32Array, lo: Uint32Array, from: number, n: number): P2pHolder[] {
  const best = new Map<string, P2pHolder>();
  registry.index.prefixMatches(hi.subarray(from), lo.subarray(from), n - from, (h, chunks) => {
    const ref = registry.holder(h);
    if (!ref) return;
    const w = ref.worker;
    if (!servesAs(w, asker) || !w.distributedUrl) return;
    const prev = best.get(w.instanceId);
    const cpu = ref.location === 'LocalCPUBackend';
    if (prev && (prev.chunks > chunks || (prev.chunks === chunks && !cpu))) return;
    best.set(w.instanceId, { instance_id: w.instanceId, peer_url: w.distributedUrl, location: ref.location, chunks });
  });
  return [...best.values()].sort(
    (a, b) => b.chunks - a.chunks || Number(b.location === 'LocalCPUBackend') - Number(a.location === 'LocalCPUBackend') || a.instance_id.localeCompare(b.instance_id),
  );
}

/** Another instance's worker whose chunks the asker can use (same rank, model and chunk size). */
function servesAs(w: WorkerRec, asker: WorkerRec): boolean {
  return w.instanceId !== asker.instanceId && w.workerId === asker.workerId && w.modelId === asker.modelId && w.chunkSize === asker.chunkSize && w.kvDtype === asker.kvDtype;
}

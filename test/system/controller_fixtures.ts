// What the controller system tests share (controller.test.ts, controller_transfer_safety.ts): cache
// instances in process (KvcStore + attachController) registered with a real `kvc controller`,
// deterministic chunks, and the context the test files fill in once the controller and the two
// instances A and B are up.
import { DType, encodeChunk, payloadBytes, type KvLayout } from '../../src/common/chunk.js';
import type { CacheConfig } from '../../src/common/config.js';
import { chunkKeys } from '../../src/common/keys.js';
import { attachController, type ControllerAttachment } from '../../src/kvc/controller_client.js';
import { KvcStore } from '../../src/kvc/store.js';
import { controllerInstanceConfig } from '../../harness/cache_instance.js';
import { tempDir } from '../../harness/temp_dir.js';

export const MODEL = 'ctl-test-model';
export const CHUNK = 16;
export const LAYOUT: KvLayout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 4 };

/** Deterministic chunk for a span: payload bytes derived from the key. */
export function makeChunk(key: string, numTokens: number, layout = LAYOUT): Uint8Array {
  const payload = new Uint8Array(payloadBytes(layout, numTokens));
  const seed = parseInt(key.slice(0, 8), 16);
  for (let i = 0; i < payload.length; i += 4096) payload[i] = (seed + i) & 0xff;
  return encodeChunk(layout, numTokens, key, payload);
}

export async function putPrompt(store: KvcStore, tokens: number[], loc?: 'LocalCPUBackend' | 'LocalDiskBackend', chunkSize = CHUNK, layout = LAYOUT) {
  const spans = chunkKeys(tokens, { modelId: modelFor(chunkSize), chunkSize, seed: 0n });
  for (const s of spans) await store.put(s.key, makeChunk(s.key, s.end - s.start, layout), loc);
  return spans;
}

export const range = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);

export async function waitUntil<T>(what: string, fn: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? ` (${(last as Error).message})` : ''}`);
}

export interface Instance {
  id: string;
  store: KvcStore;
  att: ControllerAttachment;
  cfg: CacheConfig;
  close(): Promise<void>;
}

/**
 * The model id of an instance of this chunk size: the controller refuses an instance whose chunk
 * size differs from its model's other instances (docs/controller.md "Registration"), so instances
 * of another chunk size are another model here.
 */
export function modelFor(chunkSize: number): string {
  return chunkSize === CHUNK ? MODEL : `${MODEL}-c${chunkSize}`;
}

export async function startInstance(id: string, monitorPort: number, opts: { cpuGiB?: number; disk?: boolean; diskGiB?: number; chunkSize?: number; layout?: KvLayout } = {}): Promise<Instance> {
  const diskDir = opts.disk ? tempDir('kvc-ctl-disk-') : null;
  const cfg = await controllerInstanceConfig(id, monitorPort, { chunkSize: opts.chunkSize ?? CHUNK, cpuGiB: opts.cpuGiB, diskDir, diskGiB: opts.diskGiB });
  const store = await KvcStore.create(cfg);
  const att = await attachController(store, cfg, { modelId: modelFor(opts.chunkSize ?? CHUNK), chunkSize: opts.chunkSize ?? CHUNK, seed: 0n, layout: opts.layout ?? LAYOUT });
  return {
    id,
    store,
    att,
    cfg,
    async close() {
      await att.close();
      await store.close();
    },
  };
}

/** An answer of the controller's /lookup. */
export interface Lookup {
  event_id: string;
  layout_info: Record<string, [string, number]>;
  num_tokens: number;
  layout_detail: Record<string, { location: string; matched_tokens: number; locations: Record<string, number> }>;
}

/** The running controller and instances, filled in by controller.test.ts's before(). */
export interface ControllerContext {
  /** The controller's HTTP URL and monitor port. */
  url: string;
  monitor: number;
  /** Every instance started so far (closed in after()); a group that starts its own adds them. */
  instances: Instance[];
  lookup(tokens: number[]): Promise<Lookup>;
  /** Waits until the event has finished or failed; its record (GET /events/{id}). */
  waitEvent(eventId: string, timeoutMs?: number): Promise<any>;
}

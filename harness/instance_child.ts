// A cache instance in its own process, so that a test can SIGKILL it (no `bye`: the controller
// must reap it): attaches to a controller, stores one prompt's chunks in its CPU tier, prints
// `stored <n>` once registered and stored, then idles until killed.
// Arguments: one JSON object, {id, monitorPort, modelId, chunkSize, layout, tokens, cpuGiB?}.
import { encodeChunk, payloadBytes, type KvLayout } from '../src/common/chunk.js';
import { chunkKeys } from '../src/common/keys.js';
import { attachController } from '../src/kvc/controller_client.js';
import { KvcStore } from '../src/kvc/store.js';
import { controllerInstanceConfig } from './cache_instance.js';

interface ChildArgs {
  id: string;
  monitorPort: number;
  modelId: string;
  chunkSize: number;
  layout: KvLayout;
  tokens: number[];
  /** Size of the CPU tier (default: the helper's, cache_instance.ts). */
  cpuGiB?: number;
}

const a = JSON.parse(process.argv[2]!) as ChildArgs;
const cfg = await controllerInstanceConfig(a.id, a.monitorPort, { chunkSize: a.chunkSize, cpuGiB: a.cpuGiB });
const store = await KvcStore.create(cfg);
const att = await attachController(store, cfg, { modelId: a.modelId, chunkSize: a.chunkSize, seed: 0n, layout: a.layout, flushMs: 5 });
while (att.state !== 'live') await new Promise((r) => setTimeout(r, 20));
const spans = chunkKeys(a.tokens, { modelId: a.modelId, chunkSize: a.chunkSize, seed: 0n });
for (const s of spans) await store.put(s.key, encodeChunk(a.layout, s.end - s.start, s.key, new Uint8Array(payloadBytes(a.layout, s.end - s.start))), 'LocalCPUBackend');
process.stdout.write(`stored ${spans.length}\n`);
setInterval(() => {}, 1 << 30);

// The V8 young generation of the controller process: kept small (1 MiB semi-space) so that
// scavenges come often. The reason is memory outside the JS heap: Node's HTTP parser hands every
// request body to JavaScript as new Buffers (~32 KB for an 8,192-token binary lookup body), and a
// Buffer's memory is freed only when a GC finds the Buffer dead. A scavenge every ~70 lookups
// frees them as fast as they come. With a larger young generation (V8 grows it up to 16 MiB
// when much survives, as during the bulk ingest of chunk keys) scavenges come every ~1,000
// lookups, the Buffers pile up, and V8 answers the external memory with full mark-compacts
// ("external memory pressure"). Measured, 2,000 binary lookups: 29–30 scavenges and no full GC
// with 1 MiB; 0–3 scavenges and 0–6 full GCs with 16 MiB (docs/controller.md "Lookup path").
// V8 reads the size only when the process starts, so it is a node flag of the process: `kvc up`
// passes it; by hand, `NODE_OPTIONS=--max-semi-space-size=1 kvc controller …`.

/** Largest semi-space, MiB, the controller process is started with. */
export const CONTROLLER_SEMI_SPACE_MIB = 1;

/**
 * The node flags sizing the controller's young generation, or none when the user's own
 * NODE_OPTIONS sizes the young generation or the whole heap (their setting wins).
 */
export function controllerNodeArgs(nodeOptions: string | undefined): string[] {
  if (nodeOptions && /--(?:min-semi-space-size|max-semi-space-size|max-heap-size)\b/.test(nodeOptions)) return [];
  return [`--max-semi-space-size=${CONTROLLER_SEMI_SPACE_MIB}`];
}

/**
 * The same flags as a NODE_OPTIONS value, for a controller not spawned by `kvc up` (the printed
 * by-hand commands of `kvc up --config-only`, the Kubernetes container): the user's NODE_OPTIONS
 * kept, the young-generation flag appended. Undefined when there is nothing to add (their
 * NODE_OPTIONS sizes the heap, so the command runs with it unchanged).
 */
export function controllerNodeOptions(nodeOptions: string | undefined): string | undefined {
  const add = controllerNodeArgs(nodeOptions);
  if (add.length === 0) return undefined;
  return [nodeOptions?.trim(), ...add].filter((s) => s).join(' ');
}

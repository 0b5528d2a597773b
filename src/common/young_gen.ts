// The V8 young generation of the controller process. Each request-path lookup leaves ~14 KB of
// short-lived garbage (fastify's request and reply, the answer; the binary token body itself
// goes into reused memory). With V8's default 1 MiB starting semi-space that is a scavenge every
// ~70 requests, and the semi-space only grows when much survives, which here it never does. A
// 16 MiB semi-space from the start makes it one scavenge every ~1,000 requests (measured: 29
// scavenges per 2,000 lookups by default, 2 with it; docs/controller.md "Lookup path").
// V8 reads the size only when the process starts, so it is a node flag of the process
// (`kvc up` passes it; by hand: `node --min-semi-space-size=16 "$(command -v kvc)" controller`),
// and Node does not accept it in NODE_OPTIONS.

/** Semi-space size, MiB, the controller process is started with. */
export const CONTROLLER_SEMI_SPACE_MIB = 16;

/**
 * The node flags sizing the controller's young generation, or none when the user's own
 * NODE_OPTIONS sizes the heap's young generation or the whole heap (their setting wins).
 */
export function controllerNodeArgs(nodeOptions: string | undefined): string[] {
  if (nodeOptions && /--(?:min-semi-space-size|max-semi-space-size|max-heap-size)\b/.test(nodeOptions)) return [];
  return [`--min-semi-space-size=${CONTROLLER_SEMI_SPACE_MIB}`];
}

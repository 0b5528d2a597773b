// Limits on what a client (or a peer process) may send, with their defaults in one place so the
// docs (docs/limits.md) and every server agree. Each bounds memory, stack or file descriptors a
// single sender could otherwise take; none of them is reached by the stack's own traffic.

/** Largest HTTP request body, bytes (413 above). */
export const DEFAULT_BODY_LIMIT = 16 * 1024 * 1024;
/**
 * Deepest nesting of arrays/objects in a JSON body (400 above). The stack's own bodies nest at
 * most 5 levels (chat content parts); deep nesting only serves to overflow the stack of
 * recursive code (JSON.stringify, validators) behind the parser.
 */
export const DEFAULT_MAX_JSON_DEPTH = 64;
/** Time allowed to receive a whole request (headers and body), ms (408 after it). */
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;
/** An idle keep-alive HTTP connection is closed after this, ms. */
export const DEFAULT_KEEP_ALIVE_TIMEOUT_MS = 65_000;
/**
 * Open HTTP connections from one client address (429 and close above). High enough for the
 * proxy's own pool to an engine (128 connections) plus health probes and benchmarks.
 */
export const DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 1024;
/** Largest ZeroMQ message any socket of the stack accepts, bytes (the connection is dropped above). */
export const DEFAULT_ZMQ_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

/**
 * True when `text` (JSON) nests arrays/objects deeper than `max`. A linear scan that skips
 * string contents (escapes included), so it costs one pass over the bytes and no recursion.
 */
export function jsonDeeperThan(text: string, max: number): boolean {
  let depth = 0;
  const n = text.length;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c === 34 /* " */) {
      // Jump to the closing quote: one not preceded by an odd number of backslashes.
      let j = i;
      for (;;) {
        j = text.indexOf('"', j + 1);
        if (j < 0) return false; // unterminated string: JSON.parse reports it
        let k = j - 1;
        while (text.charCodeAt(k) === 92 /* \ */) k--;
        if ((j - 1 - k) % 2 === 0) break;
      }
      i = j;
    } else if (c === 91 /* [ */ || c === 123 /* { */) {
      if (++depth > max) return true;
    } else if (c === 93 /* ] */ || c === 125 /* } */) {
      depth--;
    }
  }
  return false;
}

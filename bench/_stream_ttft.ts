// Reads a streamed completion to its end and times its first text event: the TTFT a client sees.
// Shared by the engine and remote-tier benchmarks.

/** Milliseconds from `startedAt` to the first non-empty text event, and the whole SSE body. */
export async function readStreamTtft(r: Response, startedAt: number): Promise<{ first: number; body: string }> {
  const reader = r.body!.getReader();
  const dec = new TextDecoder();
  let body = '';
  let first = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    body += dec.decode(value, { stream: true });
    if (!first && /"text":"[^"]/.test(body)) first = performance.now() - startedAt;
  }
  if (!first) throw new Error(`no token streamed: ${body.slice(0, 300)}`);
  return { first, body };
}

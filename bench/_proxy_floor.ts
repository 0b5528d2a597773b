// A reference for the proxy benchmark, not a proxy: the least a process can do to serve the
// benchmark's request through three upstream calls, with none of the proxy's checks, metrics,
// timeouts, failover or routing. A bare node:http server reads the client's body, then sends
// tokenize, prefill and decode to the stub through undici dispatch() with minimal handlers, and
// writes the decode's answer back as one chunk. `npm run bench -- proxy --stub-only
// --compare-floor` runs it against the real proxy in alternating rounds: the gap between the two
// CPU figures per request is all the proxy's own work can save.
import { createServer } from 'node:http';
import { Pool, type Dispatcher } from 'undici';

/** Collects one answer's bytes and hands them over at its end. */
class Collect implements Dispatcher.DispatchHandler {
  private chunks: Buffer[] = [];
  constructor(private readonly done: (err: Error | null, body: Buffer) => void) {}
  onConnect(): void {}
  onHeaders(): boolean {
    return true;
  }
  onData(chunk: Buffer): boolean {
    this.chunks.push(chunk);
    return true;
  }
  onComplete(): void {
    this.done(null, this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks));
  }
  onError(err: Error): void {
    this.done(err, Buffer.alloc(0));
  }
}

const HEADERS = { 'content-type': 'application/json' };

export function startFloorProxy(port: number, stubPort: number): Promise<void> {
  const pool = new Pool(`http://127.0.0.1:${stubPort}`, { connections: 128 });
  const post = (path: string, body: unknown) =>
    new Promise<Buffer>((resolve, reject) =>
      pool.dispatch({ method: 'POST', path, headers: HEADERS, body: JSON.stringify(body), headersTimeout: 30_000, bodyTimeout: 30_000 }, new Collect((e, b) => (e ? reject(e) : resolve(b)))),
    );
  let n = 0;
  const server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (d: Buffer) => parts.push(d));
    req.on('end', () => {
      void (async () => {
        try {
          const body = JSON.parse(Buffer.concat(parts).toString('utf8')) as Record<string, unknown>;
          JSON.parse((await post('/tokenize', { prompt: body.prompt })).toString('utf8'));
          const spec = { req_id: `floor-${n++}`, receiver_host: '127.0.0.1', receiver_init_port: 1, receiver_alloc_port: 2 };
          const pre = JSON.parse((await post('/v1/completions', { ...body, max_tokens: 1, stream: false, kv_transfer_params: { disagg_spec: spec } })).toString('utf8')) as { kv_transfer_params?: unknown };
          const answer = await post('/v1/completions', { ...body, kv_transfer_params: pre.kv_transfer_params });
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.end(answer);
        } catch (err) {
          res.writeHead(502).end(String(err));
        }
      })();
    });
  });
  return new Promise((resolve) => server.listen(port, '127.0.0.1', () => resolve()));
}

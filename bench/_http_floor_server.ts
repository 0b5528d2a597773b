// The floor of the controller benchmark's HTTP lookups (bench/controller.ts part (b)): a bare
// node:http server in its own process that reads a request's body and answers a fixed JSON reply
// of the lookup's shape (`num_tokens` = body bytes / 4, one instance's match), with no routing,
// validation, index or metrics. Measured with the same client, in the same alternating rounds as
// the controller, it is the latency this machine gives any Node HTTP server on that path: what is
// left of a controller's tail above it is the controller's own.
//
// Usage: node _http_floor_server.js <port>; prints `floor listening` once bound.
import http from 'node:http';

const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
  process.stderr.write('usage: node _http_floor_server.js <port>: started by bench/controller.ts, not a benchmark of its own\n');
  process.exit(2);
}
http
  .createServer((req, res) => {
    let bytes = 0;
    req.on('data', (d: Buffer) => (bytes += d.length));
    req.on('end', () => {
      const n = bytes >>> 2;
      const body = JSON.stringify({ event_id: 'lookup-floor', layout_info: { 'sim-0': ['LocalCPUBackend', n] }, num_tokens: n, layout_detail: { 'sim-0': { location: 'LocalCPUBackend', matched_tokens: n, locations: { LocalCPUBackend: n } } } });
      res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    });
  })
  .listen(port, '127.0.0.1', () => process.stdout.write('floor listening\n'));

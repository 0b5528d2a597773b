// Draws the pictures of docs/architecture.md as SVG: the processes of a deployment, one request's
// journey through them, and the inside of an engine process. Plain SVG written from the boxes and
// arrows below (no dependency: these are diagrams, not data plots, which the benchmarks draw with
// vega-lite). `node scripts/docs-diagrams.mjs` writes docs/img/architecture_*.svg;
// test/unit/docs_pages.test.ts checks that the committed files are what this script draws.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const FONT = 'font-family="Helvetica, Arial, sans-serif"';
const COLORS = {
  client: '#eeeeee',
  proxy: '#dbe9f6',
  controller: '#fde2c8',
  prefiller: '#dff0d8',
  decoder: '#e8dff5',
  tier: '#fff4c2',
  part: '#ffffff',
};

const esc = (s) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

class Svg {
  constructor(width, height, title) {
    this.width = width;
    this.height = height;
    this.parts = [`<title>${esc(title)}</title>`];
  }

  /** A box with a bold first line and smaller lines under it. */
  box(x, y, w, h, lines, fill = COLORS.part, o = {}) {
    const dash = o.dashed ? ' stroke-dasharray="6 4"' : '';
    this.parts.push(`<rect x="${x}" y="${y}" width="${w}" height="${h}" rx="6" fill="${fill}" stroke="#555"${dash}/>`);
    const [head, ...rest] = lines;
    const cx = o.left ? x + 10 : x + w / 2;
    const anchor = o.left ? 'start' : 'middle';
    let ty = y + 18;
    if (head) this.parts.push(`<text x="${cx}" y="${ty}" text-anchor="${anchor}" font-size="13" font-weight="bold" ${FONT}>${esc(head)}</text>`);
    for (const l of rest) {
      ty += 15;
      this.parts.push(`<text x="${cx}" y="${ty}" text-anchor="${anchor}" font-size="11.5" ${FONT}>${esc(l)}</text>`);
    }
  }

  /** A straight arrow from (x1, y1) to (x2, y2) with a label at its middle (offset by dx, dy). */
  arrow(x1, y1, x2, y2, label = '', o = {}) {
    const dash = o.dashed ? ' stroke-dasharray="5 4"' : '';
    const end = o.both ? ' marker-start="url(#head)"' : '';
    this.parts.push(`<line x1="${x1}" y1="${y1}" x2="${x2}" y2="${y2}" stroke="${o.color ?? '#333'}" stroke-width="1.5"${dash}${end} marker-end="url(#head)"/>`);
    if (label) this.label((x1 + x2) / 2 + (o.dx ?? 0), (y1 + y2) / 2 + (o.dy ?? -5), label, o.anchor ?? 'middle');
  }

  /** An arrow along a polyline through `points` ([x, y] pairs). */
  path(points, o = {}) {
    const dash = o.dashed ? ' stroke-dasharray="5 4"' : '';
    const start = o.both ? ' marker-start="url(#head)"' : '';
    const d = points.map(([x, y], i) => `${i ? 'L' : 'M'}${x},${y}`).join(' ');
    this.parts.push(`<path d="${d}" fill="none" stroke="#333" stroke-width="1.5"${dash}${start} marker-end="url(#head)"/>`);
  }

  /** Text lines (first one at y), on a white backing so that they stay readable over lines. */
  label(x, y, text, anchor = 'middle', size = 11.5) {
    for (const [i, l] of String(text).split('\n').entries()) {
      this.parts.push(`<text x="${x}" y="${y + i * 14}" text-anchor="${anchor}" font-size="${size}" ${FONT} paint-order="stroke" stroke="#fff" stroke-width="4">${esc(l)}</text>`);
    }
  }

  toString() {
    return [
      `<svg xmlns="http://www.w3.org/2000/svg" width="${this.width}" height="${this.height}" viewBox="0 0 ${this.width} ${this.height}">`,
      '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#333"/></marker></defs>',
      `<rect width="${this.width}" height="${this.height}" fill="#fff"/>`,
      ...this.parts,
      '</svg>',
      '',
    ].join('\n');
  }
}

/** The processes of a `kvc up` deployment and what flows between them. */
function processes() {
  const s = new Svg(960, 600, 'kvc processes');
  s.box(20, 20, 920, 560, ['', ''], '#fafafa', { dashed: true });
  s.label(30, 38, 'kvc up (src/deploy): starts, supervises and stops every process below', 'start', 12);
  s.box(30, 60, 170, 52, ['client', 'any OpenAI client'], COLORS.client);
  s.box(330, 60, 280, 66, ['proxy (kvc proxy, src/proxy)', ':9100 OpenAI API, routing, failover', ':7500 transfer notices (ZeroMQ PULL)'], COLORS.proxy);
  s.box(700, 60, 230, 66, ['controller (kvc controller)', ':9000 HTTP API, dashboard', ':9001 monitor (ZeroMQ)'], COLORS.controller);

  s.box(40, 220, 400, 210, ['prefiller engines (kvc engine, kv_producer)', 'HTTP :7100+i'], COLORS.prefiller);
  s.box(60, 268, 170, 50, ['model + scheduler', 'computes the prompt’s KV'], COLORS.part);
  s.box(250, 268, 170, 50, ['xfer sender', 'src/xfer'], COLORS.part);
  s.box(60, 340, 360, 70, ['cache instance (src/kvc)', 'KvcStore: CPU and disk tiers, remote tier', 'worker port :7700+i, peer port :7800+i'], COLORS.part);

  s.box(520, 220, 400, 210, ['decoder engines (kvc engine, kv_consumer)', 'HTTP :7200+j'], COLORS.decoder);
  s.box(730, 268, 170, 50, ['model + scheduler', 'imports KV, decodes'], COLORS.part);
  s.box(540, 268, 170, 50, ['xfer receiver', ':7300+j init, :7400+j alloc'], COLORS.part);
  s.box(540, 340, 360, 70, ['cache instance (src/kvc)', 'KvcStore: CPU and disk tiers, remote tier', 'worker port :7750+j, peer port :7850+j'], COLORS.part);

  s.box(40, 480, 560, 80, ['tiers of each cache instance', 'LocalCPUBackend: chunks in RAM (max_local_cpu_size)', 'LocalDiskBackend: chunk files (local_disk, max_local_disk_size)'], COLORS.tier, { left: true });
  s.box(620, 480, 300, 80, ['shared remote tier', 'Redis / Valkey (remote_url)', 'one copy for every instance'], COLORS.tier);

  s.arrow(200, 86, 328, 86, 'HTTP + SSE', { dy: -6 });
  s.arrow(370, 128, 250, 218);
  s.label(300, 150, 'prefill: max_tokens 1,', 'end');
  s.label(300, 164, 'kv_transfer_params.disagg_spec', 'end');
  s.arrow(330, 266, 420, 130, '', { dashed: true });
  s.label(392, 200, 'transfer notice (ZeroMQ)', 'start');
  s.arrow(560, 128, 660, 218);
  s.label(622, 168, 'tokenize; decode', 'end');
  s.label(622, 182, '(SSE back)', 'end');
  s.arrow(612, 80, 698, 80, '/prefix_lookup', { dy: -6 });
  s.arrow(880, 128, 880, 338, '', { both: true });
  s.path([[740, 128], [740, 146], [480, 146], [480, 360], [424, 360]], { both: true });
  s.label(815, 166, 'monitor: register,', 'middle');
  s.label(815, 180, 'admits, evicts;', 'middle');
  s.label(815, 194, 'worker: move, copy,', 'middle');
  s.label(815, 208, 'pin, clear', 'middle');
  s.arrow(420, 293, 538, 293, 'KV chunks (TCP)', { dy: -8, dx: 20 });
  s.arrow(422, 395, 538, 395, 'P2P chunk bytes', { both: true, dy: 16 });
  s.arrow(240, 412, 240, 478, 'put / get', { dx: 30 });
  s.arrow(720, 412, 720, 478, 'put / get', { dx: 30 });
  s.arrow(420, 412, 700, 478, '', { dashed: true });
  return s.toString();
}

/** One streamed completion through a 1P1D deployment, as a sequence of messages. */
function request() {
  const lanes = [
    ['client', 90, COLORS.client],
    ['proxy', 300, COLORS.proxy],
    ['decoder', 560, COLORS.decoder],
    ['prefiller', 820, COLORS.prefiller],
  ];
  const s = new Svg(920, 680, 'one request through kvc');
  for (const [name, x, fill] of lanes) {
    s.box(x - 70, 16, 140, 34, [name], fill);
    s.parts.push(`<line x1="${x}" y1="50" x2="${x}" y2="640" stroke="#999" stroke-dasharray="4 4"/>`);
  }
  const X = Object.fromEntries(lanes.map(([n, x]) => [n, x]));
  let y = 80;
  const step = (from, to, text, gap = 44) => {
    s.arrow(X[from], y, X[to], y, '', {});
    const mid = (X[from] + X[to]) / 2;
    s.label(mid, y - 6, text);
    y += gap;
  };
  const self = (who, text, h = 40) => {
    s.parts.push(`<rect x="${X[who] - 8}" y="${y - 12}" width="16" height="${h}" fill="#bbb" stroke="#555"/>`);
    const right = X[who] > 700;
    s.label(right ? X[who] - 14 : X[who] + 14, y, text, right ? 'end' : 'start');
    y += h + 14;
  };
  step('client', 'proxy', '1  POST /v1/completions (stream)');
  step('proxy', 'decoder', '2  POST /tokenize: token count; this decoder serves the request');
  step('decoder', 'proxy', 'count (prompt over max_model_len: 400 here, before any prefill)');
  step('proxy', 'prefiller', '3  the same request, max_tokens 1, stream false, kv_transfer_params.disagg_spec', 50);
  self('prefiller', '4  prefill the prompt,\n    seal its KV into chunks', 34);
  step('prefiller', 'decoder', '5  xfer: HELLO, ALLOC (reserve), DATA chunks; ACK each', 44);
  step('decoder', 'prefiller', 'have: chunks its own cache already holds are skipped', 44);
  step('prefiller', 'proxy', '6  transfer notice (ZeroMQ), then the HTTP reply (1 token, kv_transfer_params.xfer)', 50);
  step('proxy', 'decoder', '7  the client’s request + kv_transfer_params (same disagg_spec)', 44);
  self('decoder', '8  take() the received chunks, import them into\n    the paged KV cache, recompute the last tokens,\n    decode step by step beside other streams', 56);
  step('decoder', 'proxy', '9  SSE: one event per token', 40);
  step('proxy', 'client', '10  relayed unchanged (one write per event-loop turn)', 40);
  s.label(460, y + 4, 'Any failure before 7 (prefiller down, transfer refused): the decoder prefills by itself.', 'middle', 11.5);
  return s.toString();
}

/** Inside one engine process: request path, model, cache instance and transfer plugin. */
function engine() {
  const s = new Svg(960, 520, 'inside a kvc engine');
  s.box(20, 20, 920, 480, ['', ''], '#fafafa', { dashed: true });
  s.label(30, 38, 'kvc engine (src/engine): one process, one model', 'start', 12);
  s.box(40, 60, 360, 64, ['HTTP API (fastify, src/engine/routes)', '/v1/completions, /v1/chat/completions,', '/tokenize, /v1/models, /health, /metrics'], COLORS.proxy);
  s.box(40, 160, 360, 64, ['scheduler (scheduler.ts)', 'continuous batching: decode rows and prompt', 'chunks in one forward step, bounded in time'], COLORS.part);
  s.box(40, 260, 360, 118, ['model (src/engine/model)', 'Llama forward pass on the CPU:', 'embed → layers × [RMSNorm, attention over', 'the paged KV cache, SwiGLU] → LM head', 'weights: safetensors or GGUF (f32, f16, Q8_0,', 'k-quants) or the generated built-in model'], COLORS.prefiller);
  s.box(40, 410, 360, 64, ['kernels', 'WASM SIMD matrix products and attention,', 'shared with a worker thread (2 threads)'], COLORS.part);
  s.box(520, 60, 400, 64, ['sampler, stop strings, tokenizer', 'greedy / seeded sampling; incremental detokenizer;', 'SSE writer (one write per stream and step)'], COLORS.part);
  s.box(520, 160, 400, 80, ['connector KvcConnectorV1 (connector.ts)', 'before prefill: load the prompt’s cached chunks;', 'after prefill: save sealed chunks', '(roles kv_producer, kv_consumer, kv_both)'], COLORS.controller);
  s.box(520, 270, 400, 90, ['cache instance (src/kvc)', 'KvcStore: CPU tier → disk tier → remote tier', 'worker server: move, copy, pin, clear (controller)', 'controller client (monitor); P2P fetch and serve'], COLORS.tier);
  s.box(520, 390, 400, 84, ['xfer plugin (src/xfer)', 'prefiller: XferSender streams sealed chunks', 'decoder: XferReceiver reserves and verifies them,', 'then hands them to the connector (take, release)'], COLORS.decoder);
  s.arrow(220, 124, 220, 158, 'requests in', { dx: 40 });
  s.arrow(518, 86, 402, 86, 'SSE events', { dy: -6 });
  s.arrow(402, 172, 518, 112, 'logits → tokens', { dy: -2, dx: -8 });
  s.arrow(220, 224, 220, 258, 'forward(segments)', { dx: 60 });
  s.arrow(220, 378, 220, 408, '');
  s.arrow(402, 208, 518, 208, 'lookup, load,', { both: true, dy: -8 });
  s.label(460, 226, 'save chunks');
  s.arrow(720, 240, 720, 268, '', { both: true });
  s.arrow(880, 240, 880, 388, '', { both: true });
  s.arrow(402, 318, 518, 318, 'chunks ↔', { both: true, dy: -8 });
  s.label(460, 336, 'paged KV');
  return s.toString();
}

export function diagrams() {
  return {
    'architecture_processes.svg': processes(),
    'architecture_request.svg': request(),
    'architecture_engine.svg': engine(),
  };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const dir = join(fileURLToPath(new URL('..', import.meta.url)), 'docs', 'img');
  for (const [name, svg] of Object.entries(diagrams())) {
    writeFileSync(join(dir, name), svg);
    console.log(`wrote docs/img/${name}`);
  }
}

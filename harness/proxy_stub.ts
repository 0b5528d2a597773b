// A minimal upstream that speaks the engine endpoints the proxy uses (/tokenize,
// /v1/completions, /v1/chat/completions, /v1/models, /health), with fixed small payloads.
// Used by the proxy's own unit tests and by the proxy benchmark to measure the proxy alone,
// without model compute. It records every request so tests can check routing, and it can be
// told to fail (HTTP 500), hang, or be closed (connection refused).
import Fastify, { type FastifyInstance } from 'fastify';

/**
 * 'cut': a streamed answer breaks off after its first event (connection destroyed).
 * 'reject': completions answer 500 while /health stays ok (a request the engine fails on, the
 * engine itself fine).
 */
/** The stubs' default context length: long enough for the longest streams the tests ask for. */
export const STUB_CONTEXT = 1 << 20;

export type StubMode = 'ok' | 'error' | 'hang' | 'cut' | 'reject';

export interface StubRequest {
  path: string;
  body: Record<string, unknown>;
  /** The Authorization header the request came with, if any. */
  authorization?: string;
}

export interface StubEngine {
  app: FastifyInstance;
  port: number;
  name: string;
  requests: StubRequest[];
  /** Completion requests whose client went away before the answer was complete. */
  aborted: number;
  mode: StubMode;
  /** Delay before answering a completion, ms. */
  delayMs: number;
  /** Delay before each SSE event of a streamed answer, ms (0: all at once). */
  streamDelayMs: number;
  /** Delay before answering GET /health, ms (a busy engine's slow probe answer). */
  healthDelayMs: number;
  /** The context length its /tokenize and /health report. */
  maxModelLen: number;
  close(): Promise<void>;
}

/** Deterministic "generated" words for a prompt: the same prompt always gives the same text. */
export function stubWords(prompt: string, n: number): string[] {
  let h = 2166136261;
  for (let i = 0; i < prompt.length; i++) h = Math.imul(h ^ prompt.charCodeAt(i), 16777619) >>> 0;
  return Array.from({ length: n }, (_, i) => ` w${(h + i * 7919) % 1000}`);
}

function promptText(body: Record<string, unknown>): string {
  if (typeof body.prompt === 'string') return body.prompt;
  if (Array.isArray(body.prompt)) return body.prompt.join(',');
  if (Array.isArray(body.messages)) return JSON.stringify(body.messages);
  return '';
}

export async function startStubEngine(name: string, port = 0, host = '127.0.0.1'): Promise<StubEngine> {
  const app = Fastify({ logger: false, keepAliveTimeout: 65_000, forceCloseConnections: true });
  const stub: StubEngine = {
    app,
    port: 0,
    name,
    requests: [],
    aborted: 0,
    mode: 'ok',
    delayMs: 0,
    streamDelayMs: 0,
    healthDelayMs: 0,
    maxModelLen: STUB_CONTEXT,
    close: async () => {
      await app.close();
    },
  };
  const gate = async (): Promise<boolean> => {
    if (stub.delayMs) await new Promise((r) => setTimeout(r, stub.delayMs));
    if (stub.mode === 'hang') await new Promise((r) => setTimeout(r, 600_000).unref());
    return stub.mode === 'ok' || stub.mode === 'cut';
  };
  app.get('/health', async (_req, reply) => {
    if (stub.healthDelayMs) await new Promise((r) => setTimeout(r, stub.healthDelayMs).unref());
    return stub.mode === 'ok' || stub.mode === 'reject' ? { status: 'ok', max_model_len: stub.maxModelLen } : reply.code(503).send({ status: 'down' });
  });
  app.get('/v1/models', async () => ({ object: 'list', data: [{ id: 'stub', object: 'model', owned_by: name }] }));
  app.post('/tokenize', async (req) => {
    const body = req.body as Record<string, unknown>;
    stub.requests.push({ path: '/tokenize', body, authorization: req.headers.authorization });
    const words = promptText(body).split(/\s+/).filter(Boolean);
    return { tokens: words.map((_, i) => i + 1), count: words.length, max_model_len: stub.maxModelLen };
  });
  const complete = (chat: boolean) => async (req: import('fastify').FastifyRequest, reply: import('fastify').FastifyReply) => {
    const body = req.body as Record<string, unknown>;
    stub.requests.push({ path: chat ? '/v1/chat/completions' : '/v1/completions', body, authorization: req.headers.authorization });
    reply.raw.once('close', () => {
      if (!reply.raw.writableFinished) stub.aborted++;
    });
    if (typeof body.temperature === 'number' && body.temperature < 0) {
      return reply.code(400).send({ error: { message: 'field `temperature`: expected a number >= 0', type: 'invalid_request_error', code: 'invalid_field' } });
    }
    if (!(await gate())) return reply.code(500).send({ error: { message: `${name} failing`, type: 'internal_error', code: 'stub' } });
    const n = typeof body.max_tokens === 'number' ? body.max_tokens : 16;
    const words = stubWords(promptText(body), n);
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${name}-${stub.requests.length}`;
    const created = Math.floor(Date.now() / 1000);
    const usage = { prompt_tokens: 3, completion_tokens: n, total_tokens: 3 + n };
    const object = chat ? 'chat.completion' : 'text_completion';
    if (body.stream !== true) {
      const choice = chat
        ? { index: 0, message: { role: 'assistant', content: words.join('') }, finish_reason: 'length' }
        : { index: 0, text: words.join(''), finish_reason: 'length', logprobs: null };
      return { id, object, created, model: 'stub', choices: [choice], usage, served_by: name, kv_transfer_params: body.kv_transfer_params ?? null };
    }
    reply.hijack();
    const raw = reply.raw;
    raw.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const chunkObject = chat ? 'chat.completion.chunk' : 'text_completion';
    // Events written without a delay are gathered and written 256 at a time: on Node 24 a response
    // that queues ~10^6 writes in one turn fails its socket's writev with EINVAL (measured; Node 20
    // sends it), and a long stub stream is 300,000 events.
    let batch: string[] = [];
    const flush = () => {
      if (batch.length) raw.write(batch.join(''));
      batch = [];
    };
    const send = (o: unknown) => {
      batch.push(`data: ${JSON.stringify(o)}\n\n`);
      if (stub.streamDelayMs || batch.length >= 256) flush();
    };
    // Like the engine (and OpenAI), a chat stream opens with a role-only chunk.
    if (chat) send({ id, object: chunkObject, created, model: 'stub', choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] });
    for (let i = 0; i < words.length; i++) {
      if (stub.streamDelayMs) {
        await new Promise((r) => setTimeout(r, stub.streamDelayMs));
        if (raw.destroyed) return;
      }
      const choice = chat
        ? { index: 0, delta: { content: words[i] }, finish_reason: i === words.length - 1 ? 'length' : null }
        : { index: 0, text: words[i], finish_reason: i === words.length - 1 ? 'length' : null, logprobs: null };
      send({ id, object: chunkObject, created, model: 'stub', choices: [choice] });
      if (stub.mode === 'cut') {
        flush();
        setTimeout(() => raw.destroy(), 20);
        return;
      }
    }
    flush();
    raw.end(`data: ${JSON.stringify({ id, object: chunkObject, created, model: 'stub', choices: [], usage })}\n\ndata: [DONE]\n\n`);
  };
  app.post('/v1/completions', complete(false));
  app.post('/v1/chat/completions', complete(true));
  await app.listen({ host, port });
  const a = app.server.address();
  stub.port = typeof a === 'object' && a ? a.port : port;
  return stub;
}

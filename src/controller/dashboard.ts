// The controller's web dashboard: `/` serves the page, `/dashboard/*` its static files (shipped in
// src/controller/dashboard/, no CDN), `/dashboard/vendor/*` the charting library (uPlot, served
// from its npm package), and `GET /dashboard/state` the one JSON snapshot the page polls:
// instances and workers with heartbeat age and per-location chunks/bytes, recent events, and the
// engines' hit-rate / TTFT samples reported over the monitor protocol.
//
// `POST /dashboard/tokenize` turns a typed prompt into token ids through the engine of the chosen
// instance (its address comes with the instance's registration).
//
// The page's actions (pin, unpin, move, copy, clear) call the controller's ordinary HTTP API, so
// they are guarded exactly as that API is; the page sends `Authorization: Bearer <key>` when the
// operator typed a key into it (see app.js `authHeaders`).
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import fastifyStatic from '@fastify/static';
import type { FastifyInstance } from 'fastify';
import { ERRORS, kvcError } from '../common/errors.js';
import { requireObject } from '../common/http.js';
import { parseBody } from '../common/validate.js';
import { dashboardTokenizeSchema } from '../protocol/controller_api.js';
import { tokenizeReplySchema } from '../protocol/tokenize.js';
import type { Operations } from './operations.js';

/** How long the dashboard's prompt tokenization waits for the engine. */
const TOKENIZE_TIMEOUT_MS = 10_000;

/** Events the state snapshot carries (newest first). */
export const DASHBOARD_EVENTS = 50;

/**
 * The folder of the page's files. The build (tsc) does not copy them, so from dist/src/controller/
 * they are found in the package's src/controller/dashboard/; a copy next to the module wins.
 */
export function dashboardDir(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const candidates = [join(here, 'dashboard'), resolve(here, '../../../src/controller/dashboard')];
  const found = candidates.find((d) => existsSync(join(d, 'index.html')));
  if (!found) throw new Error(`dashboard files not found (looked in ${candidates.join(', ')})`);
  return found;
}

function uplotDir(): string {
  const require = createRequire(import.meta.url);
  return join(dirname(require.resolve('uplot/package.json')), 'dist');
}

export async function registerDashboard(app: FastifyInstance, ops: Operations): Promise<void> {
  const root = dashboardDir();
  await app.register(fastifyStatic, { root, prefix: '/dashboard/', index: false, cacheControl: false });
  await app.register(fastifyStatic, {
    root: uplotDir(),
    prefix: '/dashboard/vendor/',
    decorateReply: false,
    allowedPath: (path) => path === '/uPlot.iife.min.js' || path === '/uPlot.min.css',
  });
  app.get('/', async (_req, reply) => reply.type('text/html; charset=utf-8').sendFile('index.html', root));
  // The folder itself is not a page: send its visitors to the page.
  for (const path of ['/dashboard', '/dashboard/']) app.get(path, async (_req, reply) => reply.redirect('/'));
  app.post('/dashboard/tokenize', async (req) => {
    const b = parseBody(dashboardTokenizeSchema, requireObject(req.body));
    const url = ops.workersOf(b.instance_id, 'instance_id').find((w) => w.engineUrl)?.engineUrl;
    if (!url) throw kvcError(ERRORS.conflict, `instance_id: instance "${b.instance_id}" registered no engine address (an engine started with --port 0, or not an engine); give token ids instead`);
    let res: Response;
    try {
      res = await fetch(`${url}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ prompt: b.prompt }), signal: AbortSignal.timeout(TOKENIZE_TIMEOUT_MS) });
    } catch (e) {
      throw kvcError(ERRORS.upstream_failed, `the engine of instance "${b.instance_id}" at ${url} did not answer /tokenize: ${(e as Error).message}`);
    }
    const j = (await res.json().catch(() => null)) as { error?: { message?: string } } | null;
    if (!res.ok) {
      // (An engine started with --api-key refuses the controller, which holds no client key.)
      throw kvcError(ERRORS.upstream_failed, `the engine of instance "${b.instance_id}" refused /tokenize (HTTP ${res.status}): ${j?.error?.message ?? 'no message'}; give token ids instead`);
    }
    const r = tokenizeReplySchema.safeParse(j);
    if (!r.success) throw kvcError(ERRORS.upstream_failed, `the engine of instance "${b.instance_id}" answered /tokenize with something else than {tokens, count}`);
    return { tokens: r.data.tokens, count: r.data.count };
  });
  app.get('/dashboard/state', async () => ({
    time: new Date().toISOString(),
    instances: ops.describeInstances(),
    events: ops.events.recent(DASHBOARD_EVENTS),
    event_counts: ops.events.counts,
    engine_samples: ops.registry.engineSamples(),
  }));
}

// The controller's web dashboard: `/` serves the page, `/dashboard/*` its static files (shipped in
// src/controller/dashboard/, no CDN), `/dashboard/vendor/*` the charting library (uPlot, served
// from its npm package), and `GET /dashboard/state` the one JSON snapshot the page polls:
// instances and workers with heartbeat age and per-location chunks/bytes, recent events, and the
// engines' hit-rate / TTFT samples reported over the monitor protocol.
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
import type { Operations } from './operations.js';

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
  app.get('/dashboard/state', async () => ({
    time: new Date().toISOString(),
    instances: ops.describeInstances(),
    events: ops.events.recent(DASHBOARD_EVENTS),
    event_counts: ops.events.counts,
    engine_samples: ops.registry.engineSamples(),
  }));
}

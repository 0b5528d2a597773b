// Commands from the controller to an instance worker's HTTP port, each with a deadline.
// Failures map to the controller's own errors (catalog: src/common/errors.ts): the worker cannot be reached →
// 503, it does not answer in time → 504, it answers with a 4xx → the same 4xx and message
// (e.g. 404 unknown location), anything else → 502.
import { Agent, request } from 'undici';
import { catalogEntry, KvcError, kvcError, timedOut, unavailable, upstreamFailed } from '../common/errors.js';
import { describeIssues } from '../protocol/monitor.js';
import { WORKER_ROUTES, type WorkerReply, type WorkerRequest, type WorkerRoute } from '../protocol/worker_api.js';
import type { WorkerRec } from './registry.js';
import { deploymentSecret } from '../common/auth.js';
import { signedHeaders } from '../common/replay.js';

// undici's own header/body timeouts (300 s by default) are switched off: every call carries
// its deadline as an AbortSignal, so a long transfer is bounded by --transfer-timeout only.
const agent = new Agent({ headersTimeout: 0, bodyTimeout: 0, keepAliveTimeout: 10_000, connect: { timeout: 5_000 } });

export function workerName(w: WorkerRec): string {
  return `instance "${w.instanceId}" worker ${w.workerId} (${w.ip}:${w.workerPort})`;
}

/**
 * Calls one route of the worker API (src/protocol/worker_api.ts) and checks the reply against its
 * schema: a worker that answers 2xx with another shape is reported as a 502, never passed on.
 */
export async function callWorker<R extends WorkerRoute>(w: WorkerRec, route: R, body: WorkerRequest<R>, deadlineMs: number): Promise<WorkerReply<R>> {
  const { method, path, reply } = WORKER_ROUTES[route];
  const json = await send(w, method, path, body, deadlineMs);
  const r = reply.safeParse(json);
  if (!r.success) throw upstreamFailed(`${workerName(w)} answered ${path} with an unexpected body: ${describeIssues(r.error)}`);
  return r.data as WorkerReply<R>;
}

async function send(w: WorkerRec, method: 'GET' | 'POST', path: string, body: unknown, deadlineMs: number): Promise<unknown> {
  const url = `http://${w.ip.includes(':') ? `[${w.ip}]` : w.ip}:${w.workerPort}${path}`;
  const signal = AbortSignal.timeout(deadlineMs);
  let res: Awaited<ReturnType<typeof request>>;
  try {
    res = await request(url, {
      method,
      headers: { ...signedHeaders(deploymentSecret(), method, path, body), ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      dispatcher: agent,
    });
  } catch (e) {
    const err = e as Error & { cause?: { code?: string; message?: string } };
    if (signal.aborted) throw timedOut(`${workerName(w)} did not answer ${path} within ${deadlineMs} ms`);
    const code = (err as { code?: string }).code ?? err.cause?.code;
    throw unavailable(`${workerName(w)} is not reachable for ${path}: ${code ?? err.cause?.message ?? err.message}`);
  }
  let text: string;
  try {
    text = await res.body.text();
  } catch (e) {
    const err = e as Error;
    if (signal.aborted) throw timedOut(`${workerName(w)} did not finish answering ${path} within ${deadlineMs} ms`);
    throw upstreamFailed(`${workerName(w)} broke off its answer to ${path}: ${err.message}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw upstreamFailed(`${workerName(w)} answered ${path} with HTTP ${res.statusCode} and a body that is not JSON`);
  }
  const status = res.statusCode;
  if (status >= 200 && status < 300) return json;
  const e = (json as { error?: { message?: string; type?: string; code?: string } }).error;
  const message = `${workerName(w)}: ${e?.message ?? `HTTP ${status}`}`;
  if (status >= 400 && status < 500) {
    // A catalog code keeps its catalog status and type; anything else (fastify's FST_ERR_… codes)
    // keeps the worker's status and code as a client error.
    const entry = catalogEntry(e?.code);
    throw entry?.status === status ? kvcError(entry, message) : new KvcError(status, 'invalid_request_error', message, e?.code ?? null);
  }
  if (status === 504) throw timedOut(message);
  if (status === 503) throw unavailable(message);
  throw upstreamFailed(message);
}

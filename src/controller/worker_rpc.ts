// Commands from the controller to an instance worker's HTTP port, each with a deadline.
// Failures map to the controller's own errors (DESIGN §9): the worker cannot be reached →
// 503, it does not answer in time → 504, it answers with a 4xx → the same 4xx and message
// (e.g. 404 unknown location), anything else → 502.
import { KvcError, timedOut, unavailable, upstreamFailed } from '../common/errors.js';
import type { WorkerRec } from './registry.js';

export function workerName(w: WorkerRec): string {
  return `instance "${w.instanceId}" worker ${w.workerId} (${w.ip}:${w.workerPort})`;
}

export async function callWorker<T>(w: WorkerRec, method: 'GET' | 'POST', path: string, body: unknown, deadlineMs: number): Promise<T> {
  const url = `http://${w.ip.includes(':') ? `[${w.ip}]` : w.ip}:${w.workerPort}${path}`;
  let res: Response;
  try {
    res = await fetch(url, {
      method,
      headers: body === undefined ? undefined : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(deadlineMs),
    });
  } catch (e) {
    const err = e as Error & { cause?: { code?: string; message?: string } };
    if (err.name === 'TimeoutError' || err.name === 'AbortError') throw timedOut(`${workerName(w)} did not answer ${path} within ${deadlineMs} ms`);
    throw unavailable(`${workerName(w)} is not reachable for ${path}: ${err.cause?.code ?? err.cause?.message ?? err.message}`);
  }
  let text: string;
  try {
    text = await res.text();
  } catch (e) {
    const err = e as Error;
    if (err.name === 'TimeoutError' || err.name === 'AbortError') throw timedOut(`${workerName(w)} did not finish answering ${path} within ${deadlineMs} ms`);
    throw upstreamFailed(`${workerName(w)} broke off its answer to ${path}: ${err.message}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw upstreamFailed(`${workerName(w)} answered ${path} with HTTP ${res.status} and a body that is not JSON`);
  }
  if (res.ok) return json as T;
  const e = (json as { error?: { message?: string; type?: string; code?: string } }).error;
  const message = `${workerName(w)}: ${e?.message ?? `HTTP ${res.status}`}`;
  if (res.status >= 400 && res.status < 500) {
    throw new KvcError(res.status, (e?.type as KvcError['type']) ?? 'invalid_request_error', message, e?.code ?? null);
  }
  if (res.status === 504) throw timedOut(message);
  if (res.status === 503) throw unavailable(message);
  throw upstreamFailed(message);
}

// Fault injection for the fault tests and the soak run: kill -9, SIGSTOP/SIGCONT, and restarting
// a killed process exactly as it was started (its command line, environment and working
// directory read from /proc before the kill), plus a steady request load through the proxy that
// records every outcome.
import { spawn, type ChildProcess } from 'node:child_process';
import { openSync, readFileSync, readlinkSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

export interface ProcessImage {
  argv: string[];
  env: NodeJS.ProcessEnv;
  cwd: string;
}

/** What is needed to start a process again as it was started. */
export function processImage(pid: number): ProcessImage {
  const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter((s, i, a) => s.length > 0 || i < a.length - 1);
  if (argv[argv.length - 1] === '') argv.pop();
  const env: NodeJS.ProcessEnv = {};
  for (const kv of readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0')) {
    const i = kv.indexOf('=');
    if (i > 0) env[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return { argv, env, cwd: readlinkSync(`/proc/${pid}/cwd`) };
}

const respawned = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of respawned) if (c.exitCode === null) c.kill('SIGKILL');
});

/** Starts `image` again, output appended to `logFile`. The caller stops it (by pid) at the end. */
export function respawn(image: ProcessImage, logFile: string): ChildProcess {
  const fd = openSync(logFile, 'a');
  const child = spawn(image.argv[0]!, image.argv.slice(1), { env: image.env, cwd: image.cwd, stdio: ['ignore', fd, fd] });
  respawned.add(child);
  child.once('exit', () => respawned.delete(child));
  return child;
}

export function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    /* already gone */
  }
}

/**
 * Why an outcome counts as lost: no answer within the request's bound (`unanswered`), the
 * connection failed or broke before the answer ended (`connection`), a 200 whose body stopped
 * short of its end (`truncated`: a stream without `data: [DONE]`, a JSON answer that does not
 * parse or has no choices), an error status without a message saying why (`no_reason`). An error
 * status with a message, and a stream that ended with an error event, failed with a reason: not lost.
 */
export type LostHow = 'unanswered' | 'connection' | 'truncated' | 'no_reason';

export interface LoadResult {
  status: number;
  /** ms from sending to the first content byte (streams) or to the whole answer. */
  ttftMs: number;
  error?: string;
  stream: boolean;
  /** When it was sent (Date.now()). */
  startedAt: number;
  /** Set when the outcome is lost (see LostHow). */
  lost?: LostHow;
}

/** One load request: POSTs `body` to `path` under the proxy; answers its status, its whole text and the time to its first byte. */
export type LoadSend = (path: string, body: unknown, timeoutMs: number) => Promise<{ status: number; text: string; ttftMs: number }>;

/** LoadSend over this process's own network (fetch). */
export function fetchSend(proxy: string): LoadSend {
  return async (path, body, timeoutMs) => {
    const t0 = performance.now();
    let ttft = 0;
    const r = await fetch(`${proxy}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs) });
    let text = '';
    const dec = new TextDecoder();
    for await (const piece of (r.body ?? []) as AsyncIterable<Uint8Array>) {
      if (!ttft) ttft = performance.now() - t0;
      text += dec.decode(piece, { stream: true });
    }
    return { status: r.status, text, ttftMs: ttft || performance.now() - t0 };
  };
}

export interface LoadOptions {
  /** Each request's bound (ms, default 60 s): unanswered by then, it is aborted and counted lost. */
  timeoutMs?: number;
  maxTokens?: number;
  /** How requests are carried (default: fetch from this process; the soak sends from inside a namespace). */
  send?: LoadSend;
  /** Every fifth request's token-id prompt is this long and new (the caches fill and evict). */
  longPromptTokens?: number;
}

/** The error message an error answer carries (OpenAI's {error: {message}}, or a plain message), or ''. */
function reasonOf(text: string): string {
  try {
    const j = JSON.parse(text) as { error?: { message?: unknown } | string; message?: unknown };
    const m = typeof j.error === 'string' ? j.error : (j.error?.message ?? j.message);
    return typeof m === 'string' ? m.trim() : '';
  } catch {
    return '';
  }
}

function hasError(json: string): boolean {
  try {
    return (JSON.parse(json) as { error?: unknown }).error !== undefined;
  } catch {
    return false;
  }
}

/** Status, lost or not, and error text of one answer (see LostHow). */
export function judgeAnswer(status: number, text: string, stream: boolean): Pick<LoadResult, 'status' | 'lost' | 'error'> {
  if (status === 0) return { status, lost: /timeout/i.test(text) ? 'unanswered' : 'connection', error: text.slice(0, 300) };
  if (status === 200 && stream) {
    // A stream that broke after its headers carries an error event: it failed with a reason (599).
    const events = text.split('\n').filter((l) => l.startsWith('data: {'));
    if (events.some((l) => hasError(l.slice(6)))) return { status: 599, error: text.slice(0, 300) };
    return text.includes('data: [DONE]') ? { status } : { status, lost: 'truncated', error: text.slice(-300) };
  }
  if (status === 200) {
    try {
      if (Array.isArray((JSON.parse(text) as { choices?: unknown }).choices)) return { status };
    } catch {
      /* judged below */
    }
    return { status, lost: 'truncated', error: text.slice(0, 300) };
  }
  return reasonOf(text) ? { status, error: text.slice(0, 300) } : { status, lost: 'no_reason', error: text.slice(0, 300) };
}

/**
 * Sends load request number `k` (mixed by k: streamed and not, completions and chat, text and
 * token-id prompts) and judges its answer. The request's own bound is `timeoutMs`; should the
 * carrier itself not come back 15 s after it, the request counts as unanswered all the same.
 */
export function loadRequest(o: LoadOptions & { send: LoadSend }): (k: number) => Promise<LoadResult> {
  const timeoutMs = o.timeoutMs ?? 60_000;
  const idsPrompt = (k: number) =>
    o.longPromptTokens ? Array.from({ length: o.longPromptTokens }, (_, i) => 100 + ((i * 7919 + k * 104729) % 31000)) : [1, 450, 3186, 29871, (k % 500) + 100];
  return async (k) => {
    const stream = k % 2 === 0;
    const chat = k % 3 === 0;
    const ids = k % 5 === 4;
    const body: Record<string, unknown> = chat
      ? { model: 'builtin:tiny', messages: [{ role: 'user', content: `load request ${k}: say something about caches` }] }
      : { model: 'builtin:tiny', prompt: ids ? idsPrompt(k) : `load request ${k}: the KV cache` };
    Object.assign(body, { max_tokens: o.maxTokens ?? 4, temperature: 0, stream });
    const t0 = performance.now();
    const startedAt = Date.now();
    let guard: NodeJS.Timeout | undefined;
    try {
      const r = await Promise.race([
        o.send(`/v1/${chat ? 'chat/completions' : 'completions'}`, body, timeoutMs),
        new Promise<{ status: number; text: string; ttftMs: number }>((resolve) => {
          guard = setTimeout(() => resolve({ status: 0, text: `timeout: the carrier did not come back within ${timeoutMs + 15_000} ms`, ttftMs: performance.now() - t0 }), timeoutMs + 15_000);
        }),
      ]);
      return { ...judgeAnswer(r.status, r.text, stream), ttftMs: r.ttftMs, stream, startedAt };
    } catch (e) {
      const err = e as Error;
      return { ...judgeAnswer(0, `${err.name}: ${err.message}`, stream), ttftMs: performance.now() - t0, stream, startedAt };
    } finally {
      clearTimeout(guard);
    }
  };
}

/**
 * A closed load: keeps `concurrency` requests in flight through the proxy until stop(), each
 * client sending its next request when its last one ended (so the request rate follows how fast
 * the deployment answers). Every request is bounded by `timeoutMs`.
 */
export function startLoad(proxy: string, concurrency: number, o: LoadOptions = {}) {
  const results: LoadResult[] = [];
  /** Numbers of the requests in flight. */
  const pending = new Set<number>();
  let running = true;
  let n = 0;
  const request = loadRequest({ ...o, send: o.send ?? fetchSend(proxy) });
  const one = async (): Promise<void> => {
    const k = n++;
    pending.add(k);
    try {
      results.push(await request(k));
    } finally {
      pending.delete(k);
    }
  };
  const workers = Array.from({ length: concurrency }, async () => {
    while (running) await one();
  });
  return {
    results,
    pending,
    async stop(): Promise<LoadResult[]> {
      running = false;
      await Promise.all(workers);
      return results;
    },
  };
}

/** Polls `cond` until true; false when `ms` passed first. */
export async function eventually(cond: () => boolean | Promise<boolean>, ms: number, everyMs = 100): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    try {
      if (await cond()) return true;
    } catch {
      /* not yet */
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
  return false;
}

export async function getJson(url: string, timeoutMs = 5_000): Promise<any> {
  const r = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  return r.json();
}

// The load the fault tests and the soak send through the proxy: mixed requests (streamed and not,
// completions and chat, text and token-id prompts), each bounded, each answer judged answered,
// failed with a reason, or lost (LostHow). Carried by a LoadSend (harness/faults.ts fetchSend, or a
// namespace's client), so this module starts nothing itself. The open load at a fixed rate is
// harness/rate_load.ts.
import { performance } from 'node:perf_hooks';

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

export interface LoadOptions {
  /** Each request's bound (ms, default 60 s): unanswered by then, it is aborted and counted lost. */
  timeoutMs?: number;
  maxTokens?: number;
  /** How requests are carried (fetchSend from this process; the soak sends from inside a namespace). */
  send: LoadSend;
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
export function loadRequest(o: LoadOptions): (k: number) => Promise<LoadResult> {
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
 * A closed load: keeps `concurrency` requests in flight until stop(), each
 * client sending its next request when its last one ended (so the request rate follows how fast
 * the deployment answers). Every request is bounded by `timeoutMs`.
 */
export function startLoad(concurrency: number, o: LoadOptions) {
  const results: LoadResult[] = [];
  /** Numbers of the requests in flight. */
  const pending = new Set<number>();
  let running = true;
  let n = 0;
  const request = loadRequest(o);
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


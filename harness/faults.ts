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

export interface LoadResult {
  status: number;
  /** ms from sending to the first content byte (streams) or to the whole answer. */
  ttftMs: number;
  error?: string;
  stream: boolean;
  /** When it was sent (Date.now()). */
  startedAt: number;
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

/**
 * Keeps `concurrency` requests in flight through the proxy until stop() (mixed: streamed and not,
 * completions and chat, text and token-id prompts). Every request is bounded by `timeoutMs`.
 * `send` carries them (default: fetch from this process; the soak sends from inside a namespace).
 * With `longPromptTokens`, every fifth request's token-id prompt is that long and new (the caches
 * fill and evict, the prefill→decode transfers carry several chunks).
 */
export function startLoad(proxy: string, concurrency: number, o: { timeoutMs?: number; maxTokens?: number; send?: LoadSend; longPromptTokens?: number } = {}) {
  const results: LoadResult[] = [];
  /** Numbers of the requests in flight. */
  const pending = new Set<number>();
  let running = true;
  let n = 0;
  const send = o.send ?? fetchSend(proxy);
  const idsPrompt = (k: number) =>
    o.longPromptTokens ? Array.from({ length: o.longPromptTokens }, (_, i) => 100 + ((i * 7919 + k * 104729) % 31000)) : [1, 450, 3186, 29871, (k % 500) + 100];
  const one = async (): Promise<void> => {
    const k = n++;
    pending.add(k);
    const stream = k % 2 === 0;
    const chat = k % 3 === 0;
    const ids = k % 5 === 4;
    const body: Record<string, unknown> = chat
      ? { model: 'builtin:tiny', messages: [{ role: 'user', content: `load request ${k}: say something about caches` }] }
      : { model: 'builtin:tiny', prompt: ids ? idsPrompt(k) : `load request ${k}: the KV cache` };
    Object.assign(body, { max_tokens: o.maxTokens ?? 4, temperature: 0, stream });
    const t0 = performance.now();
    const startedAt = Date.now();
    try {
      const r = await send(`/v1/${chat ? 'chat/completions' : 'completions'}`, body, o.timeoutMs ?? 60_000);
      // A stream that broke after its headers carries an error event: count it as the error it is.
      const broken = r.status === 200 && stream && /"error"\s*:/.test(r.text);
      // status 0: no answer (the request's bound passed, or the connection failed).
      results.push({ status: broken ? 599 : r.status, ttftMs: r.ttftMs, stream, startedAt, error: r.status === 0 || r.status >= 400 || broken ? r.text.slice(0, 300) : undefined });
    } catch (e) {
      results.push({ status: 0, ttftMs: performance.now() - t0, stream, startedAt, error: (e as Error).message });
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

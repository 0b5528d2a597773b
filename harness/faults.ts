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

/**
 * Keeps `concurrency` requests in flight through the proxy until stop() (mixed: streamed and not,
 * completions and chat, text and token-id prompts). Every request is bounded by `timeoutMs`.
 */
export function startLoad(proxy: string, concurrency: number, o: { timeoutMs?: number; maxTokens?: number } = {}) {
  const results: LoadResult[] = [];
  /** Numbers of the requests in flight. */
  const pending = new Set<number>();
  let running = true;
  let n = 0;
  const one = async (): Promise<void> => {
    const k = n++;
    pending.add(k);
    const stream = k % 2 === 0;
    const chat = k % 3 === 0;
    const ids = k % 5 === 4;
    const body: Record<string, unknown> = chat
      ? { model: 'builtin:tiny', messages: [{ role: 'user', content: `load request ${k}: say something about caches` }] }
      : { model: 'builtin:tiny', prompt: ids ? [1, 450, 3186, 29871, (k % 500) + 100] : `load request ${k}: the KV cache` };
    Object.assign(body, { max_tokens: o.maxTokens ?? 4, temperature: 0, stream });
    const t0 = performance.now();
    const startedAt = Date.now();
    let ttft = 0;
    try {
      const r = await fetch(`${proxy}/v1/${chat ? 'chat/completions' : 'completions'}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(o.timeoutMs ?? 60_000),
      });
      let text = '';
      if (stream && r.body) {
        const dec = new TextDecoder();
        for await (const piece of r.body as unknown as AsyncIterable<Uint8Array>) {
          if (!ttft) ttft = performance.now() - t0;
          text += dec.decode(piece, { stream: true });
        }
      } else text = await r.text();
      if (!ttft) ttft = performance.now() - t0;
      // A stream that broke after its headers carries an error event: count it as the error it is.
      const broken = r.status === 200 && stream && /"error"\s*:/.test(text);
      results.push({ status: broken ? 599 : r.status, ttftMs: ttft, stream, startedAt, error: r.status >= 400 || broken ? text.slice(0, 300) : undefined });
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

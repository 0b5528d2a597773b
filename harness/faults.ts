// Fault injection for the fault tests and the soak run: kill -9, SIGSTOP/SIGCONT, and restarting
// a killed process exactly as it was started (its command line, environment and working
// directory read from /proc before the kill); and the load's requests carried over this
// process's own network (fetchSend; the load itself: harness/load.ts).
import { spawn, type ChildProcess } from 'node:child_process';
import { openSync, readFileSync, readlinkSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import type { LoadSend } from './load.js';

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

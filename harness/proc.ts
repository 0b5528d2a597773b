// Helpers for tests that run real processes: start the built CLI, wait until a
// server answers, and always kill what was started (by pid, never by name).
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const here = dirname(fileURLToPath(import.meta.url));
/** The compiled CLI next to this compiled test helper (works for any outDir). */
export const CLI = join(here, '..', 'src', 'cli', 'main.js');

export interface Proc {
  child: ChildProcess;
  /** Everything printed so far (stdout + stderr). */
  output(): string;
  /** Resolves when `re` appears in the output, rejects after `timeoutMs`. */
  waitFor(re: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  kill(signal?: NodeJS.Signals): Promise<number | null>;
}

const live = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of live) if (c.exitCode === null) c.kill('SIGKILL');
});

/**
 * The live `kvc engine|serve|proxy|controller --port N` children, by N: waitHttp on a URL with that
 * port waits for that child itself (see waitListening), not for whichever process answers there.
 */
const byPort = new Map<number, Proc>();
const SERVERS = new Set(['engine', 'serve', 'proxy', 'controller']);

export function startKvc(args: string[], env: NodeJS.ProcessEnv = {}): Proc {
  const child = spawn(process.execPath, [CLI, ...args], {
    env: { ...process.env, PYTHONHASHSEED: '0', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  live.add(child);
  let out = '';
  const waiters = new Set<() => void>();
  const onData = (d: Buffer) => {
    out += d.toString();
    if (process.env.KVC_TEST_VERBOSE) process.stderr.write(d);
    for (const w of waiters) w();
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const portArg = args.indexOf('--port');
  // (A proxy logs its listening line at info: not waited for when the log level hides it.)
  const quiet = args[0] === 'proxy' && /^(warn|error)$/.test({ ...process.env, ...env }.KVC_LOG_LEVEL ?? '');
  const port = SERVERS.has(args[0] ?? '') && portArg >= 0 && !quiet ? Number(args[portArg + 1]) : NaN;
  const exited = new Promise<number | null>((r) =>
    child.once('exit', (code) => {
      live.delete(child);
      if (byPort.get(port) === proc) byPort.delete(port);
      for (const w of waiters) w();
      r(code);
    }),
  );
  const proc: Proc = {
    child,
    output: () => out,
    waitFor(re, timeoutMs = 60_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const m = out.match(re);
          if (m) { cleanup(); resolve(m); return; }
          if (child.exitCode !== null || child.signalCode !== null) {
            cleanup();
            reject(new Error(`process exited (${child.exitCode ?? child.signalCode}) before printing ${re}; output:\n${out.slice(-4000)}`));
          }
        };
        const timer = setTimeout(() => { cleanup(); reject(new Error(`timed out after ${timeoutMs} ms waiting for ${re}; output:\n${out.slice(-4000)}`)); }, timeoutMs);
        const cleanup = () => { clearTimeout(timer); waiters.delete(check); };
        waiters.add(check);
        check();
      });
    },
    async kill(signal = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill(signal);
        const t = setTimeout(() => child.kill('SIGKILL'), 10_000);
        const code = await exited;
        clearTimeout(t);
        return code;
      }
      return child.exitCode;
    },
  };
  if (Number.isInteger(port)) byPort.set(port, proc);
  return proc;
}

/**
 * Polls `url` until it answers 2xx, or throws after `timeoutMs`. When the URL's port is that of a
 * live `kvc engine|serve|proxy|controller` child of this process, first waits for that child's own
 * line saying it listens there (waitListening): it fails at once with the child's output when the
 * child exits (a port taken meanwhile: EADDRINUSE), and another process that answers on the port
 * cannot pass for it.
 */
export async function waitHttp(url: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const port = Number(new URL(url).port);
  const own = byPort.get(port);
  if (own) await waitListening(own, port, timeoutMs);
  let last = '';
  while (Date.now() < deadline) {
    try {
      const r = await fetch(url, { signal: AbortSignal.timeout(2000) });
      if (r.ok) return;
      last = `HTTP ${r.status}`;
    } catch (e) {
      last = (e as Error).message;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${url} not healthy after ${timeoutMs} ms (${last})`);
}

/**
 * Waits until `p` itself says it listens on `port` (the line `kvc engine`, `kvc proxy` and
 * `kvc controller` print once bound). Polling the URL instead can be answered by another
 * process that bound the port first (another run on the machine picked it too); then `p` exits
 * with EADDRINUSE, and this rejects at once with its output.
 */
export function waitListening(p: Proc, port: number, timeoutMs = 120_000): Promise<RegExpMatchArray> {
  // `kvc engine` / `kvc proxy`: "listening on http://host:port"; `kvc controller`: "ready: http http://host:port".
  return p.waitFor(new RegExp(`(?:listening on|ready: http) http://\\S+:${port}\\b`), timeoutMs);
}

/** The error says a port was taken (EADDRINUSE, or `kvc up`'s refusal of ports already in use). */
export function portTaken(e: unknown): boolean {
  return /EADDRINUSE|already in use/i.test(e instanceof Error ? e.message : String(e));
}

/**
 * Starts something on ports from `pick`, and again on new ones when a port was taken between the
 * check and the bind (another run on the machine picked it too: portTaken), at most `attempts`
 * times in all. Any other failure is thrown at once. `start` stops what it started before throwing.
 */
export async function onFreePorts<T>(pick: () => Promise<number>, start: (base: number) => Promise<T>, attempts = 3): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    const base = await pick();
    try {
      return await start(base);
    } catch (e) {
      if (attempt >= attempts || !portTaken(e)) throw e;
      console.log(`# a port from ${base} was taken before it was bound (attempt ${attempt} of ${attempts}); again on other ports`);
    }
  }
}

/**
 * Polls `fn` until it returns a truthy value (a throw counts as not yet), or throws naming `what`
 * after `timeoutMs`.
 */
export async function waitUntil<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs: number, pollMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const v = await fn().catch(() => undefined);
    if (v) return v;
    await new Promise((r) => setTimeout(r, pollMs));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
}

export async function postJson(url: string, body: unknown, timeoutMs = 60_000, headers: Record<string, string> = {}): Promise<{ status: number; json: any }> {
  const r = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await r.text();
  let json: any;
  try { json = JSON.parse(text); } catch { json = text; }
  return { status: r.status, json };
}

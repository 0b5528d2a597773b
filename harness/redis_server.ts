// A real redis-server (Debian package `redis-server`) for tests and benchmarks: started on a
// free loopback port with no persistence, killed by pid afterwards (and at exit, whatever
// happens). When the binary is missing, findRedisServer() returns null and callers skip,
// naming the package to install.
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { join } from 'node:path';
import { freePortRange } from './ports.js';
import { REDIS_SERVER_SETTINGS } from '../src/common/remote_url.js';

export const REDIS_SKIP = 'redis-server is not installed (Debian package "redis-server": apt-get install -y redis-server)';

/** The redis-server binary on PATH (or the usual Debian places), or null. */
export function findRedisServer(): string | null {
  const dirs = [...(process.env.PATH ?? '').split(':').filter(Boolean), '/usr/bin', '/usr/sbin', '/usr/local/bin'];
  for (const d of dirs) {
    const p = join(d, 'redis-server');
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      /* next */
    }
  }
  return null;
}

const live = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of live) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

export interface RedisServer {
  port: number;
  url: string;
  pid: number;
  /** SIGSTOP: the server keeps its connections but answers nothing (a "slow" server). */
  pause(): void;
  resume(): void;
  /** Kills the server (SIGKILL: no shutdown, like a crash) and waits until it is gone. */
  kill(): Promise<void>;
  /** Starts a fresh, empty server on the same port (after kill()). */
  restart(): Promise<void>;
  stop(): Promise<void>;
}

export interface RedisServerOptions {
  maxmemory?: string;
  extraArgs?: string[];
}

function launch(bin: string, port: number, o: RedisServerOptions): Promise<ChildProcess> {
  const args = [
    '--port', String(port),
    '--bind', '127.0.0.1',
    '--daemonize', 'no',
    '--maxmemory', o.maxmemory ?? '512mb',
    ...REDIS_SERVER_SETTINGS,
    '--proto-max-bulk-len', '512mb',
    ...(o.extraArgs ?? []),
  ];
  const child = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  live.add(child);
  child.once('exit', () => live.delete(child));
  let out = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`redis-server on port ${port} did not become ready in 10 s; output:\n${out}`));
    }, 10_000);
    const onData = (d: Buffer) => {
      out += d.toString();
      if (/Ready to accept connections/.test(out)) {
        clearTimeout(timer);
        child.stdout!.off('data', onData);
        child.stdout!.resume();
        child.stderr!.resume();
        resolve(child);
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    child.once('exit', (code, sig) => {
      clearTimeout(timer);
      reject(new Error(`redis-server exited (${code ?? sig}) before it was ready; output:\n${out}`));
    });
  });
}

function exited(c: ChildProcess): Promise<void> {
  if (c.exitCode !== null || c.signalCode !== null) return Promise.resolve();
  return new Promise((r) => c.once('exit', () => r()));
}

/** Starts a redis-server on a free loopback port; throws when it cannot (call findRedisServer first). */
export async function startRedisServer(o: RedisServerOptions = {}): Promise<RedisServer> {
  const bin = findRedisServer();
  if (!bin) throw new Error(REDIS_SKIP);
  const port = await freePortRange(1);
  let child = await launch(bin, port, o);
  const srv: RedisServer = {
    port,
    url: `redis://127.0.0.1:${port}`,
    get pid() {
      return child.pid!;
    },
    pause: () => child.kill('SIGSTOP'),
    resume: () => child.kill('SIGCONT'),
    async kill() {
      child.kill('SIGCONT');
      child.kill('SIGKILL');
      await exited(child);
    },
    async restart() {
      child = await launch(bin, port, o);
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGCONT');
        child.kill('SIGKILL');
      }
      await exited(child);
    },
  };
  return srv;
}

// Child processes of `kvc up`: spawn with a log file each, wait until healthy (bounded),
// stop cleanly (SIGTERM, then SIGKILL after a grace period). A child that dies before it is
// healthy is reported with its exit status, its log path and the end of its log.
import { spawn, type ChildProcess } from 'node:child_process';
import { openSync, closeSync, readFileSync, writeSync } from 'node:fs';
import { PID_HEADER } from '../protocol/process_header.js';

export class StartError extends Error {
  override name = 'StartError';
}

export interface ChildSpec {
  name: string;
  args: string[];
  env: NodeJS.ProcessEnv;
  logPath: string;
  healthUrl: string;
  /** Flags for node itself, before the script (e.g. V8 heap sizes read only at start-up). */
  nodeArgs?: string[];
  /** Called with every line the child prints (after it went to the log). */
  onLine?: (line: string) => void;
}

export function tailFile(path: string, lines = 15): string {
  try {
    const text = readFileSync(path, 'utf8');
    return text.trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(log not readable)';
  }
}

export class Child {
  proc: ChildProcess | null = null;
  /** How the current run ended (null while it runs). */
  exit: { code: number | null; signal: NodeJS.Signals | null } | null = null;
  /** Settles when the current run's process exits (a restart starts a new run). */
  exited: Promise<void>;
  private resolveExit!: () => void;
  /** Set once we asked it to stop, so its exit is not reported as a failure. */
  stopping = false;
  /** Times it was started again after dying. */
  restarts = 0;

  constructor(
    readonly spec: ChildSpec,
    readonly cli: string,
  ) {
    this.exited = new Promise((r) => (this.resolveExit = r));
  }

  get name(): string {
    return this.spec.name;
  }

  get pid(): number | undefined {
    return this.proc?.pid;
  }

  start(): void {
    if (this.proc) {
      // A new run (restart): a fresh exit promise and status.
      this.exit = null;
      this.exited = new Promise((r) => (this.resolveExit = r));
    }
    const fd = openSync(this.spec.logPath, 'a');
    writeSync(fd, `# ${new Date().toISOString()} ${this.spec.nodeArgs?.length ? `node ${this.spec.nodeArgs.join(' ')} ` : ''}kvc ${this.spec.args.join(' ')}\n`);
    const piped = !!this.spec.onLine;
    const proc = spawn(process.execPath, [...(this.spec.nodeArgs ?? []), this.cli, ...this.spec.args], {
      env: this.spec.env,
      stdio: ['ignore', piped ? 'pipe' : fd, piped ? 'pipe' : fd],
    });
    this.proc = proc;
    if (piped) {
      // Lines go to the log file first, then to the caller (e.g. the proxy's stats lines).
      let buf = '';
      const onData = (d: Buffer) => {
        try {
          writeSync(fd, d);
        } catch {
          /* log file gone: keep the process running */
        }
        buf += d.toString();
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          this.spec.onLine!(buf.slice(0, i));
          buf = buf.slice(i + 1);
        }
      };
      proc.stdout!.on('data', onData);
      proc.stderr!.on('data', onData);
    }
    proc.once('error', (err) => {
      try {
        writeSync(fd, `# spawn failed: ${err.message}\n`);
      } catch {
        /* ignore */
      }
    });
    const resolveExit = this.resolveExit;
    proc.once('exit', (code, signal) => {
      this.exit = { code, signal };
      // Let piped output drain into the log before closing it. Only a piped run still holds the
      // fd here: closing a number already closed could close whatever reused it meanwhile (a
      // restarted child's pipe, a socket), so it is closed exactly once.
      if (piped) {
        setTimeout(() => {
          try {
            closeSync(fd);
          } catch {
            /* already closed */
          }
        }, 100);
      }
      resolveExit();
    });
    if (!piped) closeSync(fd);
  }

  describeExit(): string {
    if (!this.exit) return 'running';
    return this.exit.signal ? `killed by ${this.exit.signal}` : `exited with code ${this.exit.code}`;
  }

  /** Polls the health URL until 2xx; throws StartError if the child dies or the deadline passes. */
  async waitHealthy(deadline: number): Promise<void> {
    let last = 'no answer yet';
    while (Date.now() < deadline) {
      if (this.exit) throw this.startError(this.describeExit());
      try {
        const r = await fetch(this.spec.healthUrl, { signal: AbortSignal.timeout(2_000) });
        await r.arrayBuffer();
        const pid = r.headers.get(PID_HEADER);
        // Another process on the port (it bound it first): not this child; the child's own exit
        // (address in use) then ends the wait above.
        if (pid !== String(this.proc?.pid)) last = `answered by another process (${PID_HEADER}: ${pid ?? 'none'})`;
        else if (r.ok) return;
        else last = `HTTP ${r.status}`;
      } catch (e) {
        last = (e as Error).message;
      }
      await this.pause(100);
    }
    throw this.startError(`not healthy at ${this.spec.healthUrl} in time (last: ${last})`);
  }

  /** Waits `ms`, or less when the process exits meanwhile. */
  async pause(ms: number): Promise<void> {
    await Promise.race([new Promise((r) => setTimeout(r, ms)), this.exited]);
  }

  private startError(what: string): StartError {
    return new StartError(
      `${this.name} failed to start: ${what}\n  log: ${this.spec.logPath}\n` +
        tailFile(this.spec.logPath)
          .split('\n')
          .map((l) => `  | ${l}`)
          .join('\n'),
    );
  }

  /** SIGTERM, then SIGKILL after `graceMs`; resolves when the process is gone. */
  async stop(graceMs = 10_000): Promise<void> {
    this.stopping = true;
    const p = this.proc;
    if (!p || this.exit) return;
    p.kill('SIGTERM');
    const t = setTimeout(() => {
      if (!this.exit) p.kill('SIGKILL');
    }, graceMs);
    await this.exited;
    clearTimeout(t);
  }
}

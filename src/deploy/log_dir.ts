// The log directory of a `kvc up` deployment: its generated configs, deployment.json, the
// deployment secret and every process's log. Two deployments side by side (--port-offset) must
// not share one: the default is derived from the offset, and a directory a running deployment
// holds is refused, whether given with --log-dir or by default.
import { readFileSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { pidAlive } from '../common/pid.js';

/** The default --log-dir: kvc-logs, or kvc-logs-<offset> beside another deployment. */
export function defaultLogDir(portOffset: number): string {
  return portOffset === 0 ? 'kvc-logs' : `kvc-logs-${portOffset}`;
}

/** The file that says which `kvc up` process holds a log directory (its pid). */
export const HOLDER_FILE = 'kvc-up.pid';

/** The pid of the running `kvc up` that holds `dir`, or null (none, or a stale file). */
export function logDirHolder(dir: string): number | null {
  let pid: number;
  try {
    pid = Number(readFileSync(join(dir, HOLDER_FILE), 'utf8').trim());
  } catch {
    return null;
  }
  if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid || !pidAlive(pid)) return null;
  // A pid reused by another program since a kvc up died without cleaning up is not a holder.
  try {
    if (!readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('\0up')) return null;
  } catch {
    /* no /proc: trust the pid */
  }
  return pid;
}

export class LogDirInUse extends Error {}

/** Refuses a directory a running deployment holds (nothing is written). */
export function checkLogDir(dir: string, flagGiven: boolean): void {
  const pid = logDirHolder(dir);
  if (pid === null) return;
  throw new LogDirInUse(
    `${flagGiven ? '--log-dir' : 'the default log directory'} ${dir} belongs to a running deployment (kvc up pid ${pid}); ` +
      `nothing was started. Stop that deployment, or give this one its own --log-dir (or another --port-offset: the default is kvc-logs-<offset>)`,
  );
}

/** Takes `dir` for this process until release() (the holder file is written exclusively). */
export function holdLogDir(dir: string, flagGiven: boolean): { release(): void } {
  mkdirSync(dir, { recursive: true });
  const file = join(dir, HOLDER_FILE);
  for (let attempt = 0; ; attempt++) {
    try {
      writeFileSync(file, `${process.pid}\n`, { flag: 'wx' });
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST' || attempt > 0) throw e;
      checkLogDir(dir, flagGiven); // held: refused; stale: replaced below
      rmSync(file, { force: true });
    }
  }
  return {
    release: () => {
      try {
        if (readFileSync(file, 'utf8').trim() === String(process.pid)) rmSync(file, { force: true });
      } catch {
        /* already gone */
      }
    },
  };
}

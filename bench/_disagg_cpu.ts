// Where a deployment's CPU time went during one window of the disaggregation bench, read from the
// kernel's own accounting (nothing is sampled, so measuring does not disturb the window):
//   - per process of the deployment (and the bench's client process): CPU seconds of all its
//     threads (/proc/<pid>/stat utime + stime), as a share of the window;
//   - per decoder: seconds its scheduler's thread (the main thread, which runs the decode steps)
//     waited, runnable, for a CPU (/proc/<pid>/task/<pid>/schedstat), as a share of the window;
//   - per CPU of the machine: the share it was busy (/proc/stat), whoever ran on it;
//   - per process, the CPUs it may run on (/proc/<pid>/status Cpus_allowed_list: where `kvc up`
//     placed it).
// A decoder token late by more than its step's own CPU time waited for a CPU; these figures say
// which programs held the CPUs meanwhile.
import { readFileSync } from 'node:fs';

/** Kernel clock ticks per second of /proc/<pid>/stat's utime and stime (USER_HZ: 100 on Linux). */
const USER_HZ = 100;

export interface ProcRef {
  name: string;
  pid: number;
}

export interface CpuSnapshot {
  t: number;
  /** CPU seconds per process name (all threads). */
  cpu: Map<string, number>;
  /** Seconds the main thread of each process waited runnable for a CPU. */
  mainWait: Map<string, number>;
  /** Seconds the main thread of each process ran. */
  mainRun: Map<string, number>;
  /** Busy and total jiffies per CPU (/proc/stat). */
  cpus: { busy: number; total: number }[];
}

function procCpuSeconds(pid: number): number | null {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces) start after the last ')'.
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / USER_HZ; // utime, stime (fields 14 and 15)
  } catch {
    return null;
  }
}

function threadSchedstat(pid: number, tid: number): { run: number; wait: number } | null {
  try {
    const [run, wait] = readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').trim().split(/\s+/).map(Number);
    return { run: run! / 1e9, wait: wait! / 1e9 };
  } catch {
    return null;
  }
}

function cpuTimes(): { busy: number; total: number }[] {
  const out: { busy: number; total: number }[] = [];
  for (const line of readFileSync('/proc/stat', 'utf8').split('\n')) {
    const m = /^cpu(\d+) (.*)$/.exec(line);
    if (!m) continue;
    const v = m[2]!.trim().split(/\s+/).map(Number);
    const total = v.slice(0, 8).reduce((a, b) => a + b, 0); // user nice system idle iowait irq softirq steal
    const idle = v[3]! + v[4]!;
    out[Number(m[1])] = { busy: total - idle, total };
  }
  return out;
}

export function cpuSnapshot(procs: ProcRef[]): CpuSnapshot {
  const cpu = new Map<string, number>();
  const mainWait = new Map<string, number>();
  const mainRun = new Map<string, number>();
  for (const p of procs) {
    const c = procCpuSeconds(p.pid);
    if (c !== null) cpu.set(p.name, c);
    const s = threadSchedstat(p.pid, p.pid);
    if (s) {
      mainWait.set(p.name, s.wait);
      mainRun.set(p.name, s.run);
    }
  }
  return { t: performance.now(), cpu, mainWait, mainRun, cpus: cpuTimes() };
}

const r2 = (x: number) => Math.round(x * 100) / 100;

/**
 * The window between two snapshots: per process its CPU share (1 = one whole CPU for the window),
 * per process the share its main thread waited runnable for a CPU, and per CPU its busy share.
 */
/** The CPUs a process may run on (its affinity, as a cpulist), or null when it is gone. */
export function cpusAllowed(pid: number): string | null {
  try {
    return /^Cpus_allowed_list:\s*(\S+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? null;
  } catch {
    return null;
  }
}

export function cpuWindow(a: CpuSnapshot, b: CpuSnapshot) {
  const seconds = (b.t - a.t) / 1000;
  const per = (x: Map<string, number>, y: Map<string, number>) =>
    Object.fromEntries([...y].filter(([k]) => x.has(k)).map(([k, v]) => [k, r2((v - x.get(k)!) / seconds)]));
  return {
    cpu_share: per(a.cpu, b.cpu),
    main_thread_run_share: per(a.mainRun, b.mainRun),
    main_thread_wait_share: per(a.mainWait, b.mainWait),
    cpu_busy_share: b.cpus.map((c, i) => r2((c.busy - (a.cpus[i]?.busy ?? 0)) / Math.max(1, c.total - (a.cpus[i]?.total ?? 0)))),
  };
}

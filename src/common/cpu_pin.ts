// Pins the engine process to its CPU set (`kvc engine --cpus`), the way a GPU deployment gives
// each engine its own devices: a prefiller's long prompts then never take the cores a decoder's
// steps run on; and lowers its CPU priority (`kvc engine --cpu-priority idle`) when it shares
// cores with engines whose steps must not wait. The affinity is set with taskset(1) (util-linux) on every thread of this process
// (`-a`: the main thread, libuv's pool and V8's helpers); threads started later inherit it.
// It must run before the model is loaded: the GEMM kernel sizes its worker pool with
// os.availableParallelism(), which reads this process's affinity, so thread counts follow the set.
import { execFileSync } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { formatCpuList } from './cpu_set.js';

/**
 * Bounds on the taskset and chrt calls, tried in turn. They answer in milliseconds, but on an
 * overloaded machine starting the helper can take seconds (a restarted engine at load average 55
 * timed out after 5 s and exited): a call that timed out is tried again with the next bound, and
 * only a hung one (the last bound) stops start-up.
 */
const HELPER_TIMEOUTS_MS = [5_000, 30_000, 60_000];

/** Runs a util-linux helper within HELPER_TIMEOUTS_MS; throws its last error. */
function runHelper(cmd: string, args: string[]): void {
  for (let i = 0; ; i++) {
    try {
      execFileSync(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'], timeout: HELPER_TIMEOUTS_MS[i] });
      return;
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      if (err.code !== 'ETIMEDOUT' || i === HELPER_TIMEOUTS_MS.length - 1) throw e;
    }
  }
}

/** Why a helper failed: its own words, or that it did not answer in time. */
function helperFailure(e: unknown, cmd: string): string {
  const err = e as NodeJS.ErrnoException & { stderr?: Buffer };
  if (err.code === 'ETIMEDOUT') return `${cmd} did not answer within ${HELPER_TIMEOUTS_MS.at(-1)! / 1000} s`;
  return err.stderr?.toString().trim() || err.message;
}

/**
 * Restricts this process to `cpus` (already validated against the machine). Throws an Error
 * naming `--cpus` when taskset is missing or the kernel refuses the set (e.g. CPUs outside this
 * container's cpuset). Returns the number of CPUs the process now has.
 */
export function applyCpuSet(cpus: readonly number[], flag = '--cpus'): number {
  const list = formatCpuList(cpus);
  try {
    runHelper('taskset', ['-a', '-p', '-c', list, String(process.pid)]);
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    if (err.code === 'ENOENT') throw new Error(`${flag} ${list}: needs taskset (util-linux), which is not installed`);
    if (err.code === 'ETIMEDOUT') throw new Error(`${flag} ${list}: could not set the CPU set: ${helperFailure(e, 'taskset')}`);
    throw new Error(`${flag} ${list}: the kernel refused this CPU set: ${helperFailure(e, 'taskset')}`);
  }
  return availableParallelism();
}

/**
 * Puts every thread of this process in Linux's SCHED_IDLE class with chrt(1) (util-linux; `-a`:
 * every thread, and threads started later inherit the class). A SCHED_IDLE thread runs only when
 * no normal thread wants its CPU and is preempted as soon as one does: on a core it shares with a
 * decoder, a prefiller's GEMM gives the core back the moment a decode step is ready, and the
 * kernel places other programs' wake-ups on a CPU only SCHED_IDLE threads use. Lowering one's own
 * priority needs no privilege. Throws an Error naming `flag` when chrt is missing or refused.
 */
export function applyIdlePriority(flag = '--cpu-priority'): void {
  try {
    runHelper('chrt', ['--idle', '-a', '-p', '0', String(process.pid)]);
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    if (err.code === 'ENOENT') throw new Error(`${flag} idle: needs chrt (util-linux), which is not installed`);
    if (err.code === 'ETIMEDOUT') throw new Error(`${flag} idle: could not set SCHED_IDLE: ${helperFailure(e, 'chrt')}`);
    throw new Error(`${flag} idle: the kernel refused SCHED_IDLE: ${helperFailure(e, 'chrt')}`);
  }
}

// Pins the engine process to its CPU set (`kvc engine --cpus`), the way a GPU deployment gives
// each engine its own devices: a prefiller's long prompts then never take the cores a decoder's
// steps run on; and lowers its CPU priority (`kvc engine --cpu-priority idle`) when it shares
// cores with engines whose steps must not wait. The affinity is set with taskset(1) (util-linux) on every thread of this process
// (`-a`: the main thread, libuv's pool and V8's helpers); threads started later inherit it.
// It must run before the model is loaded: the GEMM kernel sizes its worker pool with
// os.availableParallelism(), which reads this process's affinity, so thread counts follow the set.
import { execFileSync } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { formatCpuList } from '../common/cpu_set.js';

/** Bound on the taskset and chrt calls (they answer in milliseconds; a hung one must not hang start-up). */
const TASKSET_TIMEOUT_MS = 5_000;

/**
 * Restricts this process to `cpus` (already validated against the machine). Throws an Error
 * naming `--cpus` when taskset is missing or the kernel refuses the set (e.g. CPUs outside this
 * container's cpuset). Returns the number of CPUs the process now has.
 */
export function applyCpuSet(cpus: readonly number[], flag = '--cpus'): number {
  const list = formatCpuList(cpus);
  try {
    execFileSync('taskset', ['-a', '-p', '-c', list, String(process.pid)], { stdio: ['ignore', 'ignore', 'pipe'], timeout: TASKSET_TIMEOUT_MS });
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: Buffer };
    if (err.code === 'ENOENT') throw new Error(`${flag} ${list}: needs taskset (util-linux), which is not installed`);
    const why = err.stderr?.toString().trim() || err.message;
    throw new Error(`${flag} ${list}: the kernel refused this CPU set: ${why}`);
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
    execFileSync('chrt', ['--idle', '-a', '-p', '0', String(process.pid)], { stdio: ['ignore', 'ignore', 'pipe'], timeout: TASKSET_TIMEOUT_MS });
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: Buffer };
    if (err.code === 'ENOENT') throw new Error(`${flag} idle: needs chrt (util-linux), which is not installed`);
    throw new Error(`${flag} idle: the kernel refused SCHED_IDLE: ${err.stderr?.toString().trim() || err.message}`);
  }
}

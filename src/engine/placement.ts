// Pins the engine process to its CPU set (`kvc engine --cpus`), the way a GPU deployment gives
// each engine its own devices: a prefiller's long prompts then never take the cores a decoder's
// steps run on. The affinity is set with taskset(1) (util-linux) on every thread of this process
// (`-a`: the main thread, libuv's pool and V8's helpers); threads started later inherit it.
// It must run before the model is loaded: the GEMM kernel sizes its worker pool with
// os.availableParallelism(), which reads this process's affinity, so thread counts follow the set.
import { execFileSync } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { formatCpuList } from '../common/cpu_set.js';

/** Bound on the taskset call (it answers in milliseconds; a hung one must not hang start-up). */
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

// `--cpus LIST` of `kvc engine`, `kvc proxy` and `kvc controller`: checked against the machine's
// CPUs (an unknown CPU or a malformed list stops start-up naming the flag) and applied to every
// thread of the process before it starts serving (src/common/cpu_pin.ts).
import { validateCpuList } from '../common/cpu_set.js';
import { applyCpuSet } from '../common/cpu_pin.js';
import { logger } from '../common/log.js';

/** Pins this process to `cpus` when given (nothing otherwise); `what` names the process in the log line. */
export function pinTo(cpus: string | undefined, what: string): void {
  if (cpus === undefined) return;
  const n = applyCpuSet(validateCpuList('--cpus', cpus));
  logger(what).info(`running on CPUs ${cpus.trim()} (${n} available to this process)`);
}

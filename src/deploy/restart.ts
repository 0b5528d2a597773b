// Restarting a process of `kvc up` that died on its own: after a backoff that doubles with each
// consecutive failure (1 s, 2 s, 4 s … at most 30 s) it is started again with the same command,
// log and ports, and waited on until healthy. A process that stays healthy for a minute has its
// backoff reset. After `maxRestarts` consecutive failures the supervisor gives up on it.
import type { Child } from './supervisor.js';
import { SETTINGS } from '../common/flags.js';

export interface RestartPolicy {
  /** Consecutive failed restarts before giving up on a process. */
  maxRestarts: number;
  baseDelayMs: number;
  maxDelayMs: number;
  /** A run that was healthy this long resets the backoff. */
  stableMs: number;
  /** Deadline for a restarted process to become healthy. */
  healthyWithinMs: number;
}

export const DEFAULT_RESTART: RestartPolicy = { maxRestarts: SETTINGS.maxRestarts.default!, baseDelayMs: 1_000, maxDelayMs: 30_000, stableMs: 60_000, healthyWithinMs: 300_000 };

export interface RestartEvents {
  /** A line for the operator (printed to stderr by kvc up). */
  say(line: string): void;
  /** The process is healthy again (deployment.json is rewritten with its new pid). */
  recovered(c: Child): void;
  /** Given up after policy.maxRestarts consecutive failures. */
  gaveUp(c: Child): void;
}

/**
 * Watches `c` until `stopped()` says the deployment is stopping: each unexpected exit is
 * printed, counted in c.restarts, and followed by a restart after the backoff.
 */
export async function superviseRestarts(c: Child, policy: RestartPolicy, ev: RestartEvents, stopped: () => boolean, stopSignal: Promise<void>): Promise<void> {
  let failures = 0;
  let healthySince = Date.now();
  for (;;) {
    await Promise.race([c.exited, stopSignal]);
    if (stopped() || c.stopping) return;
    if (Date.now() - healthySince >= policy.stableMs) failures = 0;
    if (failures >= policy.maxRestarts) {
      const why = policy.maxRestarts === 0 ? 'restarts are off (--max-restarts 0)' : `${failures} restarts in a row failed`;
      ev.say(`kvc up: ${c.name} (pid ${c.pid}) ${c.describeExit()}; see its log: ${c.spec.logPath}; ${why}, giving up on it`);
      ev.gaveUp(c);
      return;
    }
    const delay = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** failures);
    failures++;
    ev.say(`kvc up: ${c.name} (pid ${c.pid}) ${c.describeExit()}; see its log: ${c.spec.logPath}; restart #${c.restarts + 1} in ${(delay / 1000).toFixed(0)} s`);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([new Promise((r) => (timer = setTimeout(r, delay))), stopSignal]);
    clearTimeout(timer);
    if (stopped() || c.stopping) return;
    c.restarts++;
    c.start();
    try {
      await Promise.race([c.waitHealthy(Date.now() + policy.healthyWithinMs), stopSignal]);
    } catch (e) {
      ev.say(`kvc up: ${c.name} restart #${c.restarts} failed: ${(e as Error).message.split('\n')[0]}`);
      // Its process may still run (not healthy in time): stop it so the next attempt starts clean.
      if (!c.exit) {
        await c.stop();
        c.stopping = false;
      }
      continue;
    }
    if (stopped()) return;
    healthySince = Date.now();
    // deployment.json first: whoever reads the line may read the file at once.
    ev.recovered(c);
    ev.say(`kvc up: ${c.name} serving again (pid ${c.pid}, restart #${c.restarts})`);
  }
}

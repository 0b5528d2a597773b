// A whole local deployment (`kvc up`) for the fuzz and fault tests and the soak run: started on a
// free port offset, with every process's pid and every port it listens on read back from what
// `kvc up` wrote (deployment.json and the generated cache YAML), so callers never recompute the
// port plan. Stopped with SIGTERM to `kvc up` (which stops its children), SIGKILL as a last resort.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { freePortOffset } from '../src/deploy/free_offset.js';
import type { PlanOptions } from '../src/deploy/plan.js';
import { onFreePorts, startKvc, type Proc } from './proc.js';
import { tempDir } from './temp_dir.js';

export interface EnginePorts {
  name: string;
  role: 'prefiller' | 'decoder';
  pid: number;
  http: string;
  /** The cache instance's HTTP command port (controller → instance). */
  worker: number;
  /** The cache instance's peer port (chunk bytes between instances). */
  peer: number;
  /** xfer receiver init / alloc ports (decoders only). */
  xferInit: number | null;
  xferAlloc: number | null;
}

export interface Deployment {
  up: Proc;
  logDir: string;
  /** The deployment secret `kvc up` wrote (the controller's mutating endpoints need it). */
  secret: string;
  offset: number;
  proxy: string;
  /** The proxy's xfer notify port (ZeroMQ PULL). */
  notifyPort: number;
  controller: string;
  /** The controller's monitor port (ZeroMQ ROUTER). */
  monitorPort: number;
  engines: EnginePorts[];
  /** name → pid of every process, as `kvc up` reported it (updated by refreshPids()). */
  pids: Map<string, number>;
  refreshPids(): Map<string, number>;
  stop(): Promise<void>;
}

export interface DeployOptions {
  prefillers: number;
  decoders: number;
  /** Extra `kvc up` arguments. */
  args?: string[];
  env?: NodeJS.ProcessEnv;
  startupTimeoutMs?: number;
}

/**
 * Starts `kvc up` with the arguments `args(offset)` on a free port offset for `plan` (below the
 * kernel's ephemeral range: freePortOffset) and waits for "kvc up: ready". A port found free can
 * still be taken by another process (another run on the machine) before `kvc up` checks it ("ports
 * already in use") or before its engine binds it (EADDRINUSE): then it is started again on another
 * offset, at most three times in all (onFreePorts).
 */
export async function upOnFreeOffset(
  plan: Omit<PlanOptions, 'portOffset'>,
  args: (offset: number) => string[],
  readyTimeoutMs: number,
  env: NodeJS.ProcessEnv = {},
  shift = 0,
): Promise<{ up: Proc; offset: number }> {
  return onFreePorts(
    () => freePortOffset(plan, shift),
    async (offset) => {
      const up = startKvc(args(offset), env);
      try {
        await up.waitFor(/kvc up: ready/, readyTimeoutMs);
        return { up, offset };
      } catch (e) {
        await up.kill('SIGTERM');
        throw e;
      }
    },
  );
}

export async function startDeployment(o: DeployOptions): Promise<Deployment> {
  const timeout = o.startupTimeoutMs ?? 150_000;
  let logDir = '';
  const plan = { prefillers: o.prefillers, decoders: o.decoders, model: 'builtin:tiny', controller: true, host: '127.0.0.1' };
  const { up, offset } = await upOnFreeOffset(
    plan,
    (off) => {
      logDir = tempDir('kvc-deploy-');
      return ['up', '--prefillers', String(o.prefillers), '--decoders', String(o.decoders), '--port-offset', String(off), '--log-dir', logDir, '--startup-timeout', String(Math.ceil(timeout / 1000)), ...(o.args ?? [])];
    },
    timeout + 20_000,
    o.env ?? {},
  );
  const readPids = () => {
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number }[] };
    return new Map(dep.processes.map((p) => [p.name, p.pid]));
  };
  const pids = readPids();
  const engines: EnginePorts[] = [];
  for (const [name, pid] of pids) {
    // engine-N: a colocated engine (--prefillers 0), on the decoders' ports.
    const m = /^(prefiller|decoder|engine)-(\d+)$/.exec(name);
    if (!m) continue;
    const i = Number(m[2]);
    const y = parseYaml(readFileSync(join(logDir, `${name}.yaml`), 'utf8')) as Record<string, unknown>;
    const role = m[1] === 'prefiller' ? 'prefiller' : 'decoder';
    engines.push({
      name,
      role,
      pid,
      http: `http://127.0.0.1:${(role === 'prefiller' ? 7100 : 7200) + i + offset}`,
      worker: Number(y.kvc_worker_port),
      peer: Number(String(y.distributed_url).split(':').pop()),
      xferInit: y.xfer_peer_init_port === undefined ? null : Number(y.xfer_peer_init_port),
      xferAlloc: y.xfer_peer_alloc_port === undefined ? null : Number(y.xfer_peer_alloc_port),
    });
  }
  const d: Deployment = {
    up,
    logDir,
    secret: readFileSync(join(logDir, 'deployment.secret'), 'utf8').trim(),
    offset,
    proxy: `http://127.0.0.1:${9100 + offset}`,
    notifyPort: 7500 + offset,
    controller: `http://127.0.0.1:${9000 + offset}`,
    monitorPort: 9001 + offset,
    engines,
    pids,
    refreshPids() {
      const now = readPids();
      d.pids = now;
      return now;
    },
    async stop() {
      const all = [...d.pids.values()];
      await up.kill('SIGTERM');
      // `kvc up` stops its children; anything it could not is killed here, by pid.
      for (const pid of all) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* already gone */
        }
      }
    },
  };
  return d;
}

/**
 * Empties the CPU tier of every named instance through the controller (POST /clear with the
 * deployment secret, pinned chunks included), waits for each event, then until the index is empty.
 */
export async function clearTiers(controller: string, secret: string, instances: readonly string[]): Promise<void> {
  const post = async (path: string, body: unknown) => {
    const r = await fetch(`${controller}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${secret}` },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(30_000),
    });
    if (!r.ok) throw new Error(`${path}: HTTP ${r.status} ${await r.text()}`);
    return (await r.json()) as { event_id: string; status?: string; error?: string | null };
  };
  const events = await Promise.all(instances.map((name) => post('/clear', { instance_id: name, location: 'LocalCPUBackend', include_pinned: true })));
  const deadline = Date.now() + 60_000;
  for (const { event_id } of events) {
    for (;;) {
      const ev = await post('/check_finish', { event_id });
      if (ev.status === 'finished') break;
      if (ev.status === 'failed' || Date.now() > deadline) throw new Error(`clearing the tiers: ${event_id} ${ev.status} ${ev.error ?? ''}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  for (;;) {
    const h = (await (await fetch(`${controller}/healthz`, { signal: AbortSignal.timeout(10_000) })).json()) as { index_keys: number };
    if (h.index_keys === 0) return;
    if (Date.now() > deadline) throw new Error(`the controller still indexes ${h.index_keys} keys after clearing every tier`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** True while a process with this pid exists. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Resident set size of a process, bytes (from /proc; 0 when it is gone). */
export function rssBytes(pid: number): number {
  try {
    const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

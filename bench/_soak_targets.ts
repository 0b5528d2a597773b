// Where the soak's 2P2D deployment runs, and the faults it can take there.
//   netns  every process in its own network namespace ("host", harness/netns.ts), started from
//          `kvc up --config-only --hosts` as on real machines, the Redis tier on its own host;
//          process faults plus network faults on the hosts' links (delay, loss, a bandwidth cap,
//          partitions healed after seconds). Needs root, iproute2, python3 and /dev/net/tun.
//   local  `kvc up` on this machine (loopback): process faults only; the reason the network
//          faults cannot run is reported.
// Both take the same kvc up flags (small CPU tier, Redis tier when redis-server is installed).
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { alive, startDeployment } from '../harness/deployment.js';
import { eventually, fetchSend, processImage, respawn, signal } from '../harness/faults.js';
import type { LoadSend } from '../harness/load.js';
import { createHosts, impairUnavailable, type Hosts, type Impairment } from '../harness/netns.js';
import { startNsDeployment } from '../harness/netns_deployment.js';
import { findRedisServer, startRedisServer, type RedisServer } from '../harness/redis_server.js';
import { REDIS_SERVER_SETTINGS } from '../src/common/remote_url.js';

export interface Fault {
  what: string;
  run(): Promise<void>;
}

export interface SoakTarget {
  /** How it runs, for the first line. */
  where: string;
  logDir: string;
  proxy: string;
  engines: { name: string; http: string }[];
  /** Process name → base URL of its /metrics, for every process that has one (engines, controller, proxy). */
  metricsUrls: Map<string, string>;
  /** Process name → pid now (restarts change them). */
  pids(): Map<string, number>;
  send: LoadSend;
  /** A process's /metrics text; '' when it cannot be read (killed, stopped, cut off). */
  metrics(url: string): Promise<string>;
  processFaults: Fault[];
  /** The network faults, or why there are none. */
  networkFaults: Fault[] | string;
  stop(): Promise<void>;
}

export interface SoakOptions {
  /** kvc up flags shared by both targets. */
  upArgs: string[];
  /** How long a network fault stays before the link is clean again (ms). */
  networkFaultMs: number;
  /** How long a partition lasts (ms). */
  partitionMs: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The process faults both targets take, in turn: what `kill`/`pause` mean is the target's. */
function processFaults(restart: (name: string, pauseMs: number) => Promise<void>, pause: (name: string, ms: number) => Promise<void>): Fault[] {
  return [
    { what: 'kill -9 + restart prefiller-1', run: () => restart('prefiller-1', 0) },
    { what: 'SIGSTOP decoder-1 for 5 s', run: () => pause('decoder-1', 5_000) },
    { what: 'kill -9 + restart decoder-0', run: () => restart('decoder-0', 0) },
    { what: 'kill -9 + restart controller', run: () => restart('controller', 500) },
  ];
}

export async function localTarget(o: SoakOptions, why: string): Promise<SoakTarget> {
  let redis: RedisServer | null = null;
  if (findRedisServer()) redis = await startRedisServer({ maxmemory: '256mb' });
  // No automatic restarts by kvc up: the schedule restarts what it kills itself.
  const dep = await startDeployment({ prefillers: 2, decoders: 2, args: ['--max-restarts', '0', ...o.upArgs, ...(redis ? ['--remote-url', redis.url] : [])] });
  const restarted: ChildProcess[] = [];
  // Each process's command line, environment and directory, read while it runs: a process that
  // has died on its own by the time its fault comes (its /proc entry gone) is still restarted.
  const images = new Map([...dep.pids].map(([name, pid]) => [name, processImage(pid)]));
  const restart = async (name: string, pauseMs: number) => {
    const pid = dep.pids.get(name)!;
    const image = images.get(name)!;
    if (alive(pid)) signal(pid, 'SIGKILL');
    else console.log(`soak: ${name} (pid ${pid}) had already exited before its kill; restarting it`);
    await eventually(() => !alive(pid), 10_000, 20);
    if (pauseMs) await sleep(pauseMs);
    const child = respawn(image, join(dep.logDir, `${name}.restarted.log`));
    restarted.push(child);
    dep.pids.set(name, child.pid!);
  };
  const pause = async (name: string, ms: number) => {
    const pid = dep.pids.get(name)!;
    signal(pid, 'SIGSTOP');
    await sleep(ms);
    signal(pid, 'SIGCONT');
  };
  return {
    where: `kvc up on loopback${redis ? ', Redis tier' : ' (no redis-server: no Redis tier)'}`,
    logDir: dep.logDir,
    proxy: dep.proxy,
    engines: dep.engines.map((e) => ({ name: e.name, http: e.http })),
    metricsUrls: new Map([...dep.engines.map((e) => [e.name, e.http] as [string, string]), ['controller', dep.controller], ['proxy', dep.proxy]]),
    pids: () => dep.pids,
    send: fetchSend(dep.proxy),
    async metrics(url) {
      try {
        return await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
      } catch {
        return '';
      }
    },
    processFaults: processFaults(restart, pause),
    networkFaults: `no network faults: ${why}`,
    async stop() {
      for (const c of restarted) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
      await dep.stop();
      await redis?.stop();
    },
  };
}

export async function netnsTarget(o: SoakOptions): Promise<SoakTarget> {
  const names = ['ctl', 'p0', 'p1', 'd0', 'd1', 'redis'];
  const hosts: Hosts = await createHosts(names, 81, { impairable: names.slice(1) });
  let redis: ChildProcess | null = null;
  try {
    const bin = findRedisServer();
    if (bin) {
      redis = hosts.spawnIn('redis', bin, ['--bind', hosts.addr.redis!, '--port', '6379', '--protected-mode', 'no', '--maxmemory', '256mb', ...REDIS_SERVER_SETTINGS]);
    }
    const dep = await startNsDeployment(hosts, {
      ctl: 'ctl',
      prefillers: ['p0', 'p1'],
      decoders: ['d0', 'd1'],
      upArgs: [...o.upArgs, ...(redis ? ['--remote-url', `redis://${hosts.addr.redis}:6379/0`] : [])],
    });
    await dep.waitHealthy(240_000);
    const restart = async (name: string, pauseMs: number) => {
      await dep.kill(name);
      if (pauseMs) await sleep(pauseMs);
      dep.start(name);
    };
    const pause = async (name: string, ms: number) => {
      const pid = dep.procs.get(name)!.child.pid!;
      signal(pid, 'SIGSTOP');
      await sleep(ms);
      signal(pid, 'SIGCONT');
    };
    const impaired = (host: string, what: string, spec: Impairment, ms: number): Fault => ({
      what,
      async run() {
        await hosts.impair(host, spec);
        await sleep(ms);
        await hosts.impair(host, null);
      },
    });
    const s = (ms: number) => `${Math.round(ms / 1000)} s`;
    const networkFaults: Fault[] = [
      impaired('d0', `50 ms delay each way on decoder-0's host for ${s(o.networkFaultMs)}`, { delayMs: 50 }, o.networkFaultMs),
      impaired('p0', `3 % loss each way on prefiller-0's host for ${s(o.networkFaultMs)}`, { lossPct: 3 }, o.networkFaultMs),
      impaired('d1', `4 Mbit/s cap on decoder-1's host for ${s(o.networkFaultMs)}`, { rateMbit: 4 }, o.networkFaultMs),
      impaired('p1', `partition of prefiller-1's host for ${s(o.partitionMs)}, healed`, { partition: true }, o.partitionMs),
      ...(redis ? [impaired('redis', `partition of the Redis host for ${s(o.partitionMs)}, healed`, { partition: true }, o.partitionMs)] : []),
    ];
    return {
      where: `network namespaces (one host per process, kvc up --config-only --hosts)${redis ? ', Redis tier on its own host' : ' (no redis-server: no Redis tier)'}`,
      logDir: dep.dir,
      proxy: dep.proxy,
      engines: Object.entries(dep.engines).map(([name, http]) => ({ name, http })),
      metricsUrls: new Map([...Object.entries(dep.engines), ['controller', dep.controller], ['proxy', dep.proxy]]),
      pids: () => new Map([...dep.procs].map(([name, p]) => [name, p.child.pid!] as [string, number])),
      send: async (path, body, timeoutMs) => {
        const r = await dep.client.request('POST', `${dep.proxy}${path}`, body, timeoutMs);
        return { status: r.status, text: r.text, ttftMs: r.ttftMs };
      },
      async metrics(url) {
        const r = await dep.client.request('GET', `${url}/metrics`, undefined, 5_000);
        return r.status === 200 ? r.text : '';
      },
      processFaults: processFaults(restart, pause),
      networkFaults,
      async stop() {
        await dep.stop();
        if (redis && redis.exitCode === null) redis.kill('SIGKILL');
        hosts.teardown();
      },
    };
  } catch (e) {
    if (redis && redis.exitCode === null) redis.kill('SIGKILL');
    hosts.teardown();
    throw e;
  }
}

/** The namespaces target when this machine can run it, else the local one saying why not. */
export async function soakTarget(o: SoakOptions, wantNetns: boolean): Promise<SoakTarget> {
  const why = wantNetns ? impairUnavailable() : '--no-netns was given';
  return why ? localTarget(o, why) : netnsTarget(o);
}

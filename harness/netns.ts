// Network namespaces as "hosts" for multi-host tests: one namespace per host, each with a veth
// into a private router namespace, so the hosts reach each other over routed private subnets and
// nothing is added to the machine's own namespace. Host k is 10.<net>.<k+1>.2, its gateway (the
// router) 10.<net>.<k+1>.1. Needs root and `ip` (Debian package iproute2). teardown() deletes every
// namespace; it is also run at process exit, so a failing test leaves nothing behind.
//
// Bad networks (`impair`): what `tc netem` does on a host's link — added delay, random loss, a
// silent partition — is done by a user-space delay line (harness/delay_line.py, python3) on a TUN
// device in the router namespace, because kernels built without sch_netem (this machine's among
// them) cannot run netem at all and the test must behave the same everywhere. Policy routing
// sends every packet to or from an impaired host through its TUN device, in both directions, so
// the delay and the loss apply to each direction like netem on both ends of the link. The
// bandwidth cap is the kernel's token bucket (`tc qdisc tbf`) on both ends of the host's link.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { repoRoot } from './repo_files.js';

export const NETNS_SKIP_IP = 'ip is not installed (Debian package "iproute2": apt-get install -y iproute2)';
export const NETNS_SKIP_ROOT = 'network namespaces need root (run the tests as root)';
export const NETNS_SKIP_TC = 'tc is not installed (Debian package "iproute2": apt-get install -y iproute2)';
export const NETNS_SKIP_PYTHON = 'python3 is not installed (Debian package "python3": apt-get install -y python3); the delay line that emulates delay and loss needs it';
export const NETNS_SKIP_TUN = '/dev/net/tun is missing (the kernel has no TUN device); the delay line that emulates delay and loss needs it';

function run(cmd: string, args: string[]): void {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 10_000 });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed: ${(r.stderr || r.stdout || String(r.error)).trim()}`);
}
const ip = (args: string[]) => run('ip', args);
const has = (cmd: string) => spawnSync('sh', ['-c', `command -v ${cmd}`]).status === 0;

/** Why namespaces cannot be used here, or null when they can (checked by creating one). */
export function netnsUnavailable(): string | null {
  if (process.getuid?.() !== 0) return NETNS_SKIP_ROOT;
  if (!has('ip')) return NETNS_SKIP_IP;
  const probe = `kvcprobe${process.pid}`;
  const r = spawnSync('ip', ['netns', 'add', probe], { encoding: 'utf8' });
  if (r.status !== 0) return `cannot create a network namespace here: ${r.stderr.trim()}`;
  spawnSync('ip', ['netns', 'del', probe]);
  return null;
}

/** Why bad networks cannot be emulated here (on top of netnsUnavailable), or null when they can. */
export function impairUnavailable(): string | null {
  const ns = netnsUnavailable();
  if (ns) return ns;
  if (!has('tc')) return NETNS_SKIP_TC;
  if (!has('python3')) return NETNS_SKIP_PYTHON;
  if (spawnSync('test', ['-c', '/dev/net/tun']).status !== 0) return NETNS_SKIP_TUN;
  return null;
}

/** A host link's impairment; every field optional, the default is a clean link. */
export interface Impairment {
  /** Added one-way delay, each direction (ms). */
  delayMs?: number;
  /** Share of packets dropped at random, each direction (%). */
  lossPct?: number;
  /** Bandwidth cap, each direction (Mbit/s). */
  rateMbit?: number;
  /** Every packet dropped silently (the links stay up: no RST, no ICMP). */
  partition?: boolean;
}

export interface Hosts {
  /** Namespace name of each host. */
  ns: Record<string, string>;
  /** Address of each host. */
  addr: Record<string, string>;
  /** Takes a host's link down or up (its port on the router). */
  link(host: string, up: boolean): void;
  /** Sets a host's link impairment (null: a clean link). Only for hosts created impairable. */
  impair(host: string, spec: Impairment | null): Promise<{ passed: number; dropped: number }>;
  /** Runs a command inside a host's namespace (the child is the command itself: ip netns exec execs it). */
  spawnIn(host: string, cmd: string, args: string[], env?: NodeJS.ProcessEnv, o?: { cwd?: string; stdin?: boolean }): ChildProcess;
  teardown(): void;
}

const created = new Set<string>();
const lines = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of lines) c.kill('SIGKILL');
  for (const n of created) spawnSync('ip', ['netns', 'del', n]);
});

interface DelayLine {
  child: ChildProcess;
  ask(cmd: object): Promise<any>;
}

function startDelayLine(routerNs: string, tun: string, seed: number): Promise<DelayLine> {
  const child = spawn('ip', ['netns', 'exec', routerNs, 'python3', join(repoRoot(), 'harness', 'delay_line.py'), tun, String(seed)], { stdio: ['pipe', 'pipe', 'pipe'] });
  lines.add(child);
  child.once('exit', () => lines.delete(child));
  let err = '';
  child.stderr!.on('data', (d: Buffer) => (err += d));
  const waiting: ((v: any) => void)[] = [];
  const rl = createInterface({ input: child.stdout! });
  return new Promise((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`delay line ${tun} exited (${code}): ${err.trim()}`)));
    rl.on('line', (l) => {
      const m = JSON.parse(l);
      if (m.ready) {
        resolve({
          child,
          ask: (cmd) =>
            new Promise((res, rej) => {
              if (child.exitCode !== null) return rej(new Error(`delay line ${tun} is gone: ${err.trim()}`));
              waiting.push(res);
              child.stdin!.write(JSON.stringify(cmd) + '\n');
            }),
        });
      } else waiting.shift()?.(m);
    });
  });
}

/**
 * Creates one namespace per host name, host k at 10.<net>.<k+1>.2. The hosts named in
 * `impairable` get a delay line (see the file comment) and can be impaired with Hosts.impair.
 */
export async function createHosts(names: string[], net = 77, o: { impairable?: string[] } = {}): Promise<Hosts> {
  const tag = `kvc${process.pid % 100000}`;
  const rt = `${tag}-rt`;
  const ns: Record<string, string> = {};
  const addr: Record<string, string> = {};
  const delayLines = new Map<string, DelayLine>();
  const teardown = () => {
    for (const d of delayLines.values()) d.child.kill('SIGKILL');
    delayLines.clear();
    for (const n of [...created]) {
      spawnSync('ip', ['netns', 'del', n]);
      created.delete(n);
    }
  };
  const inNs = (n: string, cmd: string, args: string[]) => run('ip', ['netns', 'exec', n, cmd, ...args]);
  try {
    ip(['netns', 'add', rt]);
    created.add(rt);
    ip(['-n', rt, 'link', 'set', 'lo', 'up']);
    // A router: forwarding on, and no reverse-path filter (packets re-enter from the TUN devices).
    inNs(rt, 'sh', ['-c', 'echo 1 > /proc/sys/net/ipv4/ip_forward; for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done']);
    names.forEach((h, k) => {
      const n = `${tag}-${h}`;
      ns[h] = n;
      addr[h] = `10.${net}.${k + 1}.2`;
      const gw = `10.${net}.${k + 1}.1`;
      ip(['netns', 'add', n]);
      created.add(n);
      ip(['-n', n, 'link', 'set', 'lo', 'up']);
      // Created inside the host namespace with its peer directly in the router namespace.
      ip(['-n', n, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', `p${k}`, 'netns', rt]);
      ip(['-n', n, 'addr', 'add', `${addr[h]}/24`, 'dev', 'eth0']);
      ip(['-n', n, 'link', 'set', 'eth0', 'up']);
      ip(['-n', n, 'route', 'add', 'default', 'via', gw]);
      ip(['-n', rt, 'addr', 'add', `${gw}/24`, 'dev', `p${k}`]);
      ip(['-n', rt, 'link', 'set', `p${k}`, 'up']);
    });
    inNs(rt, 'sh', ['-c', 'for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done']);
    // Impairable host k: table 100+k sends everything to its TUN device t<k>. Rules, in order:
    //   1xx  what comes back out of t<k> for host k itself: delivered (main table)
    //   2xx  what host k sends (arriving on p<k>): through t<k>
    //   3xx  what anyone sends to host k: through t<k>
    // so a packet between two impaired hosts passes both delay lines, once each.
    for (const h of o.impairable ?? []) {
      const k = names.indexOf(h);
      if (k < 0) throw new Error(`impairable host ${h} is not among ${names.join(', ')}`);
      const t = `t${k}`;
      ip(['-n', rt, 'tuntap', 'add', 'dev', t, 'mode', 'tun']);
      ip(['-n', rt, 'link', 'set', t, 'up']);
      ip(['-n', rt, 'route', 'add', 'default', 'dev', t, 'table', String(100 + k)]);
      ip(['-n', rt, 'rule', 'add', 'pref', String(100 + k), 'iif', t, 'to', addr[h]!, 'lookup', 'main']);
      ip(['-n', rt, 'rule', 'add', 'pref', String(200 + k), 'iif', `p${k}`, 'lookup', String(100 + k)]);
      ip(['-n', rt, 'rule', 'add', 'pref', String(300 + k), 'to', addr[h]!, 'lookup', String(100 + k)]);
    }
    inNs(rt, 'sh', ['-c', 'for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done']);
    for (const h of o.impairable ?? []) {
      const k = names.indexOf(h);
      delayLines.set(h, await startDelayLine(rt, `t${k}`, 1000 + k));
    }
  } catch (e) {
    teardown();
    throw e;
  }
  const tbf = (n: string, dev: string, mbit: number | undefined) => {
    spawnSync('ip', ['netns', 'exec', n, 'tc', 'qdisc', 'del', 'dev', dev, 'root']);
    // A bucket of 32 kB and at most 250 ms of queue at the capped rate; beyond it packets drop, as
    // on a real bottleneck.
    if (mbit) inNs(n, 'tc', ['qdisc', 'add', 'dev', dev, 'root', 'tbf', 'rate', `${mbit}mbit`, 'burst', '32kb', 'latency', '250ms']);
  };
  return {
    ns,
    addr,
    link(host, up) {
      ip(['-n', rt, 'link', 'set', `p${names.indexOf(host)}`, up ? 'up' : 'down']);
    },
    async impair(host, spec) {
      const line = delayLines.get(host);
      if (!line) throw new Error(`host ${host} was not created impairable`);
      const s = spec ?? {};
      tbf(rt, `p${names.indexOf(host)}`, s.rateMbit);
      tbf(ns[host]!, 'eth0', s.rateMbit);
      const r = await line.ask({ delay_ms: s.delayMs ?? 0, loss_pct: s.lossPct ?? 0, partition: s.partition ?? false });
      return { passed: r.passed, dropped: r.dropped };
    },
    spawnIn(host, cmd, args, env = {}, so = {}) {
      return spawn('ip', ['netns', 'exec', ns[host]!, cmd, ...args], { env: { ...process.env, ...env }, cwd: so.cwd, stdio: [so.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'] });
    },
    teardown,
  };
}

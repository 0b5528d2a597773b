// Network namespaces as "hosts" for multi-host tests: one namespace per host, each with a veth
// into a private switch namespace that holds a bridge, so the hosts reach each other on a
// private subnet and nothing is added to the machine's own namespace. Needs root and `ip`
// (Debian package iproute2). teardown() deletes every namespace; it is also run at process exit,
// so a failing test leaves nothing behind.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';

export const NETNS_SKIP_IP = 'ip is not installed (Debian package "iproute2": apt-get install -y iproute2)';
export const NETNS_SKIP_ROOT = 'network namespaces need root (run the tests as root)';

function ip(args: string[]): void {
  const r = spawnSync('ip', args, { encoding: 'utf8', timeout: 10_000 });
  if (r.status !== 0) throw new Error(`ip ${args.join(' ')} failed: ${(r.stderr || r.stdout || String(r.error)).trim()}`);
}

/** Why namespaces cannot be used here, or null when they can (checked by creating one). */
export function netnsUnavailable(): string | null {
  if (process.getuid?.() !== 0) return NETNS_SKIP_ROOT;
  if (spawnSync('sh', ['-c', 'command -v ip']).status !== 0) return NETNS_SKIP_IP;
  const probe = `kvcprobe${process.pid}`;
  const r = spawnSync('ip', ['netns', 'add', probe], { encoding: 'utf8' });
  if (r.status !== 0) return `cannot create a network namespace here: ${r.stderr.trim()}`;
  spawnSync('ip', ['netns', 'del', probe]);
  return null;
}

export interface Hosts {
  /** Namespace name of each host. */
  ns: Record<string, string>;
  /** Address of each host on the private subnet. */
  addr: Record<string, string>;
  /** Takes a host's link down or up (its port on the switch). */
  link(host: string, up: boolean): void;
  /** Runs a command inside a host's namespace (the child is the command itself: ip netns exec execs it). */
  spawnIn(host: string, cmd: string, args: string[], env?: NodeJS.ProcessEnv): ChildProcess;
  teardown(): void;
}

const created = new Set<string>();
process.on('exit', () => {
  for (const n of created) spawnSync('ip', ['netns', 'del', n]);
});

/** Creates one namespace per host name on 10.<net>.0.0/24, host k at 10.<net>.0.(10+k). */
export function createHosts(names: string[], net = 77): Hosts {
  const tag = `kvc${process.pid % 100000}`;
  const sw = `${tag}-sw`;
  const ns: Record<string, string> = {};
  const addr: Record<string, string> = {};
  const teardown = () => {
    for (const n of [...created]) {
      spawnSync('ip', ['netns', 'del', n]);
      created.delete(n);
    }
  };
  try {
    ip(['netns', 'add', sw]);
    created.add(sw);
    ip(['-n', sw, 'link', 'add', 'br0', 'type', 'bridge']);
    ip(['-n', sw, 'link', 'set', 'br0', 'up']);
    names.forEach((h, k) => {
      const n = `${tag}-${h}`;
      ns[h] = n;
      addr[h] = `10.${net}.0.${10 + k}`;
      ip(['netns', 'add', n]);
      created.add(n);
      ip(['-n', n, 'link', 'set', 'lo', 'up']);
      // Created inside the host namespace with its peer directly in the switch namespace.
      ip(['-n', n, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', `p${k}`, 'netns', sw]);
      ip(['-n', n, 'addr', 'add', `${addr[h]}/24`, 'dev', 'eth0']);
      ip(['-n', n, 'link', 'set', 'eth0', 'up']);
      ip(['-n', sw, 'link', 'set', `p${k}`, 'master', 'br0']);
      ip(['-n', sw, 'link', 'set', `p${k}`, 'up']);
    });
  } catch (e) {
    teardown();
    throw e;
  }
  return {
    ns,
    addr,
    link(host, up) {
      ip(['-n', sw, 'link', 'set', `p${names.indexOf(host)}`, up ? 'up' : 'down']);
    },
    spawnIn(host, cmd, args, env = {}) {
      return spawn('ip', ['netns', 'exec', ns[host]!, cmd, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    },
    teardown,
  };
}

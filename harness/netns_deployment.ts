// A kvc deployment over the namespaces ("hosts") of harness/netns.ts, started exactly as a user
// starts one over several machines: `kvc up --config-only --hosts ...` writes the configuration
// and prints each host's commands, and each printed command is run by a POSIX shell inside its
// host's namespace (`kvc` on PATH is the built CLI), from the directory holding kvc-logs/. Used by
// the bad-network test and the soak. A process can be killed and started again with the same
// command; extra flags can be appended to a process's command (e.g. the controller's
// --heartbeat-timeout).
import { spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CLI } from './proc.js';
import type { Hosts } from './netns.js';
import { startNsClient, type NsClient } from './ns_http.js';
import { tempDir } from './temp_dir.js';

export interface NsProcess {
  name: string;
  host: string;
  /** The shell command as `kvc up` printed it (plus any extra flags). */
  command: string;
  child: ChildProcess;
  /** Everything it printed so far (every run of it). */
  out(): string;
}

export interface NsDeployment {
  dir: string;
  secret: string;
  /** By process name: controller, proxy, prefiller-<i>, decoder-<j>. */
  procs: Map<string, NsProcess>;
  proxy: string;
  controller: string;
  /** Engine HTTP URLs by name. */
  engines: Record<string, string>;
  /** A client in the controller's host namespace (unimpaired in the tests). */
  client: NsClient;
  /** SIGKILL and wait until gone. */
  kill(name: string): Promise<void>;
  /** Starts a killed process again with its command. */
  start(name: string): void;
  /** Polls until every engine and the controller answer their health checks, and the proxy sees every backend up. */
  waitHealthy(timeoutMs: number): Promise<void>;
  stop(): Promise<void>;
}

export interface NsDeploymentOptions {
  /** Host (namespace) names: the controller's and proxy's, then one per prefiller and per decoder. */
  ctl: string;
  prefillers: string[];
  decoders: string[];
  /** More `kvc up` flags (e.g. --remote-url, --chunk-size, --max-local-cpu-size). */
  upArgs?: string[];
  /** Flags appended to a process's printed command, by process name. */
  extra?: Record<string, string[]>;
}

export async function startNsDeployment(hosts: Hosts, o: NsDeploymentOptions): Promise<NsDeployment> {
  const dir = tempDir('kvc-ns-deploy-');
  const bin = join(dir, 'bin');
  mkdirSync(bin);
  writeFileSync(join(bin, 'kvc'), `#!/bin/sh\nexec "${process.execPath}" "${CLI}" "$@"\n`);
  chmodSync(join(bin, 'kvc'), 0o755);
  const list = [`ctl=${hosts.addr[o.ctl]}`, ...o.prefillers.map((h, i) => `p${i}=${hosts.addr[h]}`), ...o.decoders.map((h, j) => `d${j}=${hosts.addr[h]}`)].join(',');
  const up = spawnSync(process.execPath, [CLI, 'up', '--config-only', '--prefillers', String(o.prefillers.length), '--decoders', String(o.decoders.length), '--hosts', list, ...(o.upArgs ?? [])], { cwd: dir, encoding: 'utf8', timeout: 60_000 });
  if (up.status !== 0) throw new Error(`kvc up --config-only failed: ${up.stderr}${up.stdout}`);
  // "# host ADDR: name, name" then that host's commands, one per process, in the same order.
  const hostOf = new Map(Object.entries(hosts.addr).map(([h, a]) => [a, h]));
  const commands: { name: string; host: string; command: string }[] = [];
  let names: string[] = [];
  let host = '';
  for (const line of up.stdout.split('\n')) {
    const m = /^# host (\S+): (.+)$/.exec(line);
    if (m) {
      host = hostOf.get(m[1]!) ?? '';
      if (!host) throw new Error(`kvc up printed a host ${m[1]} that is not a namespace`);
      names = m[2]!.split(',').map((s) => s.trim());
    } else if (line && !line.startsWith('#') && host) {
      const name = names.shift();
      if (!name) throw new Error(`kvc up printed more commands than processes for ${host}: ${line}`);
      const command = [line.replace(/\s*&\s*$/, ''), ...(o.extra?.[name] ?? [])].join(' ');
      commands.push({ name, host, command });
    }
  }
  const env = { PATH: `${bin}:${process.env.PATH}` };
  const procs = new Map<string, NsProcess>();
  const logs = new Map<string, string>();
  const start = (name: string) => {
    const c = commands.find((x) => x.name === name);
    if (!c) throw new Error(`no process ${name} in this deployment`);
    // `exec` so that the child is the kvc process itself (its pid is the one to kill).
    const child = hosts.spawnIn(c.host, 'sh', ['-c', c.command.replace(/(^|\s)kvc /, '$1exec kvc ')], env, { cwd: dir });
    const add = (d: Buffer) => logs.set(name, (logs.get(name) ?? '') + d.toString());
    child.stdout!.on('data', add);
    child.stderr!.on('data', add);
    procs.set(name, { ...c, child, out: () => logs.get(name) ?? '' });
  };
  // The proxy starts once the engines answer (waitHealthy), as `kvc up` does: started with them,
  // its first probes find them down, and for the next probe interval it serves without a prefiller.
  for (const c of commands) if (c.name !== 'proxy') start(c.name);
  const client = startNsClient(hosts, o.ctl);
  const secret = readFileSync(join(dir, 'kvc-logs', 'deployment.secret'), 'utf8').trim();
  const ports = (name: string) => /--port (\d+)/.exec(commands.find((c) => c.name === name)!.command)![1];
  const url = (name: string) => `http://${hosts.addr[commands.find((c) => c.name === name)!.host]}:${ports(name)}`;
  const engines = Object.fromEntries(commands.filter((c) => /^(prefiller|decoder)-/.test(c.name)).map((c) => [c.name, url(c.name)]));
  const gone = (c: ChildProcess) => c.exitCode !== null || c.signalCode !== null;
  const kill = async (name: string) => {
    const p = procs.get(name)!;
    if (gone(p.child)) return;
    const exited = new Promise((r) => p.child.once('exit', r));
    p.child.kill('SIGKILL');
    await exited;
  };
  const d: NsDeployment = {
    dir,
    secret,
    procs,
    proxy: url('proxy'),
    controller: url('controller'),
    engines,
    client,
    kill,
    start,
    async waitHealthy(timeoutMs) {
      const end = Date.now() + timeoutMs;
      const checks = [`${d.controller}/healthz`, ...Object.values(engines).map((e) => `${e}/health`), `${d.proxy}/health`];
      // The proxy answers 200 as soon as one decoder is up ("degraded"): wait for all ("ok").
      const healthy = (u: string, r: { status: number; json?: any }) => r.status === 200 && (u !== `${d.proxy}/health` || r.json?.status === 'ok');
      for (const u of checks) {
        if (u === `${d.proxy}/health` && !procs.has('proxy')) start('proxy');
        while (!healthy(u, await client.request('GET', u, undefined, 3_000))) {
          if (Date.now() > end) {
            const logText = [...procs.values()].map((p) => `--- ${p.name}\n${p.out().slice(-1500)}`).join('\n');
            throw new Error(`timed out waiting for ${u}\n${logText}`);
          }
          await new Promise((r) => setTimeout(r, 500));
        }
      }
    },
    async stop() {
      client.close();
      for (const name of [...procs.keys()].reverse()) await kill(name);
    },
  };
  return d;
}

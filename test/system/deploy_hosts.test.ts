// `kvc up --config-only --hosts ...`: the per-host commands of a deployment over several machines.
// The real CLI prints them; each printed line is run by a POSIX shell (so its quoting and its
// `$(cat ...)` work as a user's would) with `kvc` replaced by a function that hands the arguments
// back, and the arguments are then parsed by the real commander definitions of the CLI (its
// preAction hook stops short of starting anything). Checks: every process runs on the host the
// list gives it, binds 0.0.0.0 and advertises that host; every address handed to another process
// (controller_url, xfer_proxy_host, the proxy's backends and the decoders' xfer receivers, the
// controller URL, the instances' registered addresses) is the right host's; every engine file
// validates; every command reads the deployment secret file written with mode 0600. Also: the
// YAML form of the list gives the same commands, --bind-addresses binds each host's address,
// and bad lists are refused naming the entry, with nothing written.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Command } from 'commander';
import { parse as parseYaml } from 'yaml';
import { parseConnectorConfig, validateCacheConfig } from '../../src/common/config.js';
import { instanceAddresses } from '../../src/common/address.js';
import { parseRemoteUrl } from '../../src/common/remote_url.js';
import { hostFlags } from '../../src/cli/options.js';
import { parseTopology } from '../../src/proxy/topology.js';
import { checkArgs, cliProgram } from '../../harness/cli_args.js';
import { CLI } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

const HOSTS = { ctl: '10.0.0.1', p0: '10.0.0.2', p1: '10.0.0.2', d0: 'dec-0.example.internal', d1: '10.0.0.4' };
const REDIS = 'redis://10.0.0.5:6379/0';
const LIST = Object.entries(HOSTS).map(([k, v]) => `${k}=${v}`).join(',');

function kvcUp(cwd: string, args: string[], nodeOptions?: string): { status: number | null; stdout: string; stderr: string } {
  // A fresh secret is generated (not one from the test's environment); NODE_OPTIONS only as the test gives it.
  const env = { ...process.env };
  delete env.KVC_DEPLOYMENT_SECRET;
  delete env.NODE_OPTIONS;
  if (nodeOptions !== undefined) env.NODE_OPTIONS = nodeOptions;
  const r = spawnSync(process.execPath, [CLI, 'up', ...args], { cwd, encoding: 'utf8', timeout: 60_000, env });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

interface Printed {
  host: string;
  args: string[];
  env: Record<string, string>;
}

/** Runs one printed command line in a shell where `kvc` prints its arguments and environment as JSON. */
function runPrinted(cwd: string, line: string): { args: string[]; env: Record<string, string> } {
  assert.ok(line.endsWith(' &'), `a host's commands run in the background: ${line}`);
  const script = `kvc() { "${process.execPath}" -e 'process.stdout.write(JSON.stringify({args: process.argv.slice(1), env: {PYTHONHASHSEED: process.env.PYTHONHASHSEED, KVC_CONFIG_FILE: process.env.KVC_CONFIG_FILE, NODE_OPTIONS: process.env.NODE_OPTIONS}}))' -- "$@"; }\n${line.slice(0, -2)}\n`;
  const r = spawnSync('sh', ['-c', script], { cwd, encoding: 'utf8', timeout: 30_000, env: { PATH: process.env.PATH } });
  assert.equal(r.status, 0, `the shell ran: ${line}\n${r.stderr}`);
  const j = JSON.parse(r.stdout) as { args: string[]; env: Record<string, string | undefined> };
  return { args: j.args, env: Object.fromEntries(Object.entries(j.env).filter(([, v]) => v !== undefined)) as Record<string, string> };
}

/** The printed commands, by host, run through the shell. */
function printedCommands(cwd: string, stdout: string): Printed[] {
  const out: Printed[] = [];
  let host: string | null = null;
  for (const line of stdout.split('\n')) {
    const m = /^# host (\S+): /.exec(line);
    if (m) host = m[1]!;
    else if (line.startsWith('#') || line.trim() === '') continue;
    else {
      assert.ok(host, `a command before any "# host" line: ${line}`);
      out.push({ host, ...runPrinted(cwd, line) });
    }
  }
  return out;
}

/** Parses `args` with the CLI's real commander definitions, stopping before the action runs. */
function parseWithCli(args: string[]): Record<string, unknown> {
  const program: Command = cliProgram();
  program.exitOverride();
  let opts: Record<string, unknown> | null = null;
  program.hook('preAction', (_root, action) => {
    opts = action.opts();
    throw new Error('parsed');
  });
  assert.throws(() => program.parse(['node', 'kvc', ...args]), /^Error: parsed$/);
  assert.ok(opts, 'the CLI parsed the command');
  return opts;
}

const flag = (args: string[], f: string) => {
  const i = args.indexOf(f);
  return i < 0 ? undefined : args[i + 1];
};

describe('kvc up --config-only --hosts', () => {
  const cwd = tempDir('kvc-hosts-');
  const r = kvcUp(cwd, ['--config-only', '--prefillers', '2', '--decoders', '2', '--hosts', LIST, '--remote-url', REDIS, '--log-dir', 'conf']);

  it('prints every process on its host; each command parses with the real CLI and names the right addresses', () => {
    assert.equal(r.status, 0, r.stderr);
    const cmds = printedCommands(cwd, r.stdout);
    const byName = new Map<string, Printed>();
    const program = cliProgram();
    for (const c of cmds) {
      const where = `host ${c.host}: kvc ${c.args.join(' ')}`;
      checkArgs(program, c.args, where);
      const opts = parseWithCli(c.args);
      assert.equal(c.env.PYTHONHASHSEED, '0', `${where}: the same chunk keys everywhere`);
      // Binds every interface, advertises the host it is listed on (and both pass the CLI's checks).
      assert.deepEqual(hostFlags(opts), { host: '0.0.0.0', advertiseHost: c.host }, where);
      assert.equal(flag(c.args, '--deployment-secret-file'), 'conf/deployment.secret', `${where}: reads the deployment secret`);
      for (let i = 1; i < c.args.length; i++) {
        if (c.args[i]!.includes('0.0.0.0')) assert.ok(['--host', '--proxy-host'].includes(c.args[i - 1]!), `${where}: ${c.args[i - 1]} hands out 0.0.0.0`);
      }
      const name = c.args[0] === 'engine' ? String(validateCacheConfig(parseYaml(readFileSync(join(cwd, c.env.KVC_CONFIG_FILE!), 'utf8'))).config.kvc_instance_id) : c.args[0]!;
      assert.ok(!byName.has(name), `${name} printed once`);
      byName.set(name, c);
    }
    assert.deepEqual([...byName.keys()].sort(), ['controller', 'decoder-0', 'decoder-1', 'prefiller-0', 'prefiller-1', 'proxy']);
    const hostOf = (n: string) => byName.get(n)!.host;
    assert.deepEqual(
      { controller: hostOf('controller'), proxy: hostOf('proxy'), p0: hostOf('prefiller-0'), p1: hostOf('prefiller-1'), d0: hostOf('decoder-0'), d1: hostOf('decoder-1') },
      { controller: HOSTS.ctl, proxy: HOSTS.ctl, p0: HOSTS.p0, p1: HOSTS.p1, d0: HOSTS.d0, d1: HOSTS.d1 },
      'each process on the host the list gives it (the proxy on the controller\'s)',
    );
    // The controller with the young-generation flag `kvc up` gives it (src/common/young_gen.ts), the others without.
    for (const [n, c] of byName) assert.equal(c.env.NODE_OPTIONS, n === 'controller' ? '--max-semi-space-size=1' : undefined, `${n}: NODE_OPTIONS`);
    assert.equal(r.stdout.split('\n').filter((l) => l.startsWith('# host ')).length, 4, 'one group per host (two prefillers share one)');

    const secret = join(cwd, 'conf', 'deployment.secret');
    assert.equal(statSync(secret).mode & 0o777, 0o600);
    assert.match(readFileSync(secret, 'utf8'), /^\S{16,}\n$/);

    const ctl = byName.get('controller')!.args;
    const monitor = Number(flag(ctl, '--monitor-port'));
    // Engines: their files validate and every address in them is the right host's.
    const engines = new Map<string, { port: number; yaml: ReturnType<typeof validateCacheConfig>['config'] }>();
    for (const n of ['prefiller-0', 'prefiller-1', 'decoder-0', 'decoder-1']) {
      const c = byName.get(n)!;
      const { config } = validateCacheConfig(parseYaml(readFileSync(join(cwd, c.env.KVC_CONFIG_FILE!), 'utf8')), n);
      const connector = parseConnectorConfig(String(flag(c.args, '--kv-transfer-config'))).config;
      assert.equal(connector.kv_role, n.startsWith('prefiller') ? 'kv_producer' : 'kv_consumer');
      assert.equal(config.controller_url, `${HOSTS.ctl}:${monitor}`, `${n}: controller_url is the controller's host`);
      assert.equal(parseRemoteUrl(config.remote_url!).host, '10.0.0.5', `${n}: shares the remote tier`);
      // What the cache instance binds and what it registers with the controller.
      const inst = instanceAddresses(config, { bindHost: '0.0.0.0', advertiseHost: c.host, advertiseExplicit: true });
      assert.deepEqual(inst, { bindHost: '0.0.0.0', advertiseHost: c.host }, `${n}: the instance registers its host`);
      if (n.startsWith('prefiller')) assert.equal(config.xfer_proxy_host, hostOf('proxy'), `${n}: notices go to the proxy's host`);
      else assert.equal(config.xfer_peer_host, '0.0.0.0', `${n}: the xfer receiver binds every interface`);
      engines.set(n, { port: Number(flag(c.args, '--port')), yaml: config });
    }
    const ports = [...engines.values()].flatMap((e) => [e.port, e.yaml.kvc_worker_port!, Number(e.yaml.distributed_url!.split(':')[1])]);
    assert.equal(new Set(ports).size, ports.length, 'engines sharing a host use distinct ports');

    // The proxy reaches every engine, and hands each decoder's xfer receiver, at its host.
    const px = byName.get('proxy')!.args;
    assert.equal(flag(px, '--controller-url'), `http://${HOSTS.ctl}:${flag(ctl, '--port')}`);
    const topo = parseTopology({
      prefillerHost: flag(px, '--prefiller-host')!, prefillerPort: flag(px, '--prefiller-port')!, numPrefillers: flag(px, '--num-prefillers'),
      decoderHost: flag(px, '--decoder-host')!, decoderPort: flag(px, '--decoder-port')!, numDecoders: flag(px, '--num-decoders'),
      decoderInitPort: flag(px, '--decoder-init-port')!, decoderAllocPort: flag(px, '--decoder-alloc-port')!,
    });
    assert.deepEqual(topo.prefillers, ['prefiller-0', 'prefiller-1'].map((n) => ({ host: hostOf(n), port: engines.get(n)!.port })));
    assert.deepEqual(topo.decoders, ['decoder-0', 'decoder-1'].map((n) => {
      const e = engines.get(n)!;
      return { host: hostOf(n), port: e.port, initPort: e.yaml.xfer_peer_init_port, allocPort: e.yaml.xfer_peer_alloc_port };
    }));
  });

  it('a YAML host file gives the same commands; --bind-addresses binds each host\'s address', () => {
    const file = join(cwd, 'hosts.yaml');
    writeFileSync(file, 'controller: 10.0.0.1\nprefiller-0: 10.0.0.2\nprefiller-1: 10.0.0.2\ndecoder-0: dec-0.example.internal\ndecoder-1: 10.0.0.4\n');
    const y = kvcUp(cwd, ['--config-only', '--prefillers', '2', '--decoders', '2', '--hosts', 'hosts.yaml', '--remote-url', REDIS, '--log-dir', 'conf']);
    assert.equal(y.status, 0, y.stderr);
    const commands = (s: string) => s.split('\n').filter((l) => !l.startsWith('#') || l.startsWith('# host '));
    assert.deepEqual(commands(y.stdout), commands(r.stdout));

    const b = kvcUp(cwd, ['--config-only', '--hosts', 'ctl=10.0.0.1,proxy=10.0.0.9,p0=10.0.0.2,d0=10.0.0.3', '--bind-addresses', '--log-dir', 'conf-bind']);
    assert.equal(b.status, 0, b.stderr);
    const cmds = printedCommands(cwd, b.stdout);
    assert.equal(cmds.length, 4);
    for (const c of cmds) {
      assert.deepEqual(hostFlags(parseWithCli(c.args)), { host: c.host, advertiseHost: c.host }, c.args.join(' '));
      if (c.args[0] === 'proxy') {
        assert.equal(c.host, '10.0.0.9', 'proxy= puts the proxy on its own host');
        assert.equal(flag(c.args, '--proxy-host'), '10.0.0.9');
      }
      if (c.args[0] === 'engine') {
        const { config } = validateCacheConfig(parseYaml(readFileSync(join(cwd, c.env.KVC_CONFIG_FILE!), 'utf8')));
        assert.equal(config.distributed_url!.split(':')[0], c.host);
        if (config.xfer_proxy_host) assert.equal(config.xfer_proxy_host, '10.0.0.9');
      }
    }
  });

  it('a bad host list is refused naming the entry, and nothing is written', () => {
    const cases: [string[], RegExp][] = [
      [['--hosts', 'ctl=10.0.0.1,p0=10.0.0.2'], /--hosts: no address for decoder-0/],
      [['--hosts', 'ctl=10.0.0.1,p0=10.0.0.2,d0=0.0.0.0'], /--hosts d0: 0\.0\.0\.0 binds every interface/],
      [['--hosts', 'ctl=10.0.0.1,p0=10.0.0.2,d0=10.0.0.3,p5=10.0.0.9'], /--hosts: unknown process "p5"/],
      [['--hosts', 'ctl=10.0.0.1,p0=10.0.0.2:7100,d0=10.0.0.3'], /--hosts p0: .*without a port/],
      [['--hosts', 'ctl=10.0.0.1,ctl=10.0.0.2,p0=10.0.0.2,d0=10.0.0.3'], /--hosts: "ctl" is given twice/],
      [['--hosts', 'ctl=10.0.0.1,p0=10.0.0.2,d0=10.0.0.3', '--host', '10.0.0.1'], /--host: with --hosts only 0\.0\.0\.0/],
      [['--hosts', 'ctl=10.0.0.1,p0=10.0.0.2,d0=10.0.0.3', '--advertise-host', '10.0.0.1'], /--advertise-host: not used with --hosts/],
      [['--hosts', 'ctl=10.0.0.1,p0=10.0.0.2,d0=10.0.0.3', '--placement', 'split'], /--placement split/],
      [['--hosts', 'missing.yaml'], /--hosts: file "missing.yaml" does not exist/],
      [['--advertise-host', '0.0.0.0'], /--advertise-host: 0\.0\.0\.0 binds every interface/],
      [['--bind-addresses'], /--bind-addresses: only with --hosts/],
    ];
    for (const [args, re] of cases) {
      const x = kvcUp(cwd, ['--config-only', '--log-dir', 'conf-bad', ...args]);
      assert.equal(x.status, 2, `${args.join(' ')}: exit 2\n${x.stdout}${x.stderr}`);
      assert.match(x.stderr, re);
      assert.ok(!existsSync(join(cwd, 'conf-bad')), `${args.join(' ')}: nothing written`);
    }
    const notConfigOnly = kvcUp(cwd, ['--hosts', 'ctl=10.0.0.1,p0=10.0.0.2,d0=10.0.0.3', '--log-dir', 'conf-bad']);
    assert.equal(notConfigOnly.status, 2);
    assert.match(notConfigOnly.stderr, /--hosts: kvc up starts processes on this machine only; with --hosts add --config-only/);
  });
});

describe('kvc up --config-only (one machine)', () => {
  // The printed controller command runs it as `kvc up` spawns it: with the young-generation flag
  // (src/common/young_gen.ts) in NODE_OPTIONS, the user's own NODE_OPTIONS kept, none added when
  // theirs sizes the heap.
  const cwd = tempDir('kvc-config-only-');
  const controllerLine = (nodeOptions?: string) => {
    const r = kvcUp(cwd, ['--config-only', '--log-dir', 'conf'], nodeOptions);
    assert.equal(r.status, 0, r.stderr);
    const lines = r.stdout.split('\n').filter((l) => / kvc (?:controller|engine|proxy) /.test(l));
    // The last (the proxy) runs in the foreground; the others in the background.
    const run = lines.map((l) => runPrinted(cwd, l.endsWith(' &') ? l : `${l} &`));
    assert.deepEqual(run.map((c) => c.args[0]), ['controller', 'engine', 'engine', 'proxy'], r.stdout);
    return run;
  };
  it('the controller with --max-semi-space-size=1 in NODE_OPTIONS, the engines and the proxy without', () => {
    const [ctl, ...others] = controllerLine();
    assert.equal(ctl!.env.NODE_OPTIONS, '--max-semi-space-size=1');
    for (const o of others) assert.equal(o.env.NODE_OPTIONS, undefined, o.args[0]);
    checkArgs(cliProgram(), ctl!.args, 'controller');
  });
  it("the user's NODE_OPTIONS kept; nothing added when it sizes the heap", () => {
    assert.equal(controllerLine('--enable-source-maps')[0]!.env.NODE_OPTIONS, '--enable-source-maps --max-semi-space-size=1');
    assert.equal(controllerLine('--max-semi-space-size=8')[0]!.env.NODE_OPTIONS, undefined, 'the printed line leaves NODE_OPTIONS to the shell');
  });
});

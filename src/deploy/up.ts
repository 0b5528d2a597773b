// `kvc up`: one command for a whole local disaggregated deployment.
// Order: check every port → write configs → controller → engines (all at once) → proxy, each
// waited on until healthy within a deadline. Everything runs with PYTHONHASHSEED=0 so chunk
// keys agree across processes. Ctrl-C / SIGTERM stops all children (proxy first, controller last).
import { mkdirSync, writeFileSync, chmodSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { isPortFree } from '../common/ports.js';
import {
  cacheYaml,
  connectorJson,
  controllerArgs,
  engineArgs,
  makePlan,
  proxyArgs,
  shQuote,
  type EngineSpec,
  type Plan,
  type PlanOptions,
} from './plan.js';
import { DEFAULT_RESTART, superviseRestarts, type RestartPolicy } from './restart.js';
import { Child, StartError } from './supervisor.js';
import { generateSecret, loadDeploymentSecret } from '../common/auth.js';
import { isWildcardHost, urlHost } from '../common/address.js';
import { controllerNodeArgs, controllerNodeOptions } from '../common/young_gen.js';

export interface UpOptions extends PlanOptions {
  /** How processes that die are restarted (default DEFAULT_RESTART). */
  restart?: RestartPolicy;
  logDir: string;
  startupTimeoutMs: number;
  /** Write the configuration files and print the commands, start nothing. */
  configOnly: boolean;
  cli: string;
  /** The client API key every process checks (and the proxy sends to the engines); null: open. */
  apiKey?: string | null;
  /** The --log-dir as the user gave it: the printed commands of a multi-host plan name files by it. */
  logDirAsGiven?: string;
}

const out = (s: string) => process.stdout.write(s + '\n');
const err = (s: string) => process.stderr.write(s + '\n');

export interface WrittenFiles {
  engines: { name: string; yaml: string; connector: string }[];
}

/** Writes <dir>/<engine>.yaml and <dir>/<engine>.connector.json for every engine. */
export function writeConfigs(plan: Plan, dir: string): WrittenFiles {
  mkdirSync(dir, { recursive: true });
  const engines = plan.engines.map((e) => {
    const yaml = join(dir, `${e.name}.yaml`);
    const connector = join(dir, `${e.name}.connector.json`);
    writeFileSync(yaml, cacheYaml(e));
    writeFileSync(connector, connectorJson(e) + '\n');
    return { name: e.name, yaml, connector };
  });
  return { engines };
}

/** The shell command of one engine, reading its connector JSON and cache YAML from configDir. */
function engineCommand(plan: Plan, e: EngineSpec, configDir: string): string {
  const args = engineArgs(plan, e, `$(cat ${shQuote(join(configDir, `${e.name}.connector.json`))})`);
  const quoted = args.map((a) => (a.startsWith('$(') ? `"${a}"` : shQuote(a)));
  return `PYTHONHASHSEED=0 KVC_CONFIG_FILE=${shQuote(join(configDir, `${e.name}.yaml`))} kvc ${quoted.join(' ')}`;
}

/**
 * The controller's by-hand command: with the young-generation flag `kvc up` gives it
 * (src/common/young_gen.ts) as NODE_OPTIONS, since `kvc` is a node script that takes no node flags.
 * nodeOptions is the user's NODE_OPTIONS, kept in the value (they would be replaced otherwise).
 */
export function controllerCommand(plan: Plan, nodeOptions: string | undefined): string {
  const opts = controllerNodeOptions(nodeOptions);
  return `${opts ? `NODE_OPTIONS=${shQuote(opts)} ` : ''}PYTHONHASHSEED=0 kvc ${controllerArgs(plan).map(shQuote).join(' ')}`;
}

/** The by-hand commands equivalent to `kvc up` (also used by the examples' READMEs). */
export function handCommands(plan: Plan, configDir: string, nodeOptions: string | undefined): string[] {
  const lines: string[] = [];
  if (plan.controller) lines.push(`${controllerCommand(plan, nodeOptions)} &`);
  for (const e of plan.engines) lines.push(`${engineCommand(plan, e, configDir)} &`);
  lines.push(`PYTHONHASHSEED=0 kvc ${proxyArgs(plan).map(shQuote).join(' ')}`);
  return lines;
}

/**
 * The commands of a plan over several machines, grouped by host: a `# host <address>: ...`
 * comment line, then that host's commands (each in the background). Every process retries
 * what it needs (engines re-register, the proxy probes the engines), so hosts may start in any order.
 */
export function hostCommands(plan: Plan, configDir: string, nodeOptions: string | undefined): string[] {
  const byHost = new Map<string, { names: string[]; lines: string[] }>();
  const add = (host: string, name: string, line: string) => {
    const h = byHost.get(host) ?? { names: [], lines: [] };
    byHost.set(host, h);
    h.names.push(name);
    h.lines.push(`${line} &`);
  };
  if (plan.controller) add(plan.controller.advertiseHost, 'controller', controllerCommand(plan, nodeOptions));
  for (const e of plan.engines) add(e.advertiseHost, e.name, engineCommand(plan, e, configDir));
  add(plan.proxy.advertiseHost, 'proxy', `PYTHONHASHSEED=0 kvc ${proxyArgs(plan).map(shQuote).join(' ')}`);
  const out: string[] = [];
  for (const [host, h] of byHost) out.push(`# host ${host}: ${h.names.join(', ')}`, ...h.lines);
  return out;
}

export async function takenPorts(plan: Plan): Promise<string[]> {
  const taken: string[] = [];
  const seen = new Set<number>();
  for (const p of plan.ports) {
    if (seen.has(p.port)) {
      taken.push(`${p.port} (${p.what}: used twice by the plan)`);
      continue;
    }
    seen.add(p.port);
    if (!(await isPortFree(p.port, plan.opts.host))) taken.push(`${p.port} (${p.what})`);
  }
  return taken;
}

/** Runs the deployment until a signal; resolves with the process exit code. */
export async function runUp(o: UpOptions): Promise<number> {
  if (o.hostList && !o.configOnly) {
    throw new Error('--hosts: kvc up starts processes on this machine only; with --hosts add --config-only and run the printed commands on each host');
  }
  const logDir = resolve(o.logDir);
  if (o.hostList) {
    // The commands name the files as the user named the directory, so the same directory copied
    // to every host works (relative: run from its parent).
    const dir = o.logDirAsGiven ?? o.logDir;
    const plan = makePlan({ ...o, secretFile: join(dir, 'deployment.secret') });
    const secret = loadDeploymentSecret(undefined) ?? generateSecret();
    writeConfigs(plan, logDir);
    const secretFile = join(logDir, 'deployment.secret');
    writeFileSync(secretFile, secret + '\n', { mode: 0o600 });
    chmodSync(secretFile, 0o600);
    const hosts = new Set([plan.controller?.advertiseHost, plan.proxy.advertiseHost, ...plan.engines.map((e) => e.advertiseHost)].filter((h) => h !== undefined));
    out(`# kvc up --config-only: ${plan.engines.length} engine(s) on ${hosts.size} host(s); wrote ${plan.engines.length * 2} configuration files and deployment.secret (mode 0600) to ${logDir}`);
    out(`# Copy ${dir}/ to every host (keep it private: it holds the deployment secret) and run that host's commands from the directory that contains it.`);
    out(`# Every process binds ${o.bindAddresses ? 'its host\'s address' : o.host} and advertises its host's address; open these ports between the hosts: ${[...new Set(plan.ports.map((p) => p.port))].sort((a, b) => a - b).join(' ')}.`);
    for (const l of hostCommands(plan, dir, process.env.NODE_OPTIONS)) out(l);
    return 0;
  }
  const plan = makePlan(o);
  if (o.configOnly) {
    writeConfigs(plan, logDir);
    out(`wrote ${plan.engines.length * 2} configuration files to ${logDir}`);
    for (const l of handCommands(plan, logDir, process.env.NODE_OPTIONS)) out(l);
    return 0;
  }
  const taken = await takenPorts(plan);
  if (taken.length) {
    err(`kvc up: ports already in use, nothing started:\n  ${taken.join('\n  ')}\nfree them or pick another --port-offset`);
    return 3;
  }
  const files = writeConfigs(plan, logDir);
  // One deployment secret for all the processes (docs/security.md): $KVC_DEPLOYMENT_SECRET when
  // set, else a new random one. It is written (mode 0600) for the operator's own calls (e.g. the
  // controller's /pin) and given to every child in its environment.
  const secret = loadDeploymentSecret(undefined) ?? generateSecret();
  const secretFile = join(logDir, 'deployment.secret');
  writeFileSync(secretFile, secret + '\n', { mode: 0o600 });
  chmodSync(secretFile, 0o600);
  const env: NodeJS.ProcessEnv = { ...process.env, PYTHONHASHSEED: '0', KVC_DEPLOYMENT_SECRET: secret };
  if (o.apiKey) env.KVC_API_KEY = o.apiKey;
  // This process checks the health of the children it started on this machine: at their bind
  // address, or over loopback when they bind every interface. What it prints for others to use
  // is the advertised address.
  const bind = plan.opts.host;
  const host = isWildcardHost(bind) ? (bind.includes(':') ? '[::1]' : '127.0.0.1') : urlHost(bind);
  const shown = urlHost(plan.proxy.advertiseHost);
  const children: Child[] = [];
  let stopping: Promise<void> | null = null;
  const stopAll = () => {
    if (!stopping) {
      stopping = (async () => {
        // Proxy first (no new requests), then engines, controller last.
        const proxy = children.filter((c) => c.name === 'proxy');
        const engines = children.filter((c) => c.name !== 'proxy' && c.name !== 'controller');
        const ctl = children.filter((c) => c.name === 'controller');
        for (const group of [proxy, engines, ctl]) await Promise.all(group.map((c) => c.stop()));
      })();
    }
    return stopping;
  };
  let signalled: string | null = null;
  let wake: () => void = () => undefined;
  const stopped = new Promise<void>((r) => (wake = r));
  const onSignal = (sig: NodeJS.Signals) => {
    if (signalled) return;
    signalled = sig;
    err(`kvc up: ${sig} received, stopping ${children.length} processes`);
    wake();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  const deadline = Date.now() + o.startupTimeoutMs;
  const launch = (c: Child) => {
    children.push(c);
    c.start();
    return c;
  };
  // A signal during start-up interrupts the waits (one promise, its rejection always handled).
  const interrupted = stopped.then(() => {
    throw new StartError('interrupted');
  });
  interrupted.catch(() => undefined);
  const guard = async (p: Promise<unknown>) => {
    await Promise.race([p, interrupted]);
  };
  try {
    const nP = plan.engines.filter((e) => e.role === 'prefiller').length;
    const nD = plan.engines.filter((e) => e.role === 'decoder').length;
    const where = (role: string) => plan.engines.find((e) => e.role === role)?.cpus ?? 'every CPU';
    out(nP === 0
      ? `kvc up: ${nD} colocated kv_both engine(s) on ${where('decoder')}, model ${o.model}; logs and configs in ${logDir}`
      : `kvc up: ${nP} prefiller(s) on ${where('prefiller')}, ${nD} decoder(s) on ${where('decoder')}, model ${o.model}; logs and configs in ${logDir}`);
    if (plan.controller) {
      const c = launch(new Child({
        name: 'controller',
        args: controllerArgs(plan),
        // Its young generation sized for the request-path lookups (src/common/young_gen.ts).
        nodeArgs: controllerNodeArgs(env.NODE_OPTIONS),
        env,
        logPath: join(logDir, 'controller.log'),
        healthUrl: `http://${host}:${plan.controller.port}/healthz`,
      }, o.cli));
      await guard(c.waitHealthy(deadline));
      out(`  controller  ready  http://${host}:${plan.controller.port} (monitor ${plan.controller.monitorPort})`);
    }
    const engines = plan.engines.map((e, i) =>
      launch(new Child({
        name: e.name,
        args: engineArgs(plan, e, connectorJson(e)),
        env: { ...env, KVC_CONFIG_FILE: files.engines[i]!.yaml },
        logPath: join(logDir, `${e.name}.log`),
        healthUrl: `http://${host}:${e.port}/health`,
      }, o.cli)),
    );
    await guard(Promise.all(engines.map(async (c, i) => {
      await c.waitHealthy(deadline);
      out(`  ${c.name.padEnd(11)} ready  http://${host}:${plan.engines[i]!.port}`);
    })));
    const proxy = launch(new Child({
      name: 'proxy',
      args: proxyArgs(plan),
      env,
      logPath: join(logDir, 'proxy.log'),
      healthUrl: `http://${host}:${plan.proxy.port}/health`,
      // Echo the statistics lines of intervals that saw requests.
      onLine: (l) => {
        if (/TTFT .*: [1-9]\d* requests/.test(l) || /^KV hit rate: .* of [1-9]\d* prompt tokens/.test(l)) out(l);
      },
    }, o.cli));
    await guard(proxy.waitHealthy(deadline));
  } catch (e) {
    if (signalled) {
      await stopAll();
      return 0;
    }
    err(`kvc up: ${(e as Error).message}`);
    err('kvc up: stopping the other processes');
    await stopAll();
    return 1;
  }

  const proxyUrl = `http://${shown}:${plan.proxy.port}`;
  const localProxyUrl = `http://${host}:${plan.proxy.port}`;
  let model = o.model;
  try {
    const r = await fetch(`${localProxyUrl}/v1/models`, { headers: o.apiKey ? { authorization: `Bearer ${o.apiKey}` } : {}, signal: AbortSignal.timeout(5_000) });
    const j = (await r.json()) as { data?: { id?: string }[] };
    if (j.data?.[0]?.id) model = j.data[0].id;
  } catch {
    /* keep the --model name */
  }
  const writeState = () => {
    const state = {
      started: new Date().toISOString(),
      proxy: proxyUrl,
      model,
      controller: plan.controller ? `http://${host}:${plan.controller.port}` : null,
      processes: children.map((c) => ({
        name: c.name,
        pid: c.pid,
        restarts: c.restarts,
        log: c.spec.logPath,
        url: c.spec.healthUrl.replace(/\/healthz?$/, ''),
      })),
    };
    writeFileSync(join(logDir, 'deployment.json'), JSON.stringify(state, null, 2) + '\n');
  };
  writeState();
  out('');
  out(`kvc up: ready. OpenAI-compatible endpoint: ${proxyUrl}/v1  (completions, chat/completions, models; /health, /metrics)`);
  for (const c of children) out(`  ${c.name.padEnd(11)} pid ${String(c.pid).padEnd(7)} ${c.spec.healthUrl.replace(/\/healthz?$/, '').padEnd(24)} log ${c.spec.logPath}`);
  out('Try:');
  out(`  curl -N ${proxyUrl}/v1/completions -H 'Content-Type: application/json' \\`);
  out(`    -d '${JSON.stringify({ model, prompt: 'The KV cache is', max_tokens: 32, temperature: 0, stream: true })}'`);
  out('Ctrl-C stops everything.');

  // Watch: a process that dies is reported, counted and restarted with backoff (the proxy
  // routes around a dead engine meanwhile and back to it once its health check passes). Only
  // giving up on the proxy ends the run; an engine given up on stays reported as gone.
  let proxyDied = false;
  const policy = o.restart ?? DEFAULT_RESTART;
  for (const c of children) {
    void superviseRestarts(
      c,
      policy,
      {
        say: err,
        recovered: () => writeState(),
        gaveUp: (x) => {
          writeState();
          if (x.name === 'proxy') {
            proxyDied = true;
            wake();
          }
        },
      },
      () => signalled !== null || proxyDied,
      stopped,
    );
  }
  await stopped;
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
  if (proxyDied) err('kvc up: the proxy is gone; stopping the deployment');
  await stopAll();
  out('kvc up: all processes stopped');
  return proxyDied ? 1 : 0;
}

// `kvc up`: one command for a whole disaggregated deployment, in one of three modes: run it on
// this machine (check every port → write configs and the secret → local.ts starts and watches the
// processes), print the by-hand commands (--config-only), or print each host's commands
// (--hosts --config-only). Everything runs with PYTHONHASHSEED=0 so chunk keys agree across
// processes.
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
import type { RestartPolicy } from './restart.js';
import { LocalDeployment } from './local.js';
import { checkLogDir, holdLogDir } from './log_dir.js';
import { generateSecret, loadDeploymentSecret } from '../common/auth.js';
import { controllerNodeOptions } from '../common/young_gen.js';
import { SETTINGS } from '../common/flags.js';

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
  /** True when --log-dir was given (else logDir is the default of the port offset, log_dir.ts). */
  logDirGiven?: boolean;
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

/** Runs the deployment until a signal (or prints a plan); resolves with the process exit code. */
export async function runUp(o: UpOptions): Promise<number> {
  if (o.hostList && !o.configOnly) {
    throw new Error('--hosts: kvc up starts processes on this machine only; with --hosts add --config-only and run the printed commands on each host');
  }
  // Configs written into a running deployment's directory would replace its own.
  checkLogDir(resolve(o.logDir), o.logDirGiven ?? true);
  if (o.hostList) return printHostsPlan(o);
  if (o.configOnly) return printLocalPlan(o);
  return runLocal(o);
}

/** Writes the deployment secret (mode 0600) into the log directory; returns the secret. */
function writeSecret(logDir: string): string {
  // $KVC_DEPLOYMENT_SECRET when set, else a new random one (docs/security.md).
  const secret = loadDeploymentSecret(undefined) ?? generateSecret();
  const secretFile = join(logDir, 'deployment.secret');
  writeFileSync(secretFile, secret + '\n', { mode: 0o600 });
  chmodSync(secretFile, 0o600);
  return secret;
}

/** --hosts --config-only: the configs, the secret and each host's commands; starts nothing. */
function printHostsPlan(o: UpOptions): number {
  const logDir = resolve(o.logDir);
  // The commands name the files as the user named the directory, so the same directory copied
  // to every host works (relative: run from its parent).
  const dir = o.logDirAsGiven ?? o.logDir;
  const plan = makePlan({ ...o, secretFile: join(dir, 'deployment.secret') });
  writeConfigs(plan, logDir);
  writeSecret(logDir);
  const hosts = new Set([plan.controller?.advertiseHost, plan.proxy.advertiseHost, ...plan.engines.map((e) => e.advertiseHost)].filter((h) => h !== undefined));
  out(`# kvc up --config-only: ${plan.engines.length} engine(s) on ${hosts.size} host(s); wrote ${plan.engines.length * 2} configuration files and deployment.secret (mode 0600) to ${logDir}`);
  out(`# Copy ${dir}/ to every host (keep it private: it holds the deployment secret) and run that host's commands from the directory that contains it.`);
  out(`# Every process binds ${o.bindAddresses ? 'its host\'s address' : o.host} and advertises its host's address; open these ports between the hosts: ${[...new Set(plan.ports.map((p) => p.port))].sort((a, b) => a - b).join(' ')}.`);
  for (const l of hostCommands(plan, dir, process.env.NODE_OPTIONS)) out(l);
  return 0;
}

/** --config-only on one machine: the configs and the by-hand commands; starts nothing. */
function printLocalPlan(o: UpOptions): number {
  const logDir = resolve(o.logDir);
  const plan = makePlan(o);
  writeConfigs(plan, logDir);
  out(`wrote ${plan.engines.length * 2} configuration files to ${logDir}`);
  for (const l of handCommands(plan, logDir, process.env.NODE_OPTIONS)) out(l);
  return 0;
}


/** Starts the whole deployment on this machine and watches it until a signal. */
async function runLocal(o: UpOptions): Promise<number> {
  const logDir = resolve(o.logDir);
  // Every process reads the secret from its file, so a 401 can say where an operator finds it.
  const plan = makePlan({ ...o, secretFile: join(logDir, 'deployment.secret') });
  const taken = await takenPorts(plan);
  if (taken.length) {
    err(`kvc up: ports already in use, nothing started:\n  ${taken.join('\n  ')}\nfree them or pick another --port-offset`);
    return 3;
  }
  const held = holdLogDir(logDir, o.logDirGiven ?? true);
  try {
    return await startLocal(o, plan, logDir);
  } finally {
    held.release();
  }
}

async function startLocal(o: UpOptions, plan: Plan, logDir: string): Promise<number> {
  const files = writeConfigs(plan, logDir);
  // One deployment secret for all the processes, written for the operator's own calls (e.g. the
  // controller's /pin) and given to every child in its environment.
  const secret = writeSecret(logDir);
  const env: NodeJS.ProcessEnv = { ...process.env, PYTHONHASHSEED: '0', KVC_DEPLOYMENT_SECRET: secret };
  // The deployment's key (--api-key, or the variable it came from) is the children's only one: a
  // VLLM_API_KEY left beside a different --api-key would make them refuse to start.
  for (const v of SETTINGS.apiKey.env!) delete env[v];
  if (o.apiKey) env.KVC_API_KEY = o.apiKey;
  const yaml = new Map(files.engines.map((e) => [e.name, e.yaml]));
  return new LocalDeployment({
    plan,
    logDir,
    yamlOf: (name) => yaml.get(name)!,
    env,
    model: o.model,
    apiKey: o.apiKey ?? null,
    startupTimeoutMs: o.startupTimeoutMs,
    ...(o.restart ? { restart: o.restart } : {}),
    cli: o.cli,
    // The statistics lines of intervals that saw requests.
    echo: (l) => /^\S+ (TTFT .*: [1-9]\d* requests|KV hit rate: .* of [1-9]\d* prompt tokens)/.test(l),
    out,
    err,
  }).run();
}

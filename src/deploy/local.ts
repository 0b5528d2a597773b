// `kvc up` on this machine: start every process of a plan (the controller and the engines at once,
// then the proxy once every engine is healthy and registered with the controller, each waited on
// within one deadline), print where everything is, then watch
// them (restarts with backoff) until a signal or the proxy is given up on. Ctrl-C / SIGTERM stops
// all children: proxy first (no new requests), then engines, controller last.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { isWildcardHost, urlHost } from '../common/address.js';
import { controllerNodeArgs } from '../common/young_gen.js';
import { connectorJson, controllerArgs, engineArgs, proxyArgs, type Plan } from './plan.js';
import { DEFAULT_RESTART, superviseRestarts, type RestartPolicy } from './restart.js';
import { Child, StartError } from './supervisor.js';

export interface LocalRun {
  plan: Plan;
  /** Absolute log directory (configs, logs, deployment.json, deployment.secret). */
  logDir: string;
  /** Each engine's cache YAML, by engine name. */
  yamlOf: (engine: string) => string;
  /** The children's environment (deployment secret, API key, PYTHONHASHSEED=0). */
  env: NodeJS.ProcessEnv;
  model: string;
  apiKey: string | null;
  startupTimeoutMs: number;
  restart?: RestartPolicy;
  /** The kvc CLI script the children run. */
  cli: string;
  /** Lines the proxy prints that `kvc up` echoes (its statistics lines of busy intervals). */
  echo: (line: string) => boolean;
  out: (s: string) => void;
  err: (s: string) => void;
}

export class LocalDeployment {
  private readonly children: Child[] = [];
  private stopping: Promise<void> | null = null;
  private signalled: string | null = null;
  private proxyDied = false;
  private wake: () => void = () => undefined;
  private readonly stopped = new Promise<void>((r) => (this.wake = r));
  /** Where this process reaches the children: their bind address, or loopback when they bind every interface. */
  private readonly host: string;
  private model: string;

  constructor(private readonly r: LocalRun) {
    const bind = r.plan.opts.host;
    this.host = isWildcardHost(bind) ? (bind.includes(':') ? '[::1]' : '127.0.0.1') : urlHost(bind);
    this.model = r.model;
  }

  /** Starts, serves until a signal (or the proxy is gone), stops; resolves with the exit code. */
  async run(): Promise<number> {
    const onSignal = (sig: NodeJS.Signals) => {
      if (this.signalled) return;
      this.signalled = sig;
      this.r.err(`kvc up: ${sig} received, stopping ${this.children.length} processes`);
      this.wake();
    };
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    try {
      const failed = await this.startAll();
      if (failed !== null) return failed;
      await this.learnModel();
      this.writeState();
      this.printReady();
      this.watch();
      await this.stopped;
    } finally {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
    }
    if (this.proxyDied) this.r.err('kvc up: the proxy is gone; stopping the deployment');
    await this.stopAll();
    this.r.out('kvc up: all processes stopped');
    return this.proxyDied ? 1 : 0;
  }

  private stopAll(): Promise<void> {
    this.stopping ??= (async () => {
      const proxy = this.children.filter((c) => c.name === 'proxy');
      const engines = this.children.filter((c) => c.name !== 'proxy' && c.name !== 'controller');
      const ctl = this.children.filter((c) => c.name === 'controller');
      for (const group of [proxy, engines, ctl]) await Promise.all(group.map((c) => c.stop()));
    })();
    return this.stopping;
  }

  private launch(c: Child): Child {
    this.children.push(c);
    c.start();
    return c;
  }

  /** Starts every process in order; null when all are healthy, else the exit code (all stopped). */
  private async startAll(): Promise<number | null> {
    const { plan, env, logDir, cli } = this.r;
    const host = this.host;
    const deadline = Date.now() + this.r.startupTimeoutMs;
    // A signal during start-up interrupts the waits (one promise, its rejection always handled).
    const interrupted = this.stopped.then(() => {
      throw new StartError('interrupted');
    });
    interrupted.catch(() => undefined);
    const guard = async (p: Promise<unknown>) => {
      await Promise.race([p, interrupted]);
    };
    try {
      const nP = plan.engines.filter((e) => e.role === 'prefiller').length;
      const nD = plan.engines.filter((e) => e.role === 'decoder').length;
      const where = (role: string) => {
        const es = plan.engines.filter((e) => e.role === role);
        const lists = [...new Set(es.map((e) => (e.cpus === null ? 'every CPU' : `CPU ${e.cpus}`)))];
        const on = lists.length === 1 ? `on ${lists[0]!}` : `(${es.map((e) => `${e.name} on CPU ${e.cpus}`).join(', ')})`;
        return es.some((e) => e.idlePriority) ? `${on} at idle CPU priority` : on;
      };
      this.r.out(nP === 0
        ? `kvc up: ${nD} colocated kv_both engine(s) ${where('decoder')}, model ${this.r.model}; logs and configs in ${logDir}`
        : `kvc up: ${nP} prefiller(s) ${where('prefiller')}, ${nD} decoder(s) ${where('decoder')}${plan.serviceCpus !== null ? `, proxy and controller on CPU ${plan.serviceCpus}` : ''}, model ${this.r.model}; logs and configs in ${logDir}`);
      if (plan.controller) {
        const c = this.launch(new Child({
          name: 'controller',
          args: controllerArgs(plan),
          // Its young generation sized for the request-path lookups (src/common/young_gen.ts).
          nodeArgs: controllerNodeArgs(env.NODE_OPTIONS),
          env,
          logPath: join(logDir, 'controller.log'),
          healthUrl: `http://${host}:${plan.controller.port}/healthz`,
        }, cli));
      }
      // The engines start with the controller, not after it: each registers as soon as the
      // controller's monitor port answers (its connection retries), long before its model is loaded.
      const engines = plan.engines.map((e) =>
        this.launch(new Child({
          name: e.name,
          args: engineArgs(plan, e, connectorJson(e)),
          env: { ...env, KVC_CONFIG_FILE: this.r.yamlOf(e.name) },
          logPath: join(logDir, `${e.name}.log`),
          healthUrl: `http://${host}:${e.port}/health`,
        }, cli)),
      );
      const controller = this.children.find((c) => c.name === 'controller');
      if (controller && plan.controller) {
        await guard(controller.waitHealthy(deadline));
        this.r.out(`  controller  ready  http://${host}:${plan.controller.port} (monitor ${plan.controller.monitorPort})`);
      }
      await guard(Promise.all(engines.map(async (c, i) => {
        await c.waitHealthy(deadline);
        this.r.out(`  ${c.name.padEnd(11)} ready  http://${host}:${plan.engines[i]!.port}`);
      })));
      // Ready means the controller knows every engine (kv-aware routing and P2P read its index).
      if (controller && plan.controller) await guard(this.waitRegistered(controller, `http://${host}:${plan.controller.port}`, deadline));
      const proxy = this.launch(new Child({
        name: 'proxy',
        args: proxyArgs(plan),
        env,
        logPath: join(logDir, 'proxy.log'),
        healthUrl: `http://${host}:${plan.proxy.port}/health`,
        onLine: (l) => {
          if (this.r.echo(l)) this.r.out(l);
        },
      }, cli));
      await guard(proxy.waitHealthy(deadline));
      return null;
    } catch (e) {
      if (this.signalled) {
        await this.stopAll();
        return 0;
      }
      this.r.err(`kvc up: ${(e as Error).message}`);
      this.r.err('kvc up: stopping the other processes');
      await this.stopAll();
      return 1;
    }
  }

  /** Until the controller's GET /instances lists every engine of the plan (its instance id is the engine's name). */
  private async waitRegistered(controller: Child, base: string, deadline: number): Promise<void> {
    const want = this.r.plan.engines.map((e) => e.name);
    let missing = want;
    while (Date.now() < deadline) {
      if (controller.exit) throw new StartError(`controller ${controller.describeExit()} before every engine registered`);
      try {
        const r = await fetch(`${base}/instances`, { signal: AbortSignal.timeout(2_000) });
        const ids = new Set(((await r.json()) as { instances?: { instance_id?: string }[] }).instances?.map((i) => i.instance_id) ?? []);
        missing = want.filter((n) => !ids.has(n));
        if (r.ok && missing.length === 0) return;
      } catch {
        /* asked again below */
      }
      await controller.pause(100);
    }
    throw new StartError(`the controller has no registration from ${missing.join(', ')} in time (their logs say why)`);
  }

  private get proxyUrl(): string {
    return `http://${urlHost(this.r.plan.proxy.advertiseHost)}:${this.r.plan.proxy.port}`;
  }

  /** The served model's name as the engines report it (the --model path otherwise). */
  private async learnModel(): Promise<void> {
    try {
      const headers: Record<string, string> = this.r.apiKey ? { authorization: `Bearer ${this.r.apiKey}` } : {};
      const res = await fetch(`http://${this.host}:${this.r.plan.proxy.port}/v1/models`, { headers, signal: AbortSignal.timeout(5_000) });
      const j = (await res.json()) as { data?: { id?: string }[] };
      if (j.data?.[0]?.id) this.model = j.data[0].id;
    } catch {
      /* keep the --model name */
    }
  }

  /** deployment.json: where every process is, its pid and restarts (rewritten on each change). */
  private writeState(): void {
    const { plan } = this.r;
    const state = {
      started: new Date().toISOString(),
      proxy: this.proxyUrl,
      model: this.model,
      controller: plan.controller ? `http://${this.host}:${plan.controller.port}` : null,
      processes: this.children.map((c) => ({
        name: c.name,
        pid: c.pid,
        restarts: c.restarts,
        log: c.spec.logPath,
        url: c.spec.healthUrl.replace(/\/healthz?$/, ''),
      })),
    };
    writeFileSync(join(this.r.logDir, 'deployment.json'), JSON.stringify(state, null, 2) + '\n');
  }

  private printReady(): void {
    const { out } = this.r;
    const proxyUrl = this.proxyUrl;
    out('');
    out(`kvc up: ready. OpenAI-compatible endpoint: ${proxyUrl}/v1  (completions, chat/completions, models; /health, /metrics)`);
    for (const c of this.children) out(`  ${c.name.padEnd(11)} pid ${String(c.pid).padEnd(7)} ${c.spec.healthUrl.replace(/\/healthz?$/, '').padEnd(24)} log ${c.spec.logPath}`);
    out('Try:');
    out(`  curl -N ${proxyUrl}/v1/completions -H 'Content-Type: application/json' \\`);
    out(`    -d '${JSON.stringify({ model: this.model, prompt: 'The KV cache is', max_tokens: 32, temperature: 0, stream: true })}'`);
    out('Ctrl-C stops everything.');
  }

  /**
   * A process that dies is reported, counted and restarted with backoff (the proxy routes around
   * a dead engine meanwhile and back to it once its health check passes). Only giving up on the
   * proxy ends the run; an engine given up on stays reported as gone.
   */
  private watch(): void {
    const policy = this.r.restart ?? DEFAULT_RESTART;
    for (const c of this.children) {
      void superviseRestarts(
        c,
        policy,
        {
          say: this.r.err,
          recovered: () => this.writeState(),
          gaveUp: (x) => {
            this.writeState();
            if (x.name === 'proxy') {
              this.proxyDied = true;
              this.wake();
            }
          },
        },
        () => this.signalled !== null || this.proxyDied,
        this.stopped,
      );
    }
  }
}

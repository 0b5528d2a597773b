// The plan of a local disaggregated deployment (`kvc up`): which processes, on which ports,
// with which cache YAML and connector JSON (both described in docs/configuration.md). The values
// are the reference values listed in docs/proxy.md; only ports shift with --port-offset. The same generator writes the files
// committed under examples/1p1d and examples/2p2d, so the examples and `kvc up` cannot drift.
//
// Addresses: every process has a bind address (its --host) and an advertised one (its
// --advertise-host: what the others are given to reach it). On one machine both come from
// --host (and --advertise-host). Over several machines (`hostList`, `kvc up --config-only
// --hosts`) each process advertises its own host's address and binds 0.0.0.0 (or, with
// bindAddresses, that same address); the Kubernetes manifests are such a plan whose addresses
// are Service names (src/deploy/k8s.ts).
import { join } from 'node:path';
import { stringify } from 'yaml';
import { GiB, remoteEndpoint } from '../common/config.js';
import { DEFAULT_CHUNK_SIZE, passThroughArgs, SETTINGS, type PassThroughValues } from '../common/flags.js';
import { resolveAdvertiseHost, urlHost } from '../common/address.js';
import { placeEngines, type Placement } from './placement.js';
import { assignHosts } from './hosts.js';

export interface PlanOptions {
  prefillers: number;
  decoders: number;
  model: string;
  portOffset: number;
  controller: boolean;
  /** P2P prefix sharing between the engines (needs the controller); default: on with the controller. */
  p2p?: boolean;
  /** The controller sends replica hints (duplicates evicted first; docs/storage.md). Default true. */
  replicaHints?: boolean;
  /** The address every process binds (one machine; with hostList: 0.0.0.0 unless bindAddresses). */
  host: string;
  /** One machine: the address processes reach each other at (default: host, or the hostname for 0.0.0.0). */
  advertiseHost?: string;
  /** Several machines: process name (controller, proxy, prefiller-0, p0, ...) → its address (src/deploy/hosts.ts). */
  hostList?: Map<string, string>;
  /** With hostList: each process binds its own address instead of 0.0.0.0. */
  bindAddresses?: boolean;
  /** Passed to every process as --deployment-secret-file (the printed commands of a multi-host plan). */
  secretFile?: string;
  /** --replay-window in ms, passed to every process with the secret (absent: each process's default). */
  replayWindowMs?: number;
  /** How engines get CPUs (src/deploy/placement.ts); default `split`. */
  placement?: Placement;
  /** The machine's CPUs (default: the online CPUs); tests pass their own. */
  machineCpus?: readonly number[];
  /** Proxy routing: round-robin (default) or kv-aware (needs the controller). */
  routing?: 'round-robin' | 'kv-aware';
  /** --max-local-prefill-tokens / --max-prefill-queue passed to the proxy when given. */
  maxLocalPrefillTokens?: number;
  maxPrefillQueue?: number;
  /** The proxy's --stats-interval (ms) when given. */
  statsIntervalMs?: number;
  /** Passed to every engine as `kvc engine` flags (absent: the engine's default); the settings marked passThrough in src/common/flags.ts. */
  engine?: PassThroughValues;
  /** Cache settings written into every engine's YAML (absent: the reference values). */
  cache?: CacheSettings;
}

/** Cache YAML values `kvc up` writes for every engine. */
export interface CacheSettings {
  chunkSize?: number;
  /** GiB of CPU tier per engine (0: no CPU tier). */
  maxLocalCpuSize?: number;
  /** A directory under which each engine gets its own disk tier directory (<dir>/<engine name>). */
  localDisk?: string;
  /** GiB of disk tier per engine; needs localDisk. */
  maxLocalDiskSize?: number;
  /** remote_url of every engine (the shared Redis/Valkey tier); absent: no remote tier. */
  remoteUrl?: string;
}

/**
 * Every engine, prefiller and decoder, keeps a CPU tier of this many GiB by default, so a
 * prefix computed or received once can be reused there (and found by kv-aware routing).
 */
export const DEFAULT_LOCAL_CPU_GIB = SETTINGS.maxLocalCpuSize.default!;

/** Reference ports of a deployment (docs/architecture.md) before --port-offset. */
export const BASE_PORTS = {
  prefiller: 7100,
  decoder: 7200,
  xferInit: 7300,
  xferAlloc: 7400,
  notify: 7500,
  /** kvc_worker_port: prefillers 7700+i, decoders 7750+j. */
  worker: 7700,
  /** distributed_url: prefillers 7800+i, decoders 7850+j. */
  distributed: 7800,
  controller: 9000,
  controllerMonitor: 9001,
  proxy: 9100,
} as const;

/** Most engines of one role that the port layout leaves room for. */
export const MAX_PER_ROLE = 50;

export interface EngineSpec {
  name: string;
  /** The address this engine binds (--host, distributed_url, xfer_peer_host) and the one it is reached at. */
  bindHost: string;
  advertiseHost: string;
  role: 'prefiller' | 'decoder';
  index: number;
  port: number;
  cacheConfig: Record<string, unknown>;
  connector: Record<string, unknown>;
  /** `--cpus` of this engine (a cpulist), or null: every CPU. */
  cpus: string | null;
  /** `--cpu-priority idle` (a prefiller sharing CPUs with decoders; src/deploy/placement.ts). */
  idlePriority?: boolean;
}

export interface PortUse {
  port: number;
  what: string;
}

/** Where a process listens and is reached. */
export interface Addresses {
  bindHost: string;
  advertiseHost: string;
}

export interface Plan {
  opts: PlanOptions;
  /** True for a plan over several machines (hostList): every command names its --advertise-host. */
  multiHost: boolean;
  controller: ({ port: number; monitorPort: number } & Addresses) | null;
  engines: EngineSpec[];
  proxy: { port: number; notifyPort: number } & Addresses;
  /** `--cpus` of the proxy and the controller (src/deploy/placement.ts), or null: every CPU. */
  serviceCpus: string | null;
  ports: PortUse[];
}

export function makePlan(o: PlanOptions): Plan {
  if (!Number.isInteger(o.prefillers) || o.prefillers < 0 || o.prefillers > MAX_PER_ROLE) {
    throw new Error(`--prefillers: expected an integer 0..${MAX_PER_ROLE} (0: colocated kv_both engines behind the proxy), found ${o.prefillers}`);
  }
  if (!Number.isInteger(o.decoders) || o.decoders < 1 || o.decoders > MAX_PER_ROLE) {
    throw new Error(`--decoders: expected an integer 1..${MAX_PER_ROLE}, found ${o.decoders}`);
  }
  if (!Number.isInteger(o.portOffset) || o.portOffset < -7000 || BASE_PORTS.proxy + o.portOffset > 65535) {
    throw new Error(`--port-offset: expected an integer that keeps every port in 1..65535, found ${o.portOffset}`);
  }
  if (o.routing !== undefined && o.routing !== 'round-robin' && o.routing !== 'kv-aware') {
    throw new Error(`--routing: expected round-robin or kv-aware, found "${String(o.routing)}"`);
  }
  if (o.routing === 'kv-aware' && !o.controller) throw new Error('--routing kv-aware: needs the controller (its index says where prefixes are cached); drop --no-controller');
  for (const [flag, v] of [['--max-local-prefill-tokens', o.maxLocalPrefillTokens], ['--max-prefill-queue', o.maxPrefillQueue]] as const) {
    if (v !== undefined && !(Number.isSafeInteger(v) && v >= 0)) throw new Error(`${flag}: expected an integer >= 0, found ${v}`);
  }
  const cache = o.cache ?? {};
  if (cache.maxLocalDiskSize !== undefined && cache.maxLocalDiskSize > 0 && !cache.localDisk) {
    throw new Error('--max-local-disk-size: needs --local-disk <dir> (each engine gets <dir>/<engine name>)');
  }
  if (cache.localDisk && !(cache.maxLocalDiskSize !== undefined && cache.maxLocalDiskSize > 0)) {
    throw new Error('--local-disk: needs --max-local-disk-size <GiB> > 0 (the disk tier\'s capacity per engine)');
  }
  const chunkSize = cache.chunkSize ?? DEFAULT_CHUNK_SIZE;
  /** The CPU and disk tiers of one engine: the flags when given, else the reference values. */
  const tiers = (name: string, refCpu: number) => {
    const cpu = cache.maxLocalCpuSize ?? refCpu;
    return {
      local_cpu: cpu > 0,
      max_local_cpu_size: cpu,
      max_local_disk_size: cache.maxLocalDiskSize ?? 0,
      ...(cache.localDisk ? { local_disk: join(cache.localDisk, name) } : {}),
    };
  };
  if (cache.remoteUrl !== undefined) remoteEndpoint({ remote_url: cache.remoteUrl }, '--remote-url');
  const off = (p: number) => p + o.portOffset;
  const colocated = o.prefillers === 0;
  if (o.hostList && (o.placement?.kind === 'split' || o.placement?.kind === 'decode-first')) {
    throw new Error(`--placement ${o.placement.kind}: splits this machine's CPUs, which mean nothing on other hosts; with --hosts use shared (the default) or prefill=LIST/decode=LIST (applied on every host)`);
  }
  const cpus = placeEngines(o.placement ?? { kind: o.hostList ? 'shared' : 'split' }, o.prefillers, o.decoders, o.machineCpus);
  const engineNames = [
    ...Array.from({ length: o.prefillers }, (_, i) => `prefiller-${i}`),
    ...Array.from({ length: o.decoders }, (_, j) => (colocated ? `engine-${j}` : `decoder-${j}`)),
  ];
  const assigned = o.hostList ? assignHosts(o.hostList, engineNames, o.controller) : null;
  const oneAdvertised = assigned ? '' : resolveAdvertiseHost('--advertise-host', o.advertiseHost, o.host);
  /** Bind and advertised address of a process (by name: controller, proxy or an engine's). */
  const at = (name: string): Addresses => {
    if (!assigned) return { bindHost: o.host, advertiseHost: oneAdvertised };
    const adv = name === 'controller' ? assigned.controller! : name === 'proxy' ? assigned.proxy : assigned.engines[name]!;
    return { bindHost: o.bindAddresses ? adv : o.host, advertiseHost: adv };
  };
  const ctlAt = o.controller ? at('controller') : null;
  const proxyAt = at('proxy');
  const controllerMonitor = off(BASE_PORTS.controllerMonitor);
  const notifyPort = off(BASE_PORTS.notify);
  const ctl = (worker: number, distributed: number, id: string) => ({
    enable_controller: o.controller,
    kvc_instance_id: id,
    ...(ctlAt ? { controller_url: `${urlHost(ctlAt.advertiseHost)}:${controllerMonitor}` } : {}),
    // With the controller, every engine fetches a prefix it lacks from the engine that holds it
    // (P2P, docs/p2p.md) instead of recomputing it.
    ...(o.controller && o.p2p !== false ? { enable_p2p: true } : {}),
    kvc_worker_port: worker,
    // The peer and worker ports bind this address; the engine registers its --advertise-host.
    distributed_url: `${urlHost(at(id).bindHost)}:${distributed}`,
  });
  const remote = cache.remoteUrl !== undefined ? { remote_url: cache.remoteUrl } : {};
  /**
   * The cache settings every engine has, whatever its role: the chunk size, a CPU tier (default
   * DEFAULT_LOCAL_CPU_GIB: what it computed or received is reused by the next request with the
   * same prefix routed here), the remote tier and its controller attachment. `slot` numbers its
   * worker and peer ports (prefillers 0.., decoders and colocated engines MAX_PER_ROLE..).
   */
  const engineCache = (name: string, slot: number) => ({
    chunk_size: chunkSize,
    ...tiers(name, DEFAULT_LOCAL_CPU_GIB),
    ...remote,
    ...ctl(off(BASE_PORTS.worker + slot), off(BASE_PORTS.distributed + slot), name),
  });
  const engines: EngineSpec[] = [];
  for (let i = 0; i < o.prefillers; i++) {
    const name = `prefiller-${i}`;
    engines.push({
      name,
      ...at(name),
      role: 'prefiller',
      index: i,
      port: off(BASE_PORTS.prefiller + i),
      cacheConfig: {
        ...engineCache(name, i),
        enable_xfer: true,
        enable_xpyd: true,
        xfer_role: 'sender',
        xfer_proxy_host: proxyAt.advertiseHost,
        xfer_proxy_port: notifyPort,
        xfer_buffer_size: GiB,
        // The engine computes on the CPU: its transfer buffer is host memory.
        xfer_buffer_device: 'cpu',
      },
      connector: {
        kv_connector: 'KvcConnectorV1',
        kv_role: 'kv_producer',
        kv_connector_extra_config: { discard_partial_chunks: false, kvc_rpc_port: `producer${i + 1}` },
      },
      cpus: cpus.prefill,
      ...(cpus.prefillIdle ? { idlePriority: true } : {}),
    });
  }
  for (let j = 0; j < o.decoders; j++) {
    if (colocated) {
      engines.push(colocatedEngine(j, off(BASE_PORTS.decoder + j), engineCache(`engine-${j}`, MAX_PER_ROLE + j), cpus.decoders[j] ?? null, at(`engine-${j}`)));
      continue;
    }
    const name = `decoder-${j}`;
    engines.push({
      name,
      ...at(name),
      role: 'decoder',
      index: j,
      port: off(BASE_PORTS.decoder + j),
      cacheConfig: {
        // A decoder stores what it received or computed, so a prefix it holds needs no transfer.
        ...engineCache(name, MAX_PER_ROLE + j),
        enable_xfer: true,
        enable_xpyd: true,
        xfer_role: 'receiver',
        // The receiver binds here; prefillers are given the decoder's advertised address by the proxy.
        xfer_peer_host: at(name).bindHost,
        xfer_peer_init_port: off(BASE_PORTS.xferInit + j),
        xfer_peer_alloc_port: off(BASE_PORTS.xferAlloc + j),
        xfer_buffer_size: 2147483648,
        xfer_buffer_device: 'cpu',
        xfer_backends: ['tcp'],
      },
      connector: {
        kv_connector: 'KvcConnectorV1',
        kv_role: 'kv_consumer',
        kv_connector_extra_config: { discard_partial_chunks: false, kvc_rpc_port: `consumer${j + 1}`, skip_last_n_tokens: 1 },
      },
      cpus: cpus.decoders[j] ?? null,
    });
  }
  const controller = ctlAt ? { port: off(BASE_PORTS.controller), monitorPort: controllerMonitor, ...ctlAt } : null;
  const proxy = { port: off(BASE_PORTS.proxy), notifyPort, ...proxyAt };
  const ports: PortUse[] = [];
  if (controller) ports.push({ port: controller.port, what: 'controller HTTP' }, { port: controller.monitorPort, what: 'controller monitor' });
  for (const e of engines) {
    const c = e.cacheConfig;
    ports.push({ port: e.port, what: `${e.name} HTTP` });
    ports.push({ port: c.kvc_worker_port as number, what: `${e.name} kvc_worker_port` });
    ports.push({ port: Number(String(c.distributed_url).split(':').pop()), what: `${e.name} distributed_url` });
    if (e.role === 'decoder' && !colocated) {
      ports.push({ port: c.xfer_peer_init_port as number, what: `${e.name} xfer init` });
      ports.push({ port: c.xfer_peer_alloc_port as number, what: `${e.name} xfer alloc` });
    }
  }
  ports.push({ port: proxy.port, what: 'proxy HTTP' }, { port: proxy.notifyPort, what: 'proxy xfer notify' });
  for (const p of ports) {
    if (p.port < 1 || p.port > 65535) throw new Error(`--port-offset ${o.portOffset} puts ${p.what} on port ${p.port}, outside 1..65535`);
  }
  // On one machine only: with --hosts the proxy and the controller have hosts of their own.
  return { opts: o, multiHost: assigned !== null, controller, engines, proxy, serviceCpus: assigned ? null : cpus.services, ports };
}

/**
 * One engine of a colocated deployment (`--prefillers 0`): kv_both, prefilling and decoding its own
 * requests with chunked prefill (a long prompt is computed --max-num-batched-tokens tokens per
 * step, between the decode rows of running sequences), keeping its chunks in a CPU tier; no xfer.
 * This is how a user runs a colocated engine; the proxy balances requests over them round-robin.
 */
function colocatedEngine(j: number, port: number, cacheConfig: Record<string, unknown>, cpus: string | null, at: Addresses): EngineSpec {
  return {
    name: `engine-${j}`,
    ...at,
    role: 'decoder',
    index: j,
    port,
    cacheConfig,
    connector: {
      kv_connector: 'KvcConnectorV1',
      kv_role: 'kv_both',
      kv_connector_extra_config: { discard_partial_chunks: false, kvc_rpc_port: `engine${j + 1}` },
    },
    cpus,
  };
}

/** The cache YAML of one engine, with a header saying where it comes from. */
export function cacheYaml(e: EngineSpec): string {
  return `# ${e.name}: cache instance configuration (docs/configuration.md), generated by \`kvc up\`.\n` + stringify(e.cacheConfig);
}

export function connectorJson(e: EngineSpec): string {
  return JSON.stringify(e.connector);
}

/**
 * Arguments of `kvc engine` for one engine, with the engine flags every disaggregated engine
 * runs with (eager mode, no prefix caching, no per-request logs).
 */
export function engineArgs(plan: Plan, e: EngineSpec, connector: string): string[] {
  const pass = passThroughArgs(plan.opts.engine ?? {});
  return [
    'engine',
    ...hostArgs(plan, e),
    '--port', String(e.port),
    '--model', plan.opts.model,
    ...pass,
    '--kv-transfer-config', connector,
    '--enforce-eager',
    '--no-enable-prefix-caching',
    '--disable-log-requests',
    ...secretArgs(plan),
    ...cpuArgs(e.cpus),
    ...(e.idlePriority ? ['--cpu-priority', 'idle'] : []),
  ];
}

/** --host, and --advertise-host when it differs from it or the plan spans several machines. */
function hostArgs(plan: Plan, a: Addresses): string[] {
  return ['--host', a.bindHost, ...(plan.multiHost || a.advertiseHost !== a.bindHost ? ['--advertise-host', a.advertiseHost] : [])];
}

/** The deployment secret's file and the replay window that goes with it (docs/security.md). */
function secretArgs(plan: Plan): string[] {
  const w = plan.opts.replayWindowMs;
  return [
    ...(plan.opts.secretFile !== undefined ? ['--deployment-secret-file', plan.opts.secretFile] : []),
    ...(w !== undefined && w !== SETTINGS.replayWindow.default ? ['--replay-window', SETTINGS.replayWindow.show!(w)] : []),
  ];
}

/** `--cpus LIST` for a process placed on `cpus` (none: every CPU). */
function cpuArgs(cpus: string | null): string[] {
  return cpus !== null ? ['--cpus', cpus] : [];
}

export function controllerArgs(plan: Plan): string[] {
  const c = plan.controller!;
  return ['controller', ...hostArgs(plan, c), '--port', String(c.port), '--monitor-port', String(c.monitorPort), ...(plan.opts.replicaHints === false ? ['--replica-hints', 'off'] : []), ...cpuArgs(plan.serviceCpus), ...secretArgs(plan)];
}

export function proxyArgs(plan: Plan): string[] {
  const p = plan.engines.filter((e) => e.role === 'prefiller');
  const d = plan.engines.filter((e) => e.role === 'decoder');
  // Colocated (no prefiller): the engines have no xfer receiver; the proxy only balances requests
  // over them (--num-prefillers 0), so the decoder xfer ports below are never contacted.
  const firstDecoder = d[0]!.cacheConfig;
  const initPort = (e: EngineSpec) => String(e.cacheConfig.xfer_peer_init_port ?? BASE_PORTS.xferInit + plan.opts.portOffset + e.index);
  const allocPort = (e: EngineSpec) => String(e.cacheConfig.xfer_peer_alloc_port ?? BASE_PORTS.xferAlloc + plan.opts.portOffset + e.index);
  // The proxy reaches every engine at its advertised address, and hands the decoder's to the
  // prefiller as the xfer receiver (disagg_spec.receiver_host). On one machine: one host, first
  // ports and counts; over several: one entry per engine.
  const backends = plan.multiHost
    ? [
        ...(p.length ? ['--prefiller-host', p.map((e) => e.advertiseHost).join(','), '--prefiller-port', p.map((e) => e.port).join(',')] : []),
        '--num-prefillers', String(p.length),
        '--decoder-host', d.map((e) => e.advertiseHost).join(','),
        '--decoder-port', d.map((e) => e.port).join(','),
        '--num-decoders', String(d.length),
        '--decoder-init-port', d.map(initPort).join(','),
        '--decoder-alloc-port', d.map(allocPort).join(','),
      ]
    : [
        '--prefiller-host', plan.proxy.advertiseHost,
        '--prefiller-port', String(p[0]?.port ?? BASE_PORTS.prefiller + plan.opts.portOffset),
        '--num-prefillers', String(p.length),
        '--decoder-host', d[0]!.advertiseHost,
        '--decoder-port', String(d[0]!.port),
        '--num-decoders', String(d.length),
        '--decoder-init-port', String(firstDecoder.xfer_peer_init_port ?? BASE_PORTS.xferInit + plan.opts.portOffset),
        '--decoder-alloc-port', String(firstDecoder.xfer_peer_alloc_port ?? BASE_PORTS.xferAlloc + plan.opts.portOffset),
      ];
  return [
    'proxy',
    ...hostArgs(plan, plan.proxy),
    '--port', String(plan.proxy.port),
    ...backends,
    // The notify port binds with the HTTP port; prefillers reach it at xfer_proxy_host (the proxy's advertised address).
    '--proxy-host', plan.proxy.bindHost,
    '--proxy-port', String(plan.proxy.notifyPort),
    ...cpuArgs(plan.serviceCpus),
    ...secretArgs(plan),
    ...(plan.controller ? ['--controller-url', `http://${urlHost(plan.controller.advertiseHost)}:${plan.controller.port}`] : []),
    ...(plan.opts.routing ? ['--routing', plan.opts.routing] : []),
    ...(plan.opts.maxLocalPrefillTokens !== undefined ? ['--max-local-prefill-tokens', String(plan.opts.maxLocalPrefillTokens)] : []),
    ...(plan.opts.maxPrefillQueue !== undefined ? ['--max-prefill-queue', String(plan.opts.maxPrefillQueue)] : []),
    ...(plan.opts.statsIntervalMs !== undefined ? ['--stats-interval', String(plan.opts.statsIntervalMs / 1000)] : []),
  ];
}

/** Quotes an argument for a POSIX shell when needed. */
export function shQuote(s: string): string {
  return /^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

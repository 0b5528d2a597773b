// The controller process: HTTP API + monitor port + reaper, started by `kvc controller`
// and in process by tests and the benchmark.
import type { FastifyInstance } from 'fastify';
import { seedFromEnv } from '../common/keys.js';
import { logger } from '../common/log.js';
import { resolveAdvertiseHost, urlHost } from '../common/address.js';
import { EventLog } from './events.js';
import { buildHttpApi } from './http_api.js';
import { MonitorServer } from './monitor.js';
import { Operations } from './operations.js';
import { Registry } from './registry.js';
import { ReplicaHints } from './replica_hints.js';

const log = logger('controller');

export interface ControllerOptions {
  /** The address the HTTP and monitor ports bind. */
  host: string;
  /** The address the controller is reached at (its URL); default: host, or the hostname for 0.0.0.0/::. */
  advertiseHost?: string;
  port: number;
  monitorPort: number;
  /** A worker silent for longer than this is reaped and its chunks leave the index. */
  heartbeatTimeoutMs?: number;
  commandTimeoutMs?: number;
  transferTimeoutMs?: number;
  seed?: bigint;
  eventHistory?: number;
  /** Export process metrics (CPU, memory, event loop) on /metrics: the `kvc controller` process sets it. */
  processMetrics?: boolean;
  /**
   * Tell instances which of their chunks another instance holds too, so that they evict
   * duplicates first (src/controller/replica_hints.ts). Default true.
   */
  replicaHints?: boolean;
}

export interface Controller {
  readonly url: string;
  readonly registry: Registry;
  readonly ops: Operations;
  readonly http: FastifyInstance;
  close(): Promise<void>;
}

export async function startController(o: ControllerOptions): Promise<Controller> {
  const seed = o.seed ?? seedFromEnv();
  const heartbeatTimeoutMs = o.heartbeatTimeoutMs ?? 10_000;
  const registry = new Registry({ heartbeatTimeoutMs, seed });
  const ops = new Operations(registry, new EventLog(o.eventHistory ?? 10_000), seed, {
    commandMs: o.commandTimeoutMs ?? 5_000,
    transferMs: o.transferTimeoutMs ?? 300_000,
  });
  const monitor = new MonitorServer(registry);
  if (o.replicaHints ?? true) {
    const hints = new ReplicaHints(registry, (id, msg) => monitor.sendTo(id, msg));
    registry.replicas = hints;
  }
  await monitor.bind(o.host, o.monitorPort);
  let http: FastifyInstance;
  try {
    http = await buildHttpApi(ops, { processMetrics: o.processMetrics ?? false });
    await http.listen({ host: o.host, port: o.port });
  } catch (e) {
    await monitor.close();
    throw e;
  }
  const reaper = setInterval(() => registry.reap(), Math.max(50, Math.floor(heartbeatTimeoutMs / 4)));
  reaper.unref();
  const url = `http://${urlHost(resolveAdvertiseHost('--advertise-host', o.advertiseHost, o.host))}:${o.port}`;
  log.info(`seed ${seed}, heartbeat timeout ${heartbeatTimeoutMs} ms`);
  return {
    url,
    registry,
    ops,
    http,
    async close() {
      clearInterval(reaper);
      await http.close();
      await monitor.close();
    },
  };
}

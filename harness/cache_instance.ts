// The cache YAML of a test's in-process cache instance attached to a controller: a CPU tier (and a
// disk tier when given a directory), its worker and peer ports on fresh loopback ports.
import { validateCacheConfig, type CacheConfig } from '../src/common/config.js';
import { freePortRange } from './ports.js';

export interface InstanceConfigOptions {
  chunkSize: number;
  cpuGiB?: number;
  /** A directory for LocalDiskBackend (none: no disk tier). */
  diskDir?: string | null;
  diskGiB?: number;
}

export async function controllerInstanceConfig(id: string, monitorPort: number, o: InstanceConfigOptions): Promise<CacheConfig> {
  const base = await freePortRange(2);
  return validateCacheConfig({
    chunk_size: o.chunkSize,
    local_cpu: true,
    max_local_cpu_size: o.cpuGiB ?? 0.01,
    max_local_disk_size: o.diskDir ? (o.diskGiB ?? 0.05) : 0,
    local_disk: o.diskDir ?? null,
    enable_controller: true,
    kvc_instance_id: id,
    controller_url: `127.0.0.1:${monitorPort}`,
    kvc_worker_port: base,
    distributed_url: `127.0.0.1:${base + 1}`,
  }).config;
}

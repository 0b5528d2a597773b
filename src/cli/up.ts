// `kvc up`: a whole local disaggregated deployment in one command (see src/deploy/up.ts, docs/proxy.md).
import type { Command } from 'commander';
import { checkBindHost, isWildcardHost } from '../common/address.js';
import { parseHostList } from '../deploy/hosts.js';
import { fileURLToPath } from 'node:url';
import { dirname, join, resolve } from 'node:path';
import { parsePlacement } from '../deploy/placement.js';
import { DEFAULT_RESTART } from '../deploy/restart.js';
import { defaultLogDir, LogDirInUse } from '../deploy/log_dir.js';
import { PASS_THROUGH, type PassThroughValues } from '../common/flags.js';
import { addSettings } from './flags.js';

const CLI = join(dirname(fileURLToPath(import.meta.url)), 'main.js');

/** The parsed flags (src/common/flags.ts; the engines' pass-through ones are read by name). */
interface UpFlags {
  prefillers: number;
  decoders: number;
  model: string;
  host: string;
  advertiseHost?: string;
  hosts?: string;
  bindAddresses?: boolean;
  remoteUrl?: string;
  chunkSize: number;
  maxLocalCpuSize: number;
  localDisk?: string;
  maxLocalDiskSize?: number;
  maxRestarts: number;
  portOffset: number;
  controller: boolean;
  p2p: boolean;
  replicaHints: boolean;
  logDir?: string;
  startupTimeout: number;
  apiKey?: string;
  replayWindow: number;
  placement: string;
  routing: 'round-robin' | 'kv-aware';
  maxLocalPrefillTokens?: number;
  maxPrefillQueue?: number;
  statsInterval: number;
  configOnly?: boolean;
}


export function registerUp(program: Command): void {
  const cmd = program
    .command('up')
    .description('start a local disaggregated deployment: controller, X prefillers, Y decoders and the proxy');
  addSettings(cmd, 'up')
    .action(async (o: UpFlags, cmd: Command) => {
      let code: number;
      try {
        const multi = o.hosts !== undefined;
        if (!multi && o.bindAddresses === true) throw new Error('--bind-addresses: only with --hosts (one machine: --host is the bind address)');
        if (multi && o.advertiseHost !== undefined) throw new Error('--advertise-host: not used with --hosts (each process advertises the address --hosts gives it)');
        // With --hosts every process binds 0.0.0.0 unless --host names another wildcard (::).
        const hostGiven = cmd.getOptionValueSource('host') === 'cli';
        if (multi && hostGiven && !isWildcardHost(o.host)) {
          throw new Error(`--host: with --hosts only 0.0.0.0 or :: (each process binds every interface), or --bind-addresses to bind each host's address; found "${o.host}"`);
        }
        const host = checkBindHost('--host', multi && !hostGiven ? '0.0.0.0' : o.host);
        const hostList = multi ? parseHostList(o.hosts!) : undefined;
        const given = (name: string) => cmd.getOptionValueSource(name) === 'cli';
        const engine: PassThroughValues = {};
        const values = o as unknown as Record<string, unknown>;
        for (const name of PASS_THROUGH) if (values[name] !== undefined) engine[name] = values[name];
        // Derived from the offset, so a deployment beside another gets its own (src/deploy/log_dir.ts).
        const logDir = o.logDir ?? defaultLogDir(o.portOffset);
        const { runUp } = await import('../deploy/up.js');
        code = await runUp({
          prefillers: o.prefillers,
          decoders: o.decoders,
          model: o.model,
          portOffset: o.portOffset,
          controller: o.controller,
          p2p: o.p2p,
          replicaHints: o.replicaHints,
          // The proxy's own default applies unless given.
          routing: given('routing') ? o.routing : undefined,
          maxLocalPrefillTokens: o.maxLocalPrefillTokens,
          maxPrefillQueue: o.maxPrefillQueue,
          statsIntervalMs: given('statsInterval') ? o.statsInterval : undefined,
          host,
          advertiseHost: o.advertiseHost,
          hostList,
          bindAddresses: o.bindAddresses === true,
          logDirAsGiven: logDir,
          logDirGiven: o.logDir !== undefined,
          // With --hosts the default is shared: this machine's CPUs say nothing about the others.
          placement: multi && !given('placement') ? { kind: 'shared' } : parsePlacement(o.placement),
          engine,
          cache: {
            // Written into every engine's YAML only when given: the YAML's own defaults are the table's.
            chunkSize: given('chunkSize') ? o.chunkSize : undefined,
            maxLocalCpuSize: given('maxLocalCpuSize') ? o.maxLocalCpuSize : undefined,
            localDisk: o.localDisk === undefined ? undefined : resolve(o.localDisk),
            maxLocalDiskSize: o.maxLocalDiskSize,
            remoteUrl: o.remoteUrl,
          },
          restart: { ...DEFAULT_RESTART, maxRestarts: o.maxRestarts },
          logDir,
          startupTimeoutMs: o.startupTimeout,
          configOnly: o.configOnly === true,
          cli: CLI,
          apiKey: o.apiKey ?? null,
          replayWindowMs: o.replayWindow,
        });
      } catch (e) {
        process.stderr.write(`kvc up: ${(e as Error).message}\n`);
        // 3: the deployment's resources are taken (like ports already in use); 2: bad flags.
        code = e instanceof LogDirInUse ? 3 : 2;
      }
      process.exit(code);
    });
}

// `kvc up`: a whole local disaggregated deployment in one command (see src/deploy/up.ts, docs/proxy.md).
import type { Command } from 'commander';
import { checkBindHost, isWildcardHost } from '../common/address.js';
import { parseHostList } from '../deploy/hosts.js';
import { fileURLToPath } from 'node:url';
import { dirname, join, resolve } from 'node:path';
import { parsePlacement } from '../deploy/placement.js';
import { runUp } from '../deploy/up.js';
import { DEFAULT_RESTART } from '../deploy/restart.js';
import { DTYPES_ACCEPTED } from '../engine/settings.js';
import { intFlag as int, optionalPositiveInt as posInt, secondsFlag } from './options.js';
import { loadApiKey } from '../common/auth.js';

/** A size in GiB (>= 0, or > 0 with `positive`), or undefined when the flag was not given. */
function gibFlag(flag: string, v: unknown, positive = false): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (String(v).trim() === '' || !Number.isFinite(n) || n < 0 || (positive && n === 0)) throw new Error(`${flag}: expected a size in GiB ${positive ? '> 0' : '>= 0'}, found "${String(v)}"`);
  return n;
}
const str = (v: unknown) => (v === undefined ? undefined : String(v));

const CLI = join(dirname(fileURLToPath(import.meta.url)), 'main.js');


export function registerUp(program: Command): void {
  program
    .command('up')
    .description('start a local disaggregated deployment: controller, X prefillers, Y decoders and the proxy')
    .option('--prefillers <n>', 'number of prefiller engines (ports 7100+i); 0: colocated kv_both engines (as many as --decoders) behind the proxy', '1')
    .option('--decoders <n>', 'number of decoder engines (ports 7200+i)', '1')
    .option('--model <model>', 'model of every engine: builtin:tiny or a local checkpoint directory', 'builtin:tiny')
    .option('--host <addr>', 'address every process binds (with --hosts: 0.0.0.0 unless --bind-addresses)', '127.0.0.1')
    .option('--advertise-host <addr>', 'address the processes reach each other at (default: --host, or this machine\'s hostname when --host is 0.0.0.0)')
    .option('--hosts <list>', 'with --config-only: the machines of a deployment over several hosts, as name=address pairs (ctl=10.0.0.1,p0=10.0.0.2,d0=10.0.0.3) or a YAML file; prints each host\'s commands (docs/deploy.md)')
    .option('--bind-addresses', 'with --hosts: each process binds its host\'s address instead of 0.0.0.0')
    .option('--remote-url <url>', 'cache: the shared remote tier of every engine (redis://host:6379/0, rediss://, valkey://)')
    .option('--served-model-name <name>', 'engines: the model name clients send')
    .option('--max-model-len <n>', 'engines: longest prompt + completion in tokens')
    .option('--dtype <dtype>', 'engines: compute type (auto, float32, float)')
    .option('--max-num-seqs <n>', 'engines: sequences computed concurrently')
    .option('--max-num-batched-tokens <n>', 'engines: tokens per engine step')
    .option('--kv-cache-memory <GiB>', 'engines: paged KV budget per engine')
    .option('--chunk-size <n>', 'cache: tokens per KV chunk (default 256)')
    .option('--max-local-cpu-size <GiB>', 'cache: CPU tier per engine in GiB (default 5 on every engine; 0 turns it off)')
    .option('--local-disk <dir>', 'cache: disk tier directory; each engine uses <dir>/<engine name>')
    .option('--max-local-disk-size <GiB>', 'cache: disk tier per engine (needs --local-disk)')
    .option('--max-restarts <n>', 'restarts in a row (with backoff 1 s, 2 s, … 30 s) before giving up on a process that keeps dying; 0: never restart', String(DEFAULT_RESTART.maxRestarts))
    .option('--port-offset <n>', 'added to every reference port (to run beside another deployment)', '0')
    .option('--no-controller', 'do not start the controller; engines run with enable_controller: false')
    .option('--no-p2p', 'engines do not fetch prefixes they lack from each other (P2P, on by default with the controller; docs/p2p.md)')
    .option('--no-replica-hints', 'the controller does not tell engines which chunks another engine holds too (on by default: duplicates are evicted first; docs/storage.md)')
    .option('--log-dir <dir>', 'where per-process logs, generated configs and deployment.json go', 'kvc-logs')
    .option('--startup-timeout <s>', 'seconds allowed for all processes to become healthy', '300')
    .option('--api-key <key>', 'client API key of the deployment: clients send "Authorization: Bearer <key>" (default: $KVC_API_KEY; none: open)')
    .option('--placement <how>', 'CPUs of the engines: split (prefillers and decoders on disjoint CPUs), shared (no pinning) or prefill=LIST/decode=LIST', 'split')
    .option('--routing <mode>', 'proxy routing: round-robin (default) or kv-aware (cached prefix + load; docs/routing.md)')
    .option('--max-local-prefill-tokens <n>', "proxy: prefill on the decoder when at most this many prompt tokens are uncached there (kv-aware default 256)")
    .option('--max-prefill-queue <n>', 'proxy: prefill on the decoder when every prefiller has more than this many prefills in flight (kv-aware default 8)')
    .option('--config-only', 'write the cache YAML and connector JSON files and print the commands (with --hosts: per host, plus the deployment secret file); start nothing')
    .action(async (o: Record<string, string | boolean>, cmd: Command) => {
      let code: number;
      try {
        const multi = o.hosts !== undefined;
        if (!multi && o.bindAddresses === true) throw new Error('--bind-addresses: only with --hosts (one machine: --host is the bind address)');
        if (multi && o.advertiseHost !== undefined) throw new Error('--advertise-host: not used with --hosts (each process advertises the address --hosts gives it)');
        // With --hosts every process binds 0.0.0.0 unless --host names another wildcard (::).
        const hostGiven = cmd.getOptionValueSource('host') === 'cli';
        if (multi && hostGiven && !isWildcardHost(String(o.host))) {
          throw new Error(`--host: with --hosts only 0.0.0.0 or :: (each process binds every interface), or --bind-addresses to bind each host's address; found "${String(o.host)}"`);
        }
        const host = checkBindHost('--host', multi && !hostGiven ? '0.0.0.0' : String(o.host));
        const hostList = multi ? parseHostList(String(o.hosts)) : undefined;
        const startupTimeoutMs = secondsFlag('--startup-timeout', String(o.startupTimeout));
        if (o.dtype !== undefined && !(DTYPES_ACCEPTED as readonly string[]).includes(String(o.dtype))) {
          throw new Error(`--dtype: expected one of ${DTYPES_ACCEPTED.join(', ')}, found "${String(o.dtype)}"`);
        }
        code = await runUp({
          prefillers: int('--prefillers', String(o.prefillers)),
          decoders: int('--decoders', String(o.decoders)),
          model: String(o.model),
          portOffset: int('--port-offset', String(o.portOffset)),
          controller: o.controller !== false,
          p2p: o.p2p !== false,
          replicaHints: o.replicaHints !== false,
          routing: o.routing === undefined ? undefined : (String(o.routing) as 'round-robin'),
          maxLocalPrefillTokens: o.maxLocalPrefillTokens === undefined ? undefined : int('--max-local-prefill-tokens', String(o.maxLocalPrefillTokens), 0),
          maxPrefillQueue: o.maxPrefillQueue === undefined ? undefined : int('--max-prefill-queue', String(o.maxPrefillQueue), 0),
          host,
          advertiseHost: o.advertiseHost === undefined ? undefined : String(o.advertiseHost),
          hostList,
          bindAddresses: o.bindAddresses === true,
          logDirAsGiven: String(o.logDir),
          // With --hosts the default is shared: this machine's CPUs say nothing about the others.
          placement: multi && cmd.getOptionValueSource('placement') !== 'cli' ? { kind: 'shared' } : parsePlacement(String(o.placement)),
          engine: {
            servedModelName: str(o.servedModelName),
            maxModelLen: posInt('--max-model-len', str(o.maxModelLen)),
            dtype: str(o.dtype),
            maxNumSeqs: posInt('--max-num-seqs', str(o.maxNumSeqs)),
            maxNumBatchedTokens: posInt('--max-num-batched-tokens', str(o.maxNumBatchedTokens)),
            kvCacheMemory: gibFlag('--kv-cache-memory', o.kvCacheMemory, true),
          },
          cache: {
            chunkSize: posInt('--chunk-size', str(o.chunkSize)),
            maxLocalCpuSize: gibFlag('--max-local-cpu-size', o.maxLocalCpuSize),
            localDisk: o.localDisk === undefined ? undefined : resolve(String(o.localDisk)),
            maxLocalDiskSize: gibFlag('--max-local-disk-size', o.maxLocalDiskSize),
            remoteUrl: str(o.remoteUrl),
          },
          restart: { ...DEFAULT_RESTART, maxRestarts: int('--max-restarts', String(o.maxRestarts), 0, 1000) },
          logDir: String(o.logDir),
          startupTimeoutMs,
          configOnly: o.configOnly === true,
          cli: CLI,
          apiKey: o.apiKey === undefined ? loadApiKey(undefined) : loadApiKey(String(o.apiKey)),
        });
      } catch (e) {
        process.stderr.write(`kvc up: ${(e as Error).message}\n`);
        code = 2;
      }
      process.exit(code);
    });
}

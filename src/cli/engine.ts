// `kvc engine`: the OpenAI-compatible CPU inference server. Flags become startEngine() options
// (src/engine/settings.ts validates them); SIGTERM / SIGINT close the engine, then exit 0.
import type { Command } from 'commander';
import { gibToBytes } from '../common/config.js';
import { logger } from '../common/log.js';
import { validateCpuList } from '../common/cpu_set.js';
import { applyCpuSet } from '../engine/placement.js';
import { startEngine } from '../engine/server.js';
import { ADVERTISE_HELP, hostFlags, intFlag, optionalPositiveInt as posInt, portFlag } from './options.js';
import { apiKeyFrom, applySecret } from './security.js';

const log = logger('engine');

interface EngineFlags {
  deploymentSecretFile?: string;
  apiKey?: string;
  host: string;
  advertiseHost?: string;
  port: string;
  model?: string;
  dtype: string;
  enablePrefixCaching?: boolean;
  enableP2p?: boolean;
  servedModelName?: string;
  maxModelLen?: string;
  maxNumSeqs?: string;
  maxNumBatchedTokens?: string;
  stepTargetMs?: string;
  maxQueueLen?: string;
  kvCacheMemory?: string;
  kvTransferConfig?: string;
  cpus?: string;
  disableLogRequests?: boolean;
  disableLogStats?: boolean;
}

export function registerEngine(program: Command): void {
  program
    .command('engine')
    .description('serve a Llama-architecture model on the CPU with an OpenAI-compatible API')
    .argument('[model]', 'the model, as in `vllm serve <model>` (same as --model)')
    .option('--port <port>', 'HTTP port', '8000')
    .option('--host <host>', 'address to bind (0.0.0.0: every interface)', '127.0.0.1')
    .option('--advertise-host <host>', ADVERTISE_HELP + '; also the address its cache instance registers with the controller when bound to 0.0.0.0')
    .option('--model <model>', '"builtin:tiny" (random weights, generated at first use), a local Hugging Face checkpoint directory (config.json, tokenizer.json, *.safetensors), or a llama.cpp model file ending in .gguf; nothing is downloaded (default: builtin:tiny)')
    .option('--served-model-name <name>', 'model name clients send (default: the --model value)')
    .option('--max-model-len <n>', 'longest prompt + completion in tokens (default: the model\'s max_position_embeddings)')
    .option('--dtype <dtype>', 'compute type: auto, float32 or float (this CPU engine computes in float32; bf16/f16 weights are widened on load)', 'auto')
    .option('--max-num-seqs <n>', 'sequences computed concurrently', '16')
    .option('--max-num-batched-tokens <n>', 'most tokens per engine step (prefill chunk + decode rows; fewer prompt tokens when a step would exceed --step-target-ms)', '512')
    .option('--step-target-ms <ms>', 'wall time a step\'s prompt tokens should take at most, at the measured cost per token, so the engine answers HTTP (health probes) and decode rows between prompt chunks; 0: budget in tokens only', '200')
    .option('--max-queue-len <n>', 'requests that may wait for a slot before new ones get 503', '1024')
    .option('--kv-cache-memory <GiB>', 'paged KV budget in GiB (default: max-num-seqs full-length sequences, at most 4)')
    .option('--kv-transfer-config <json>', 'connector JSON, e.g. {"kv_connector":"KvcConnectorV1","kv_role":"kv_both"}; the cache instance is read from $KVC_CONFIG_FILE')
    .option('--cpus <list>', 'CPUs this engine runs on, as a cpulist ("0-1", "1", "0,2"); GEMM threads follow the set (default: every CPU)')
    .option('--enable-prefix-caching', 'reuse the KV of earlier prompts through a cache instance: without --kv-transfer-config, attaches a kv_both connector with the cache of $KVC_CONFIG_FILE (default: a CPU tier)')
    .option('--no-enable-prefix-caching', 'no cache instance unless --kv-transfer-config gives one (the default; the engine itself keeps no KV of finished requests)')
    .option('--enable-p2p', 'on a local cache miss, fetch the following chunks from the instance the controller says holds them (sets enable_p2p of $KVC_CONFIG_FILE; needs enable_controller)')
    .option('--enforce-eager', 'accepted for compatibility: the CPU engine always runs eagerly (it has no graph mode)')
    .option('--disable-log-requests', 'do not log one line per finished request (id, tokens, cached tokens, TTFT, duration)')
    .option('--disable-log-stats', 'do not log the periodic statistics line (throughput, running/waiting, KV usage, prefix-cache hit rate)')
    .option('--api-key <key>', 'clients must send "Authorization: Bearer <key>" (default: $KVC_API_KEY; none: open)')
    .option('--deployment-secret-file <path>', 'file whose first line is the secret the processes of this deployment share (default: $KVC_DEPLOYMENT_SECRET; none: internal channels are open)')
    .action(async (positional: string | undefined, f: EngineFlags) => {
      if (positional !== undefined && f.model !== undefined && positional !== f.model) {
        throw new Error(`the model is given twice, as "${positional}" and as --model "${f.model}"; give one`);
      }
      const model = positional ?? f.model ?? 'builtin:tiny';
      const { host, advertiseHost } = hostFlags(f);
      applySecret(f, host, 'the engine');
      const apiKey = apiKeyFrom(f);
      const port = portFlag('--port', f.port);
      if (f.cpus !== undefined) {
        // Before the model loads: its GEMM thread count is taken from this process's affinity.
        const n = applyCpuSet(validateCpuList('--cpus', f.cpus));
        log.info(`running on CPUs ${f.cpus.trim()} (${n} available to this process)`);
      }
      let kvCacheBytes: number | undefined;
      if (f.kvCacheMemory !== undefined) {
        const g = Number(f.kvCacheMemory);
        if (!Number.isFinite(g) || g <= 0) throw new Error(`--kv-cache-memory: expected a size in GiB > 0, found "${f.kvCacheMemory}"`);
        kvCacheBytes = gibToBytes(g);
      }
      const engine = await startEngine({
        host,
        advertiseHost,
        port,
        model,
        dtype: f.dtype,
        enablePrefixCaching: f.enablePrefixCaching,
        enableP2p: f.enableP2p,
        servedModelName: f.servedModelName,
        maxModelLen: posInt('--max-model-len', f.maxModelLen),
        maxNumSeqs: posInt('--max-num-seqs', f.maxNumSeqs),
        maxNumBatchedTokens: posInt('--max-num-batched-tokens', f.maxNumBatchedTokens),
        stepTargetMs: f.stepTargetMs === undefined ? undefined : intFlag('--step-target-ms', f.stepTargetMs, 0, 60_000),
        maxQueue: posInt('--max-queue-len', f.maxQueueLen),
        kvCacheBytes,
        kvTransferConfig: f.kvTransferConfig,
        processMetrics: true,
        apiKey,
        logRequests: !f.disableLogRequests,
        logStats: !f.disableLogStats,
      });
      log.info(`serving "${engine.modelName}" (model id ${engine.modelId}, max_model_len ${engine.maxModelLen})`);
      // `engine listening on <URL>` is the line scripts wait for: the URL is the advertised one.
      process.stdout.write(`engine listening on ${engine.url}${host !== advertiseHost ? ` (bound on ${host})` : ''}\n`);
      let stopping = false;
      const stop = (sig: string) => {
        if (stopping) return;
        stopping = true;
        log.info(`${sig}: shutting down`);
        const force = setTimeout(() => {
          log.error('shutdown took longer than 15 s; exiting');
          process.exit(1);
        }, 15_000);
        force.unref();
        engine.close().then(
          () => process.exit(0),
          (e: unknown) => {
            log.error(`shutdown failed: ${(e as Error).message}`);
            process.exit(1);
          },
        );
      };
      process.on('SIGTERM', () => stop('SIGTERM'));
      process.on('SIGINT', () => stop('SIGINT'));
    });
}

// `kvc engine`: the OpenAI-compatible CPU inference server. Flags become startEngine() options
// (src/engine/settings.ts validates them); SIGTERM / SIGINT close the engine, then exit 0.
import type { Command } from 'commander';
import { gibToBytes } from '../common/config.js';
import { logger } from '../common/log.js';
import { applyIdlePriority } from '../common/cpu_pin.js';
import { pinTo } from './pin.js';
import { addSettings } from './flags.js';
import { hostFlags } from './options.js';
import { apiKeyFrom, applySecret } from './security.js';

const log = logger('engine');

interface EngineFlags {
  deploymentSecretFile?: string;
  replayWindow: number;
  apiKey?: string;
  host: string;
  advertiseHost?: string;
  port: number;
  model: string;
  dtype: string;
  kvCacheDtype: string;
  enablePrefixCaching?: boolean;
  enableP2p?: boolean;
  servedModelName?: string;
  maxModelLen?: number;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  stepTargetMs: number;
  maxQueueLen: number;
  kvCacheMemory?: number;
  kvTransferConfig?: string;
  cpus?: string;
  cpuPriority: 'normal' | 'idle';
  disableLogRequests?: boolean;
  disableLogStats?: boolean;
  chatTemplate?: string;
}

export function registerEngine(program: Command): void {
  const cmd = program
    .command('engine')
    .alias('serve')
    .description('serve a Llama-architecture model on the CPU with an OpenAI-compatible API (also `kvc serve MODEL`, as `vllm serve`)')
    .argument('[model]', 'the model, as in `vllm serve <model>` (same as --model)');
  addSettings(cmd, 'engine').action(async (positional: string | undefined, f: EngineFlags, c: Command) => {
      const modelGiven = c.getOptionValueSource('model') === 'cli';
      if (positional !== undefined && modelGiven && positional !== f.model) {
        throw new Error(`the model is given twice, as "${positional}" and as --model "${f.model}"; give one`);
      }
      const model = positional ?? f.model;
      const { host, advertiseHost } = hostFlags(f);
      applySecret(f, host, 'the engine');
      const apiKey = apiKeyFrom(f);
      // Before the model loads: its GEMM thread count is taken from this process's affinity.
      pinTo(f.cpus, 'engine');
      if (f.cpuPriority === 'idle') {
        // Before the model loads too: the GEMM workers started then inherit the class.
        applyIdlePriority();
        log.info('running at idle CPU priority (SCHED_IDLE): only on CPU time no normal-priority program wants');
      }
      const { startEngine } = await import('../engine/server.js');
      const engine = await startEngine({
        host,
        advertiseHost,
        port: f.port,
        model,
        dtype: f.dtype,
        kvCacheDtype: f.kvCacheDtype,
        enablePrefixCaching: f.enablePrefixCaching,
        enableP2p: f.enableP2p,
        servedModelName: f.servedModelName,
        maxModelLen: f.maxModelLen,
        maxNumSeqs: f.maxNumSeqs,
        maxNumBatchedTokens: f.maxNumBatchedTokens,
        stepTargetMs: f.stepTargetMs,
        maxQueue: f.maxQueueLen,
        kvCacheBytes: f.kvCacheMemory === undefined ? undefined : gibToBytes(f.kvCacheMemory),
        kvTransferConfig: f.kvTransferConfig,
        processMetrics: true,
        apiKey,
        logRequests: !f.disableLogRequests,
        logStats: !f.disableLogStats,
        chatTemplate: f.chatTemplate,
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

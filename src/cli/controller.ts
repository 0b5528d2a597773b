// `kvc controller`: the cache controller (HTTP API on --port, monitor port for instances).
import type { Command } from 'commander';
import { addSettings } from './flags.js';
import { pinTo } from './pin.js';
import { hostFlags } from './options.js';
import { applySecret } from './security.js';
import { urlHost } from '../common/address.js';


export function registerController(program: Command): void {
  const cmd = program
    .command('controller')
    .description('run the KV cache controller: instance registry, global chunk index, move/copy/pin/lookup/clear');
  addSettings(cmd, 'controller').action(async (opts: { host: string; advertiseHost?: string; port: number; monitorPort: number; heartbeatTimeout: number; commandTimeout: number; transferTimeout: number; replicaHints: boolean; deploymentSecretFile?: string; replayWindow: number; cpus?: string }) => {
      const { host, advertiseHost } = hostFlags(opts);
      pinTo(opts.cpus, 'controller');
      applySecret(opts, host, 'the controller');
      const { port, monitorPort } = opts;
      if (port === monitorPort) throw new Error('--port and --monitor-port must differ');
      const { startController } = await import('../controller/server.js');
      const ctl = await startController({
        host,
        advertiseHost,
        port,
        monitorPort,
        heartbeatTimeoutMs: opts.heartbeatTimeout,
        commandTimeoutMs: opts.commandTimeout,
        transferTimeoutMs: opts.transferTimeout,
        processMetrics: true,
        replicaHints: opts.replicaHints,
      });
      process.stdout.write(`kvc controller ready: http ${ctl.url} monitor tcp://${urlHost(advertiseHost)}:${monitorPort} (bound on ${host}) dashboard ${ctl.url}/\n`);
      let stopping = false;
      const stop = () => {
        if (stopping) return;
        stopping = true;
        void ctl.close().finally(() => process.exit(0));
        setTimeout(() => process.exit(0), 3000).unref();
      };
      process.on('SIGINT', stop);
      process.on('SIGTERM', stop);
  });
}

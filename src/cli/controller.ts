// `kvc controller`: the cache controller (HTTP API on --port, monitor port for instances).
import type { Command } from 'commander';
import { startController } from '../controller/server.js';
import { ADVERTISE_HELP, hostFlags, portFlag, secondsFlag } from './options.js';
import { applySecret } from './security.js';
import { urlHost } from '../common/address.js';


export function registerController(program: Command): void {
  program
    .command('controller')
    .description('run the KV cache controller: instance registry, global chunk index, move/copy/pin/lookup/clear')
    .option('--host <host>', 'address to bind (HTTP and monitor; 0.0.0.0: every interface)', '127.0.0.1')
    .option('--advertise-host <host>', ADVERTISE_HELP)
    .option('--port <port>', 'HTTP port of the operations', '9000')
    .option('--monitor-port <port>', 'port cache instances connect to (controller_url)', '9001')
    .option('--heartbeat-timeout <seconds>', 'reap a worker silent for this long', '10')
    .option('--command-timeout <seconds>', 'deadline of a short command to a worker (lookup, pin, health)', '5')
    .option('--transfer-timeout <seconds>', 'deadline of a move, copy or clear', '300')
    .option('--replica-hints <on|off>', 'tell instances which of their chunks another instance holds too, so they evict duplicates first (docs/storage.md)', 'on')
    .option('--deployment-secret-file <path>', 'file whose first line is the secret the processes of this deployment share (default: $KVC_DEPLOYMENT_SECRET; none: internal channels are open)')
    .action(async (opts: { host: string; advertiseHost?: string; port: string; monitorPort: string; heartbeatTimeout: string; commandTimeout: string; transferTimeout: string; replicaHints: string; deploymentSecretFile?: string }) => {
      const { host, advertiseHost } = hostFlags(opts);
      applySecret(opts, host, 'the controller');
      const port = portFlag('--port', opts.port);
      const monitorPort = portFlag('--monitor-port', opts.monitorPort);
      if (port === monitorPort) throw new Error('--port and --monitor-port must differ');
      if (opts.replicaHints !== 'on' && opts.replicaHints !== 'off') throw new Error(`--replica-hints: expected on or off, got "${opts.replicaHints}"`);
      const ctl = await startController({
        host,
        advertiseHost,
        port,
        monitorPort,
        heartbeatTimeoutMs: secondsFlag('--heartbeat-timeout', opts.heartbeatTimeout),
        commandTimeoutMs: secondsFlag('--command-timeout', opts.commandTimeout),
        transferTimeoutMs: secondsFlag('--transfer-timeout', opts.transferTimeout),
        processMetrics: true,
        replicaHints: opts.replicaHints === 'on',
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

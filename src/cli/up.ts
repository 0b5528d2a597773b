// `kvc up`: a whole local disaggregated deployment in one command (see src/deploy/up.ts, docs/proxy.md).
import type { Command } from 'commander';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { parsePlacement } from '../deploy/placement.js';
import { runUp } from '../deploy/up.js';
import { intFlag as int, secondsFlag } from './options.js';

const CLI = join(dirname(fileURLToPath(import.meta.url)), 'main.js');


export function registerUp(program: Command): void {
  program
    .command('up')
    .description('start a local disaggregated deployment: controller, X prefillers, Y decoders and the proxy')
    .option('--prefillers <n>', 'number of prefiller engines (ports 7100+i); 0: colocated kv_both engines (as many as --decoders) behind the proxy', '1')
    .option('--decoders <n>', 'number of decoder engines (ports 7200+i)', '1')
    .option('--model <model>', 'model of every engine', 'builtin:tiny')
    .option('--port-offset <n>', 'added to every reference port (to run beside another deployment)', '0')
    .option('--no-controller', 'do not start the controller; engines run with enable_controller: false')
    .option('--log-dir <dir>', 'where per-process logs, generated configs and deployment.json go', 'kvc-logs')
    .option('--startup-timeout <s>', 'seconds allowed for all processes to become healthy', '300')
    .option('--placement <how>', 'CPUs of the engines: split (prefillers and decoders on disjoint CPUs), shared (no pinning) or prefill=LIST/decode=LIST', 'split')
    .option('--config-only', 'write the cache YAML and connector JSON files and print the commands; start nothing')
    .action(async (o: Record<string, string | boolean>) => {
      let code: number;
      try {
        const startupTimeoutMs = secondsFlag('--startup-timeout', String(o.startupTimeout));
        code = await runUp({
          prefillers: int('--prefillers', String(o.prefillers)),
          decoders: int('--decoders', String(o.decoders)),
          model: String(o.model),
          portOffset: int('--port-offset', String(o.portOffset)),
          controller: o.controller !== false,
          host: '127.0.0.1',
          placement: parsePlacement(String(o.placement)),
          logDir: String(o.logDir),
          startupTimeoutMs,
          configOnly: o.configOnly === true,
          cli: CLI,
        });
      } catch (e) {
        process.stderr.write(`kvc up: ${(e as Error).message}\n`);
        code = 2;
      }
      process.exit(code);
    });
}

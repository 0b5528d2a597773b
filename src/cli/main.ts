#!/usr/bin/env node
// The `kvc` command. Each subcommand lives in its own file beside this one and is
// registered here, so `kvc --help` lists everything the stack can run.
import { KVC_VERSION } from '../common/version.js';
import { Command } from 'commander';
import { environment } from '../common/environment.js';
import { registerKeys } from './keys.js';
import { registerEngine } from './engine.js';
import { registerController } from './controller.js';
import { registerProxy } from './proxy.js';
import { registerUp } from './up.js';
import { unsupportedVllmFlag } from './vllm_flags.js';
import { UsageError } from './flags.js';

// An environment variable with a value nobody understands is refused before anything starts.
const envErrors = environment().errors;
if (envErrors.length) {
  process.stderr.write(`kvc: ${envErrors.join('; ')}\n`);
  process.exit(1);
}

const program = new Command();
program
  .name('kvc')
  .description('KV-cache-centric LLM serving: cache instances, controller, xfer transfer, engine, proxy')
  .version(KVC_VERSION)
  // An unknown or bad flag gets one line (with commander's "did you mean"), not the whole help.
  .showHelpAfterError('(run with --help for the list of options)');

registerKeys(program);
registerEngine(program);
registerController(program);
registerProxy(program);
registerUp(program);

// vLLM's flags kvc does not implement are refused by name before commander sees them.
const [sub, ...subArgs] = process.argv.slice(2);
if (sub === 'engine' || sub === 'serve') {
  const refused = unsupportedVllmFlag(subArgs);
  if (refused) {
    process.stderr.write(`kvc ${sub}: ${refused}\n`);
    process.exit(2);
  }
}

program.parseAsync(process.argv).catch((err: unknown) => {
  process.stderr.write(`kvc: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(err instanceof UsageError ? 2 : 1);
});

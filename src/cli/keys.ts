// `kvc keys`: prints the chunk keys of a token list, one line per chunk, so a user can
// check by hand that two processes (same PYTHONHASHSEED, model, chunk size) agree.
import type { Command } from 'commander';
import { chunkKeys, seedFromEnv } from '../common/keys.js';

export function registerKeys(program: Command): void {
  program
    .command('keys')
    .description('print the chunk keys (index, tokens, key) of a list of token ids')
    .requiredOption('--model <id>', 'model id the keys are bound to')
    .option('--chunk-size <n>', 'tokens per chunk', '256')
    .option('--discard-partial-chunks', 'give the last, shorter chunk no key', false)
    .argument('<tokens...>', 'token ids (non-negative integers)')
    .action((tokens: string[], opts: { model: string; chunkSize: string; discardPartialChunks: boolean }) => {
      const chunkSize = Number(opts.chunkSize);
      if (!Number.isInteger(chunkSize) || chunkSize <= 0) throw new Error(`--chunk-size: expected a positive integer, found "${opts.chunkSize}"`);
      const ids = tokens.map((t, i) => {
        if (!/^\d+$/.test(t) || Number(t) > 0xffffffff) throw new Error(`token #${i}: expected a non-negative 32-bit integer, found "${t}"`);
        return Number(t);
      });
      const spans = chunkKeys(ids, { modelId: opts.model, chunkSize, seed: seedFromEnv(), discardPartialChunks: opts.discardPartialChunks });
      for (const s of spans) process.stdout.write(`${s.index}\t${s.end - s.start}\t${s.key}\n`);
    });
}

// The trace a trace bench replays (`--trace`): a file in Mooncake's format, or `generated:NAME`, one
// of the generator's named shapes (harness/trace_gen.ts) written for the given seed to
// bench-results/trace/, so that the bench runs with nothing but the repository and the file it
// replayed can be reused with `--trace FILE`.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { generateTrace, traceText, TRACE_SHAPES } from '../harness/trace_gen.js';
import { resultsDir } from './_plot.js';

/** The default `--trace`: the repository's own few-tenant trace. */
export const DEFAULT_TRACE = 'generated:tenants';

/**
 * The defaults the trace bench and the tier model share (docs/trace.md "Options"): with them,
 * `npm run bench -- trace` replays the window docs/trace.md reports for `tenants` at a rate the
 * built-in model's 2P2D deployment carries on 2 cores.
 */
export const TRACE_DEFAULTS = { window: '0:120', sample: 0.05, rate: 1.2, blockTokens: 32, tierFraction: 0.2 } as const;

const PREFIX = 'generated:';

/** The trace's text and where it is (the written file for a generated one). */
export function loadTrace(spec: string, seed: number): { text: string; file: string } {
  if (spec.startsWith(PREFIX)) {
    const name = spec.slice(PREFIX.length);
    const shape = TRACE_SHAPES[name];
    if (!shape) throw new Error(`--trace: expected a file or generated:NAME with NAME one of ${Object.keys(TRACE_SHAPES).join(', ')}, found "${spec}"`);
    const dir = resultsDir('trace');
    mkdirSync(dir, { recursive: true });
    const file = join(dir, `generated-${name}-seed${seed}.jsonl`);
    const text = traceText(generateTrace(shape, seed));
    writeFileSync(file, text);
    return { text, file };
  }
  if (!existsSync(spec)) throw new Error(`--trace: ${spec} does not exist (expected a file in Mooncake's format or generated:NAME)`);
  return { text: readFileSync(spec, 'utf8'), file: spec };
}

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

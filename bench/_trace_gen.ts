// Writes a synthetic request trace in Mooncake's format (harness/trace_model.ts) from the generator
// in harness/trace_gen.ts (its model is described there), for `npm run bench -- trace --trace FILE`
// and `node dist/bench/_trace_policy.js --trace FILE`:
//
//   npm run build && node dist/bench/_trace_gen.js --out FILE [--shape tenants|sessions] [--tenants N]
//     [--conversations N] [--turns T] [--system-blocks N] [--turn-blocks N] [--duration S] [--think S]
//     [--skew X] [--seed 1]
//
// A named shape (TRACE_SHAPES, default `tenants`) gives every parameter; a flag overrides one.
// `--trace generated:NAME` in the trace bench writes the same file as `--shape NAME --seed S`.
import { writeFileSync } from 'node:fs';
import { generateTrace, traceText, TRACE_SHAPES, type TraceShape } from '../harness/trace_gen.js';

const FLAGS: Record<string, { key: keyof TraceShape; int: boolean; min: number; help: string }> = {
  '--tenants': { key: 'tenants', int: true, min: 1, help: 'tenants (system prompts)' },
  '--conversations': { key: 'conversations', int: true, min: 1, help: 'conversations' },
  '--turns': { key: 'turns', int: false, min: 1, help: 'mean turns per conversation' },
  '--system-blocks': { key: 'systemBlocks', int: true, min: 0, help: '512-token blocks of each system prompt' },
  '--turn-blocks': { key: 'turnBlocks', int: true, min: 1, help: 'most new blocks a turn adds' },
  '--duration': { key: 'duration', int: false, min: 1, help: 'seconds over which conversations start' },
  '--think': { key: 'think', int: false, min: 0, help: 'mean seconds between turns' },
  '--skew': { key: 'skew', int: false, min: 0, help: 'Zipf exponent of tenant popularity' },
};

function parse(argv: string[]): { out: string; shape: TraceShape; seed: number } {
  let out: string | null = null;
  let base = 'tenants';
  let seed = 1;
  const over: Partial<TraceShape> = {};
  const seen = new Set<string>();
  for (let i = 0; i < argv.length; i += 2) {
    const f = argv[i]!;
    const val = argv[i + 1];
    if (val === undefined) throw new Error(`${f}: expected a value`);
    if (seen.has(f)) throw new Error(`${f}: given twice`);
    seen.add(f);
    if (f === '--out') {
      out = val;
      continue;
    }
    if (f === '--shape') {
      if (!(val in TRACE_SHAPES)) throw new Error(`--shape: expected one of ${Object.keys(TRACE_SHAPES).join(', ')}, found "${val}"`);
      base = val;
      continue;
    }
    const spec = FLAGS[f];
    if (f !== '--seed' && !spec) throw new Error(`${f}: unknown option (expected --out, --shape, --seed, ${Object.keys(FLAGS).join(', ')})`);
    const n = Number(val);
    const min = spec?.min ?? 0;
    const int = spec?.int ?? true;
    if (val.trim() === '' || !Number.isFinite(n) || n < min || (int && !Number.isInteger(n))) {
      throw new Error(`${f}: expected ${int ? 'an integer' : 'a number'} >= ${min} (${spec?.help ?? 'random seed'}), found "${val}"`);
    }
    if (spec) over[spec.key] = n;
    else seed = n;
  }
  if (out === null) throw new Error('--out: expected the file to write');
  return { out, shape: { ...TRACE_SHAPES[base]!, ...over }, seed };
}

function main(): void {
  try {
    const { out, shape, seed } = parse(process.argv.slice(2));
    const lines = generateTrace(shape, seed);
    writeFileSync(out, traceText(lines));
    const tokens = lines.reduce((a, l) => a + l.input_length, 0);
    console.log(`${out}: ${lines.length} requests, ${shape.conversations} conversations over ${shape.tenants} tenants, average input ${Math.round(tokens / lines.length)} tokens`);
  } catch (e) {
    console.error(`trace generator: ${(e as Error).message}`);
    process.exit(2);
  }
}

main();

// Writes a synthetic request trace in Mooncake's format (harness/trace_model.ts) with another shape
// than the FAST'25 synthetic trace: few tenants, each with a long system prompt, and long
// multi-turn conversations, so that `npm run bench -- trace --trace FILE` is also measured on
// traffic where reuse comes mostly from earlier turns of the same conversation.
//
//   npm run build && node dist/bench/_trace_gen.js --out FILE [--tenants 4] [--conversations 80]
//     [--turns 8] [--system-blocks 6] [--turn-blocks 3] [--duration 3600] [--think 45] [--skew 1.2] [--seed 1]
//
// Model: conversation c belongs to tenant t with probability ∝ 1/(t+1)^skew (Zipf) and starts at a
// uniform time in [0, duration). It has 1 + a geometric number of further turns (mean `turns` in
// all); turn k's prompt is the tenant's `system-blocks`-block system prompt, the whole previous
// prompt with its partial last block completed (the previous answer), and 1..`turn-blocks` new
// blocks, the last one partial. Turns are `think` seconds apart on average (exponential). Hash ids:
// a full block shared by two prompts at the same position gets the same id (same prefix, same
// tokens), anything else a new one; a prompt's partial last block always gets an id of its own.
// output_length is 20..300 tokens. Lines are written in arrival order.
import { writeFileSync } from 'node:fs';
import { mulberry32, TRACE_BLOCK_TOKENS } from '../harness/trace_model.js';

const FLAGS: Record<string, { def: number; int: boolean; min: number; help: string }> = {
  '--tenants': { def: 4, int: true, min: 1, help: 'tenants (system prompts)' },
  '--conversations': { def: 80, int: true, min: 1, help: 'conversations' },
  '--turns': { def: 8, int: false, min: 1, help: 'mean turns per conversation' },
  '--system-blocks': { def: 6, int: true, min: 0, help: '512-token blocks of each system prompt' },
  '--turn-blocks': { def: 3, int: true, min: 1, help: 'most new blocks a turn adds' },
  '--duration': { def: 3600, int: false, min: 1, help: 'seconds over which conversations start' },
  '--think': { def: 45, int: false, min: 0, help: 'mean seconds between turns' },
  '--skew': { def: 1.2, int: false, min: 0, help: 'Zipf exponent of tenant popularity' },
  '--seed': { def: 1, int: true, min: 0, help: 'random seed' },
};

function parse(argv: string[]): { out: string; v: Record<string, number> } {
  const v: Record<string, number> = Object.fromEntries(Object.entries(FLAGS).map(([k, f]) => [k, f.def]));
  let out: string | null = null;
  for (let i = 0; i < argv.length; i += 2) {
    const f = argv[i]!;
    const val = argv[i + 1];
    if (val === undefined) throw new Error(`${f}: expected a value`);
    if (f === '--out') {
      out = val;
      continue;
    }
    const spec = FLAGS[f];
    if (!spec) throw new Error(`${f}: unknown option (expected --out, ${Object.keys(FLAGS).join(', ')})`);
    const n = Number(val);
    if (val.trim() === '' || !Number.isFinite(n) || n < spec.min || (spec.int && !Number.isInteger(n))) {
      throw new Error(`${f}: expected ${spec.int ? 'an integer' : 'a number'} >= ${spec.min} (${spec.help}), found "${val}"`);
    }
    v[f] = n;
  }
  if (out === null) throw new Error('--out: expected the file to write');
  return { out, v };
}

interface Line {
  timestamp: number;
  input_length: number;
  output_length: number;
  hash_ids: number[];
}

function generate(v: Record<string, number>): Line[] {
  const r = mulberry32(v['--seed']!);
  let nextId = 0;
  const weights = Array.from({ length: v['--tenants']! }, (_, t) => 1 / (t + 1) ** v['--skew']!);
  const wsum = weights.reduce((a, b) => a + b, 0);
  const tenantOf = () => {
    let x = r() * wsum;
    for (let t = 0; t < weights.length; t++) if ((x -= weights[t]!) < 0) return t;
    return weights.length - 1;
  };
  const system = weights.map(() => Array.from({ length: v['--system-blocks']! }, () => nextId++));
  const lines: Line[] = [];
  const exp = (mean: number) => -Math.log(1 - r()) * mean;
  for (let c = 0; c < v['--conversations']!; c++) {
    const tenant = tenantOf();
    let t = r() * v['--duration']! * 1000;
    // Turns: 1 + geometric with mean turns − 1.
    const pMore = 1 - 1 / v['--turns']!;
    let full = [...system[tenant]!];
    for (;;) {
      const added = 1 + Math.floor(r() * v['--turn-blocks']!);
      const newFull = Array.from({ length: added - 1 }, () => nextId++);
      const partialTokens = 1 + Math.floor(r() * (TRACE_BLOCK_TOKENS - 1));
      const ids = [...full, ...newFull, nextId++];
      lines.push({ timestamp: Math.round(t), input_length: (ids.length - 1) * TRACE_BLOCK_TOKENS + partialTokens, output_length: 20 + Math.floor(r() * 281), hash_ids: ids });
      // The next turn resends this prompt with its last block completed by the answer.
      full = [...full, ...newFull, nextId++];
      if (r() >= pMore) break;
      t += exp(v['--think']! * 1000);
    }
  }
  lines.sort((a, b) => a.timestamp - b.timestamp);
  return lines;
}

function main(): void {
  try {
    const { out, v } = parse(process.argv.slice(2));
    const lines = generate(v);
    writeFileSync(out, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
    const tokens = lines.reduce((a, l) => a + l.input_length, 0);
    console.log(`${out}: ${lines.length} requests, ${v['--conversations']} conversations over ${v['--tenants']} tenants, average input ${Math.round(tokens / lines.length)} tokens`);
  } catch (e) {
    console.error(`trace generator: ${(e as Error).message}`);
    process.exit(2);
  }
}

main();

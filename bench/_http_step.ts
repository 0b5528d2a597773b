// The engine's cost per decode step outside the model at batch 8, over HTTP with streaming.
// Two runs of 8 concurrent streams, 128 tokens and 1 token each (their difference is 127 decode
// steps: prefill, connection and request handling cancel out):
//   HTTP step     (wall of the 128-token run − wall of the 1-token run) / 127
//   forward step  the same difference of the time spent inside the model's forward, timed in the
//                 engine process during those very runs (bench/_engine_step_child.ts)
//   direct step   wall per step of the same forward (8 rows, same positions) in a plain loop in
//                 the engine process, no HTTP, no scheduler (bench/_engine_step_child.ts)
//   step gap      the headline figure: per decode step, the time from the end of one forward call
//                 to the start of the next (scheduling, sampling, detokenizing, SSE, socket writes,
//                 GC, the event loop) plus sampling work done inside the forward call (this tree
//                 computes greedy argmax right after the LM head); the median over the 128-token
//                 runs' steps, measured step by step in the engine process
//   overhead      HTTP step − direct step, also reported: it adds the forward's own slowdown while
//                 serving, but as the difference of two ~10 ms figures measured seconds apart it
//                 swings by ±0.5 ms per step on a shared machine (0.6-1.4 × on unchanged code);
//                 "HTTP step − forward call" (also reported) counts in-call sampling as forward
//   overhead CPU  engine-process CPU per HTTP step − per direct step, which other processes on a
//                 loaded machine do not stretch
// Each tree (this one, and optionally a built older checkout) runs in its own child process
// (bench/_engine_step_child.ts) with the client here, so the client's SSE parsing is not counted;
// the trees alternate within each round, so a comparison is made in the same minutes.
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const CHILD = fileURLToPath(new URL('./_engine_step_child.js', import.meta.url));
const ROWS = 8;
const PROMPT = 32;
const TOKENS = 128;

export interface StepCost {
  /** Wall ms per decode step over HTTP. */
  httpMs: number;
  /** Wall ms per step inside the model's forward. */
  forwardMs: number;
  /** httpMs − forwardMs (the forward call as the scheduler makes it, with what it does inside). */
  overheadInsideMs: number;
  /** Wall ms per step of the same forward in a plain loop (no HTTP, no scheduler). */
  directMs: number;
  /** httpMs − directMs. */
  overheadDirectMs: number;
  /** Median step gap (with in-call sampling): the headline figure. */
  overheadMs: number;
  /** Engine CPU ms per direct step. */
  directCpuMs: number;
  /** Engine-process CPU ms per step over HTTP, and inside the forward; HTTP − direct. */
  httpCpuMs: number;
  forwardCpuMs: number;
  overheadCpuMs: number;
}

class TreeEngine {
  private readonly child: ChildProcess;
  private pending: ((m: Record<string, unknown>) => void) | null = null;
  url = '';

  constructor(readonly label: string, readonly root: string) {
    this.child = fork(CHILD, [], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'], env: { ...process.env, KVC_LOG_LEVEL: 'warn' } });
    this.child.on('message', (m: Record<string, unknown>) => {
      const p = this.pending;
      this.pending = null;
      p?.(m);
    });
  }

  async call(msg: Record<string, unknown>): Promise<Record<string, unknown>> {
    const r = await new Promise<Record<string, unknown>>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`${this.label}: no answer to ${String(msg.cmd)} in 600 s`)), 600_000);
      this.pending = (m) => {
        clearTimeout(t);
        resolve(m);
      };
      this.child.send(msg);
    });
    if (typeof r.error === 'string') throw new Error(`${this.label} (${this.root}): ${r.error}`);
    return r;
  }

  async start(): Promise<void> {
    this.url = (await this.call({ cmd: 'start', root: this.root })).url as string;
  }
  async gaps(): Promise<{ median: number; count: number }> {
    return (await this.call({ cmd: 'gaps' })) as { median: number; count: number };
  }
  async direct(): Promise<{ ms: number; cpu: number }> {
    return (await this.call({ cmd: 'direct', prompt: PROMPT, tokens: TOKENS })) as { ms: number; cpu: number };
  }
  async stats(): Promise<{ cpu: number; fwdCpu: number; fwdWall: number; forwards: number }> {
    return (await this.call({ cmd: 'stats' })) as { cpu: number; fwdCpu: number; fwdWall: number; forwards: number };
  }
  async close(): Promise<void> {
    const exited = new Promise<void>((r) => this.child.once('exit', () => r()));
    this.child.send({ cmd: 'close' });
    await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
    if (this.child.exitCode === null) this.child.kill();
  }
}

const prompt = (salt: number) => Array.from({ length: PROMPT }, (_, i) => 1000 + ((i * 7919 + salt * 104729) % 30000));

/** One streamed completion read to its end; checks that it finished by length. */
async function streamOne(url: string, salt: number, maxTokens: number): Promise<void> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'builtin:tiny', prompt: prompt(salt), max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true }),
    signal: AbortSignal.timeout(600_000),
  });
  const body = await r.text();
  if (!r.ok || !body.endsWith('data: [DONE]\n\n') || !body.includes('"finish_reason":"length"')) throw new Error(`stream failed (HTTP ${r.status}): ${body.slice(-300)}`);
}

interface Run {
  /** Wall ms of the run, and of it inside the forward; engine CPU ms, and of it inside the forward. */
  ms: number;
  fwdMs: number;
  cpu: number;
  fwdCpu: number;
}

/** 8 concurrent streams of `maxTokens` tokens. */
async function batch(e: TreeEngine, salt: number, maxTokens: number): Promise<Run> {
  const s0 = await e.stats();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: ROWS }, (_, i) => streamOne(e.url, salt + i, maxTokens)));
  const ms = performance.now() - t0;
  const s1 = await e.stats();
  return { ms, fwdMs: s1.fwdWall - s0.fwdWall, cpu: (s1.cpu - s0.cpu) / 1000, fwdCpu: (s1.fwdCpu - s0.fwdCpu) / 1000 };
}

async function measureOnce(e: TreeEngine, salt: number): Promise<StepCost> {
  const one = await batch(e, salt, 1);
  await e.gaps(); // forget anything before this run
  const full = await batch(e, salt + 100, TOKENS);
  const g = await e.gaps();
  if (g.count < TOKENS / 2) throw new Error(`${e.label}: only ${g.count} decode-step gaps seen in a run of ${TOKENS} tokens at batch ${ROWS}`);
  const per = (f: (r: Run) => number) => (f(full) - f(one)) / (TOKENS - 1);
  const httpMs = per((r) => r.ms);
  const forwardMs = per((r) => r.fwdMs);
  const httpCpuMs = per((r) => r.cpu);
  const forwardCpuMs = per((r) => r.fwdCpu);
  const d = await e.direct();
  return { httpMs, forwardMs, overheadInsideMs: httpMs - forwardMs, directMs: d.ms, overheadDirectMs: httpMs - d.ms, overheadMs: g.median, directCpuMs: d.cpu, httpCpuMs, forwardCpuMs, overheadCpuMs: httpCpuMs - d.cpu };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Per-step cost of each tree, medians of `rounds` rounds, trees alternating in every round. */
export async function measureStepCost(trees: { label: string; root: string }[], rounds = 9): Promise<Map<string, StepCost>> {
  const engines = trees.map((t) => new TreeEngine(t.label, t.root));
  try {
    for (const e of engines) {
      await e.start();
      // Warm-up: JIT, first-touch of KV and kernel buffers, the forward path of the child.
      await batch(e, 900, 32);
    }
    const runs = new Map<string, StepCost[]>(trees.map((t) => [t.label, []]));
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? engines : [...engines].reverse();
      for (const e of order) runs.get(e.label)!.push(await measureOnce(e, 10 + r * 1000));
    }
    const out = new Map<string, StepCost>();
    for (const [label, xs] of runs) {
      const m = (f: (c: StepCost) => number) => median(xs.map(f));
      out.set(label, {
        httpMs: m((c) => c.httpMs),
        forwardMs: m((c) => c.forwardMs),
        overheadInsideMs: m((c) => c.overheadInsideMs),
        directMs: m((c) => c.directMs),
        overheadDirectMs: m((c) => c.overheadDirectMs),
        overheadMs: m((c) => c.overheadMs),
        directCpuMs: m((c) => c.directCpuMs),
        httpCpuMs: m((c) => c.httpCpuMs),
        forwardCpuMs: m((c) => c.forwardCpuMs),
        overheadCpuMs: m((c) => c.overheadCpuMs),
      });
    }
    return out;
  } finally {
    for (const e of engines) await e.close();
  }
}

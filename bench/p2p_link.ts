// npm run bench -- p2p_link   (options: --rtt-ms, --tokens, --chunk-size, --fetches, --gap-ms, --rounds; --help)
// P2P fetches across a slow link, with and without connection reuse (docs/p2p.md "Connection
// reuse"). Two network namespaces (harness/netns.ts): a holder process with a prompt's chunks
// (the built-in model's layout, float16: 256 KiB per 256-token chunk) behind its peer port, and a
// fetcher process that pulls the whole prompt from it, as an engine that missed it would, with the
// engine's time bound (p2p_timeout_ms 1000 ms + bytes ÷ 16 MiB/s). The fetcher's link has half the
// round trip added each way by the TUN delay line (harness/delay_line.py; this kernel has no
// sch_netem). Each round runs both modes, order alternating: `fetches` fetches one after another
// (`gap-ms` between them) on a fresh client, with reuse off (a connection per fetch, as before)
// and on (the first fetch opens the connection, the later ones reuse it).
// Reported: tokens fetched within the bound per fetch (the rest the engine computes), first fetch
// and later fetches apart, per mode and round; a bar plot bench-results/p2p_link/p2p_link.svg.
// Needs root, iproute2, python3 and /dev/net/tun (the multi-host tests' requirements).
// Last line: {"bench":"p2p_link","rtt_ms":…,"tokens":…,"later_tokens_per_fetch":{"off":[…],"on":[…]},
//             "later_ratio_on_vs_off":[…],"first_tokens_per_fetch":{…},"later_ms":{…}}
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { dirname } from 'node:path';
import { Command, InvalidArgumentError, Option } from 'commander';
import { createHosts, impairUnavailable, type Hosts } from '../harness/netns.js';
import { resultsDir, writeBarsSvg, type BarRow } from './_plot.js';

const CHILD = join(dirname(fileURLToPath(import.meta.url)), '_p2p_link_child.js');
const PORT = 7950;

interface Opts {
  rttMs: number;
  tokens: number;
  chunkSize: number;
  fetches: number;
  gapMs: number;
  rounds: number;
}

const int = (min: number, max: number) => (v: string) => {
  if (!/^[0-9]+$/.test(v) || Number(v) < min || Number(v) > max) throw new InvalidArgumentError(`expected an integer from ${min} to ${max}, got "${v}"`);
  return Number(v);
};

function parseOptions(argv: string[]): Opts {
  return new Command('p2p_link')
    .description('P2P fetches across a slow link, with and without connection reuse')
    .addOption(new Option('--rtt-ms <ms>', 'round trip added between fetcher and holder').default(200).argParser(int(0, 5000)))
    .addOption(new Option('--tokens <n>', 'prompt tokens fetched').default(2048).argParser(int(1, 524_288)))
    .addOption(new Option('--chunk-size <n>', 'tokens per chunk').default(256).argParser(int(1, 65_536)))
    .addOption(new Option('--fetches <n>', 'fetches per mode and round').default(5).argParser(int(2, 100)))
    .addOption(new Option('--gap-ms <ms>', 'pause between fetches').default(1000).argParser(int(0, 60_000)))
    .addOption(new Option('--rounds <n>', 'rounds').default(3).argParser(int(1, 20)))
    .parse(argv, { from: 'user' })
    .opts<Opts>();
}

interface Fetch {
  chunks: number;
  of: number;
  ms: number;
  how: string;
  stale: number;
}

/** Runs `cmd` in `host` and resolves with its JSON stdout lines once it exits 0. */
function runIn(hosts: Hosts, host: string, args: string[], onLine?: (m: any, child: ChildProcess) => void): { child: ChildProcess; done: Promise<any[]> } {
  const child = hosts.spawnIn(host, process.execPath, [CHILD, ...args], { KVC_LOG_LEVEL: 'warn' });
  const out: any[] = [];
  let err = '';
  child.stderr!.on('data', (d: Buffer) => (err += d));
  createInterface({ input: child.stdout! }).on('line', (l) => {
    if (!l.startsWith('{')) return;
    const m = JSON.parse(l);
    out.push(m);
    onLine?.(m, child);
  });
  const done = new Promise<any[]>((resolve, reject) =>
    child.once('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`${host} ${args[0]} exited ${code}: ${err.trim().slice(-2000)}`)))),
  );
  return { child, done };
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

async function main(): Promise<void> {
  const o = parseOptions(process.argv.slice(2));
  const why = impairUnavailable();
  if (why) throw new Error(`p2p_link needs network namespaces and the delay line: ${why}`);
  const hosts = await createHosts(['holder', 'fetcher'], 83, { impairable: ['fetcher'] });
  let holder: ChildProcess | null = null;
  try {
    const url = `${hosts.addr.holder}:${PORT}`;
    const h = runIn(hosts, 'holder', ['holder', hosts.addr.holder!, String(PORT), String(o.tokens), String(o.chunkSize)]);
    holder = h.child;
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('the holder did not start within 60 s')), 60_000);
      h.child.stdout!.on('data', (d: Buffer) => String(d).includes('"ready"') && (clearTimeout(t), resolve()));
      h.done.catch((e) => (clearTimeout(t), reject(e)));
    });
    await hosts.impair('fetcher', { delayMs: o.rttMs / 2 });
    const chunks = Math.ceil(o.tokens / o.chunkSize);
    console.log(`P2P fetches across a ${o.rttMs} ms round trip: ${o.tokens}-token prompt, ${chunks} chunks of ${o.chunkSize} tokens (built-in model, float16), ${o.fetches} fetches a mode and round, ${o.gapMs} ms apart, ${o.rounds} rounds; bound = p2p_timeout_ms 1000 + bytes ÷ 16 MiB/s`);
    const first: Record<string, number[]> = { off: [], on: [] };
    const later: Record<string, number[]> = { off: [], on: [] };
    const laterMs: Record<string, number[]> = { off: [], on: [] };
    const tokensOf = (f: Fetch) => Math.min(o.tokens, f.chunks * o.chunkSize);
    for (let r = 0; r < o.rounds; r++) {
      for (const mode of r % 2 === 0 ? ['off', 'on'] : ['on', 'off']) {
        const fetches = (await runIn(hosts, 'fetcher', ['fetcher', url, String(o.tokens), String(o.chunkSize), String(o.fetches), String(o.gapMs), mode === 'on' ? '1' : '0']).done) as Fetch[];
        first[mode]!.push(tokensOf(fetches[0]!));
        later[mode]!.push(Math.round(mean(fetches.slice(1).map(tokensOf))));
        laterMs[mode]!.push(Math.round(mean(fetches.slice(1).map((f) => f.ms))));
        console.log(`  round ${r + 1} reuse ${mode.padEnd(3)}: ${fetches.map((f) => `${f.chunks}/${f.of} in ${f.ms} ms (${f.how}${f.stale ? `, ${f.stale} stale` : ''})`).join('; ')}`);
      }
    }
    // null where reuse off brought nothing (no ratio to take)
    const ratio = later.on!.map((x, i) => (later.off![i]! > 0 ? Number((x / later.off![i]!).toFixed(2)) : null));
    console.log(`  tokens fetched within the bound, first fetch: reuse off ${first.off!.join(', ')}; on ${first.on!.join(', ')} (of ${o.tokens})`);
    console.log(`  tokens fetched within the bound, later fetches (mean): reuse off ${later.off!.join(', ')}; on ${later.on!.join(', ')} (of ${o.tokens}); on ÷ off ${ratio.map((x) => x ?? 'n/a (off: 0)').join(', ')}`);
    console.log(`  time of a later fetch (mean ms): reuse off ${laterMs.off!.join(', ')}; on ${laterMs.on!.join(', ')}`);
    const rows: BarRow[] = [];
    for (const mode of ['off', 'on']) {
      rows.push({ panel: 'first fetch', series: `reuse ${mode}`, value: Math.round(mean(first[mode]!)) });
      rows.push({ panel: 'later fetches', series: `reuse ${mode}`, value: Math.round(mean(later[mode]!)) });
    }
    const svg = await writeBarsSvg(join(resultsDir('p2p_link'), 'p2p_link.svg'), `P2P tokens fetched within the bound at ${o.rttMs} ms RTT (${o.tokens}-token prompt)`, rows, 'tokens per fetch');
    console.log(`  plot: ${svg}`);
    console.log(JSON.stringify({ bench: 'p2p_link', rtt_ms: o.rttMs, tokens: o.tokens, gap_ms: o.gapMs, first_tokens_per_fetch: first, later_tokens_per_fetch: later, later_ratio_on_vs_off: ratio, later_ms: laterMs }));
  } finally {
    holder?.kill('SIGKILL');
    hosts.teardown();
  }
}

await main();

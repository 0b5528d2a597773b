// CPU placement of a local deployment (`kvc up --placement`): which cores each engine runs on,
// handed to every engine as `kvc engine --cpus LIST`, at which CPU priority prefillers run
// (`kvc engine --cpu-priority`), and where the proxy and the controller run (`--cpus` too).
//
//   split (default)  prefillers and decoders get disjoint parts of the machine's CPUs, in
//                    proportion to their counts (at least one CPU each): a long prompt being
//                    prefilled never takes a decoder's core. The proxy and the controller run on
//                    the prefillers' CPUs: the proxy relays every token of every stream and the
//                    controller indexes every stored chunk, and on a decoder's core each wake-up
//                    of theirs is a decode step that waits (measured in a burst of long prompts:
//                    the decoder's main thread waited ~1.5 s behind them in a 10 s span). On 2
//                    CPUs: prefillers, proxy and controller on CPU 0, decoders on CPU 1 (2P2D:
//                    both decoders share CPU 1). With one CPU, or with no prefillers
//                    (`--prefillers 0`: colocated kv_both engines), every process runs on every
//                    CPU.
//   decode-first     each decoder gets a CPU of its own (the last D CPUs) and the prefillers run
//                    on every CPU at idle priority (SCHED_IDLE): a decode step never waits behind
//                    prefill compute or another decoder's steps. Not the default: a prefiller at
//                    idle priority gets no CPU at all while normal-priority work fills the
//                    machine (its start-up and its prefills wait without bound), and short
//                    prompts' first tokens wait for the decoders' leftover time. Needs at least
//                    as many CPUs as decoders.
//   shared           no pinning: every process may run on every CPU.
//   prefill=LIST/decode=LIST
//                    explicit cpulists for each role (e.g. `prefill=0/decode=1`,
//                    `prefill=0-1/decode=2-3`); every engine of a role shares its list.
//                    With --prefillers 0 only `decode=LIST` is accepted. The proxy and the
//                    controller are not pinned (the user chose where the engines go).
//   (decode-first pins neither: every CPU runs an engine that must not wait.)
import { formatCpuList, machineCpus, validateCpuList } from '../common/cpu_set.js';

export type Placement = { kind: 'split' } | { kind: 'decode-first' } | { kind: 'shared' } | { kind: 'explicit'; prefill: string | null; decode: string };

/** The cpulist of the prefillers and of each decoder (null: not pinned), and the prefillers' priority. */
export interface RoleCpus {
  prefill: string | null;
  /** Decoder j's cpulist (colocated engines too); its length is the number of decoders. */
  decoders: (string | null)[];
  /** Prefillers run at idle priority (they share CPUs with decoders). */
  prefillIdle: boolean;
  /** The cpulist of the proxy and the controller (null: not pinned). */
  services: string | null;
}

const FLAG = '--placement';

/** Parses the flag's text; CPU lists are checked against `machine`. */
export function parsePlacement(text: string, machine: readonly number[] = machineCpus()): Placement {
  const s = text.trim();
  if (s === 'split') return { kind: 'split' };
  if (s === 'shared') return { kind: 'shared' };
  if (s === 'decode-first') return { kind: 'decode-first' };
  const parts = new Map<string, string>();
  for (const item of s.split('/')) {
    const m = /^(prefill|decode)=(.+)$/.exec(item.trim());
    if (!m) throw new Error(`${FLAG}: expected "split", "decode-first", "shared" or "prefill=LIST/decode=LIST" (e.g. "prefill=0/decode=1"), found "${text}"`);
    if (parts.has(m[1]!)) throw new Error(`${FLAG}: "${m[1]}=" is given twice in "${text}"`);
    parts.set(m[1]!, formatCpuList(validateCpuList(`${FLAG} ${m[1]}=${m[2]}`, m[2]!, machine)));
  }
  const decode = parts.get('decode');
  if (decode === undefined) throw new Error(`${FLAG}: "decode=LIST" is missing in "${text}"`);
  return { kind: 'explicit', prefill: parts.get('prefill') ?? null, decode };
}

/** The CPU lists of prefillers and decoders for `p` prefillers and `d` decoders. */
export function placeEngines(pl: Placement, p: number, d: number, machine: readonly number[] = machineCpus()): RoleCpus {
  const each = (list: string | null) => Array.from({ length: d }, () => list);
  if (pl.kind === 'shared') return { prefill: null, decoders: each(null), prefillIdle: false, services: null };
  if (pl.kind === 'explicit') {
    if (p === 0 && pl.prefill !== null) throw new Error(`${FLAG}: "prefill=${pl.prefill}" given with --prefillers 0 (there is no prefiller to place)`);
    if (p > 0 && pl.prefill === null) throw new Error(`${FLAG}: "prefill=LIST" is missing (the deployment has ${p} prefiller(s))`);
    return { prefill: pl.prefill, decoders: each(pl.decode), prefillIdle: false, services: null };
  }
  const cpus = [...machine].sort((a, b) => a - b);
  if (p === 0 || cpus.length < 2) return { prefill: null, decoders: each(null), prefillIdle: false, services: null };
  const nPrefill = Math.max(1, Math.min(cpus.length - 1, Math.round((cpus.length * p) / (p + d))));
  if (pl.kind === 'decode-first') {
    if (d > cpus.length) throw new Error(`${FLAG} decode-first: ${d} decoders need a CPU each, the machine has ${cpus.length}`);
    // A CPU each for the decoders (the last ones), the prefillers on every CPU, below any decoder.
    return { prefill: formatCpuList(cpus), decoders: cpus.slice(cpus.length - d).map((c) => formatCpuList([c])), prefillIdle: true, services: null };
  }
  const prefill = formatCpuList(cpus.slice(0, nPrefill));
  return { prefill, decoders: each(formatCpuList(cpus.slice(nPrefill))), prefillIdle: false, services: prefill };
}

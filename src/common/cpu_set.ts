// CPU sets: the cores an engine process may run on (`kvc engine --cpus`, `kvc up --placement`).
// A list uses the kernel's cpulist syntax (`0-1`, `1`, `0,2-3`), the same one taskset(1) and
// /sys/devices/system/cpu/online use, so what an operator types is what the kernel reports.
import { readFileSync } from 'node:fs';
import { cpus } from 'node:os';

/** Parses a cpulist (`0-3,6`) into sorted distinct CPU numbers; `what` names the flag in errors. */
export function parseCpuList(what: string, text: string): number[] {
  const s = text.trim();
  if (s === '') throw new Error(`${what}: expected a CPU list such as "0-1" or "1", found ""`);
  const out = new Set<number>();
  for (const part of s.split(',')) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part.trim());
    if (!m) throw new Error(`${what}: expected a CPU list such as "0-1" or "0,2", found "${text}" ("${part}" is not a CPU number or range)`);
    const a = Number(m[1]);
    const b = m[2] === undefined ? a : Number(m[2]);
    if (b < a) throw new Error(`${what}: range "${part}" in "${text}" runs backwards`);
    for (let c = a; c <= b; c++) out.add(c);
  }
  return [...out].sort((x, y) => x - y);
}

/** Formats CPU numbers back as a compact cpulist (`[0,1,2,5]` → `0-2,5`). */
export function formatCpuList(list: readonly number[]): string {
  const s = [...new Set(list)].sort((a, b) => a - b);
  const parts: string[] = [];
  for (let i = 0; i < s.length; ) {
    let j = i;
    while (j + 1 < s.length && s[j + 1] === s[j]! + 1) j++;
    parts.push(i === j ? `${s[i]}` : `${s[i]}-${s[j]}`);
    i = j + 1;
  }
  return parts.join(',');
}

/**
 * The machine's online CPUs: /sys/devices/system/cpu/online on Linux (it can have holes, e.g.
 * `0-3,6-7`), else 0..n-1 from os.cpus().
 */
export function machineCpus(): number[] {
  try {
    return parseCpuList('/sys/devices/system/cpu/online', readFileSync('/sys/devices/system/cpu/online', 'utf8'));
  } catch {
    return Array.from({ length: Math.max(1, cpus().length) }, (_, i) => i);
  }
}

/** Parses `text` and checks every CPU is one of `machine`; the error names the flag and the machine's CPUs. */
export function validateCpuList(what: string, text: string, machine: readonly number[] = machineCpus()): number[] {
  const list = parseCpuList(what, text);
  const known = new Set(machine);
  const unknown = list.filter((c) => !known.has(c));
  if (unknown.length) {
    throw new Error(
      `${what}: CPU ${formatCpuList(unknown)} ${unknown.length > 1 ? 'are' : 'is'} not on this machine (its CPUs are ${formatCpuList(machine)}), found "${text}"`,
    );
  }
  return list;
}

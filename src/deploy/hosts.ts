// The host list of a deployment over several machines (`kvc up --config-only --hosts ...`): which
// address each process is reached at. Given inline as `name=address` pairs separated by commas
// (`ctl=10.0.0.1,p0=10.0.0.2,d0=10.0.0.3`) or as a YAML file mapping the same names to addresses.
//
// Names: `controller` (or `ctl`), `proxy`, `prefiller-<i>` (or `p<i>`), `decoder-<j>` (or `d<j>`),
// and for a colocated deployment (--prefillers 0) `engine-<j>` (or `e<j>`). Every engine of the
// plan must be listed, and the controller when the deployment has one; the proxy runs on the
// controller's host unless `proxy` is listed. Several processes may share a host (their ports
// differ). An address is what the others use to reach that process (its --advertise-host), so
// it must be a host name or IP address, never 0.0.0.0.
import { existsSync, readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { checkAdvertiseHost } from '../common/address.js';

const FLAG = '--hosts';

/** The advertised address of every process of a multi-host plan. */
export interface HostAssignment {
  controller: string | null;
  proxy: string;
  /** By engine name (prefiller-0, decoder-0, engine-0, ...). */
  engines: Record<string, string>;
}

/** Raw `name → address` pairs from the flag's text (inline list or YAML file). */
export function parseHostList(text: string): Map<string, string> {
  const s = text.trim();
  const pairs = new Map<string, string>();
  const add = (name: string, addr: unknown, where: string) => {
    if (typeof addr !== 'string' && typeof addr !== 'number') throw new Error(`${FLAG}: ${where}: expected an address for "${name}", found ${JSON.stringify(addr)}`);
    if (pairs.has(name)) throw new Error(`${FLAG}: "${name}" is given twice`);
    pairs.set(name, String(addr).trim());
  };
  if (s.includes('=')) {
    for (const item of s.split(',')) {
      const m = /^\s*([^=\s]+)\s*=\s*(\S*)\s*$/.exec(item);
      if (!m || !m[2]) throw new Error(`${FLAG}: expected name=address pairs separated by commas (e.g. ctl=10.0.0.1,p0=10.0.0.2,d0=10.0.0.3), found "${item.trim()}"`);
      add(m[1]!, m[2], 'in the list');
    }
    return pairs;
  }
  if (!/\.ya?ml$/i.test(s)) throw new Error(`${FLAG}: expected name=address pairs (ctl=10.0.0.1,p0=10.0.0.2,d0=10.0.0.3) or a YAML file (*.yaml), found "${text}"`);
  if (!existsSync(s)) throw new Error(`${FLAG}: file "${s}" does not exist`);
  let doc: unknown;
  try {
    doc = parseYaml(readFileSync(s, 'utf8'));
  } catch (e) {
    throw new Error(`${FLAG}: ${s} is not valid YAML: ${(e as Error).message}`);
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) throw new Error(`${FLAG}: ${s}: expected a mapping of process names to addresses (controller: 10.0.0.1)`);
  for (const [k, v] of Object.entries(doc as Record<string, unknown>)) add(k, v, s);
  return pairs;
}

/** The canonical name of a host-list entry (`p0` → `prefiller-0`), or null when it is not a process name. */
function canonical(name: string): string | null {
  if (name === 'controller' || name === 'ctl') return 'controller';
  if (name === 'proxy') return 'proxy';
  const m = /^(prefiller-|p|decoder-|d|engine-|e)(\d+)$/.exec(name);
  if (!m) return null;
  const role = { 'prefiller-': 'prefiller', p: 'prefiller', 'decoder-': 'decoder', d: 'decoder', 'engine-': 'engine', e: 'engine' }[m[1]!]!;
  return `${role}-${Number(m[2])}`;
}

/**
 * Checks the list against the plan's processes (`engineNames`, with or without a controller)
 * and returns every process's address. Errors name the entry and what was expected.
 */
export function assignHosts(pairs: Map<string, string>, engineNames: readonly string[], withController: boolean): HostAssignment {
  const known = new Set<string>([...engineNames, 'proxy', ...(withController ? ['controller'] : [])]);
  const byName = new Map<string, string>();
  for (const [raw, addr] of pairs) {
    const name = canonical(raw);
    if (name === null || !known.has(name)) {
      const what = name === 'controller' ? 'the deployment has no controller (--no-controller)' : `the deployment's processes are ${[...known].join(', ')}`;
      throw new Error(`${FLAG}: unknown process "${raw}": ${what}`);
    }
    if (byName.has(name)) throw new Error(`${FLAG}: ${name} is given twice`);
    byName.set(name, checkAdvertiseHost(`${FLAG} ${raw}`, addr));
  }
  const missing = engineNames.filter((n) => !byName.has(n));
  if (withController && !byName.has('controller')) missing.unshift('controller');
  if (!withController && !byName.has('proxy')) missing.push('proxy');
  if (missing.length) throw new Error(`${FLAG}: no address for ${missing.join(', ')} (every engine${withController ? ' and the controller' : ' and the proxy'} must be listed)`);
  return {
    controller: withController ? byName.get('controller')! : null,
    proxy: byName.get('proxy') ?? byName.get('controller')!,
    engines: Object.fromEntries(engineNames.map((n) => [n, byName.get(n)!])),
  };
}

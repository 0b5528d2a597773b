// Turns the proxy's comma-list flags into concrete backend addresses.
//
// The flags follow these pairing rules so that the same command line works for one machine
// and for many:
//   one host  + one port   + --num N  → N consecutive ports on that host (7100, 7101, …)
//   one host  + many ports            → that host with each port
//   many hosts + one port             → each host with that same port
//   many hosts + many ports (same count) → paired one to one
// A count given with --num-* must agree with the lists; anything else is an error that
// names the flags, because a silently wrong topology sends KV to the wrong decoder.

import { parseNumber, parsePort as parsePortValue } from '../common/parse_value.js';

export class TopologyError extends Error {
  override name = 'TopologyError';
}

export interface Endpoint {
  host: string;
  port: number;
}

export interface DecoderEndpoint extends Endpoint {
  /** The decoder's xfer receiver ports (init: handshake and chunk data, alloc: buffer reservations), on its host. */
  initPort: number;
  allocPort: number;
}

export function splitList(value: string, flag: string): string[] {
  const items = value.split(',').map((s) => s.trim());
  if (items.some((s) => s === '')) throw new TopologyError(`${flag}: empty item in "${value}"`);
  return items;
}

/** One port of a comma list. */
export function parsePort(s: string, flag: string): number {
  try {
    return parsePortValue(flag, s);
  } catch (e) {
    throw new TopologyError((e as Error).message);
  }
}

function parseCount(n: string | number | undefined, flag: string): number | undefined {
  if (n === undefined) return undefined;
  try {
    return parseNumber(flag, String(n), { integer: true, min: 1, max: 1024 });
  } catch (e) {
    throw new TopologyError((e as Error).message);
  }
}

/**
 * Pairs hosts with ports. `ports` is a list of numbers: a single port plus a count expands
 * to consecutive ports; a single port with many hosts is shared.
 */
export function pairEndpoints(
  hostsArg: string,
  portsArg: string,
  countArg: string | number | undefined,
  flags: { host: string; port: string; num: string },
): Endpoint[] {
  const hosts = splitList(hostsArg, flags.host);
  const ports = splitList(portsArg, flags.port).map((p) => parsePort(p, flags.port));
  const count = parseCount(countArg, flags.num);
  let out: Endpoint[];
  if (hosts.length === 1 && ports.length === 1) {
    const n = count ?? 1;
    if (ports[0]! + n - 1 > 65535) throw new TopologyError(`${flags.port}: ${n} consecutive ports from ${ports[0]} exceed 65535`);
    out = Array.from({ length: n }, (_, i) => ({ host: hosts[0]!, port: ports[0]! + i }));
  } else if (hosts.length === 1) {
    out = ports.map((port) => ({ host: hosts[0]!, port }));
  } else if (ports.length === 1) {
    out = hosts.map((host) => ({ host, port: ports[0]! }));
  } else if (hosts.length === ports.length) {
    out = hosts.map((host, i) => ({ host, port: ports[i]! }));
  } else {
    throw new TopologyError(
      `${flags.host} lists ${hosts.length} hosts and ${flags.port} lists ${ports.length} ports; ` +
        `give one host, one port, or the same number of each`,
    );
  }
  if (count !== undefined && count !== out.length) {
    throw new TopologyError(`${flags.num} is ${count} but ${flags.host}/${flags.port} describe ${out.length} backends`);
  }
  const seen = new Set<string>();
  for (const e of out) {
    const k = `${e.host}:${e.port}`;
    if (seen.has(k)) throw new TopologyError(`${flags.host}/${flags.port}: ${k} is listed twice`);
    seen.add(k);
  }
  return out;
}

/**
 * One port per decoder, by the same rule as --decoder-port: a single value is shared by
 * decoders on distinct hosts and expands to consecutive ports for decoders sharing a host
 * (the k-th decoder on a host gets value + k); a list gives one port per decoder.
 */
export function perDecoderPorts(arg: string, decoders: Endpoint[], flag: string): number[] {
  const ports = splitList(arg, flag).map((p) => parsePort(p, flag));
  if (ports.length === 1) {
    const onHost = new Map<string, number>();
    return decoders.map((d) => {
      const k = onHost.get(d.host) ?? 0;
      onHost.set(d.host, k + 1);
      if (ports[0]! + k > 65535) throw new TopologyError(`${flag}: ${k + 1} consecutive ports from ${ports[0]} on ${d.host} exceed 65535`);
      return ports[0]! + k;
    });
  }
  if (ports.length !== decoders.length) throw new TopologyError(`${flag} lists ${ports.length} ports for ${decoders.length} decoders`);
  return ports;
}

export interface TopologyArgs {
  prefillerHost: string;
  prefillerPort: string;
  numPrefillers?: string | number;
  decoderHost: string;
  decoderPort: string;
  numDecoders?: string | number;
  decoderInitPort: string;
  decoderAllocPort: string;
}

export interface Topology {
  prefillers: Endpoint[];
  decoders: DecoderEndpoint[];
}

export function parseTopology(a: TopologyArgs): Topology {
  // --num-prefillers 0: a colocated deployment (kv_both engines that prefill their own requests);
  // the proxy only balances requests over the decoders and the prefiller flags are not used.
  const noPrefillers = a.numPrefillers !== undefined && String(a.numPrefillers).trim() === '0';
  const prefillers = noPrefillers
    ? []
    : pairEndpoints(a.prefillerHost, a.prefillerPort, a.numPrefillers, {
        host: '--prefiller-host',
        port: '--prefiller-port',
        num: '--num-prefillers',
      });
  const dec = pairEndpoints(a.decoderHost, a.decoderPort, a.numDecoders, {
    host: '--decoder-host',
    port: '--decoder-port',
    num: '--num-decoders',
  });
  const init = perDecoderPorts(a.decoderInitPort, dec, '--decoder-init-port');
  const alloc = perDecoderPorts(a.decoderAllocPort, dec, '--decoder-alloc-port');
  const decoders = dec.map((d, i) => ({ ...d, initPort: init[i]!, allocPort: alloc[i]! }));
  // Every decoder port (HTTP, xfer init, xfer alloc) must be distinct on its host.
  const used = new Map<string, string>();
  for (const d of decoders) {
    for (const [what, port] of [['HTTP', d.port], ['--decoder-init-port', d.initPort], ['--decoder-alloc-port', d.allocPort]] as const) {
      const k = `${d.host}:${port}`;
      const prev = used.get(k);
      if (prev) throw new TopologyError(`decoder ${d.host}:${d.port}: ${what} ${k} is already used as ${prev}`);
      used.set(k, `${what} of decoder ${d.host}:${d.port}`);
    }
  }
  return { prefillers, decoders };
}

// Bind and advertised addresses of a listening process (docs/deploy.md). `--host` is what a
// process binds; `--advertise-host` is what it registers and hands out to others (the controller's
// registry, a move's target, the commands `kvc up --config-only` prints). By default a process
// advertises its bind address, or the machine's hostname when it binds every interface (0.0.0.0
// or ::), since a wildcard address means nothing to a peer on another machine.
import { hostname } from 'node:os';
import { isIP } from 'node:net';

/** Addresses that bind every interface: never something another process can connect to. */
const WILDCARDS = new Set(['0.0.0.0', '::', '[::]', '0:0:0:0:0:0:0:0']);

export function isWildcardHost(host: string): boolean {
  return WILDCARDS.has(host.trim());
}

/** RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens. */
const LABEL = /^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/;

/** Null when `v` is an IP address or a host name, else what is wrong with it. */
function hostProblem(v: string): string | null {
  if (v.length === 0) return 'it is empty';
  const bare = v.startsWith('[') && v.endsWith(']') ? v.slice(1, -1) : v;
  if (isIP(bare)) return null;
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(v)) return 'give the host alone, without a scheme';
  if (/:\d+$/.test(v)) return 'give the host alone, without a port';
  if (v.length > 253) return 'a host name has at most 253 characters';
  const labels = v.replace(/\.$/, '').split('.');
  if (labels.some((l) => !LABEL.test(l))) return 'a host name is made of letters, digits, hyphens and dots';
  // All-numeric dotted names that are not valid IPv4 addresses (e.g. 10.0.0.256) are typos.
  if (labels.every((l) => /^\d+$/.test(l))) return 'not a valid IPv4 address';
  return null;
}

/** Checks a bind address (`--host`): an IP address (wildcards allowed) or a host name. */
export function checkBindHost(flag: string, v: string): string {
  const p = hostProblem(v.trim());
  if (p) throw new Error(`${flag}: expected an IP address or host name to listen on (0.0.0.0: every interface), found ${JSON.stringify(v)}: ${p}`);
  return v.trim();
}

/**
 * Checks an advertised address: an IP address or host name that other processes can connect
 * to, so never a wildcard.
 */
export function checkAdvertiseHost(flag: string, v: string): string {
  const s = v.trim();
  const p = hostProblem(s);
  if (p) throw new Error(`${flag}: expected the IP address or host name other processes reach this one at, found ${JSON.stringify(v)}: ${p}`);
  if (isWildcardHost(s)) throw new Error(`${flag}: ${s} binds every interface and cannot be reached by a peer; give this machine's address or name`);
  return s;
}

/** The advertised address: the flag when given (checked), else the bind address or, for a wildcard, this machine's hostname. */
export function resolveAdvertiseHost(flag: string, advertise: string | undefined | null, bindHost: string): string {
  if (advertise !== undefined && advertise !== null) return checkAdvertiseHost(flag, advertise);
  return isWildcardHost(bindHost) ? hostname() : bindHost;
}

/** A host as it appears in a URL or host:port (IPv6 in brackets). */
export function urlHost(host: string): string {
  return host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
}

/**
 * The addresses of a cache instance's worker and peer ports (src/kvc/controller_client.ts).
 * They bind the host of distributed_url (the engine's --host without one). They are
 * advertised as: the cache YAML's advertise_host; else the engine's --advertise-host when it was
 * given; else the bind address, or for a wildcard bind the engine's advertised address.
 */
export function instanceAddresses(
  cfg: { distributed_url: string | null; advertise_host?: string | null },
  engine: { bindHost: string; advertiseHost: string; advertiseExplicit: boolean },
): { bindHost: string; advertiseHost: string } {
  const bindHost = cfg.distributed_url ? cfg.distributed_url.slice(0, cfg.distributed_url.lastIndexOf(':')).replace(/^\[|\]$/g, '') : engine.bindHost;
  const advertiseHost = cfg.advertise_host ?? (engine.advertiseExplicit ? engine.advertiseHost : isWildcardHost(bindHost) ? engine.advertiseHost : bindHost);
  return { bindHost, advertiseHost };
}

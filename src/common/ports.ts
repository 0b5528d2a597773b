// Port helpers for tests and for `kvc up`'s "ports already taken" check.
import { readFileSync } from 'node:fs';
import net from 'node:net';

/**
 * The first port of the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range; 32768,
 * Linux's default, elsewhere). Outgoing connections take their local port from that range, so a
 * port found free there can be taken by any process's next connection before a server binds it
 * (seen as EADDRINUSE in full test runs). Ports picked for servers stay below it.
 */
export function ephemeralPortLow(): number {
  try {
    const lo = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    if (Number.isInteger(lo) && lo > 1024) return lo;
  } catch {
    // not Linux: the usual default below
  }
  return 32768;
}

/** True when nothing listens on host:port (we can bind it ourselves). */
export function isPortFree(port: number, host = '127.0.0.1'): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, host, () => srv.close(() => resolve(true)));
  });
}

/**
 * Finds `count` consecutive free ports starting at a random base in [lo, hi); by default from
 * 20000 up to the ephemeral range (ephemeralPortLow), so no outgoing connection can take them.
 * Tests use this so that runs never collide with each other or with a live deployment.
 */
export async function freePortRange(count: number, lo = 20000, hi = ephemeralPortLow()): Promise<number> {
  if (hi - lo <= count) throw new Error(`freePortRange: [${lo}, ${hi}) cannot hold ${count} consecutive ports`);
  for (let attempt = 0; attempt < 200; attempt++) {
    const base = lo + Math.floor(Math.random() * (hi - lo - count));
    let ok = true;
    for (let i = 0; i < count && ok; i++) ok = await isPortFree(base + i);
    if (ok) return base;
  }
  throw new Error(`no ${count} consecutive free ports found in [${lo}, ${hi})`);
}

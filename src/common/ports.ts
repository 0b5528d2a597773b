// Port helpers for tests and for `kvc up`'s "ports already taken" check.
import net from 'node:net';

/** True when nothing listens on host:port (we can bind it ourselves). */
export function isPortFree(port: number, host = '127.0.0.1'): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, host, () => srv.close(() => resolve(true)));
  });
}

/**
 * Finds `count` consecutive free ports starting at a random base in [lo, hi).
 * Tests use this so that runs never collide with each other or with a live deployment.
 */
export async function freePortRange(count: number, lo = 20000, hi = 60000): Promise<number> {
  for (let attempt = 0; attempt < 200; attempt++) {
    const base = lo + Math.floor(Math.random() * (hi - lo - count));
    let ok = true;
    for (let i = 0; i < count && ok; i++) ok = await isPortFree(base + i);
    if (ok) return base;
  }
  throw new Error(`no ${count} consecutive free ports found in [${lo}, ${hi})`);
}

// Child process of `npm run bench -- engine` for the per-step HTTP cost: serves ONE engine tree
// (this repository's, or another built checkout given by its root, e.g. the tree before a change)
// and times that engine's model forward in process while it serves, so the bench can subtract
// the forward's own time from the HTTP step time of the same run, tree by tree.
//
// The engine's model object is what its scheduler calls (`model.forward`), in both trees; the
// child wraps that method to add up wall and process CPU time spent inside it. Process CPU
// outside the forward is the main thread's (scheduling, sampling, detokenizing, SSE, socket
// writes, GC) plus what the kernel's second thread burns there: it spins briefly after its last
// job before it sleeps in Atomics.wait (gemm_ctl.ts SPIN_MS), a real cost of the step.
//
// Messages (IPC): {cmd:'start', root} → {url}; {cmd:'stats'} → {cpu, fwdCpu, fwdWall, forwards}
// (µs, µs, ms, calls so far); {cmd:'close'} → exits. The engine runs without a connector.
import { pathToFileURL } from 'node:url';
import { join } from 'node:path';

/** The part of an engine (of either tree) the child touches. */
interface ChildEngine {
  url: string;
  model: { forward(...a: unknown[]): unknown };
  close(): Promise<void>;
}
type Msg = { cmd: 'start'; root: string } | { cmd: 'stats' } | { cmd: 'close' };

let engine: ChildEngine | null = null;
const cpuMicros = () => {
  const u = process.cpuUsage();
  return u.user + u.system;
};
const inside = { cpu: 0, wall: 0, calls: 0 };
const send = (m: unknown) => process.send!(m);

process.on('message', (m: Msg) => {
  void (async () => {
    try {
      if (m.cmd === 'start') {
        const mod = (await import(pathToFileURL(join(m.root, 'dist/src/engine/server.js')).href)) as { startEngine(o: Record<string, unknown>): Promise<ChildEngine> };
        // Only options both trees know (an older tree has no logRequests/logStats; stdout is dropped).
        const e = await mod.startEngine({ model: 'builtin:tiny', maxNumSeqs: 8, maxNumBatchedTokens: 512, host: '127.0.0.1', port: 0 });
        const forward = e.model.forward.bind(e.model);
        e.model.forward = (...a: unknown[]) => {
          const c0 = cpuMicros();
          const t0 = performance.now();
          try {
            return forward(...a);
          } finally {
            inside.wall += performance.now() - t0;
            inside.cpu += cpuMicros() - c0;
            inside.calls++;
          }
        };
        engine = e;
        send({ url: e.url });
      } else if (m.cmd === 'stats') {
        send({ cpu: cpuMicros(), fwdCpu: inside.cpu, fwdWall: inside.wall, forwards: inside.calls });
      } else {
        await engine?.close();
        process.exit(0);
      }
    } catch (e) {
      send({ error: (e as Error).stack ?? String(e) });
    }
  })();
});

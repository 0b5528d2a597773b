// The worker thread of EncodeThread (tokenize_thread.ts): its own Tokenizer built from the same
// tokenizer.json and tokenizer_config.json objects, encoding texts the engine's main thread sends.
// It lowers its own thread's priority (on Linux the nice value is per thread), so on a CPU it
// shares with the scheduler's thread the decode steps keep the CPU and tokenizing fills the rest.
import { setPriority } from 'node:os';
import { parentPort, workerData } from 'node:worker_threads';
import { Tokenizer } from './tokenizer.js';

const data = workerData as { tj: Record<string, unknown>; cfg: Record<string, unknown>; source: string; nice: number };
const tok = Tokenizer.fromJson(data.tj, data.cfg, data.source);
try {
  setPriority(data.nice);
} catch {
  /* not permitted here: the thread runs at the process's priority */
}
parentPort!.on('message', (m: { id: number; text: string; addBos: boolean }) => {
  try {
    const ids = Int32Array.from(tok.encode(m.text, { addBos: m.addBos }));
    parentPort!.postMessage({ id: m.id, ids }, [ids.buffer]);
  } catch (e) {
    parentPort!.postMessage({ id: m.id, error: (e as Error).message });
  }
});

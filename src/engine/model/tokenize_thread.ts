// Tokenizing a long text prompt off the engine's main thread. The tokenizer library's BPE takes
// about 25 µs of CPU per token (a 3,000-token prompt of the built-in model's Llama-2 vocabulary:
// 75–100 ms, 200 ms the first time), and on the main thread that is a block every decoding
// sequence waits for: one long text prompt arriving at a decoder stalled its streams for ~10
// decode steps. EncodeThread keeps a worker thread with its own copy of the tokenizer, started
// with the engine (so its start, and the copy of the tokenizer's JSON, happen before serving) and
// at a lower CPU priority than the scheduler's thread (WORKER_NICE): while sequences decode, the
// text's tokenization takes the CPU the decode steps leave, and the request waits for it, not the
// streams. The ids are the same as the main thread's (the same Tokenizer code on the same JSON).

/** Texts shorter than this are encoded inline: ~5 ms at most, less than a worker round trip costs in queueing. */
export const OFF_THREAD_MIN_CHARS = 1024;
/**
 * The worker thread's nice value. At 10 its CPU weight is about a tenth of the scheduler thread's
 * (nice 0): on a decoder's own CPU, decode steps slow by ~10 % while a long prompt is tokenized,
 * and that prompt's first token comes later by up to ~10 × its tokenizing time.
 */
export const WORKER_NICE = 10;

export interface TokenizerOrigin {
  tj: Record<string, unknown>;
  cfg: Record<string, unknown>;
  source: string;
}

type Pending = { resolve: (ids: number[]) => void; reject: (e: Error) => void };

export class EncodeThread {
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private worker: import('node:worker_threads').Worker | null = null;
  /** Texts the worker has encoded so far. */
  encoded = 0;

  private constructor(private readonly origin: TokenizerOrigin) {}

  /** Starts the worker and waits until its tokenizer is built (a failure there rejects). */
  static async start(origin: TokenizerOrigin): Promise<EncodeThread> {
    const t = new EncodeThread(origin);
    await t.spawn();
    try {
      // A first round trip: the worker has built its tokenizer and answers.
      await t.encode('warm', false);
    } catch (e) {
      await t.close();
      throw e;
    }
    return t;
  }

  private async spawn(): Promise<void> {
    const { Worker } = await import('node:worker_threads');
    const w = new Worker(new URL('./tokenize_worker.js', import.meta.url), { workerData: { ...this.origin, nice: WORKER_NICE } });
    w.unref();
    w.on('message', (m: { id: number; ids?: Int32Array; error?: string }) => {
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      if (m.ids) {
        this.encoded++;
        p.resolve(Array.from(m.ids));
      }
      else p.reject(new Error(m.error ?? 'tokenizer worker failed'));
    });
    const gone = (why: string) => {
      if (this.worker !== w) return;
      this.worker = null;
      for (const p of this.pending.values()) p.reject(new Error(why));
      this.pending.clear();
    };
    w.on('error', (e) => gone(`tokenizer worker failed: ${e.message}`));
    w.on('exit', (code) => gone(`tokenizer worker exited (code ${code})`));
    this.worker = w;
  }

  /** Ids of `text` (BOS first when `addBos`), computed on the worker; rejects if the worker is gone. */
  encode(text: string, addBos: boolean): Promise<number[]> {
    const w = this.worker;
    if (!w) return Promise.reject(new Error('tokenizer worker is not running'));
    const id = this.nextId++;
    return new Promise<number[]>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      w.postMessage({ id, text, addBos });
    });
  }

  async close(): Promise<void> {
    const w = this.worker;
    this.worker = null;
    for (const p of this.pending.values()) p.reject(new Error('tokenizer worker stopped'));
    this.pending.clear();
    if (w) await w.terminate();
  }
}

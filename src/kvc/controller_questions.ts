// Questions a cache instance asks the controller over its monitor connection (P2P holders, miss
// reasons), each awaiting its answer by id. A question settles exactly once: by its answer, by its
// time bound, by a send that failed, or when the connection is lost or closed. An answer that
// comes after its question settled, or that answers another kind of question, is dropped.

/** What a schema's safeParse returns (zod's shape), so this module needs no schema of its own. */
export type Parsed<T> = { success: true; data: T } | { success: false; error: { issues: readonly { message: string }[] } };

interface Waiting {
  /** The answer message's type (`p2p_holders`, `miss_reasons`). */
  answerType: string;
  settle(answer: Parsed<unknown>): void;
  reject(e: Error): void;
  timer: NodeJS.Timeout;
}

export class ControllerQuestions {
  private readonly waiting = new Map<number, Waiting>();
  private nextId = 1;

  /**
   * Sends a question (`send(id)`) and resolves with `accept` of the answer's parsed message of
   * type `answerType`; `accept` may throw to reject an answer that does not fit the question.
   * `what` names the question in the error when it cannot be sent.
   */
  ask<A, T>(what: string, answerType: string, timeoutMs: number, send: (id: number) => Promise<unknown>, accept: (answer: A) => T): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        reject(new Error(`no answer from the controller within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiting.set(id, {
        answerType,
        timer,
        reject,
        settle: (r) => {
          if (!r.success) return reject(new Error(`malformed ${answerType} answer: ${r.error.issues[0]?.message ?? 'invalid'}`));
          try {
            resolve(accept(r.data as A));
          } catch (e) {
            reject(e as Error);
          }
        },
      });
      send(id).catch((e: unknown) => {
        if (!this.take(id)) return;
        reject(new Error(`${what} not sent: ${(e as Error).message}`));
      });
    });
  }

  /** The answer message `m` of type `answerType`, parsed by `parse` (its schema's safeParse). */
  answer(answerType: string, m: { id?: unknown }, parse: (m: unknown) => Parsed<unknown>): void {
    if (typeof m.id !== 'number' || this.waiting.get(m.id)?.answerType !== answerType) return; // settled already
    this.take(m.id)!.settle(parse(m));
  }

  /** Rejects every question still waiting (the connection was lost or is closing). */
  failAll(why: string): void {
    for (const id of [...this.waiting.keys()]) this.take(id)!.reject(new Error(why));
  }

  /** Removes question `id` and stops its time bound; undefined when it has settled already. */
  private take(id: number): Waiting | undefined {
    const w = this.waiting.get(id);
    if (!w) return undefined;
    this.waiting.delete(id);
    clearTimeout(w.timer);
    return w;
  }
}

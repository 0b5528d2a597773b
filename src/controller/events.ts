// Event records of asynchronous controller operations (move, copy, pin, unpin, clear):
// pending → running → finished | failed. Finished and failed events are kept in a bounded
// history (oldest completed dropped first); pending/running ones are never dropped.
import { randomUUID } from 'node:crypto';

export type EventStatus = 'pending' | 'running' | 'finished' | 'failed';
export type EventKind = 'move' | 'copy' | 'pin' | 'unpin' | 'clear' | 'compress' | 'decompress';

export interface EventRecord {
  event_id: string;
  kind: EventKind;
  status: EventStatus;
  num_tokens: number;
  /** Chunks the operation acts on (scheduled); `done_chunks` how many completed. */
  num_chunks: number;
  done_chunks: number;
  error: string | null;
  /** What was asked, echoed for the reader of GET /events/{id}. */
  request: Record<string, unknown>;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
  duration_ms: number | null;
}

export class EventLog {
  private readonly events = new Map<string, EventRecord>();
  private readonly completed: string[] = [];
  private readonly t0 = new Map<string, number>();
  readonly counts: Record<EventStatus, number> = { pending: 0, running: 0, finished: 0, failed: 0 };
  /** Told of every completion (finished or failed), after the record is final: the metrics observe it. */
  onComplete: ((ev: EventRecord) => void) | null = null;

  constructor(private readonly maxHistory = 10_000) {}

  create(kind: EventKind, num_tokens: number, num_chunks: number, request: Record<string, unknown>): EventRecord {
    const ev: EventRecord = {
      event_id: `${kind}-${randomUUID()}`,
      kind,
      status: 'pending',
      num_tokens,
      num_chunks,
      done_chunks: 0,
      error: null,
      request,
      created_at: new Date().toISOString(),
      started_at: null,
      finished_at: null,
      duration_ms: null,
    };
    this.events.set(ev.event_id, ev);
    this.t0.set(ev.event_id, performance.now());
    this.counts.pending++;
    return ev;
  }

  get(id: string): EventRecord | undefined {
    return this.events.get(id);
  }

  /** The `limit` most recently created events still kept, newest first (for the dashboard). */
  recent(limit: number): EventRecord[] {
    const out: EventRecord[] = [];
    // A Map iterates in insertion (= creation) order; walking it whole is bounded by the history.
    for (const ev of this.events.values()) {
      out.push(ev);
      if (out.length > limit) out.shift();
    }
    return out.reverse();
  }

  start(ev: EventRecord): void {
    if (ev.status !== 'pending') return;
    this.counts.pending--;
    this.counts.running++;
    ev.status = 'running';
    ev.started_at = new Date().toISOString();
  }

  finish(ev: EventRecord, done_chunks: number): void {
    this.complete(ev, 'finished', null, done_chunks);
  }

  fail(ev: EventRecord, error: string): void {
    this.complete(ev, 'failed', error);
  }

  private complete(ev: EventRecord, status: 'finished' | 'failed', error: string | null, doneChunks?: number): void {
    if (ev.status === 'finished' || ev.status === 'failed') return;
    if (doneChunks !== undefined) ev.done_chunks = doneChunks;
    this.counts[ev.status]--;
    this.counts[status]++;
    ev.status = status;
    ev.error = error;
    ev.started_at ??= new Date().toISOString();
    ev.finished_at = new Date().toISOString();
    const t = this.t0.get(ev.event_id);
    ev.duration_ms = t === undefined ? null : Math.round((performance.now() - t) * 1000) / 1000;
    this.t0.delete(ev.event_id);
    this.completed.push(ev.event_id);
    while (this.completed.length > this.maxHistory) this.events.delete(this.completed.shift()!);
    this.onComplete?.(ev);
  }
}

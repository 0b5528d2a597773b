// RemoteTier: the shared third tier of a cache instance, on a Redis or Valkey server
// (`remote_url`). Several engines, on one host or many, point at the same server, so a prefix
// computed by any of them is a hit for all.
//
// Rules, and why:
//  - Writes never make a request wait: put() copies the chunk into a bounded queue (a byte
//    budget, recycled buffers) and returns; a background pump keeps a few SETs in flight. When
//    the queue is full or the server is unreachable the chunk is dropped and counted: the local
//    tiers still hold it, the remote tier is a cache.
//  - Reads are bounded: every command has a timeout (remote_timeout_ms); after a failed or timed
//    out read the tier is skipped for a short pause, so a slow server costs one timeout, not
//    one per chunk per request. While the client is not connected, reads are skipped at once.
//  - Every chunk read is verified (checksum, length, header key == the key asked for) before it
//    is used; a corrupt value is deleted from the server and counted, never served.
//  - The client reconnects by itself (backoff capped at 2 s); each reconnect is counted.
// Keys on the server: `kvc:<model_id>:<16-hex chunk key>`.
import { Redis } from 'ioredis';
import { verifyChunk } from '../common/chunk.js';
import { BufferPool } from '../common/buffer_pool.js';
import type { ChunkKey } from '../common/keys.js';
import { logger } from '../common/log.js';
import type { RemoteEndpoint } from '../common/remote_url.js';

const log = logger('kvc.remote');

/** Reads are skipped for this long after a read failed or timed out. */
const SUSPEND_AFTER_ERROR_MS = 1_000;
/** SETs in flight at once (pipelined on the one connection). */
const MAX_INFLIGHT_SETS = 4;
/** Idle write buffers kept for reuse once the queue drains (twice what is in flight at once). */
const IDLE_QUEUE_BUFFERS = 2 * MAX_INFLIGHT_SETS;
/** GETs in flight at once while reading a prefix. */
const MAX_INFLIGHT_GETS = 4;
/** Keys remembered as present on the server, so a chunk read from there is not written back. */
const KNOWN_KEYS = 1 << 16;
/** Connection errors are logged at most this often (a down server would otherwise flood the log). */
const ERROR_LOG_INTERVAL_MS = 10_000;

export interface RemoteTierOptions {
  endpoint: RemoteEndpoint;
  modelId: string;
  /** Per-command timeout in ms (remote_timeout_ms). */
  timeoutMs: number;
  /** Byte budget of the write queue (remote_write_queue_size). */
  queueBytes: number;
}

export interface RemoteStats {
  url: string;
  connected: boolean;
  /** Chunks handed to put(), by what happened to them. */
  putsQueued: number;
  putsWritten: number;
  putBytes: number;
  putsDroppedQueueFull: number;
  putsDroppedUnavailable: number;
  putsSkippedKnown: number;
  putErrors: number;
  /** Reads sent to the server and their outcome. */
  gets: number;
  hits: number;
  misses: number;
  getErrors: number;
  corrupt: number;
  getBytes: number;
  /** Reads not sent because the server was unreachable or the tier paused after an error. */
  getsSkipped: number;
  reconnects: number;
  connectionErrors: number;
  queueBytes: number;
  queueChunks: number;
}

export type EnqueueResult = 'queued' | 'known' | 'dropped';

interface Pending {
  key: ChunkKey;
  buf: Uint8Array;
  length: number;
}

export class RemoteTier {
  readonly endpoint: RemoteEndpoint;
  private readonly client: Redis;
  private readonly prefix: string;
  private readonly pool: BufferPool;
  private readonly queue: Pending[] = [];
  private readonly pending = new Set<ChunkKey>();
  private readonly known = new Map<ChunkKey, true>();
  private inflight = 0;
  private suspendedUntil = 0;
  private everReady = false;
  private closed = false;
  private lastErrorLog = 0;
  private errorsSinceLog = 0;
  private idleWaiters: (() => void)[] = [];
  private readonly s: Omit<RemoteStats, 'url' | 'connected' | 'queueBytes' | 'queueChunks'> = {
    putsQueued: 0,
    putsWritten: 0,
    putBytes: 0,
    putsDroppedQueueFull: 0,
    putsDroppedUnavailable: 0,
    putsSkippedKnown: 0,
    putErrors: 0,
    gets: 0,
    hits: 0,
    misses: 0,
    getErrors: 0,
    corrupt: 0,
    getBytes: 0,
    getsSkipped: 0,
    reconnects: 0,
    connectionErrors: 0,
  };

  constructor(private readonly o: RemoteTierOptions) {
    this.endpoint = o.endpoint;
    this.prefix = `kvc:${o.modelId}:`;
    this.pool = new BufferPool(o.queueBytes);
    const ep = o.endpoint;
    this.client = new Redis({
      host: ep.host,
      port: ep.port,
      username: ep.username,
      password: ep.password,
      db: ep.db,
      tls: ep.tls ? { servername: ep.host } : undefined,
      connectionName: 'kvc',
      lazyConnect: true,
      commandTimeout: o.timeoutMs,
      connectTimeout: Math.max(1_000, o.timeoutMs),
      // Fail fast instead of queueing while disconnected: a request must not wait for a reconnect.
      enableOfflineQueue: false,
      autoResendUnfulfilledCommands: false,
      maxRetriesPerRequest: 0,
      retryStrategy: (times) => Math.min(100 * 2 ** Math.min(times, 5), 2_000),
    });
    this.client.on('error', (e: Error) => {
      this.s.connectionErrors++;
      this.logError(`remote tier ${ep.display}: ${e.message}`);
    });
    this.client.on('ready', () => {
      if (this.everReady) {
        this.s.reconnects++;
        // The server may have restarted empty (no persistence): forget what we believed it holds.
        this.forgetKnown();
        log.info(`remote tier ${ep.display}: reconnected`);
      }
      this.everReady = true;
      this.suspendedUntil = 0;
    });
  }

  /**
   * Connects, waiting at most `waitMs`. An unreachable server is not an error: the instance
   * serves from its local tiers and the client keeps retrying in the background.
   */
  async start(waitMs = Math.max(2_000, this.o.timeoutMs)): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    const ok = await Promise.race([
      this.client.connect().then(
        () => true,
        () => false,
      ),
      new Promise<boolean>((r) => (timer = setTimeout(() => r(false), waitMs))),
    ]);
    clearTimeout(timer);
    if (ok) log.info(`remote tier ${this.endpoint.display}: connected (keys ${this.prefix}<chunk key>)`);
    else log.warn(`remote tier ${this.endpoint.display}: not reachable yet; serving from the local tiers and retrying in the background`);
    return ok;
  }

  /** The key a chunk has on the server. */
  remoteKey(key: ChunkKey): string {
    return this.prefix + key;
  }

  get connected(): boolean {
    return this.client.status === 'ready';
  }

  private available(): boolean {
    return !this.closed && this.client.status === 'ready' && Date.now() >= this.suspendedUntil;
  }

  private logError(msg: string): void {
    const now = Date.now();
    this.errorsSinceLog++;
    if (now - this.lastErrorLog < ERROR_LOG_INTERVAL_MS) return;
    const more = this.errorsSinceLog > 1 ? ` (${this.errorsSinceLog - 1} more errors since the last report)` : '';
    log.warn(msg + more);
    this.lastErrorLog = now;
    this.errorsSinceLog = 0;
  }

  /** Forgets which chunks the server was believed to hold, so the next puts write them again. */
  forgetKnown(): void {
    this.known.clear();
  }

  private remember(key: ChunkKey): void {
    this.known.delete(key);
    this.known.set(key, true);
    if (this.known.size > KNOWN_KEYS) this.known.delete(this.known.keys().next().value!);
  }

  /**
   * Queues a copy of `chunk` for writing in the background and returns at once. A chunk the
   * server is known to hold, or already queued, is not written again.
   */
  enqueue(key: ChunkKey, chunk: Uint8Array): EnqueueResult {
    if (this.known.has(key) || this.pending.has(key)) {
      this.s.putsSkippedKnown++;
      return 'known';
    }
    if (this.closed || this.client.status !== 'ready') {
      this.s.putsDroppedUnavailable++;
      return 'dropped';
    }
    // The caller may reuse its buffer once put() returns, so the queue holds its own copy.
    const buf = this.pool.acquire(chunk.byteLength);
    if (!buf) {
      this.s.putsDroppedQueueFull++;
      return 'dropped';
    }
    buf.set(chunk, 0);
    this.queue.push({ key, buf, length: chunk.byteLength });
    this.pending.add(key);
    this.s.putsQueued++;
    this.pump();
    return 'queued';
  }

  private pump(): void {
    while (this.inflight < MAX_INFLIGHT_SETS && this.queue.length) {
      const item = this.queue.shift()!;
      this.inflight++;
      const value = Buffer.from(item.buf.buffer, item.buf.byteOffset, item.length);
      this.client
        .set(this.remoteKey(item.key), value)
        .then(
          () => {
            this.s.putsWritten++;
            this.s.putBytes += item.length;
            this.remember(item.key);
          },
          (e: Error) => {
            this.s.putErrors++;
            this.logError(`remote tier ${this.endpoint.display}: write of chunk ${item.key} failed: ${e.message}`);
          },
        )
        .finally(() => {
          this.pool.release(item.buf);
          this.pending.delete(item.key);
          this.inflight--;
          this.pump();
          if (this.inflight === 0 && this.queue.length === 0) {
            // Drained: keep the buffers a steady stream reuses, give back what a backlog (a slow
            // or unreachable server) made the pool take, so its peak is not held for good.
            this.pool.trimIdle(IDLE_QUEUE_BUFFERS);
            for (const w of this.idleWaiters.splice(0)) w();
          }
        });
    }
  }

  /** Resolves true once every queued write finished (written or failed), false after `timeoutMs`. */
  flush(timeoutMs: number): Promise<boolean> {
    if (this.inflight === 0 && this.queue.length === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const t = setTimeout(() => resolve(false), timeoutMs);
      this.idleWaiters.push(() => {
        clearTimeout(t);
        resolve(true);
      });
    });
  }

  /** Reads and verifies one chunk; null when absent, unreachable, timed out or corrupt (all counted). */
  async get(key: ChunkKey): Promise<Uint8Array | null> {
    if (!this.available()) {
      this.s.getsSkipped++;
      return null;
    }
    this.s.gets++;
    let buf: Buffer | null;
    try {
      buf = await this.client.getBuffer(this.remoteKey(key));
    } catch (e) {
      this.s.getErrors++;
      this.suspendedUntil = Date.now() + SUSPEND_AFTER_ERROR_MS;
      this.logError(`remote tier ${this.endpoint.display}: read of chunk ${key} failed: ${(e as Error).message}; reads paused for ${SUSPEND_AFTER_ERROR_MS} ms`);
      return null;
    }
    if (!buf) {
      this.s.misses++;
      this.known.delete(key);
      return null;
    }
    const chunk = new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    try {
      verifyChunk(chunk, key);
    } catch (e) {
      this.s.corrupt++;
      this.known.delete(key);
      log.warn(`remote tier ${this.endpoint.display}: chunk ${key} rejected (${(e as Error).message}); deleting it from the server`);
      this.client.del(this.remoteKey(key)).catch(() => undefined);
      return null;
    }
    this.s.hits++;
    this.s.getBytes += chunk.byteLength;
    this.remember(key);
    return chunk;
  }

  /**
   * Reads `keys` in order, a few at a time, and returns the leading ones found (verified): the
   * first miss ends the prefix, so nothing after it is fetched.
   */
  async getLeading(keys: readonly ChunkKey[]): Promise<Uint8Array[]> {
    const out: Uint8Array[] = [];
    let next = 0;
    let stop = false;
    const results: (Uint8Array | null | undefined)[] = new Array(keys.length);
    const worker = async () => {
      while (!stop && next < keys.length) {
        const i = next++;
        const got = await this.get(keys[i]!);
        results[i] = got;
        if (!got) stop = true;
      }
    };
    await Promise.all(Array.from({ length: Math.min(MAX_INFLIGHT_GETS, keys.length) }, worker));
    for (const r of results) {
      if (!r) break;
      out.push(r);
    }
    return out;
  }

  stats(): RemoteStats {
    return {
      url: this.endpoint.display,
      connected: this.connected,
      ...this.s,
      queueBytes: this.pool.inUseBytes,
      queueChunks: this.queue.length + this.inflight,
    };
  }

  /** Lets queued writes finish (bounded by the command timeout), then disconnects. */
  async close(): Promise<void> {
    if (this.closed) return;
    if (this.client.status === 'ready') await this.flush(this.o.timeoutMs);
    this.closed = true;
    for (const item of this.queue.splice(0)) {
      this.pool.release(item.buf);
      this.pending.delete(item.key);
      this.s.putsDroppedUnavailable++;
    }
    this.client.disconnect();
    this.pool.trim();
  }
}

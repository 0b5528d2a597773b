// Replay protection of the channels the deployment secret authenticates (docs/security.md
// "Replay"). Every authenticated internal message carries `ts` (the sender's wall clock, ms since
// the epoch) and `nonce` (16 random bytes, hex), and its HMAC tag covers them together with the
// whole message, so a captured message cannot be altered. The receiver checks, in this order:
//   1. the tag (an unauthenticated flood never reaches the nonce memory),
//   2. the timestamp: |now - ts| <= the replay window (--replay-window, 30 s by default), which
//      is also the clock skew tolerated between two hosts,
//   3. the nonce: not seen within the window. A nonce is remembered until its ts + window, after
//      which step 2 refuses the message anyway, so the memory holds at most ~2 windows of nonces;
//      it is bounded (NONCE_CAPACITY per channel): when full, messages are refused, never
//      accepted unchecked.
// A restart loses the nonce memory: a message captured within the last window before the restart
// can be replayed once after it, and never once its timestamp is older than the window.
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { Counter, type Registry } from 'prom-client';
import stringify from 'safe-stable-stringify';
import { environment } from './environment.js';

/** Nonces one channel of one process remembers at most (85 bytes each, measured: 8.5 MB when full). */
export const NONCE_CAPACITY = 100_000;

/** Why an authenticated channel refused a message: the error catalog code a client sees. */
export type RefusalReason = 'invalid_deployment_secret' | 'stale_timestamp' | 'replayed_nonce' | 'nonce_memory_full';

export interface Refusal {
  reason: RefusalReason;
  message: string;
}

let windowMs: number | undefined;

/** Sets this process's replay window (the CLI from --replay-window, or a test). */
export function setReplayWindow(ms: number): void {
  windowMs = ms;
}

/** This process's replay window in ms: --replay-window, else $KVC_REPLAY_WINDOW, else 30 s. */
export function replayWindowMs(): number {
  windowMs ??= environment().get('replayWindow')!;
  return windowMs;
}

/** A fresh (ts, nonce) pair for one message (`now`: the sender's clock). */
export function stamp(now = Date.now()): { ts: number; nonce: string } {
  return { ts: now, nonce: randomBytes(16).toString('hex') };
}

/** The deterministic text of a JSON value (keys sorted): what both ends hash. Undefined: "". */
export function canonical(v: unknown): string {
  return v === undefined ? '' : (stringify(v) ?? '');
}

// ---- refusal counts (kvc_auth_refused_total in every process's /metrics) --------------------

const refusalCounts = new Map<string, number>();

/** Counts one refusal of `channel` for `reason`. */
export function countRefusal(channel: string, reason: RefusalReason): void {
  const k = `${channel}\u0000${reason}`;
  refusalCounts.set(k, (refusalCounts.get(k) ?? 0) + 1);
}

/** Refusals so far by "channel/reason" (tests, logs). */
export function refusalsSoFar(): Record<string, number> {
  return Object.fromEntries([...refusalCounts].map(([k, v]) => [k.replace('\u0000', '/'), v]));
}

/** Registers kvc_auth_refused_total{channel, reason} in `registry`, read from the process's counts at scrape time. */
export function registerRefusalCounter(registry: Registry): void {
  const seen = new Map<string, number>();
  new Counter({
    name: 'kvc_auth_refused_total',
    help: 'Internal messages refused by the deployment-secret check, by channel and reason (invalid_deployment_secret, stale_timestamp, replayed_nonce, nonce_memory_full); docs/security.md',
    labelNames: ['channel', 'reason'],
    registers: [registry],
    collect() {
      for (const [k, v] of refusalCounts) {
        const [channel, reason] = k.split('\u0000') as [string, string];
        this.labels(channel, reason).inc(Math.max(0, v - (seen.get(k) ?? 0)));
        seen.set(k, v);
      }
    },
  });
}

// ---- the nonce memory --------------------------------------------------------------------

/**
 * The nonces one channel accepted within the window, in one-second buckets by expiry so whole
 * buckets are dropped as time passes (no per-entry timer, no scan).
 */
export class NonceMemory {
  private readonly seen = new Set<string>();
  private readonly buckets = new Map<number, string[]>();
  private lowest = -1;

  constructor(
    readonly channel: string,
    private readonly o: { windowMs?: () => number; capacity?: number; now?: () => number } = {},
  ) {}

  get size(): number {
    return this.seen.size;
  }

  /** Checks the timestamp and the nonce of an authenticated message and remembers the nonce; a refusal (counted) or null. */
  admit(ts: unknown, nonce: unknown): Refusal | null {
    const r = this.check(ts, nonce);
    if (r) countRefusal(this.channel, r.reason);
    return r;
  }

  private check(ts: unknown, nonce: unknown): Refusal | null {
    const now = (this.o.now ?? Date.now)();
    const window = (this.o.windowMs ?? replayWindowMs)();
    this.expire(now);
    if (typeof ts !== 'number' || !Number.isFinite(ts)) {
      return { reason: 'stale_timestamp', message: `${this.channel}: the message carries no timestamp (ts: milliseconds since the epoch)` };
    }
    if (Math.abs(now - ts) > window) {
      const off = Math.round((now - ts) / 1000);
      return {
        reason: 'stale_timestamp',
        message: `${this.channel}: the message's timestamp is ${Math.abs(off)} s ${off >= 0 ? 'old' : 'in the future'}, outside the replay window of ${window / 1000} s (a replayed message, or clocks further apart than the window)`,
      };
    }
    if (typeof nonce !== 'string' || nonce.length < 16 || nonce.length > 64) {
      return { reason: 'replayed_nonce', message: `${this.channel}: the message carries no nonce (16 to 64 characters)` };
    }
    if (this.seen.has(nonce)) return { reason: 'replayed_nonce', message: `${this.channel}: this message (nonce ${nonce.slice(0, 16)}…) was already received; a replay is refused` };
    if (this.seen.size >= (this.o.capacity ?? NONCE_CAPACITY)) {
      return { reason: 'nonce_memory_full', message: `${this.channel}: ${this.seen.size} messages within the replay window already; retry later` };
    }
    this.seen.add(nonce);
    const b = Math.floor((ts + window) / 1000);
    let list = this.buckets.get(b);
    if (!list) this.buckets.set(b, (list = []));
    list.push(nonce);
    if (this.lowest < 0 || b < this.lowest) this.lowest = b;
    return null;
  }

  /** Forgets the nonces whose ts + window has passed (their timestamps are refused from now on). */
  private expire(now: number): void {
    const upTo = Math.floor(now / 1000); // buckets below it have expired
    if (this.buckets.size === 0) {
      this.lowest = upTo;
      return;
    }
    while (this.lowest < upTo && this.buckets.size > 0) {
      const list = this.buckets.get(this.lowest);
      if (list) {
        for (const n of list) this.seen.delete(n);
        this.buckets.delete(this.lowest);
      }
      this.lowest++;
    }
    if (this.buckets.size === 0) this.lowest = upTo;
  }
}

// ---- sealed messages of the binary channels ------------------------------------------------

/** The tag of a sealed message: HMAC-SHA256(secret, "<channel>:" + canonical(message without auth)), hex. */
export function sealTag(secret: string, channel: string, msg: Record<string, unknown>): string {
  const { auth: _auth, ...rest } = msg;
  return createHmac('sha256', secret).update(`${channel}:${canonical(rest)}`).digest('hex');
}

/** `msg` with ts, nonce and auth added (unchanged without a secret: the channel is open); `now`: the sender's clock. */
export function seal<T extends object>(secret: string | null, channel: string, msg: T, now = Date.now()): T & { ts?: number; nonce?: string; auth?: string } {
  if (secret === null) return msg;
  const m = { ...msg, ...stamp(now) } as T & { ts: number; nonce: string; auth?: string };
  m.auth = sealTag(secret, channel, m as Record<string, unknown>);
  return m;
}

/**
 * Checks a sealed message (tag, then timestamp, then nonce): a refusal (counted under the
 * memory's channel) or null. Always null without a secret.
 */
export function unseal(secret: string | null, memory: NonceMemory, msg: Record<string, unknown>): Refusal | null {
  if (secret === null) return null;
  const got = msg.auth;
  if (typeof got !== 'string' || !sameHex(got, sealTag(secret, memory.channel, msg))) {
    countRefusal(memory.channel, 'invalid_deployment_secret');
    return { reason: 'invalid_deployment_secret', message: `${memory.channel}: ${got === undefined ? 'no' : 'a wrong'} deployment secret tag` };
  }
  return memory.admit(msg.ts, msg.nonce);
}

/** Constant-time equality of two tags. */
export function sameHex(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

// ---- signed HTTP requests ------------------------------------------------------------------

export const SIGNATURE_HEADERS = { ts: 'x-kvc-timestamp', nonce: 'x-kvc-nonce', signature: 'x-kvc-signature' } as const;

/** HMAC-SHA256(secret, "http\n<METHOD> <path>\n<ts>\n<nonce>\n" + sha256(canonical(body))), hex. */
export function requestSignature(secret: string, method: string, path: string, ts: string, nonce: string, body: unknown): string {
  const digest = createHash('sha256').update(canonical(body)).digest('hex');
  return createHmac('sha256', secret).update(`http\n${method.toUpperCase()} ${path}\n${ts}\n${nonce}\n${digest}`).digest('hex');
}

/** The headers that sign one internal HTTP call (none without a secret). `body` is the JSON value sent; `now` the sender's clock. */
export function signedHeaders(secret: string | null, method: string, path: string, body?: unknown, now = Date.now()): Record<string, string> {
  if (secret === null) return {};
  const s = stamp(now);
  const ts = String(s.ts);
  return { [SIGNATURE_HEADERS.ts]: ts, [SIGNATURE_HEADERS.nonce]: s.nonce, [SIGNATURE_HEADERS.signature]: requestSignature(secret, method, path, ts, s.nonce, body) };
}

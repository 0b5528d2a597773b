// Connections to holders' peer ports, kept between P2P fetches (docs/p2p.md "Connection reuse").
// Every fetch on a fresh connection pays the TCP handshake (one round trip) before its FETCH can
// leave, and TCP's slow start after it; across a 200 ms round trip that is most of the default 1 s
// bound. A holder that is asked to keep the connection (FETCH `keep`) answers FETCH_END with `keep`
// and goes on reading the next FETCH on it; the requester then parks the connection here, idle,
// for the next fetch from that holder.
//
// Bounds: at most P2P_POOL_MAX_IDLE_PER_PEER idle connections per holder (fetches running at the
// same time each have their own; the extra ones are closed when they come back), each closed
// after P2P_POOL_IDLE_MS unused, before the holder's own idle limit (DEFAULT_PEER_IDLE_MS) would
// close it under a fetch about to start. A connection that closes, errors or sends anything while
// idle leaves the pool at once; one that fails during a fetch is closed, never parked. Idle
// connections do not keep the process alive (unref).
//
// A pooled connection is only ever used by one fetch at a time, and every FETCH on it is sealed on
// its own (timestamp, nonce, HMAC tag: src/kvc/p2p_serve.ts), so reuse changes nothing of what the
// holder checks per message.
import net from 'node:net';
import { DEFAULT_PEER_IDLE_MS } from './worker_peer.js';

/** Idle connections kept per holder. */
export const P2P_POOL_MAX_IDLE_PER_PEER = 4;
/** An idle connection unused this long is closed (half the holder's own idle limit). */
export const P2P_POOL_IDLE_MS = DEFAULT_PEER_IDLE_MS / 2;

/** How a fetch got its connection (label `how` of kvc_p2p_connections_total). */
export type ConnHow = 'new' | 'reused' | 'stale';

/** What a fetch does with the connection while it owns it. */
export interface ConnUser {
  /** Where the next read lands (the fetch's frame reader). */
  buffer(): Uint8Array;
  /** `n` bytes arrived in the last buffer(). */
  read(n: number): void;
  /** Bytes that arrived in a buffer lent before this user took the connection. */
  push(data: Buffer): void;
  /** The TCP connection is established (at once for a pooled one). */
  connected(): void;
  /** The connection closed or failed. */
  ended(error: Error | null): void;
}

const IDLE_READ = Buffer.allocUnsafe(256);

/** One TCP connection to a holder's peer port, read straight into its current user's buffers. */
export class PeerConn {
  readonly sock: net.Socket;
  isConnected = false;
  dead = false;
  /** ms from a FETCH written to its answer's first byte, measured on this connection's first fetch. */
  firstByteMs: number | null = null;
  private user: ConnUser | null = null;
  private lentTo: ConnUser | null = null;
  private lent: Uint8Array = IDLE_READ;
  private idleTimer: NodeJS.Timeout | null = null;
  /** Set while parked: takes the connection out of its pool when it dies. */
  onIdleDeath: (() => void) | null = null;

  constructor(host: string, port: number) {
    this.sock = net.connect({
      host,
      port,
      onread: {
        // Node asks for the next read's buffer right after a read, so a read may land in a buffer
        // lent to an earlier user (or to none): then its bytes are handed over by copy.
        buffer: () => {
          this.lentTo = this.user;
          this.lent = this.user ? this.user.buffer() : IDLE_READ;
          return this.lent;
        },
        callback: (n: number) => {
          if (n <= 0) return true;
          if (!this.user) this.destroy(); // nothing may arrive on an idle connection
          else if (this.lentTo === this.user) this.user.read(n);
          else this.user.push(Buffer.from(this.lent.subarray(0, n)));
          return true;
        },
      },
    } as net.NetConnectOpts);
    this.sock.setNoDelay(true);
    this.sock.on('connect', () => {
      this.isConnected = true;
      this.user?.connected();
    });
    this.sock.on('error', (e) => this.die(e));
    this.sock.on('close', () => this.die(null));
  }

  /** Hands the connection to `user` (a fetch); it learns of the connect if that is still to come. */
  attach(user: ConnUser): void {
    this.user = user;
    this.sock.ref();
    if (this.isConnected) user.connected();
  }

  detach(): void {
    this.user = null;
  }

  destroy(): void {
    this.sock.destroy();
    this.die(null);
  }

  park(idleMs: number, onExpire: () => void): void {
    this.user = null;
    this.sock.unref();
    this.idleTimer = setTimeout(onExpire, idleMs);
    this.idleTimer.unref();
  }

  unpark(): void {
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = null;
    this.onIdleDeath = null;
  }

  private die(error: Error | null): void {
    if (this.dead) return;
    this.dead = true;
    this.sock.destroy();
    if (this.idleTimer) clearTimeout(this.idleTimer);
    const u = this.user;
    this.user = null;
    u?.ended(error);
    this.onIdleDeath?.();
    this.onIdleDeath = null;
  }
}

export interface PoolHooks {
  /** A fetch got a connection: a new one, a pooled one, or a pooled one found dead at use. */
  onConnection?(how: ConnHow): void;
  /** Idle connections in the pool changed by `delta`. */
  onIdle?(delta: number): void;
}

/** Idle authenticated-per-message connections to holders, by peer URL. */
export class PeerConnPool {
  private readonly idle = new Map<string, PeerConn[]>();
  private closed = false;

  constructor(
    private readonly o: { maxIdlePerPeer?: number; idleMs?: number } & PoolHooks = {},
  ) {}

  /** An idle connection to `peerUrl` (most recently parked first), or null. */
  take(peerUrl: string): PeerConn | null {
    const list = this.idle.get(peerUrl);
    const c = list?.pop() ?? null;
    if (list && list.length === 0) this.idle.delete(peerUrl);
    if (!c) return null;
    this.o.onIdle?.(-1);
    c.unpark();
    return c;
  }

  /** Parks `c` for the next fetch from `peerUrl`; closes it when the pool is full or closed. */
  put(peerUrl: string, c: PeerConn): void {
    const list = this.idle.get(peerUrl) ?? [];
    if (this.closed || c.dead || list.length >= (this.o.maxIdlePerPeer ?? P2P_POOL_MAX_IDLE_PER_PEER)) {
      c.destroy();
      return;
    }
    list.push(c);
    this.idle.set(peerUrl, list);
    this.o.onIdle?.(1);
    const leave = () => {
      const l = this.idle.get(peerUrl);
      const i = l?.indexOf(c) ?? -1;
      if (i < 0) return;
      l!.splice(i, 1);
      if (l!.length === 0) this.idle.delete(peerUrl);
      this.o.onIdle?.(-1);
    };
    c.onIdleDeath = leave;
    c.park(this.o.idleMs ?? P2P_POOL_IDLE_MS, () => c.destroy());
  }

  counted(how: ConnHow): void {
    this.o.onConnection?.(how);
  }

  /** Idle connections held, in all. */
  get size(): number {
    let n = 0;
    for (const l of this.idle.values()) n += l.length;
    return n;
  }

  /** Closes every idle connection; later returned ones are closed too. */
  close(): void {
    this.closed = true;
    for (const l of [...this.idle.values()]) for (const c of [...l]) c.destroy();
    this.idle.clear();
  }
}

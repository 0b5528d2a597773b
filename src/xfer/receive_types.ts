// The receive buffer's records (src/xfer/receive_buffer.ts): its options, chunk entries,
// reservations (one per transfer, with its deadline and outcome), queued ALLOCs, and what the
// buffer hands out.
import type { AllocMeta, DataMeta } from '../protocol/xfer_frames.js';

export type EntryState = 'pending' | 'ready';

/** One chunk held (or being received) by the receiver; shared by every reservation naming its key. */
export interface Entry {
  key: string;
  /** Accounted bytes (size class of the chunk length). */
  cost: number;
  /** Exact chunk length announced at reservation time. */
  bytes: number;
  state: EntryState;
  buf: Uint8Array | null;
  refs: number;
  /** Session currently streaming into buf (so a cut connection can fail it). */
  writer: string | null;
  /**
   * The session and request whose reservation created the entry: the only sender expected to
   * write it. Reservations that got the key in `have` wait on this one; when that session
   * closes or cancels the request before sending it, the entry is discarded (waiters wake).
   */
  owner: string;
  ownerReq: string;
  waiters: (() => void)[];
}

/** How a transfer (one reservation) ended: every reservation reaches exactly one of these. */
export type TransferOutcome = 'done' | 'failed' | 'abandoned';
export const TRANSFER_OUTCOMES: readonly TransferOutcome[] = ['done', 'failed', 'abandoned'];

export interface Reservation {
  reqId: string;
  /** When it must have ended (ms, this.now's clock); the timer abandons it then. */
  deadline: number;
  timer: NodeJS.Timeout | null;
  outcome: TransferOutcome | null;
  keys: string[];
  /** the entries this reservation holds a reference on (not looked up by key: a failed key may be re-reserved) */
  entries: Entry[];
  createdAt: number;
  /** When it reached its outcome (this.now's clock), null while in flight. */
  endedAt: number | null;
  session: string;
  /** Its request arrived at the engine (claim) or took it (take): the request frees it. */
  claimed: boolean;
}

/** The answer to an ALLOC: granted (with the keys not to send), or refused with why. */
export type AllocReply = { ok: boolean; have?: string[]; error?: string };

export interface AllocWaiter {
  meta: AllocMeta;
  need: number;
  deadline: number;
  reply: (r: AllocReply) => void;
  timer: NodeJS.Timeout;
}

export interface ReceiverStats {
  capacityBytes: number;
  reservedBytes: number;
  /** memory actually held by the buffer pool (grows on demand) */
  poolBytes: number;
  reservations: number;
  entries: number;
  readyEntries: number;
  chunksReceived: number;
  bytesReceived: number;
  chunksRejected: number;
  allocRefused: number;
  reservationsExpired: number;
  /** Reservations freed unused because their request ended first (endRequest, release, or the sender withdrew the ALLOC). */
  reservationsReleased: number;
  /** Reservations freed by the request that took them (its import done or given up). */
  reservationsTaken: number;
  sessions: number;
  /** Transfers (reservations) by how they ended; `inFlight` have not ended yet. */
  transfers: Record<TransferOutcome | 'inFlight', number>;
}

/** What take() hands the consumer: leading ready chunks; views stay valid until release(). */
export interface Taken {
  keys: string[];
  chunks: Uint8Array[];
  numTokens: number;
  release(): void;
}

/** A DATA frame's body that has arrived in full (chunkArrived). */
export interface ArrivedChunk {
  /** The sending session (the connection's own, whatever the frame says). */
  session: string;
  meta: DataMeta;
  /** The entry chunkTarget gave the body to, or null when it was dropped. */
  entry: Entry | null;
  /** The body where it landed; null when dropped. */
  body: Uint8Array | null;
  bodyLen: number;
  /** The xxh64 of the payload computed while it arrived, or null if it was not. */
  payloadSum: bigint | null;
}

export interface ReceiveBufferOptions {
  /** xfer_buffer_size: upper bound of reserved bytes. */
  bufferBytes: number;
  /** The largest chunk this layout and chunk size make; an ALLOC naming a larger one is refused. */
  maxChunkBytes: number;
  /** Reservations not taken within this time are freed by sweep(). */
  ttlMs: number;
  /** An unclaimed reservation is freed this long after its transfer ended (its request never came). */
  claimWindowMs: number;
  /** Upper bound on how long an ALLOC may wait for space, whatever the sender asks. */
  maxAllocWaitMs: number;
  /** The transfer contract's floor: a reservation ends within transferDeadlineMs(floor, its bytes). */
  deadlineFloorMs: number;
  /**
   * The sender `session` was writing a chunk when its transfer's deadline passed: its connection
   * is stalled (frames on it are in order, so nothing after the chunk can arrive either) and must
   * be cut; closing it ends in closeSession(), which discards the half-written chunk.
   */
  cutSession?: (session: string, why: string) => void;
  /** See ReceiverOptions.maxReservedPerSender. */
  maxReservedPerSender?: number;
  /** See ReceiverOptions.heldLocally. */
  heldLocally?: (key: string) => boolean;
  /** Every chunk of request `reqId`'s reservation is here and verified. */
  onComplete?: (reqId: string, keys: string[]) => void;
  /** The clock reservations age by (tests pass their own). */
  now?: () => number;
}

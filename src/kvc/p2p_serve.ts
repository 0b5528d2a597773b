// The holder side of a P2P pull (docs/p2p.md): a FETCH frame on the peer port
// (src/kvc/worker_peer.ts hands it here) asks for consecutive chunks of one prompt. They are
// sent in order as CHUNK frames up to the first one this instance no longer holds, then
// FETCH_END says how many were sent, and the connection closes, unless the FETCH asked to keep it
// (`keep`) and was served: then FETCH_END says `keep: true` and the connection waits for the
// requester's next FETCH (src/kvc/p2p_pool.ts), each FETCH checked on its own as below. A chunk of the CPU tier is written
// from where it lies, pinned until the socket has taken its bytes (so an eviction meanwhile cannot
// recycle them: chunkForSend, as for a move); one of another tier is read into a copy first. Each
// is checked against its key; the requester verifies the checksum as the bytes arrive.
// Authentication: with a deployment secret the FETCH is sealed (timestamp, nonce and an HMAC tag
// over the whole frame, src/common/replay.ts), like every internal channel, so a captured FETCH
// can neither ask for other keys nor be replayed.
import type net from 'node:net';
import { checkChunkFor } from '../common/chunk.js';
import { deploymentSecret } from '../common/auth.js';
import { NonceMemory, sealTag, stamp, unseal } from '../common/replay.js';
import { logger } from '../common/log.js';
import { PEER_PROTOCOL_VERSION, PeerFrame, peerChunkHead, peerControlFrame, type PeerFetch } from '../protocol/peer_frames.js';
import type { KvcStore } from './store.js';
import { chunkForSend, type OutgoingChunk } from './transfer_holds.js';
import type { LocationName } from './types.js';

const log = logger('kvc.p2p');

/** The channel name of the FETCH tag. */
const CHANNEL = 'p2p-fetch';

/** The FETCH of `keys`: stamped always, and sealed with a deployment secret; `keep` asks the holder to keep the connection. */
export function fetchFrame(from: string, keys: readonly string[], keep = false): PeerFetch {
  const msg: PeerFetch = { v: PEER_PROTOCOL_VERSION, from, keys: [...keys], ...stamp(), ...(keep ? { keep: true } : {}) };
  const secret = deploymentSecret();
  return secret === null ? msg : { ...msg, auth: sealTag(secret, CHANNEL, msg) };
}

/** Nonces of the FETCHes this process served within the replay window. */
const fetchNonces = new NonceMemory(CHANNEL);

/** The chunk for `key` from the fastest local location that has it, or null. Never the remote tier. */
async function readLocal(store: KvcStore, readers: Map<LocationName, (key: string) => Promise<OutgoingChunk | null>>, key: string): Promise<OutgoingChunk | null> {
  for (const loc of store.locations()) {
    if (!store.has(key, loc)) continue;
    let read = readers.get(loc);
    if (!read) readers.set(loc, (read = chunkForSend(store, loc)));
    const got = await read(key).catch(() => null);
    if (got) return got;
  }
  return null;
}

/** Resolves once `b` is queued (at once, or at the next drain); `written` runs when the socket has taken it or failed. */
function write(sock: net.Socket, b: Uint8Array, written?: () => void): Promise<void> {
  return new Promise<void>((res, rej) => {
    if (sock.destroyed) {
      written?.();
      return rej(new Error('connection closed'));
    }
    const onClose = () => rej(new Error('connection closed'));
    if (sock.write(b, () => written?.())) return res();
    sock.once('close', onClose);
    sock.once('drain', () => {
      sock.off('close', onClose);
      res();
    });
  });
}

/**
 * Serves one FETCH; resolves when the answer is written (or the connection is gone), with true
 * when the connection stays open for the next FETCH (asked with `keep`, and served).
 */
export async function serveFetch(sock: net.Socket, store: KvcStore, req: PeerFetch, peerName: string, stop: { requested: boolean } = { requested: false }): Promise<boolean> {
  const end = (sent: number, error?: string): boolean => {
    if (sock.destroyed) return false;
    if (error === undefined && req.keep === true) {
      sock.write(peerControlFrame(PeerFrame.FetchEnd, { ok: true, sent, keep: true }));
      return true;
    }
    sock.end(peerControlFrame(PeerFrame.FetchEnd, error === undefined ? { ok: true, sent } : { ok: false, sent, error }));
    return false;
  };
  const refused = unseal(deploymentSecret(), fetchNonces, req);
  if (refused) {
    log.warn(`refused a P2P fetch from ${peerName} (${req.from}): ${refused.reason}: ${refused.message}`);
    return end(0, `fetch refused (${refused.reason}): ${refused.message}`);
  }
  let sent = 0;
  const readers = new Map<LocationName, (key: string) => Promise<OutgoingChunk | null>>();
  /** Releases of chunks whose bytes may still wait in the socket's queue (all run when the fetch ends). */
  const pending = new Set<() => void>();
  let onClose: (() => void) | null = null;
  try {
    for (const key of req.keys) {
      if (sock.destroyed) return false;
      if (stop.requested) break; // FETCH_STOP: the requester's bound passed; FETCH_END says how many came
      const got = await readLocal(store, readers, key);
      if (!got) break; // the run ends here: the requester computes the rest
      const release = () => {
        if (pending.delete(release)) got.release?.();
        if (pending.size === 0 && onClose) sock.off('close', onClose);
      };
      pending.add(release);
      checkChunkFor(got.bytes, key);
      await write(sock, peerChunkHead(key, got.bytes.byteLength));
      await write(sock, got.bytes, release);
      sent++;
    }
  } catch (e) {
    log.warn(`P2P fetch by ${req.from} (${peerName}) stopped after ${sent} chunk(s): ${(e as Error).message}`);
    return end(sent, (e as Error).message);
  } finally {
    if (sock.destroyed) for (const r of [...pending]) r();
    else if (pending.size) {
      // Released by the socket's write callbacks, or by its close; a kept connection serves many
      // fetches, so the listener goes once the last of them is released.
      onClose = () => {
        for (const r of [...pending]) r();
      };
      sock.once('close', onClose);
    }
  }
  // A peer's read is a use: this is the recent copy (the requester admits its own evict-first,
  // peer_copy_admission). Read in prompt order, the head became the oldest of the run: order it
  // head-last so eviction takes the prefix from its tail (LruIndex.touchHeadLast).
  if (sent > 0) store.touchPrefix(req.keys.slice(0, sent));
  log.debug(`P2P fetch by ${req.from}: sent ${sent}/${req.keys.length} chunk(s)`);
  return end(sent);
}

// A standalone xfer endpoint in its own process, driven over the IPC channel of
// child_process.fork(). Tests and bench/xfer.ts use it to put sender and receiver in separate
// processes with synthetic chunks (real chunk format, real checksums).
//
//   fork('dist/src/xfer/peer.js', [JSON.stringify({role: 'receiver', ...ReceiverOptions, autoRelease?})])
//   fork('dist/src/xfer/peer.js', [JSON.stringify({role: 'sender', ...SenderOptions})])
// Requests: {id, op, ...}; replies: {id, ok, result} or {id, ok: false, error}.
//   receiver ops: stats, usage (process CPU µs and GC counts, for the benchmark), lookup {keys}, take {keys, reqId?, waitMs?} (verifies, then releases), release {reqId}
//   sender ops:   send {spec, seed, tokens: number[], corrupt?: number[], failAt?: number} (one synthetic
//                 chunk per entry of tokens; chunks in `corrupt` get a payload byte flipped after
//                 sealing; building chunk `failAt` throws, as a failed KV export would),
//                 sendRepeated {specs, tokens, seed} (same payloads, fresh keys per spec; for the benchmark)
import { PerformanceObserver, constants as perf } from 'node:perf_hooks';
import { encodeChunk, HEADER_BYTES, payloadBytes, verifyChunk, type KvLayout } from '../common/chunk.js';
import { XferReceiver, type ReceiverOptions } from './receiver.js';
import { XferSender, type DisaggSpec, type OutChunk, type SenderOptions } from './sender.js';

/** Deterministic synthetic key for (seed, index): 16 hex digits. */
export function syntheticKey(seed: number, index: number): string {
  const hi = (Math.imul(seed + 1, 0x9e3779b1) ^ Math.imul(index + 7, 0x85ebca6b)) >>> 0;
  const lo = (Math.imul(index + 1, 0xc2b2ae35) ^ Math.imul(seed + 3, 0x27d4eb2f)) >>> 0;
  return hi.toString(16).padStart(8, '0') + lo.toString(16).padStart(8, '0');
}

/** A sealed chunk with a deterministic payload (xorshift32 words). */
export function syntheticChunk(layout: KvLayout, numTokens: number, key: string, seed: number): Uint8Array {
  const bytes = payloadBytes(layout, numTokens);
  const payload = new Uint8Array(bytes);
  const words = new Uint32Array(payload.buffer, 0, Math.floor(bytes / 4));
  let x = (seed * 2654435761 + 12345) >>> 0 || 1;
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    words[i] = x >>> 0;
  }
  return encodeChunk(layout, numTokens, key, payload);
}

/** Rewrites the key in a sealed chunk's header (the checksum covers the payload only). */
export function rekey(chunk: Uint8Array, key: string): void {
  new DataView(chunk.buffer, chunk.byteOffset, HEADER_BYTES).setBigUint64(32, BigInt('0x' + key), true);
}

type Msg = { id: number; op: string; [k: string]: any };

async function main(): Promise<void> {
  const cfg = JSON.parse(process.argv[2] ?? '{}');
  const reply = (id: number, result: unknown) => process.send!({ id, ok: true, result });
  const fail = (id: number, e: unknown) => process.send!({ id, ok: false, error: (e as Error).message ?? String(e) });

  if (cfg.role === 'receiver') {
    const recv = await XferReceiver.start(cfg as ReceiverOptions);
    // full (mark-compact) and young-generation collections, for the benchmark's report
    const gcs = { full: 0, young: 0 };
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        const kind = (e as { detail?: { kind?: number } }).detail?.kind;
        if (kind === perf.NODE_PERFORMANCE_GC_MAJOR) gcs.full++;
        else if (kind === perf.NODE_PERFORMANCE_GC_MINOR) gcs.young++;
      }
    }).observe({ entryTypes: ['gc'] });
    if (cfg.autoRelease) {
      // Benchmark mode: a request's chunks are consumed as soon as all of them arrived.
      recv.on('complete', (reqId: string, keys: string[]) => {
        void recv.take(keys, reqId).then((t) => t.release());
      });
    }
    process.on('message', async (m: Msg) => {
      try {
        if (m.op === 'stats') return reply(m.id, recv.stats());
        if (m.op === 'usage') {
          const u = process.cpuUsage();
          return reply(m.id, { cpuMicros: u.user + u.system, gcFull: gcs.full, gcYoung: gcs.young });
        }
        if (m.op === 'lookup') return reply(m.id, recv.lookup(m.keys));
        if (m.op === 'release') return reply(m.id, recv.release(m.reqId));
        if (m.op === 'take') {
          const t = await recv.take(m.keys, m.reqId, m.waitMs ?? 0);
          // the consumer's job: check what it got is what was sent (key order, checksums)
          t.chunks.forEach((c, i) => verifyChunk(c, t.keys[i]));
          t.release();
          return reply(m.id, { keys: t.keys, numTokens: t.numTokens });
        }
        if (m.op === 'close') {
          await recv.close();
          reply(m.id, true);
          return process.exit(0);
        }
        throw new Error(`unknown op ${m.op}`);
      } catch (e) {
        fail(m.id, e);
      }
    });
    process.send!({ ready: true, receiverId: recv.receiverId });
    return;
  }

  if (cfg.role === 'sender') {
    const sender = new XferSender(cfg as SenderOptions);
    const layout = (cfg as SenderOptions).layout;
    process.on('message', async (m: Msg) => {
      try {
        if (m.op === 'send') {
          const tokens: number[] = m.tokens;
          const corrupt: number[] = m.corrupt ?? [];
          const chunks: OutChunk[] = tokens.map((n, i) => {
            const key = m.keys?.[i] ?? syntheticKey(m.seed, i);
            const data = () => {
              if (m.failAt === i) throw new Error(`synthetic export failure at chunk ${i}`);
              const c = syntheticChunk(layout, n, key, m.seed * 1000 + i);
              if (corrupt.includes(i)) c[c.byteLength - 1]! ^= 0xff; // after sealing: the checksum no longer matches
              return c;
            };
            return { key, numTokens: n, data };
          });
          return reply(m.id, await sender.send(m.spec, chunks));
        }
        if (m.op === 'sendRepeated') {
          // Payloads built once (outside the timing), re-keyed per request. `lanes` requests are
          // in flight at once, as on a busy prefiller; each lane owns its buffers, since a buffer
          // is re-keyed only after its previous request was acked.
          const tokens: number[] = m.tokens;
          const lanes: number = m.lanes ?? 1;
          const laneBufs = Array.from({ length: lanes }, (_, l) =>
            tokens.map((n, i) => syntheticChunk(layout, n, syntheticKey(m.seed + l, i), m.seed * 1000 + l * 100 + i)),
          );
          const t0 = process.hrtime.bigint();
          let bytes = 0;
          let chunks = 0;
          let next = 0;
          const lane = async (l: number) => {
            const bufs = laneBufs[l]!;
            for (let r = next++; r < m.specs.length; r = next++) {
              const out: OutChunk[] = bufs.map((b, i) => {
                const key = syntheticKey(m.seed + r + 1, i);
                return { key, numTokens: tokens[i]!, data: () => (rekey(b, key), b) };
              });
              const res = await sender.send(m.specs[r], out);
              if (!res.ok) throw new Error(res.error);
              bytes += res.bytes;
              chunks += res.sent;
            }
          };
          await Promise.all(Array.from({ length: lanes }, (_, l) => lane(l)));
          const s = Number(process.hrtime.bigint() - t0) / 1e9;
          return reply(m.id, { bytes, chunks, seconds: s });
        }
        if (m.op === 'close') {
          await sender.close();
          reply(m.id, true);
          return process.exit(0);
        }
        throw new Error(`unknown op ${m.op}`);
      } catch (e) {
        fail(m.id, e);
      }
    });
    process.send!({ ready: true, senderId: sender.senderId });
    return;
  }
  throw new Error(`peer: role must be "sender" or "receiver", found ${JSON.stringify(cfg.role)}`);
}

if (process.send) {
  process.on('disconnect', () => process.exit(0)); // parent gone: never linger
  main().catch((e) => {
    process.send!({ ready: false, error: (e as Error).message });
    process.exit(1);
  });
}

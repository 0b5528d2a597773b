// Zero-copy receive (src/common/slot_arena.ts, src/protocol/frame_reader.ts pull mode,
// src/xfer/direct_read.ts): slots in the xxh64 kernel's WASM memory hashed in place give exactly
// xxhash-wasm's values for any input and any split; the pool keeps the BufferPool contract (budget,
// recycling, trim); a frame reader fed the way a socket's `onread` feeds it reads bodies straight
// into their slot and gives the same frames and digests as push(); a real socket read that way
// carries frames intact.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import fc from 'fast-check';
import xxhash from 'xxhash-wasm';
import { SlotArenaPool } from '../../src/common/slot_arena.js';
import { copyingHash } from '../../src/common/stream_hash.js';
import { checksum64 } from '../../src/common/keys.js';
import { xxh64InPlace } from '../../src/common/xxh64_kernel.js';
import { FrameParser, FrameType, writeFrame } from '../../src/protocol/xfer_frames.js';
import { readDirect } from '../../src/common/direct_read.js';
import { MAX_DIRECT_READ } from '../../src/protocol/frame_reader.js';
import { propertyParams } from '../../harness/property.js';

const { h64Raw } = await xxhash();

test('in-place xxh64 over arena slots equals xxhash-wasm for random inputs, odd lengths and any split', () => {
  const pool = new SlotArenaPool(64 << 20);
  fc.assert(
    fc.property(
      fc.uint8Array({ minLength: 0, maxLength: 5000 }),
      fc.array(fc.integer({ min: 1, max: 700 }), { minLength: 1, maxLength: 12 }),
      fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }),
      (data, cuts, seed) => {
        const slot = pool.acquire(Math.max(1, data.length))!;
        try {
          slot.set(data);
          const h = pool.hasher(slot, seed);
          let o = 0;
          for (let i = 0; o < data.length; i++) {
            const n = Math.min(cuts[i % cuts.length]!, data.length - o);
            h.update(slot.subarray(o, o + n));
            o += n;
          }
          const want = h64Raw(data, seed);
          assert.equal(h.digest(), want);
          // and the copying fallback agrees
          const c = copyingHash(seed);
          c.update(data);
          assert.equal(c.digest(), want);
        } finally {
          pool.release(slot);
        }
      },
    ),
    propertyParams({ numRuns: 300 }),
  );
});

test('checksum64 of bytes in a slot (hashed in place) equals xxhash-wasm, for any offset and length; not after the arena is gone', () => {
  const pool = new SlotArenaPool(8 << 20);
  const slot = pool.acquire(300_000)!;
  slot.set(randomBytes(slot.byteLength));
  for (const [from, to] of [[0, 300_000], [64, 300_000], [3, 4], [17, 17], [1, 299_999]] as const) {
    const v = slot.subarray(from, to);
    assert.notEqual(xxh64InPlace(v), null, 'a slot is hashed in place');
    assert.equal(checksum64(v), h64Raw(Uint8Array.from(v)));
  }
  pool.release(slot);
  pool.trim();
  assert.equal(xxh64InPlace(slot), null, 'a trimmed arena is no longer registered');
  assert.equal(checksum64(slot.subarray(0, 1000)), h64Raw(Uint8Array.from(slot.subarray(0, 1000))));
});

test('two streams in one arena, interleaved, keep their own state', () => {
  const pool = new SlotArenaPool(16 << 20);
  const a = pool.acquire(100_003)!;
  const b = pool.acquire(100_003)!;
  assert.equal(a.buffer, b.buffer, 'same arena');
  a.set(randomBytes(100_003));
  b.set(randomBytes(100_003));
  const ha = pool.hasher(a);
  const hb = pool.hasher(b);
  for (let o = 0; o < 100_003; o += 9_999) {
    ha.update(a.subarray(o, Math.min(100_003, o + 9_999)));
    hb.update(b.subarray(o, Math.min(100_003, o + 9_999)));
  }
  assert.equal(ha.digest(), checksum64(a.subarray(0, 100_003)));
  assert.equal(hb.digest(), checksum64(b.subarray(0, 100_003)));
  assert.throws(() => ha.update(new Uint8Array(8)), /not in its arena/);
});

test('slot pool: budget, aligned slots, warm reuse, held memory counts only what was used, trim gives idle arenas back', () => {
  const pool = new SlotArenaPool(10 * 8192);
  const slots = Array.from({ length: 10 }, () => pool.acquire(5000)!);
  for (const s of slots) {
    assert.equal(s.byteLength, 8192);
    assert.equal(s.byteOffset % 4096, 0, 'slots are page aligned');
  }
  assert.equal(pool.acquire(5000), null, 'over the budget');
  assert.equal(pool.heldBytes, 10 * 8192);
  pool.release(slots[3]!);
  const again = pool.acquire(8000)!;
  assert.equal(again.byteOffset, slots[3]!.byteOffset, 'a warm slot is reused first');
  for (const s of slots) if (s !== slots[3]) pool.release(s);
  pool.release(again);
  assert.equal(pool.inUseBytes, 0);
  assert.equal(pool.heldBytes, 10 * 8192);
  pool.trim();
  assert.equal(pool.heldBytes, 0);
  // a small first slot does not count the arena's untouched space
  const one = new SlotArenaPool(1 << 30).acquire(4096)!;
  assert.equal(one.byteLength, 4096);
});

test('slot pool: a live slot keeps its arena (and its bytes) through trim', () => {
  const pool = new SlotArenaPool(1 << 20);
  const live = pool.acquire(4096)!;
  live.fill(7);
  const free = pool.acquire(4096)!;
  pool.release(free);
  pool.trim();
  assert.equal(pool.inUseBytes, 4096);
  assert.ok(live.every((x) => x === 7));
  pool.release(live);
  pool.trim();
  assert.equal(pool.heldBytes, 0);
});

/** The bytes a sender writes for: a CANCEL, DATA frames with the given bodies, a CANCEL. */
function wire(bodies: Uint8Array[]): Buffer {
  const parts: Buffer[] = [];
  const sock = { write: (b: Uint8Array) => (parts.push(Buffer.from(b)), true), cork() {}, uncork() {} } as any;
  writeFrame(sock, FrameType.Cancel, { session: 's', req_id: 'a' });
  bodies.forEach((b, i) => writeFrame(sock, FrameType.Data, { req_id: 'r', key: `k${i}` }, b));
  writeFrame(sock, FrameType.Cancel, { session: 's', req_id: 'z' });
  return Buffer.concat(parts);
}

interface Got {
  type: number;
  meta: any;
  body: Buffer | null;
  sum: bigint | null;
  inSlot: boolean;
}

function parserInto(pool: SlotArenaPool, got: Got[]): FrameParser {
  let slot: Uint8Array | null = null;
  return new FrameParser(
    1 << 20,
    (type, meta, len) => {
      if (type !== FrameType.Data || meta.key === 'k1') return null; // k1: dropped body
      return (slot = pool.acquire(len)!);
    },
    (type, meta, body, _len, sum) => {
      const inSlot = body !== null && slot !== null && body.buffer === slot.buffer && body.byteOffset === slot.byteOffset;
      got.push({ type, meta, body: body ? Buffer.from(body) : null, sum, inSlot });
      if (body && slot) pool.release(slot);
      slot = null;
    },
    (type) => (type === FrameType.Data ? 64 : null),
    (body) => pool.hasher(body),
  );
}

/** The reader's scratch buffer (where reads outside a kept body land). */
function scratchOf(p: FrameParser): ArrayBufferLike | undefined {
  return (p as unknown as { scratch: Buffer | null }).scratch?.buffer;
}

test('pull mode: reads of any size give the frames, bodies and digests push() gives, bodies read in place', () => {
  const bodies = [randomBytes(70_001), randomBytes(200), randomBytes(131_072 + 5)];
  const bytes = wire(bodies);
  for (const cap of [1, 13, 4096, 65_536, 1 << 20]) {
    const pushed: Got[] = [];
    const pulled: Got[] = [];
    const pa = parserInto(new SlotArenaPool(8 << 20), pushed);
    for (let o = 0; o < bytes.length; o += Math.max(cap, 997)) pa.push(bytes.subarray(o, o + Math.max(cap, 997)));
    const pb = parserInto(new SlotArenaPool(8 << 20), pulled);
    let o = 0;
    let direct = 0;
    while (o < bytes.length) {
      // what the kernel does: fill at most the lent buffer, at most `cap` bytes per read
      const into = pb.readBuffer();
      const n = Math.min(into.byteLength, cap, bytes.length - o);
      into.set(bytes.subarray(o, o + n));
      if (into.buffer !== scratchOf(pb)) {
        direct += n;
        assert.ok(into.byteLength <= MAX_DIRECT_READ, 'one read into a body is bounded (the event loop turn stays short)');
      }
      o += n;
      pb.readDone(n);
    }
    assert.deepEqual(
      pulled.map((g) => [g.type, g.meta, g.body, g.sum]),
      pushed.map((g) => [g.type, g.meta, g.body, g.sum]),
      `read size ${cap}`,
    );
    assert.equal(pulled.length, 5);
    assert.equal(pulled[1]!.sum, checksum64(bodies[0]!.subarray(64)));
    assert.equal(pulled[3]!.sum, checksum64(bodies[2]!.subarray(64)));
    assert.equal(pulled[2]!.body, null, 'a dropped body is read past');
    if (cap >= 4096) assert.ok(direct > bodies[0]!.length, `read size ${cap}: most body bytes were read straight into their slot (${direct})`);
  }
});

test('readDirect: a real connection read into the parser delivers frames intact, and a protocol error reaches onError', async () => {
  const bodies = [randomBytes(300_000), randomBytes(1_000)];
  const pool = new SlotArenaPool(8 << 20);
  const got: Got[] = [];
  const errors: string[] = [];
  let closed!: () => void;
  const done = new Promise<void>((r) => (closed = r));
  const srv = net.createServer({ pauseOnConnect: true }, (accepted) => {
    const parser = parserInto(pool, got);
    const sock = readDirect(accepted, parser, (e) => {
      errors.push(e.message);
      sock.destroy();
    });
    sock.on('close', () => closed());
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as net.AddressInfo).port;
  const c = net.connect(port, '127.0.0.1');
  await new Promise<void>((r) => c.once('connect', r));
  c.write(wire(bodies));
  c.write(Buffer.alloc(12)); // not a frame: bad magic
  await done;
  c.destroy();
  srv.close();
  assert.equal(got.length, 4);
  assert.ok(got[1]!.inSlot && got[1]!.body!.equals(bodies[0]!));
  assert.equal(got[1]!.sum, checksum64(bodies[0]!.subarray(64)));
  assert.equal(got[2]!.body, null, 'the dropped body was read past');
  assert.deepEqual([got[3]!.type, got[3]!.meta], [FrameType.Cancel, { session: 's', req_id: 'z' }]);
  assert.match(errors[0] ?? '', /bad frame magic/);
});

test('slot pool: chunks of every length up to a full chunk use the arenas prepared at start (one per power of two), in disjoint slots', () => {
  // A receiver's chunks: full ones and a last, partial one of any length (here 2,048 bytes per
  // token, 256-token chunks, a 64-byte header). Before, each distinct length made its own arena.
  const full = 64 + 256 * 2048;
  const pool = new SlotArenaPool(128 << 20);
  pool.prepare(full);
  const prepared = pool.allocations;
  assert.equal(prepared, 9, 'slot sizes 4 KiB .. 1 MiB');
  // Up to 32 requests in flight, each holding a chunk: lengths 1..256 tokens in turn.
  const held: { n: number; s: Uint8Array }[] = [];
  const check = (h: { n: number; s: Uint8Array }) => assert.ok(h.s.every((x) => x === h.n % 251), `slot of ${h.n} tokens kept its bytes`);
  for (let n = 1; n <= 256; n++) {
    const bytes = 64 + n * 2048;
    const s = pool.acquire(bytes)!;
    assert.equal(s.byteLength, Math.ceil(bytes / 4096) * 4096, 'a slot is a view of its size class');
    assert.equal(s.byteOffset % 4096, 0);
    s.fill(n % 251);
    held.push({ n, s });
    if (held.length > 32) {
      const old = held.shift()!;
      check(old);
      pool.release(old.s);
    }
  }
  assert.equal(pool.allocations, prepared, 'no arena created while serving');
  held.forEach(check);
  assert.equal(pool.inUseBytes, held.reduce((a, h) => a + h.s.byteLength, 0), 'the budget counts size classes');
  assert.ok(pool.heldBytes >= pool.inUseBytes, 'held memory: whole slots');
  for (const h of held) pool.release(h.s);
  assert.equal(pool.inUseBytes, 0);
  const again = pool.acquire(full)!;
  assert.equal(pool.allocations, prepared, 'a warm slot is reused');
  pool.release(again);
  // Idle: the used arenas go back, and fresh ones of the prepared sizes replace them at once.
  pool.trim();
  assert.equal(pool.heldBytes, 0);
  const afterTrim = pool.allocations;
  assert.ok(afterTrim > prepared, 'used arenas were replaced');
  for (const n of [1, 100, 256]) pool.release(pool.acquire(64 + n * 2048)!);
  assert.equal(pool.allocations, afterTrim, 'no arena created by the next transfer');
});

// The message definitions of src/protocol: each schema accepts what its sender writes and
// rejects a bad field with an error that names it; the binary codecs round-trip; the shared
// FrameReader reads frames split at any byte and hashes bodies while they arrive.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { encode } from '@msgpack/msgpack';
import { checksum64 } from '../../src/common/keys.js';
import { decodeMsg, describeIssues, encodeMsg, isKeyOp, keyOpSchema, packKeys, registerMsgSchema, syncMsgSchema, unpackKeys, controllerMsgSchema } from '../../src/protocol/monitor.js';
import { healthReplySchema, moveCommandSchema, keysAtSchema, WORKER_ROUTES } from '../../src/protocol/worker_api.js';
import { decodeNotice, encodeNotice } from '../../src/protocol/xfer_notice.js';
import { kvTransferParams, parseDisaggSpec, transferReqId } from '../../src/protocol/disagg_spec.js';
import { FrameReader, ProtocolError } from '../../src/protocol/frame_reader.js';
import { FrameParser, FrameType, writeFrame, XFER_FRAMES } from '../../src/protocol/xfer_frames.js';
import { decodePeerControl, PEER_FRAMES, PeerFrame, peerChunkHead, peerControlFrame, peerHelloSchema, splitChunkBody } from '../../src/protocol/peer_frames.js';

const KEY = '0123456789abcdef';
const register = {
  t: 'register', v: 1, instance_id: 'i', worker_id: 0, session: 's', ip: '127.0.0.1', worker_port: 8000,
  distributed_url: null, chunk_size: 256, model_id: 'm', seed: '0', locations: ['LocalCPUBackend'], pid: 1,
};

test('monitor: register/sync/ops accept what an instance sends and name a bad field', () => {
  assert.ok(registerMsgSchema.safeParse(register).success);
  const bad = registerMsgSchema.safeParse({ ...register, worker_port: 70000 });
  assert.ok(!bad.success);
  assert.match(describeIssues(bad.error), /worker_port/);
  const missing = registerMsgSchema.safeParse({ ...register, model_id: undefined });
  assert.ok(!missing.success);
  assert.match(describeIssues(missing.error), /model_id/);

  const keys = packKeys([KEY, 'fedcba9876543210']);
  assert.deepEqual(unpackKeys(keys), [KEY, 'fedcba9876543210']);
  assert.ok(syncMsgSchema.safeParse({ t: 'sync', location: 'LocalCPUBackend', keys, reset: true, last: true }).success);
  const torn = syncMsgSchema.safeParse({ t: 'sync', location: 'LocalCPUBackend', keys: keys.subarray(0, 5), reset: true, last: true });
  assert.ok(!torn.success);
  assert.match(describeIssues(torn.error), /keys: expected packed 8-byte keys/);

  assert.ok(isKeyOp([1, 'LocalCPUBackend', keys]));
  assert.ok(!isKeyOp([2, 'LocalCPUBackend', keys]));
  const op = keyOpSchema.safeParse([1, 'LocalCPUBackend', 'not bytes']);
  assert.ok(!op.success);
  assert.match(describeIssues(op.error), /^2: /);

  // The codec round-trips through msgpack (binary keys stay binary).
  const back = decodeMsg(encodeMsg({ t: 'sync', location: 'LocalCPUBackend', keys, reset: false, last: true }));
  assert.ok(syncMsgSchema.safeParse(back).success);
  assert.equal(decodeMsg(Buffer.from([0xc1])), null);
  assert.equal(decodeMsg(encode([1, 2])), null);
  assert.ok(controllerMsgSchema.safeParse({ t: 'welcome', heartbeat_interval_ms: 250 }).success);
  assert.ok(!controllerMsgSchema.safeParse({ t: 'welcome' }).success);
});

test('worker API: requests and replies are checked, the bad field named', () => {
  assert.ok(keysAtSchema.safeParse({ keys: [KEY], location: 'LocalDiskBackend' }).success);
  const badKey = keysAtSchema.safeParse({ keys: ['xyz'], location: 'LocalCPUBackend' });
  assert.ok(!badKey.success);
  assert.deepEqual(badKey.error.issues[0]!.path, ['keys', 0]);
  assert.match(badKey.error.issues[0]!.message, /16-digit hex chunk key/);
  const badLoc = keysAtSchema.safeParse({ keys: [], location: 'GPU' });
  assert.ok(!badLoc.success);
  assert.deepEqual(badLoc.error.issues[0]!.path, ['location']);

  const move = { keys: [KEY], location: 'LocalCPUBackend', copy: true, target: { location: 'LocalCPUBackend', distributed_url: 'h:1' }, deadline_ms: 1000 };
  assert.ok(moveCommandSchema.safeParse(move).success);
  const noDeadline = moveCommandSchema.safeParse({ ...move, deadline_ms: 0 });
  assert.ok(!noDeadline.success);
  assert.deepEqual(noDeadline.error.issues[0]!.path, ['deadline_ms']);

  assert.ok(WORKER_ROUTES.move.reply.safeParse({ moved: 3 }).success);
  const badReply = WORKER_ROUTES.lookup.reply.safeParse({ count: 'three' });
  assert.ok(!badReply.success);
  assert.deepEqual(badReply.error.issues[0]!.path, ['count']);
  const health = { instance_id: 'i', worker_id: 0, model_id: 'm', chunk_size: 256, moves_in_flight: 0, locations: [{ location: 'LocalCPUBackend', capacityBytes: 1, usedBytes: 0, chunks: 0, pinned: 0 }] };
  assert.ok(healthReplySchema.safeParse(health).success);
  assert.ok(!healthReplySchema.safeParse({ ...health, chunk_size: '256' }).success);
});

test('transfer notice: one codec; a bad field is named', () => {
  const n = { req_id: 'r', prefiller: 'p', num_chunks: 2, num_tokens: 40, ok: false, error: 'buffer full' };
  assert.deepEqual(decodeNotice(encodeNotice(n)), n);
  assert.throws(() => decodeNotice(encode({ ...n, num_chunks: 'two' })), /xfer notice: "num_chunks"/);
  assert.throws(() => decodeNotice(encode({ ...n, ok: undefined })), /xfer notice: "ok"/);
  assert.throws(() => decodeNotice(encode([1])), /expected a msgpack map/);
  assert.throws(() => decodeNotice(Buffer.from([0xc1])));
});

test('disagg_spec: one validation naming the field; kv_transfer_params built on the prefiller params', () => {
  const spec = { req_id: 'kvc-1', receiver_host: '127.0.0.1', receiver_init_port: 7300, receiver_alloc_port: 7400 };
  assert.deepEqual(parseDisaggSpec(spec), { ok: true, spec });
  assert.deepEqual(parseDisaggSpec({ ...spec, receiver_alloc_port: 0 }), { ok: false, error: 'kv_transfer_params.disagg_spec.receiver_alloc_port: expected a port between 1 and 65535' });
  assert.deepEqual(parseDisaggSpec({ ...spec, req_id: '' }), { ok: false, error: 'kv_transfer_params.disagg_spec.req_id: expected a non-empty string' });
  assert.deepEqual(parseDisaggSpec({ ...spec, receiver_host: 5 }), { ok: false, error: 'kv_transfer_params.disagg_spec.receiver_host: expected a host name' });
  const notObject = parseDisaggSpec('nope');
  assert.ok(!notObject.ok && /^kv_transfer_params\.disagg_spec: expected an object/.test(notObject.error));
  assert.deepEqual(kvTransferParams(spec, { xfer: { ok: true } }), { xfer: { ok: true }, disagg_spec: spec });
  assert.equal(transferReqId(kvTransferParams(spec)), 'kvc-1');
  assert.equal(transferReqId({ disagg_spec: { req_id: 7 } }), undefined);
});

/** Feeds `bytes` to `push` in pieces of every size from 1 to `max`. */
function feedSplit(bytes: Buffer, push: (b: Buffer) => void, piece: number): void {
  for (let o = 0; o < bytes.length; o += piece) push(bytes.subarray(o, o + piece));
}

test('FrameReader: xfer frames split at any byte, body hashed from the hook offset', () => {
  const body = Buffer.from(Array.from({ length: 300 }, (_, i) => i & 0xff));
  for (const piece of [1, 7, 13, 64, 1000]) {
    // writeFrame into a recording socket: the bytes a sender puts on the wire.
    const wire: Buffer[] = [];
    const sock = { write: (b: Uint8Array) => (wire.push(Buffer.from(b)), true), cork() {}, uncork() {} } as any;
    writeFrameTo(sock, body);
    const got: { type: number; meta: any; sum: bigint | null; body: Buffer | null }[] = [];
    const slot = Buffer.alloc(body.length);
    const parser = new FrameParser(1 << 20, () => slot, (type, meta, b, _len, sum) => got.push({ type, meta, sum, body: b ? Buffer.from(b) : null }), (type) => (type === FrameType.Data ? 64 : null));
    feedSplit(Buffer.concat(wire), (b) => parser.push(b), piece);
    assert.equal(got.length, 2, `piece ${piece}`);
    assert.equal(got[0]!.type, FrameType.Cancel);
    assert.deepEqual(got[0]!.meta, { session: 's', req_id: 'r' });
    assert.equal(got[1]!.type, FrameType.Data);
    assert.deepEqual(got[1]!.body, body);
    assert.equal(got[1]!.sum, checksum64(body.subarray(64)));
  }
  // Malformed input is refused, naming why.
  const parser = new FrameParser(10, () => null, () => {});
  assert.throws(() => parser.push(Buffer.alloc(12)), (e: Error) => e instanceof ProtocolError && /bad frame magic/.test(e.message));
  const big = new FrameParser(10, () => null, () => {});
  const head = Buffer.alloc(12);
  head.writeUInt16LE(0x5846, 0);
  head.writeUInt8(1, 2);
  head.writeUInt8(FrameType.Data, 3);
  head.writeUInt32LE(0, 4);
  head.writeUInt32LE(11, 8);
  assert.throws(() => big.push(head), /frame body of 11 bytes exceeds 10/);
  assert.equal(XFER_FRAMES.headBytes, 12);
});

/** One control frame, then one DATA frame with a body, as the sender writes them. */
function writeFrameTo(sock: any, body: Buffer): void {
  writeFrame(sock, FrameType.Cancel, { session: 's', req_id: 'r' });
  writeFrame(sock, FrameType.Data, { req_id: 'r', key: KEY }, body);
}

test('FrameReader: peer frames, an asynchronous handler holds later frames back in order', async () => {
  const chunk = Buffer.from(Array.from({ length: 200 }, (_, i) => (i * 7) & 0xff));
  const wire = Buffer.concat([
    peerControlFrame(PeerFrame.Hello, { v: 1, location: 'LocalCPUBackend', count: 1, from: 'x' }),
    peerChunkHead(KEY, chunk.length),
    chunk,
    peerControlFrame(PeerFrame.Commit, { count: 1 }),
  ]);
  const seen: string[] = [];
  let release!: () => void;
  const reader = new FrameReader(PEER_FRAMES, {
    sink: (_t, _m, len) => Buffer.alloc(len),
    hashFrom: (type) => (type === PeerFrame.Chunk ? 16 + 64 : null),
    onFrame: (type, _m, body, _len, digest) => {
      if (type === PeerFrame.Chunk) {
        const { key, chunk: c } = splitChunkBody(body!);
        seen.push(`chunk ${key} ${c.length} ${digest === checksum64(chunk.subarray(64))}`);
        return new Promise<void>((r) => (release = r));
      }
      seen.push(type === PeerFrame.Hello ? `hello ${(decodePeerControl(peerHelloSchema, 'HELLO', body!) as any).msg.location}` : `frame ${type}`);
    },
  });
  feedSplit(wire, (b) => reader.push(b), 9);
  assert.deepEqual(seen, ['hello LocalCPUBackend', `chunk ${KEY} 200 true`]);
  assert.ok(reader.handling);
  release();
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(seen, ['hello LocalCPUBackend', `chunk ${KEY} 200 true`, `frame ${PeerFrame.Commit}`]);
  // A control body that does not match its schema is named.
  const bad = decodePeerControl(peerHelloSchema, 'HELLO', encode({ v: 1, location: 5, count: 1, from: 'x' }));
  assert.ok(!bad.ok && /malformed HELLO: location/.test(bad.error));
  // A refused header stops the reader before any body buffer is taken.
  let sinks = 0;
  const refusing = new FrameReader(PEER_FRAMES, { refuse: (h) => (h.bodyLen > 100 ? `frame of ${h.bodyLen} bytes` : null), sink: () => (sinks++, null), onFrame: () => {} });
  assert.throws(() => refusing.push(peerChunkHead(KEY, 1000)), /frame of 1016 bytes/);
  assert.equal(sinks, 0);
});

// KV chunk format (src/common/chunk.ts): round trip, header checks, checksum detection.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DType, HEADER_BYTES, chunkBytes, chunkPayload, encodeChunk, payloadBytes, readHeader, sealChunk, verifyChunk, ChunkFormatError } from '../../src/common/chunk.js';

const layout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 4 };
const key = '0123456789abcdef';

function payload(tokens: number): Uint8Array {
  const f = new Float32Array(payloadBytes(layout, tokens) / 4);
  for (let i = 0; i < f.length; i++) f[i] = Math.sin(i);
  return new Uint8Array(f.buffer);
}

test('encode → verify round-trips header fields and payload', () => {
  const p = payload(3);
  const c = encodeChunk(layout, 3, key, p);
  assert.equal(c.byteLength, chunkBytes(layout, 3));
  const h = verifyChunk(c, key);
  assert.deepEqual({ ...h, checksum: 0n }, { ...layout, codec: 0, numTokens: 3, key, checksum: 0n, payloadBytes: p.byteLength });
  assert.deepEqual(chunkPayload(c), p);
});

test('sealChunk seals a payload written in place, without a copy', () => {
  const buf = new Uint8Array(chunkBytes(layout, 2) + 100);
  buf.set(payload(2), HEADER_BYTES);
  const view = sealChunk(buf, layout, 2, key);
  assert.equal(view.buffer, buf.buffer);
  assert.equal(view.byteLength, chunkBytes(layout, 2));
  verifyChunk(view, key);
});

test('a flipped payload bit, a truncation, a wrong key or a bad header is detected', () => {
  const c = encodeChunk(layout, 2, key, payload(2));
  const flipped = c.slice();
  flipped[HEADER_BYTES + 5]! ^= 1;
  assert.throws(() => verifyChunk(flipped), /checksum mismatch/);
  assert.throws(() => verifyChunk(c.subarray(0, c.byteLength - 1)), /truncated/);
  assert.throws(() => verifyChunk(c, 'ffffffffffffffff'), /key mismatch/);
  assert.throws(() => readHeader(c.subarray(0, 10)), ChunkFormatError);
  const badMagic = c.slice();
  badMagic[0] = 0;
  assert.throws(() => readHeader(badMagic), /bad magic/);
  const badShape = c.slice();
  new DataView(badShape.buffer).setUint32(8, 3, true); // num_layers no longer matches payload length
  assert.throws(() => readHeader(badShape), /inconsistent/);
});

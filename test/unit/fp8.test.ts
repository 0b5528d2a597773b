// The fp8 KV formats (common/fp8.ts): every finite byte round-trips, rounding is to nearest even,
// out-of-range values saturate to the largest finite value, NaN stays NaN; the decoded values
// are the OCP E4M3 ("fn") and E5M2 ones.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { e4m3Table, e5m2Table, f32ToE4m3, f32ToE5m2 } from '../../src/common/fp8.js';

const formats = [
  { name: 'E4M3', enc: f32ToE4m3, table: e4m3Table(), max: 448, maxBits: 0x7e, minSub: 2 ** -9, mant: 3 },
  { name: 'E5M2', enc: f32ToE5m2, table: e5m2Table(), max: 57344, maxBits: 0x7b, minSub: 2 ** -16, mant: 2 },
];

for (const f of formats) {
  test(`${f.name}: every finite byte encodes back to itself (±0 to their own sign)`, () => {
    for (let b = 0; b < 256; b++) {
      const v = f.table[b]!;
      if (!Number.isFinite(v)) continue;
      assert.equal(f.enc(v), b, `byte 0x${b.toString(16)} = ${v}`);
    }
  });

  test(`${f.name}: known values, saturation, NaN, round to nearest even`, () => {
    assert.equal(f.table[0x01], f.minSub);
    assert.equal(f.table[f.maxBits], f.max);
    assert.equal(f.table[0x80 | f.maxBits], -f.max);
    assert.equal(f.enc(1), (f.name === 'E4M3' ? 7 : 15) << f.mant);
    assert.equal(f.enc(1e9), f.maxBits);
    assert.equal(f.enc(-Infinity), 0x80 | f.maxBits);
    assert.ok(Number.isNaN(f.table[f.enc(NaN)]!));
    // Halfway between 1 and the next value (1 + 2^-mant) rounds to 1 (even), the next halfway up.
    const ulp = 2 ** -f.mant;
    assert.equal(f.table[f.enc(1 + ulp / 2)], 1);
    assert.equal(f.table[f.enc(1 + ulp * 1.5)], 1 + 2 * ulp);
    assert.equal(f.table[f.enc(1 + ulp / 2 + 1e-6)], 1 + ulp);
    // Below half the smallest subnormal: zero; just above: the smallest subnormal.
    assert.equal(f.enc(f.minSub / 2), 0);
    assert.equal(f.table[f.enc(f.minSub * 0.51)], f.minSub);
  });
}

test('E4M3 has no infinities: S.1111.111 is NaN, 0x7e is 448', () => {
  assert.ok(Number.isNaN(e4m3Table()[0x7f]!));
  assert.ok(Number.isNaN(e4m3Table()[0xff]!));
  assert.equal(e4m3Table()[0x78], 256);
  assert.equal(e5m2Table()[0x7c], Infinity);
});

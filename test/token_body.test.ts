// The controller's reader of /lookup and /prefix_lookup bodies (src/controller/token_body.ts):
// whatever it claims must be exactly what JSON.parse + the token-id schema would give, and
// everything else must be left to that generic path (undefined).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { scanTokenBody } from '../src/controller/token_body.js';
import { tokenIds } from '../src/common/validate.js';

/** What the generic path makes of a body: the token ids when it is {"tokens": valid ids} and nothing else. */
function generic(text: string): number[] | undefined {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return undefined;
  const keys = Object.keys(v);
  if (keys.length !== 1 || keys[0] !== 'tokens') return undefined;
  const r = tokenIds.safeParse((v as { tokens: unknown }).tokens);
  return r.success ? r.data : undefined;
}

const scan = (s: string) => {
  const r = scanTokenBody(Buffer.from(s));
  return r === undefined ? undefined : [...r];
};

test('token ids in every JSON spacing are read exactly, up to 2^32 − 1', () => {
  assert.deepEqual(scan('{"tokens":[1,2,3]}'), [1, 2, 3]);
  assert.deepEqual(scan(' \n{ "tokens" :\t[ 0 , 4294967295 ]\r\n}  '), [0, 4294967295]);
  assert.deepEqual(scan('{"tokens":[]}'), []);
  const many = Array.from({ length: 40_000 }, (_, i) => (i * 2654435761) % 4294967296);
  assert.deepEqual(scan(JSON.stringify({ tokens: many })), many);
});

test('anything else is left to the generic path (which then answers or names the field)', () => {
  for (const s of ['{"tokens":[01]}', '{"tokens":[4294967296]}', '{"tokens":[-1]}', '{"tokens":[1.5]}', '{"tokens":[1e3]}', '{"tokens":[1,]}',
    '{"tokens":[1],"x":1}', '{"x":1,"tokens":[1]}', '{"tokens":[1]}x', '{"tokens":[1', '{"tokens":', '', '[1,2]', '{"tok\\u0065ns":[1]}',
    '{"tokens":[[1]]}', '{"tokens":"abc"}', '{"tokens":[1,"2"]}', '{"tokens":null}']) {
    assert.equal(scanTokenBody(Buffer.from(s)), undefined, s);
  }
});

test('property: on random bodies the scanner agrees with JSON.parse + the schema whenever it answers', () => {
  const id = fc.oneof(fc.nat(), fc.constantFrom(0, 4294967295, 4294967296, -1, 1.5));
  const ws = fc.constantFrom('', ' ', '\n', '\t', '\r\n ');
  const body = fc.tuple(fc.array(id, { maxLength: 50 }), ws, ws, fc.constantFrom('', ',"x":1', ',')).map(([ids, a, b, extra]) =>
    `${a}{${b}"tokens"${a}:${b}[${ids.join(`${a},${b}`)}]${extra}}${b}`,
  );
  fc.assert(
    fc.property(fc.oneof(body, fc.string()), (s) => {
      const got = scan(s);
      const want = generic(s);
      if (got !== undefined) assert.deepEqual(got, want, s);
    }),
    { numRuns: 2000 },
  );
  // And every plain token body (valid ids, any spacing) is taken by the fast path.
  const valid = fc.tuple(fc.array(fc.nat({ max: 4294967295 }), { maxLength: 50 }), ws, ws).map(([ids, a, b]) => ({ ids, s: `${a}{${b}"tokens"${a}:${b}[${ids.join(`${a},${b}`)}]}${b}` }));
  fc.assert(fc.property(valid, ({ ids, s }) => assert.deepEqual(scan(s), ids, s)), { numRuns: 1000 });
});

// The error catalog (src/common/errors.ts) and the shared HTTP error handling (src/common/http.ts):
// one code ↔ one status and type, the shorthands give the same errors as the catalog entries,
// and every error a server produces for bad client input has the OpenAI shape and a catalog code.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { z } from 'zod';
import {
  ERRORS,
  KvcError,
  asKvcError,
  badRequest,
  conflict,
  kvcError,
  notFound,
  timedOut,
  tooLarge,
  unavailable,
  upstreamFailed,
  type ErrorType,
} from '../../src/common/errors.js';
import { createHttpServer, requireObject } from '../../src/common/http.js';
import { parseBody } from '../../src/common/validate.js';

/** The OpenAI error type that goes with each HTTP status. */
const TYPE_OF_STATUS: Record<number, ErrorType> = {
  400: 'invalid_request_error',
  401: 'invalid_request_error',
  404: 'not_found_error',
  408: 'timeout_error',
  409: 'conflict_error',
  413: 'payload_too_large',
  429: 'invalid_request_error',
  431: 'invalid_request_error',
  500: 'internal_error',
  502: 'upstream_error',
  503: 'unavailable_error',
  504: 'timeout_error',
};

test('every catalog entry is spelled once (code = key) and its type matches its status', () => {
  const entries = Object.entries(ERRORS);
  assert.ok(entries.length >= 20);
  for (const [key, e] of entries) {
    assert.equal(e.code, key);
    assert.match(e.code, /^[a-z]+(_[a-z]+)*$/);
    assert.equal(e.type, TYPE_OF_STATUS[e.status], `${key}: status ${e.status} goes with ${TYPE_OF_STATUS[e.status]}`);
    assert.ok(Object.isFrozen(e));
  }
  assert.ok(Object.isFrozen(ERRORS));
});

test('kvcError builds the OpenAI shape from an entry; the shorthands give the same errors', () => {
  const e = kvcError(ERRORS.store_full, 'destination has no room');
  assert.ok(e instanceof KvcError);
  assert.equal(e.status, 409);
  assert.deepEqual(e.toJSON(), { error: { message: 'destination has no room', type: 'conflict_error', param: null, code: 'store_full' } });
  assert.ok(e.is(ERRORS.store_full));
  assert.ok(!e.is(ERRORS.conflict));

  const same = (a: KvcError, b: KvcError) => assert.deepEqual([a.status, a.toJSON()], [b.status, b.toJSON()]);
  same(badRequest('m'), kvcError(ERRORS.invalid_field, 'm'));
  same(badRequest('m', 'invalid_json'), kvcError(ERRORS.invalid_json, 'm'));
  same(notFound('m'), kvcError(ERRORS.not_found, 'm'));
  same(notFound('m', 'unknown_event'), kvcError(ERRORS.unknown_event, 'm'));
  same(conflict('m'), kvcError(ERRORS.conflict, 'm'));
  same(conflict('m', 'chunk_gone'), kvcError(ERRORS.chunk_gone, 'm'));
  same(tooLarge('m'), kvcError(ERRORS.body_too_large, 'm'));
  same(upstreamFailed('m'), kvcError(ERRORS.upstream_failed, 'm'));
  same(unavailable('m'), kvcError(ERRORS.unavailable, 'm'));
  same(timedOut('m'), kvcError(ERRORS.timeout, 'm'));
  same(asKvcError(new Error('boom')), kvcError(ERRORS.internal, 'boom'));
  assert.equal(asKvcError(e), e);
});

test('the shared HTTP server answers bad input with catalog codes in the OpenAI shape', async () => {
  const app = createHttpServer({ name: 'test', bodyLimit: 1024 });
  app.post('/echo', async (req) => parseBody(z.object({ n: z.number().int() }).strict(), requireObject(req.body)));
  app.post('/throw', async (req) => {
    const b = requireObject(req.body);
    if (b.what === 'conflict') throw kvcError(ERRORS.chunk_gone, 'chunk k left cpu');
    throw new Error('a bug');
  });
  try {
    const post = async (url: string, payload: string, type = 'application/json') => {
      const r = await app.inject({ method: 'POST', url, payload, headers: { 'content-type': type } });
      return { status: r.statusCode, body: r.json() as { error: { message: string; type: string; code: string } } };
    };
    const cases: [string, Awaited<ReturnType<typeof post>>, number, string][] = [
      ['malformed JSON', await post('/echo', '{"n":'), 400, 'invalid_json'],
      ['not an object', await post('/echo', '[1]'), 400, 'invalid_json'],
      ['wrong field type', await post('/echo', '{"n":"x"}'), 400, 'invalid_field'],
      ['wrong content type', await post('/echo', 'n=1', 'application/x-www-form-urlencoded'), 400, 'invalid_content_type'],
      ['body over the limit', await post('/echo', JSON.stringify({ n: 1, pad: 'x'.repeat(2000) })), 413, 'body_too_large'],
      ['catalog error thrown', await post('/throw', '{"what":"conflict"}'), 409, 'chunk_gone'],
      ['bug', await post('/throw', '{}'), 500, 'internal'],
    ];
    for (const [what, r, status, code] of cases) {
      assert.equal(r.status, status, what);
      assert.equal(r.body.error.code, code, what);
      assert.equal(r.body.error.type, ERRORS[code as keyof typeof ERRORS].type, what);
      assert.equal(typeof r.body.error.message, 'string', what);
    }
    assert.match(cases[2]![1].body.error.message, /field `n`/);
    const nf = await app.inject({ method: 'GET', url: '/nowhere' });
    assert.equal(nf.statusCode, 404);
    assert.deepEqual(nf.json(), { error: { message: 'no route GET /nowhere', type: 'not_found_error', param: null, code: 'route_not_found' } });
  } finally {
    await app.close();
  }
});

// Long text prompts are tokenized on the tokenizer's worker thread while the engine has sequences
// running (src/engine/model/tokenize_thread.ts): the ids are the main thread's, short texts and an
// idle engine stay inline, and a stopped worker falls back to inline encoding. Counted by the
// worker's own tally of texts it encoded; no time is measured.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { ensureBuiltinModel } from '../../src/engine/model/formats/builtin.js';
import { Tokenizer } from '../../src/engine/model/tokenizer.js';
import { OFF_THREAD_MIN_CHARS } from '../../src/engine/model/tokenize_thread.js';

let tok: Tokenizer;
const words = 'a decoder keeps its rhythm while long prompts arrive in a burst, héllo wörld 東京 😀'.split(' ');
const long = Array.from({ length: 1500 }, (_, i) => words[(i * 7) % words.length]).join(' ');

before(async () => {
  tok = await Tokenizer.load(await ensureBuiltinModel('tiny'));
  await tok.startEncodeThread();
});
after(async () => {
  await tok.stopEncodeThread();
});

describe('tokenizing off the main thread', () => {
  it('encodes a long text on the worker, with the same ids as inline, BOS as asked', async () => {
    assert.ok(long.length >= OFF_THREAD_MIN_CHARS);
    const n0 = tok.encodedOffThread;
    assert.deepEqual(await tok.encodeAsync(long, {}, true), tok.encode(long));
    assert.deepEqual(await tok.encodeAsync(long, { addBos: false }, true), tok.encode(long, { addBos: false }));
    const chat = `<s>[INST] ${long} [/INST]`;
    assert.deepEqual(await tok.encodeChatTextAsync(chat, undefined, true), tok.encodeChatText(chat));
    assert.equal(tok.encodedOffThread - n0, 3);
  });

  it('keeps short texts and an idle engine inline', async () => {
    const n0 = tok.encodedOffThread;
    assert.deepEqual(await tok.encodeAsync('a short prompt', {}, true), tok.encode('a short prompt'));
    assert.deepEqual(await tok.encodeAsync(long, {}, false), tok.encode(long));
    assert.equal(tok.encodedOffThread, n0);
  });

  it('falls back to inline encoding once the worker is stopped', async () => {
    await tok.stopEncodeThread();
    assert.equal(tok.encodedOffThread, 0);
    assert.deepEqual(await tok.encodeAsync(long, {}, true), tok.encode(long));
  });
});

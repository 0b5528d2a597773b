// "Did you mean …?" for a mistyped name (request field, config key, flag): the closest known
// name by edit distance, offered only when it is close enough to be a plausible typo.
import { closest, distance } from 'fastest-levenshtein';

/** The known name closest to `name`, or null when none is within a third of its length (min 2 edits). */
export function suggest(name: string, known: readonly string[]): string | null {
  if (!known.length) return null;
  const best = closest(name.toLowerCase(), known as string[]);
  const d = distance(name.toLowerCase(), best);
  return d <= Math.max(2, Math.floor(name.length / 3)) ? best : null;
}

/** " (did you mean `x`?)" or "". */
export function didYouMean(name: string, known: readonly string[], quote = '`'): string {
  const s = suggest(name, known);
  return s === null ? '' : ` (did you mean ${quote}${s}${quote}?)`;
}

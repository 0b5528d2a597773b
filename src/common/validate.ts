// Validation of client input and configuration with zod, turned into one message
// that names the field, what was expected and what was found.
import { z } from 'zod';
import { ERRORS, describeValue, kvcError } from './errors.js';
import { didYouMean } from './did_you_mean.js';

export function fieldPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const p of path) out += typeof p === 'number' ? `[${p}]` : out ? `.${String(p)}` : String(p);
  return out || '(body)';
}

/** The value at `path` (e.g. a zod issue's path) inside `input`, walking every element; undefined when absent. */
export function valueAt(input: unknown, path: readonly PropertyKey[]): unknown {
  let cur: unknown = input;
  for (const p of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[p as string];
  }
  return cur;
}

/** The schema inside optional/nullable/default/pipe/array wrappers, walked along `path`; null when the path leaves the schema. */
function schemaAt(schema: z.core.$ZodType, path: readonly PropertyKey[]): z.core.$ZodType | null {
  let cur: z.core.$ZodType | undefined = schema;
  let i = 0;
  for (let guard = 0; cur && guard < 64; guard++) {
    const def = cur._zod.def as unknown as Record<string, unknown> & { type: string };
    if (def.type === 'optional' || def.type === 'nullable' || def.type === 'default' || def.type === 'prefault' || def.type === 'readonly' || def.type === 'catch') {
      cur = def.innerType as z.core.$ZodType;
    } else if (def.type === 'pipe') {
      cur = def.in as z.core.$ZodType;
    } else if (i === path.length) {
      return cur;
    } else if (def.type === 'object') {
      cur = (def.shape as Record<string, z.core.$ZodType>)[String(path[i++])];
    } else if (def.type === 'array' && typeof path[i] === 'number') {
      cur = def.element as z.core.$ZodType;
      i++;
    } else {
      return null;
    }
  }
  return null;
}

/** The field names an object schema at `path` knows (for a did-you-mean), or [] when it is not an object. */
export function knownKeysAt(schema: z.core.$ZodType, path: readonly PropertyKey[]): string[] {
  const s = schemaAt(schema, path);
  const def = s?._zod.def as { type?: string; shape?: Record<string, unknown> } | undefined;
  return def?.type === 'object' && def.shape ? Object.keys(def.shape) : [];
}

/**
 * Formats the first zod issue as "field `x`: <problem> (found <value>)"; an unknown field as
 * "field `x`: unknown field (did you mean `y`?)", `known` being the names allowed where it is.
 */
export function formatIssue(issue: z.core.$ZodIssue, input: unknown, known: readonly string[] = []): string {
  const field = fieldPath(issue.path);
  if (issue.code === 'unrecognized_keys') {
    const at = (k: string) => fieldPath([...issue.path, k]);
    const first = issue.keys[0]!;
    const others = issue.keys.length > 1 ? ` (also unknown: ${issue.keys.slice(1).map((k) => `\`${at(k)}\``).join(', ')})` : '';
    const list = known.length ? `; known fields: ${known.join(', ')}` : '';
    return `field \`${at(first)}\`: unknown field${didYouMean(first, known)}${others}${list}`;
  }
  const found = valueAt(input, issue.path);
  return `field \`${field}\`: ${issue.message} (found ${describeValue(found)})`;
}

/** Parses `input` with `schema`, throwing a 400 KvcError that names the offending field. */
export function parseBody<S extends z.ZodType>(schema: S, input: unknown): z.infer<S> {
  const r = schema.safeParse(input);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  if (issue.code === 'unrecognized_keys') throw kvcError(ERRORS.unknown_field, formatIssue(issue, input, knownKeysAt(schema, issue.path)));
  throw kvcError(ERRORS.invalid_field, formatIssue(issue, input));
}

/** Token id arrays: non-negative 32-bit integers. */
export const tokenIds = z.array(z.number().int('expected an integer token id').min(0).max(0xffffffff));

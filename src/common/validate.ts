// Validation of client input and configuration with zod, turned into one message
// that names the field, what was expected and what was found.
import { z } from 'zod';
import { ERRORS, describeValue, kvcError } from './errors.js';

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

/** Formats the first zod issue as "field `x`: <problem> (found <value>)". */
export function formatIssue(issue: z.core.$ZodIssue, input: unknown): string {
  const field = fieldPath(issue.path);
  if (issue.code === 'unrecognized_keys') {
    return `${field === '(body)' ? '' : `field \`${field}\`: `}unknown field(s) ${issue.keys.map((k) => `\`${k}\``).join(', ')}`;
  }
  const found = valueAt(input, issue.path);
  return `field \`${field}\`: ${issue.message} (found ${describeValue(found)})`;
}

/** Parses `input` with `schema`, throwing a 400 KvcError that names the offending field. */
export function parseBody<S extends z.ZodType>(schema: S, input: unknown): z.infer<S> {
  const r = schema.safeParse(input);
  if (r.success) return r.data;
  throw kvcError(ERRORS.invalid_field, formatIssue(r.error.issues[0]!, input));
}

/** Token id arrays: non-negative 32-bit integers. */
export const tokenIds = z.array(z.number().int('expected an integer token id').min(0).max(0xffffffff));

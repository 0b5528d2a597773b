// Parsing of the text values of flags and environment variables. Every number kvc reads from a
// command line or the environment goes through parseNumber, so a bad value is refused the same way
// everywhere: `<name>: expected <what>, found "<value>"`, where <name> is the flag or variable.

export interface NumberRule {
  /** Whole numbers only. */
  integer?: boolean;
  min?: number;
  max?: number;
  /** `min` itself is excluded (sizes and durations that must be > 0). */
  minExclusive?: boolean;
  /** What the number counts, for the message ("seconds", "GiB"). */
  unit?: string;
}

function describeRule(r: NumberRule): string {
  const kind = r.integer ? 'an integer' : 'a number';
  const unit = r.unit ? ` of ${r.unit}` : '';
  const lo = r.min === undefined ? '' : `${r.minExclusive ? '>' : '>='} ${r.min}`;
  const hi = r.max === undefined ? '' : `<= ${r.max}`;
  if (r.integer && r.min !== undefined && r.max !== undefined && !r.minExclusive) return `${kind}${unit} between ${r.min} and ${r.max}`;
  const bounds = [lo, hi].filter((s) => s !== '').join(' and ');
  return `${kind}${unit}${bounds ? ` ${bounds}` : ''}`;
}

/** A number following `rule`, from its text; throws naming `name` and the value found. */
export function parseNumber(name: string, raw: string, rule: NumberRule = {}): number {
  const s = raw.trim();
  const n = Number(s);
  const shapeOk = rule.integer ? /^[-+]?\d+$/.test(s) && Number.isSafeInteger(n) : s !== '' && Number.isFinite(n);
  const ok =
    shapeOk &&
    (rule.min === undefined || (rule.minExclusive ? n > rule.min : n >= rule.min)) &&
    (rule.max === undefined || n <= rule.max);
  if (!ok) throw new Error(`${name}: expected ${describeRule(rule)}, found "${raw}"`);
  return n;
}

/** The longest delay Node's timers take (2^31 - 1 ms, ~24.8 days): a longer one fires after 1 ms. */
export const MAX_TIMER_SECONDS = 2_147_483;

/** A number of seconds > 0 that a timer can wait, returned in milliseconds. */
export function parseSeconds(name: string, raw: string): number {
  return Math.round(parseNumber(name, raw, { min: 0, minExclusive: true, max: MAX_TIMER_SECONDS, unit: 'seconds' }) * 1000);
}

/** A TCP port 1..65535. */
export function parsePort(name: string, raw: string): number {
  return parseNumber(name, raw, { integer: true, min: 1, max: 65535 });
}

/** One of `choices`, exactly as written. */
export function parseChoice<T extends string>(name: string, raw: string, choices: readonly T[], why = ''): T {
  if (!(choices as readonly string[]).includes(raw)) throw new Error(`${name}: expected one of ${choices.join(', ')}, found "${raw}"${why}`);
  return raw as T;
}

/** A non-empty string, trimmed. */
export function parseText(name: string, raw: string): string {
  const s = raw.trim();
  if (s === '') throw new Error(`${name}: expected a non-empty value`);
  return s;
}

/**
 * A boolean as LMCache reads one from its environment (true / false / 1 / 0 / yes / no / on /
 * off, any case), and as YAML writes one.
 */
export function parseBoolean(name: string, raw: string): boolean {
  const s = raw.trim().toLowerCase();
  if (['true', '1', 'yes', 'on'].includes(s)) return true;
  if (['false', '0', 'no', 'off'].includes(s)) return false;
  throw new Error(`${name}: expected true or false (also 1/0, yes/no, on/off), found "${raw}"`);
}

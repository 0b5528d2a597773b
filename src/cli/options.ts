// Parsing of numeric command-line flags, shared by every subcommand so that a bad value is
// refused the same way everywhere: "<flag>: expected <what>, found "<value>"".
import { checkBindHost, resolveAdvertiseHost } from '../common/address.js';

/** An integer within [min, max]. */
export function intFlag(flag: string, v: string, min = Number.MIN_SAFE_INTEGER, max = Number.MAX_SAFE_INTEGER): number {
  const s = v.trim();
  if (!/^-?\d+$/.test(s) || Number(s) < min || Number(s) > max) {
    const range = min === Number.MIN_SAFE_INTEGER && max === Number.MAX_SAFE_INTEGER ? 'an integer' : `an integer between ${min} and ${max}`;
    throw new Error(`${flag}: expected ${range}, found "${v}"`);
  }
  return Number(s);
}

/** An integer >= 1, or undefined when the flag was not given. */
export function optionalPositiveInt(flag: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  if (!/^\d+$/.test(v) || Number(v) < 1) throw new Error(`${flag}: expected a positive integer, found "${v}"`);
  return Number(v);
}

/** A TCP port. */
export function portFlag(flag: string, v: string): number {
  return intFlag(flag, v, 1, 65535);
}

/** The longest delay Node's timers take (2^31 - 1 ms, ~24.8 days): a longer one fires after 1 ms. */
export const MAX_TIMER_SECONDS = 2_147_483;

/** A number of seconds > 0 that a timer can wait (≤ MAX_TIMER_SECONDS), returned in milliseconds. */
export function secondsFlag(flag: string, v: string): number {
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n) || n <= 0 || n > MAX_TIMER_SECONDS) {
    throw new Error(`${flag}: expected a number of seconds > 0 and <= ${MAX_TIMER_SECONDS}, found "${v}"`);
  }
  return Math.round(n * 1000);
}

/** `--host` (bind) and `--advertise-host` (what the process hands out), checked; see src/common/address.ts. */
export function hostFlags(o: { host?: unknown; advertiseHost?: unknown }): { host: string; advertiseHost: string } {
  const host = checkBindHost('--host', String(o.host));
  return { host, advertiseHost: resolveAdvertiseHost('--advertise-host', o.advertiseHost === undefined ? undefined : String(o.advertiseHost), host) };
}

export const ADVERTISE_HELP = 'address other processes reach this one at, which it registers and hands out (default: --host, or this machine\'s hostname when --host is 0.0.0.0 or ::)';

// `--host` and `--advertise-host` of the serving commands, checked together (the flags themselves
// are declared in src/common/flags.ts; see src/common/address.ts for the rules).
import { checkBindHost, resolveAdvertiseHost } from '../common/address.js';

/** `--host` (bind) and `--advertise-host` (what the process hands out), checked; see src/common/address.ts. */
export function hostFlags(o: { host?: unknown; advertiseHost?: unknown }): { host: string; advertiseHost: string } {
  const host = checkBindHost('--host', String(o.host));
  return { host, advertiseHost: resolveAdvertiseHost('--advertise-host', o.advertiseHost === undefined ? undefined : String(o.advertiseHost), host) };
}

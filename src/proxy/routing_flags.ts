// The routing flags of `kvc proxy` (also passed through by `kvc up`) → RoutingOptions. A bad
// value is an error naming the flag; the conditional-disaggregation flags take their mode's
// default when not given (kv-aware: KV_AWARE_DEFAULTS; round-robin: off, so every request is
// disaggregated as specified), and are honoured in either mode when given.
import { SETTINGS } from '../common/flags.js';
import { KV_AWARE_DEFAULTS, ROUTING_MODES, type RoutingMode, type RoutingOptions } from './router.js';

/** The flags as typed (text) or as the command line parsed them (numbers). */
export interface RoutingFlags {
  routing?: string;
  maxLocalPrefillTokens?: string | number;
  maxPrefillQueue?: string | number;
  controllerUrl?: string;
}

/** A count flag: the table's parser for text, a parsed value as is. */
function count(name: 'maxLocalPrefillTokens' | 'maxPrefillQueue', v: string | number): number {
  const s = SETTINGS[name];
  return typeof v === 'number' ? v : s.parse!(v, s.flags!.split(' ')[0]!);
}

export function parseRoutingFlags(f: RoutingFlags): { routing: RoutingOptions; controllerUrl: string | null } {
  const mode = (f.routing ?? 'round-robin') as RoutingMode;
  if (!ROUTING_MODES.includes(mode)) throw new Error(`--routing: expected one of ${ROUTING_MODES.join(', ')}, found "${f.routing}"`);
  const kv = mode === 'kv-aware';
  const maxLocalPrefillTokens = f.maxLocalPrefillTokens !== undefined ? count('maxLocalPrefillTokens', f.maxLocalPrefillTokens) : kv ? KV_AWARE_DEFAULTS.maxLocalPrefillTokens : null;
  const maxPrefillQueue = f.maxPrefillQueue !== undefined ? count('maxPrefillQueue', f.maxPrefillQueue) : kv ? KV_AWARE_DEFAULTS.maxPrefillQueue : null;
  let controllerUrl: string | null = null;
  if (f.controllerUrl !== undefined) {
    let u: URL;
    try {
      u = new URL(f.controllerUrl);
    } catch {
      throw new Error(`--controller-url: expected an http:// URL of the controller's HTTP port, found "${f.controllerUrl}"`);
    }
    if (u.protocol !== 'http:' || (u.pathname !== '/' && u.pathname !== '')) {
      throw new Error(`--controller-url: expected http://host:port (the controller's HTTP port, no path), found "${f.controllerUrl}"`);
    }
    controllerUrl = u.origin;
  }
  if (kv && !controllerUrl) throw new Error('--routing kv-aware: needs --controller-url (the controller whose index says where prefixes are cached)');
  return { routing: { mode, maxLocalPrefillTokens, maxPrefillQueue }, controllerUrl };
}

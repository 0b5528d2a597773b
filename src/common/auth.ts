// Credentials of a deployment (see docs/security.md):
//   - the client API key (`--api-key` / KVC_API_KEY): clients present `Authorization: Bearer <key>`
//     on the OpenAI endpoints of the proxy and the engines, as with `vllm serve --api-key`;
//   - the deployment secret (KVC_DEPLOYMENT_SECRET or `--deployment-secret-file`), shared by the
//     processes of one deployment. Internal HTTP calls are signed (x-kvc-timestamp, x-kvc-nonce,
//     x-kvc-signature over the method, path and body), and messages on the binary channels are
//     sealed (ts, nonce and an HMAC tag over the whole message), so the secret never travels
//     and a captured message can be neither altered nor replayed (src/common/replay.ts). The
//     controller's mutations also take `Authorization: Bearer <secret>` from operators, the
//     dashboard and LMCache-style scripts: that path has no replay protection.
// Every comparison is constant-time. Without a secret, the internal channels are open (today's
// behaviour) and each process warns when it is not bound to loopback.
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ERRORS, kvcError } from './errors.js';
import { NonceMemory, SIGNATURE_HEADERS, countRefusal, requestSignature, sameHex } from './replay.js';
import { logger } from './log.js';
import { environmentOf } from './environment.js';

const log = logger('auth');

/** 401 in the OpenAI shape (OpenAI answers a bad key with code invalid_api_key). */
export const unauthorized = (message: string, secret = false) => kvcError(secret ? ERRORS.invalid_deployment_secret : ERRORS.invalid_api_key, message);

/** A new deployment secret: 32 random bytes, hex. */
export function generateSecret(): string {
  return randomBytes(32).toString('hex');
}

/** Constant-time string equality (false for different lengths without comparing). */
export function safeEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/**
 * The deployment secret from `--deployment-secret-file` (first line, trimmed) or
 * KVC_DEPLOYMENT_SECRET; null when neither is set. A file that cannot be read or is empty, or a
 * secret shorter than 16 characters, is an error (never silently run without one).
 */
export function loadDeploymentSecret(file: string | undefined, env: NodeJS.ProcessEnv = process.env): string | null {
  let secret: string | null = null;
  let from = '';
  if (file !== undefined) {
    try {
      secret = readFileSync(file, 'utf8').split(/\r?\n/)[0]!.trim();
    } catch (e) {
      throw new Error(`--deployment-secret-file: cannot read ${file}: ${(e as Error).message}`);
    }
    from = `--deployment-secret-file ${file}`;
  } else {
    const e = environmentOf(env);
    const s = e.get('deploymentSecret');
    if (s !== undefined) {
      secret = s.trim();
      from = e.source('deploymentSecret')!;
    }
  }
  if (secret === null) return null;
  if (secret.length < 16) throw new Error(`${from}: the deployment secret must be at least 16 characters (found ${secret.length})`);
  return secret;
}

/** The client API key from `--api-key`, else KVC_API_KEY or vLLM's VLLM_API_KEY; null when none is set. */
export function loadApiKey(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): string | null {
  if (flag !== undefined) {
    if (flag.trim().length === 0) throw new Error('--api-key: expected a non-empty key');
    return flag.trim();
  }
  return environmentOf(env).get('apiKey') ?? null;
}

/** The bearer token of a request's Authorization header, or null. */
export function bearer(req: FastifyRequest): string | null {
  const h = req.headers.authorization;
  if (typeof h !== 'string') return null;
  const m = /^Bearer\s+(.+)$/i.exec(h.trim());
  return m ? m[1]!.trim() : null;
}

export interface GuardOptions {
  /** The key callers must present; null: the guard is off. */
  key: string | null;
  /** Which requests need it (by method and path without the query string). */
  applies: (method: string, path: string) => boolean;
  /** For the log and the error message: "API key" or "deployment secret". */
  what: string;
  /** Log name of the server. */
  name: string;
  /** Where the caller finds the key, appended to the 401's message (e.g. the secret's file). */
  where?: () => string;
}

/**
 * Requires `Authorization: Bearer <key>` on the requests `applies` selects: 401 in the OpenAI
 * shape otherwise, and a warning in the log naming the caller's address (rate-limited per address).
 */
export function requireBearer(app: FastifyInstance, o: GuardOptions): void {
  const key = o.key;
  if (key === null) return;
  const lastWarned = new Map<string, number>();
  app.addHook('onRequest', async (req) => {
    const path = req.url.split('?', 1)[0]!;
    if (!o.applies(req.method, path)) return;
    const got = bearer(req);
    if (got !== null && safeEqual(got, key)) return;
    const who = req.socket.remoteAddress ?? '?';
    const now = Date.now();
    if ((lastWarned.get(who) ?? 0) < now - 10_000) {
      lastWarned.set(who, now);
      if (lastWarned.size > 10_000) lastWarned.clear();
      log.warn(`${o.name}: refused ${req.method} ${path.slice(0, 100)} from ${who}: ${got === null ? 'no' : 'a wrong'} ${o.what}`);
    }
    const where = o.where ? ` (${o.where()})` : '';
    throw unauthorized(
      got === null
        ? `this server requires ${o.what === 'API key' ? 'an' : 'the'} ${o.what}: send "Authorization: Bearer <${o.what === 'API key' ? 'key' : 'secret'}>"${where}`
        : `the ${o.what} presented is not valid${where}`,
      o.what !== 'API key',
    );
  });
}

export interface SecretGuardOptions {
  /** Which requests need the deployment secret (by method and path without the query string). */
  applies: (method: string, path: string) => boolean;
  /** Log name of the server, and the channel its refusals are counted under (kvc_auth_refused_total). */
  name: string;
  channel: string;
  /** Also take `Authorization: Bearer <secret>` (no replay protection); false: signed calls only. */
  bearer: boolean;
  /** Where the caller finds the secret, appended to the 401's message. */
  where?: () => string;
}

/**
 * Requires the deployment secret on the requests `applies` selects: a signed call (its headers
 * are checked once the body is parsed, since the signature covers it: tag, then timestamp, then
 * nonce), or, with `bearer`, the secret itself. Refusals are 401 (429 when the nonce memory is
 * full) in the OpenAI shape with the reason as the code, counted, and logged per caller address
 * (rate-limited).
 */
export function requireSecret(app: FastifyInstance, o: SecretGuardOptions): void {
  const secret = deploymentSecret();
  if (secret === null) return;
  const memory = new NonceMemory(o.channel);
  const signed = new WeakSet<FastifyRequest>();
  const lastWarned = new Map<string, number>();
  /** The 401/429 of `reason`; `tail` follows the where-to-find-the-secret hint. */
  const refuse = (req: FastifyRequest, reason: 'invalid_deployment_secret' | 'stale_timestamp' | 'replayed_nonce' | 'nonce_memory_full', message: string, counted = false, tail = '') => {
    if (!counted) countRefusal(o.channel, reason);
    const who = req.socket.remoteAddress ?? '?';
    const now = Date.now();
    if ((lastWarned.get(who) ?? 0) < now - 10_000) {
      lastWarned.set(who, now);
      if (lastWarned.size > 10_000) lastWarned.clear();
      log.warn(`${o.name}: refused ${req.method} ${req.url.split('?', 1)[0]!.slice(0, 100)} from ${who}: ${reason}: ${message}`);
    }
    return kvcError(ERRORS[reason], `${message}${o.where ? ` (${o.where()})` : ''}${tail}`);
  };
  app.addHook('onRequest', async (req) => {
    if (!o.applies(req.method, req.url.split('?', 1)[0]!)) return;
    if (typeof req.headers[SIGNATURE_HEADERS.signature] === 'string') {
      // Fail closed: a guarded route registered before this guard would have no signature check.
      if ((req.routeOptions.config as { kvcSignatureChecked?: boolean } | undefined)?.kvcSignatureChecked !== true) {
        throw refuse(req, 'invalid_deployment_secret', 'this route does not take signed calls');
      }
      signed.add(req);
      return;
    }
    const got = o.bearer ? bearer(req) : null;
    if (got !== null && safeEqual(got, secret)) return;
    const signedCall = 'a signed call (x-kvc-timestamp, x-kvc-nonce, x-kvc-signature; docs/security.md)';
    const how = o.bearer ? '"Authorization: Bearer <secret>"' : signedCall;
    const tail = o.bearer ? `, or ${signedCall}` : '';
    throw refuse(req, 'invalid_deployment_secret', bearer(req) === null ? `this server requires the deployment secret: send ${how}` : `the deployment secret presented is not valid; send ${how}`, false, tail);
  });
  // The signature check needs the parsed body, so it runs at preValidation, on the guarded routes
  // only: the other routes (the proxy's OpenAI endpoints) get no extra hook on their hot path.
  const checkSignature = async (req: FastifyRequest) => {
    if (!signed.has(req)) return;
    const h = (name: string) => {
      const v = req.headers[name];
      return typeof v === 'string' ? v : '';
    };
    const ts = h(SIGNATURE_HEADERS.ts);
    const nonce = h(SIGNATURE_HEADERS.nonce);
    if (!sameHex(h(SIGNATURE_HEADERS.signature), requestSignature(secret, req.method, req.url, ts, nonce, req.body))) {
      throw refuse(req, 'invalid_deployment_secret', 'the signature (x-kvc-signature) does not match this request and the deployment secret');
    }
    const r = memory.admit(/^\d{1,16}$/.test(ts) ? Number(ts) : undefined, nonce);
    if (r) throw refuse(req, r.reason, r.message, true);
  };
  app.addHook('onRoute', (route) => {
    if (![route.method].flat().some((m) => o.applies(m, route.url ?? route.path))) return;
    route.preValidation = [...[route.preValidation ?? []].flat(), checkSignature];
    route.config = { ...(route.config as object | undefined), kvcSignatureChecked: true };
  });
}

/** True for addresses only this machine can reach. */
export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\./.test(host);
}

/** The warning every process logs when it runs without a deployment secret on a non-loopback address. */
export function warnIfOpen(secret: string | null, host: string, what: string): void {
  if (secret === null && !isLoopback(host)) {
    log.warn(`${what} listens on ${host} without a deployment secret: any host that reaches it can use its internal channels (set KVC_DEPLOYMENT_SECRET or --deployment-secret-file)`);
  }
}

// The deployment secret of this process: set once at start-up by the CLI (from
// --deployment-secret-file), otherwise read from KVC_DEPLOYMENT_SECRET on first use. Every
// component of the process (controller, cache instance, xfer, proxy) authenticates with it.
let processSecret: string | null | undefined;
/** The file it was read from (absolute), or null: $KVC_DEPLOYMENT_SECRET. */
let processSecretFile: string | null = null;

/** Sets this process's deployment secret (the CLI, or a test; null: none) and the file it came from. */
export function setDeploymentSecret(secret: string | null, file: string | null = null): void {
  processSecret = secret;
  processSecretFile = file;
}

/** Where an operator finds this process's deployment secret, for a 401's message. */
export function deploymentSecretWhere(): string {
  if (processSecretFile) return `this deployment's secret is the first line of ${processSecretFile}`;
  return `this process was given it in $KVC_DEPLOYMENT_SECRET; \`kvc up\` writes it to deployment.secret in its --log-dir`;
}

/** This process's deployment secret, or null when it runs without one. */
export function deploymentSecret(): string | null {
  if (processSecret === undefined) processSecret = loadDeploymentSecret(undefined);
  return processSecret;
}

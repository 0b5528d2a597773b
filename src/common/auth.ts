// Credentials of a deployment (see docs/security.md):
//   - the client API key (`--api-key` / KVC_API_KEY): clients present `Authorization: Bearer <key>`
//     on the OpenAI endpoints of the proxy and the engines, as with `vllm serve --api-key`;
//   - the deployment secret (KVC_DEPLOYMENT_SECRET or `--deployment-secret-file`), shared by the
//     processes of one deployment: internal HTTP calls present `Authorization: Bearer <secret>`,
//     and messages on the binary channels carry `auth` = HMAC-SHA256(secret, "<channel>:<subject>"),
//     where the subject names what the message is about (a session, a request id), so a captured
//     tag is only good for that one thing.
// Every comparison is constant-time. Without a secret, the internal channels are open (today's
// behaviour) and each process warns when it is not bound to loopback.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { ERRORS, kvcError } from './errors.js';
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

/** The tag a binary-channel message carries: HMAC-SHA256(secret, "<channel>:<subject>"), hex. */
export function tag(secret: string, channel: string, subject: string): string {
  return createHmac('sha256', secret).update(`${channel}:${subject}`).digest('hex');
}

/** True when `got` is the tag of (channel, subject); always true without a secret. */
export function verifyTag(secret: string | null, channel: string, subject: string, got: unknown): boolean {
  if (secret === null) return true;
  return typeof got === 'string' && safeEqual(got, tag(secret, channel, subject));
}

/** The bearer token of a request's Authorization header, or null. */
export function bearer(req: FastifyRequest): string | null {
  const h = req.headers.authorization;
  if (typeof h !== 'string') return null;
  const m = /^Bearer\s+(.+)$/i.exec(h.trim());
  return m ? m[1]!.trim() : null;
}

/** Headers that authenticate an internal HTTP call (none without a secret). */
export function internalHeaders(secret: string | null): Record<string, string> {
  return secret === null ? {} : { authorization: `Bearer ${secret}` };
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

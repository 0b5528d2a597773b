// `remote_url` of a cache instance: where the shared remote tier lives. Only Redis-protocol
// servers are supported (Redis, Valkey); every other scheme an LMCache configuration may carry
// (lm://, s3://, redis-sentinel://, infinistore://, mooncakestore://, ...) is refused at start-up,
// because a remote tier that is silently absent looks exactly like one that never hits.
//
//   redis://[user[:password]@]host[:port][/db]     plain TCP, port 6379 by default
//   rediss://...                                   TLS
//   valkey://... / valkeys://...                   the same for Valkey (same protocol)

export const REMOTE_SCHEMES = ['redis', 'rediss', 'valkey', 'valkeys'] as const;
export type RemoteScheme = (typeof REMOTE_SCHEMES)[number];

export interface RemoteEndpoint {
  scheme: RemoteScheme;
  host: string;
  port: number;
  username: string | undefined;
  password: string | undefined;
  db: number;
  tls: boolean;
  /** The URL with the password replaced by `***`, for logs and messages. */
  display: string;
}

export class RemoteUrlError extends Error {
  override name = 'RemoteUrlError';
}

/** Parses a remote_url; throws RemoteUrlError saying what was expected (the caller names the key). */
export function parseRemoteUrl(raw: string): RemoteEndpoint {
  const m = /^([A-Za-z][A-Za-z0-9+.-]*):\/\//.exec(raw);
  if (!m) throw new RemoteUrlError(`expected a URL like redis://host:6379 (supported schemes: ${REMOTE_SCHEMES.map((s) => s + '://').join(', ')})`);
  const scheme = m[1]!.toLowerCase();
  if (!(REMOTE_SCHEMES as readonly string[]).includes(scheme)) {
    throw new RemoteUrlError(`unsupported scheme "${scheme}://"; this build supports ${REMOTE_SCHEMES.map((s) => s + '://').join(', ')} (a Redis or Valkey server)`);
  }
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw new RemoteUrlError('not a valid URL; expected redis://[user:password@]host[:port][/db]');
  }
  if (!u.hostname) throw new RemoteUrlError('the URL names no host; expected redis://[user:password@]host[:port][/db]');
  if (u.search || u.hash) throw new RemoteUrlError('query parameters and fragments are not supported; expected redis://[user:password@]host[:port][/db]');
  const port = u.port === '' ? 6379 : Number(u.port);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new RemoteUrlError(`port ${u.port} is outside 1..65535`);
  const path = u.pathname.replace(/^\/+/, '');
  if (path !== '' && !/^\d{1,5}$/.test(path)) throw new RemoteUrlError(`the path "/${path}" is not a database number; expected /0, /1, ...`);
  const db = path === '' ? 0 : Number(path);
  const username = u.username ? decodeURIComponent(u.username) : undefined;
  const password = u.password ? decodeURIComponent(u.password) : undefined;
  // IPv6 literals come back bracketed from URL; the socket wants them bare.
  const host = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname;
  const auth = username || password ? `${username ?? ''}${password ? ':***' : ''}@` : '';
  return {
    scheme: scheme as RemoteScheme,
    host,
    port,
    username,
    password,
    db,
    tls: scheme === 'rediss' || scheme === 'valkeys',
    display: `${scheme}://${auth}${u.hostname}:${port}/${db}`,
  };
}

/**
 * The server settings the remote tier wants (see docs/storage.md): evict least recently used
 * chunks when maxmemory is reached, and never persist (a cache of gigabytes must not stall the
 * server writing snapshots). Used by the Kubernetes manifests and the tests' own servers.
 */
export const REDIS_SERVER_SETTINGS = ['--maxmemory-policy', 'allkeys-lru', '--save', '', '--appendonly', 'no'] as const;

// An HTTP client living inside a network namespace: the test's own namespace cannot reach the
// hosts of harness/netns.ts, so one long-lived Node child in a host's namespace makes the requests
// (any number at once) and hands back each answer. Streams are read to the end; the time to their
// first byte is reported as ttftMs. Every request is bounded by its own timeout.
import { createInterface } from 'node:readline';
import type { Hosts } from './netns.js';

const CLIENT = `
import { createInterface } from 'node:readline';
const say = (o) => process.stdout.write(JSON.stringify(o) + '\\n');
createInterface({ input: process.stdin }).on('line', async (line) => {
  const { id, method, url, body, timeoutMs, headers } = JSON.parse(line);
  const t0 = performance.now();
  let ttftMs = 0;
  try {
    const r = await fetch(url, { method, headers: { ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers }, body: body === undefined ? undefined : JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs) });
    let text = '';
    const dec = new TextDecoder();
    for await (const piece of r.body ?? []) {
      if (!ttftMs) ttftMs = performance.now() - t0;
      text += dec.decode(piece, { stream: true });
    }
    say({ id, status: r.status, text, ms: performance.now() - t0, ttftMs: ttftMs || performance.now() - t0 });
  } catch (e) {
    say({ id, status: 0, text: String(e), ms: performance.now() - t0, ttftMs: performance.now() - t0 });
  }
});
process.stdin.on('end', () => process.exit(0));
`;

export interface NsReply {
  status: number;
  text: string;
  ms: number;
  ttftMs: number;
  /** The body parsed as JSON, when it is JSON. */
  json?: any;
}

export interface NsClient {
  request(method: string, url: string, body?: unknown, timeoutMs?: number, headers?: Record<string, string>): Promise<NsReply>;
  close(): void;
}

export function startNsClient(hosts: Hosts, host: string): NsClient {
  const child = hosts.spawnIn(host, process.execPath, ['--input-type=module', '-e', CLIENT], {}, { stdin: true });
  const waiting = new Map<number, (r: NsReply) => void>();
  let err = '';
  child.stderr!.on('data', (d: Buffer) => (err += d));
  createInterface({ input: child.stdout! }).on('line', (l) => {
    const r = JSON.parse(l) as NsReply & { id: number };
    try {
      r.json = JSON.parse(r.text);
    } catch {
      /* not JSON */
    }
    waiting.get(r.id)?.(r);
    waiting.delete(r.id);
  });
  child.once('exit', () => {
    for (const [, w] of waiting) w({ status: 0, text: `the namespace client exited: ${err.trim()}`, ms: 0, ttftMs: 0 });
    waiting.clear();
  });
  let n = 0;
  return {
    request(method, url, body, timeoutMs = 60_000, headers = {}) {
      const id = n++;
      return new Promise((resolve) => {
        if (child.exitCode !== null) return resolve({ status: 0, text: `the namespace client is gone: ${err.trim()}`, ms: 0, ttftMs: 0 });
        waiting.set(id, resolve);
        child.stdin!.write(JSON.stringify({ id, method, url, body, timeoutMs, headers }) + '\n');
      });
    },
    close() {
      child.stdin!.end();
      setTimeout(() => child.exitCode === null && child.kill('SIGKILL'), 2_000).unref();
    },
  };
}

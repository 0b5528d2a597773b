// run-tests: exclusive — a request whose link is cut must end within a bound.
// 1P1D across hosts: every process in its own network namespace ("host") on a private subnet:
//   ctl   controller + proxy      pre   prefiller-0      dec   decoder-0 + sharer (kv_both)
//   redis redis-server (the shared remote tier)
// Addresses as on real machines: the controller, the proxy, the prefiller and the decoder bind
// 0.0.0.0 (their cache instances' worker, peer and xfer ports too) and advertise their host's
// address with --advertise-host; the single engine binds its host's address. Nothing is told
// 0.0.0.0 or 127.0.0.1: a peer given a wrong address would reach the wrong namespace or nothing.
// Checks: the controller registered every instance at its host's address; greedy output through the proxy equals a single engine's; a prefix computed on one host
// is a remote-tier hit on another (both directions); a controller move of a prompt's chunks from
// the prefiller's host to the decoder's host; the decoder's link cut mid-request: the request ends
// (answered or a clean JSON error) within a bound, nothing hangs, and service resumes once the link
// is back. Needs root and `ip` (iproute2) and redis-server; otherwise skipped, saying which.
// The namespaces are deleted in after() and at process exit, also when a check fails.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { writeFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { CLI } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';
import { createHosts, netnsUnavailable, type Hosts } from '../../harness/netns.js';
import { REDIS_SKIP, findRedisServer } from '../../harness/redis_server.js';
import { REDIS_SERVER_SETTINGS } from '../../src/common/remote_url.js';

const MODEL = 'builtin:tiny';
const ids = (n: number, salt = 0) => Array.from({ length: n }, (_, i) => 1000 + ((i * 37 + salt * 101) % 20000));
const skip = netnsUnavailable() ?? (findRedisServer() ? null : REDIS_SKIP);

const FETCH_SCRIPT = `
const [method, url, body, timeout] = process.argv.slice(1);
const t0 = Date.now();
try {
  const r = await fetch(url, { method, headers: body ? { 'content-type': 'application/json' } : {}, body: body || undefined, signal: AbortSignal.timeout(Number(timeout)) });
  process.stdout.write(JSON.stringify({ status: r.status, text: await r.text(), ms: Date.now() - t0 }));
} catch (e) {
  process.stdout.write(JSON.stringify({ status: 0, text: String(e), ms: Date.now() - t0 }));
}
`;

interface Reply { status: number; text: string; ms: number; json?: any }

describe('1P1D across network namespaces', { skip: skip ?? false }, () => {
  let hosts: Hosts;
  let dir: string;
  const procs: { name: string; child: ChildProcess; out: () => string }[] = [];
  const timings: string[] = [];

  /** An HTTP request made from inside a host's namespace (the test's own namespace cannot reach them). */
  const request = (from: string, method: string, url: string, body?: unknown, timeoutMs = 60_000): Promise<Reply> =>
    new Promise((resolve, reject) => {
      const c = hosts.spawnIn(from, process.execPath, ['--input-type=module', '-e', FETCH_SCRIPT, method, url, body === undefined ? '' : JSON.stringify(body), String(timeoutMs)]);
      let out = '';
      c.stdout!.on('data', (d: Buffer) => (out += d));
      c.once('exit', () => {
        try {
          const r = JSON.parse(out) as Reply;
          try { r.json = JSON.parse(r.text); } catch { /* not JSON */ }
          resolve(r);
        } catch {
          reject(new Error(`request helper printed ${out}`));
        }
      });
    });

  const start = (name: string, host: string, cmd: string, args: string[], env: NodeJS.ProcessEnv = {}) => {
    const child = hosts.spawnIn(host, cmd, args, { PYTHONHASHSEED: '0', ...env });
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d));
    child.stderr!.on('data', (d: Buffer) => (out += d));
    procs.push({ name, child, out: () => out });
    return child;
  };
  const kvc = (name: string, host: string, args: string[], env: NodeJS.ProcessEnv = {}) => start(name, host, process.execPath, [CLI, ...args], env);

  const waitUntil = async (what: string, cond: () => Promise<boolean>, ms = 180_000) => {
    const deadline = Date.now() + ms;
    while (!(await cond().catch(() => false))) {
      if (Date.now() > deadline) {
        const logs = procs.map((p) => `--- ${p.name}\n${p.out().slice(-1500)}`).join('\n');
        throw new Error(`timed out waiting for ${what}\n${logs}`);
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  };
  const healthy = (from: string, url: string) => async () => (await request(from, 'GET', url, undefined, 3_000)).status === 200;
  const complete = async (from: string, base: string, prompt: number[], maxTokens = 8) => {
    const r = await request(from, 'POST', `${base}/v1/completions`, { model: MODEL, prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true });
    assert.equal(r.status, 200, r.text);
    return { text: r.json.choices[0].text as string, cached: (r.json.usage?.prompt_tokens_details?.cached_tokens ?? 0) as number, ms: r.ms };
  };
  const metric = async (from: string, base: string, name: string, labels = '') => {
    const r = await request(from, 'GET', `${base}/metrics`, undefined, 10_000);
    const line = r.text.split('\n').find((l) => l.startsWith(name) && l.includes(labels) && !l.startsWith('#'));
    return line ? Number(line.slice(line.lastIndexOf(' ') + 1)) : NaN;
  };

  let A: Record<string, string>;
  let proxyUrl: string, ctlUrl: string, preUrl: string, sharerUrl: string;

  before(async () => {
    const t0 = Date.now();
    hosts = await createHosts(['ctl', 'pre', 'dec', 'redis']);
    A = hosts.addr;
    dir = tempDir('kvc-netns-');
    timings.push(`namespaces up in ${Date.now() - t0} ms`);
    const remote = `redis://${A.redis}:6379/0`;
    start('redis', 'redis', findRedisServer()!, ['--bind', A.redis!, '--port', '6379', '--protected-mode', 'no', '--maxmemory', '256mb', ...REDIS_SERVER_SETTINGS]);
    const yaml = (name: string, body: Record<string, unknown>) => {
      const p = join(dir, `${name}.yaml`);
      writeFileSync(p, Object.entries(body).map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join('\n') + '\n');
      return p;
    };
    const common = { chunk_size: 16, local_cpu: true, max_local_cpu_size: 0.05, enable_controller: true, controller_url: `${A.ctl}:9001`, remote_url: remote, remote_timeout_ms: 500 };
    // The instances bind every interface (distributed_url 0.0.0.0, the receiver too) and register
    // the engine's --advertise-host.
    const pre = yaml('prefiller-0', { ...common, kvc_instance_id: 'prefiller-0', kvc_worker_port: 7700, distributed_url: '0.0.0.0:7800', enable_xfer: true, xfer_role: 'sender', xfer_proxy_host: A.ctl, xfer_proxy_port: 7500 });
    const dec = yaml('decoder-0', { ...common, kvc_instance_id: 'decoder-0', kvc_worker_port: 7750, distributed_url: '0.0.0.0:7850', enable_xfer: true, xfer_role: 'receiver', xfer_peer_host: '0.0.0.0', xfer_peer_init_port: 7300, xfer_peer_alloc_port: 7400 });
    const sharer = yaml('sharer', { chunk_size: 16, local_cpu: true, max_local_cpu_size: 0.05, remote_url: remote, remote_timeout_ms: 500 });
    kvc('controller', 'ctl', ['controller', '--host', '0.0.0.0', '--advertise-host', A.ctl!, '--port', '9000', '--monitor-port', '9001']);
    ctlUrl = `http://${A.ctl}:9000`;
    await waitUntil('the controller', healthy('ctl', `${ctlUrl}/healthz`));
    const engine = (host: string[], port: number, role: string, extra: Record<string, unknown> = {}) =>
      ['engine', ...host, '--port', String(port), '--model', MODEL, '--max-model-len', '512', '--kv-transfer-config', JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: role, ...extra })];
    kvc('prefiller-0', 'pre', engine(['--host', '0.0.0.0', '--advertise-host', A.pre!], 7100, 'kv_producer'), { KVC_CONFIG_FILE: pre });
    kvc('decoder-0', 'dec', engine(['--host', '0.0.0.0', '--advertise-host', A.dec!], 7200, 'kv_consumer', { kv_connector_extra_config: { skip_last_n_tokens: 1 } }), { KVC_CONFIG_FILE: dec });
    // Bound to its host's address: advertised as that address by default.
    kvc('sharer', 'dec', engine(['--host', A.dec!], 7201, 'kv_both'), { KVC_CONFIG_FILE: sharer });
    preUrl = `http://${A.pre}:7100`;
    sharerUrl = `http://${A.dec}:7201`;
    await waitUntil('the engines', async () =>
      (await healthy('ctl', `${preUrl}/health`)()) && (await healthy('ctl', `http://${A.dec}:7200/health`)()) && (await healthy('ctl', `${sharerUrl}/health`)()),
    );
    kvc('proxy', 'ctl', [
      'proxy', '--host', '0.0.0.0', '--advertise-host', A.ctl!, '--port', '9100', '--proxy-host', '0.0.0.0', '--proxy-port', '7500',
      '--prefiller-host', A.pre!, '--prefiller-port', '7100', '--decoder-host', A.dec!, '--decoder-port', '7200',
      '--decoder-init-port', '7300', '--decoder-alloc-port', '7400',
      '--prefill-timeout', '15', '--decode-timeout', '30', '--idle-timeout', '10', '--health-interval', '1',
    ]);
    proxyUrl = `http://${A.ctl}:9100`;
    await waitUntil('the proxy', healthy('ctl', `${proxyUrl}/health`));
    timings.push(`all processes healthy ${Date.now() - t0} ms after start`);
  });

  after(async () => {
    for (const p of procs.reverse()) {
      if (p.child.exitCode === null && p.child.signalCode === null) {
        p.child.kill('SIGKILL');
        await new Promise((r) => p.child.once('exit', r));
      }
    }
    hosts?.teardown();
    if (dir) rmSync(dir, { recursive: true, force: true });
    if (timings.length) process.stdout.write(`# multi-host timings: ${timings.join('; ')}\n`);
  });

  it('the controller registered each cache instance at its host\'s advertised address', async () => {
    let instances: any[] = [];
    await waitUntil('both instances registered', async () => {
      instances = (await request('ctl', 'GET', `${ctlUrl}/instances`)).json?.instances ?? [];
      return instances.length === 2;
    }, 60_000);
    const byId = Object.fromEntries(instances.map((i) => [i.instance_id, i.workers[0]]));
    assert.deepEqual(
      { pre: [byId['prefiller-0']?.ip, byId['prefiller-0']?.distributed_url], dec: [byId['decoder-0']?.ip, byId['decoder-0']?.distributed_url] },
      { pre: [A.pre, `${A.pre}:7800`], dec: [A.dec, `${A.dec}:7850`] },
      JSON.stringify(instances),
    );
    // Started with --host 0.0.0.0 --advertise-host: each says where it is reached.
    const ctlLog = procs.find((p) => p.name === 'controller')!.out();
    assert.match(ctlLog, new RegExp(`http://${A.ctl!.replace(/\./g, '\\.')}:9000`), 'the controller prints its advertised URL');
    assert.match(procs.find((p) => p.name === 'decoder-0')!.out(), new RegExp(`engine listening on http://${A.dec!.replace(/\./g, '\\.')}:7200 \\(bound on 0\\.0\\.0\\.0\\)`));
  });

  it('greedy output through the proxy across hosts equals a single engine; a prefix is shared through the remote tier both ways', async () => {
    // Computed by the single engine on host dec (written to Redis on host redis) ...
    const p1 = ids(40, 1);
    const truth1 = await complete('ctl', sharerUrl, p1);
    assert.equal(truth1.cached, 0);
    await waitUntil('the sharer\'s chunks on the remote tier', async () => (await metric('ctl', sharerUrl, 'kvc_remote_puts_total', 'outcome="written"')) >= 3, 30_000);
    // ... then served 1P1D across hosts: the prefiller on host pre reads it through the remote tier.
    const viaProxy1 = await complete('ctl', proxyUrl, p1);
    timings.push(`1P1D request (remote hit on the prefiller) ${viaProxy1.ms} ms`);
    assert.equal(viaProxy1.text, truth1.text);
    assert.ok((await metric('ctl', preUrl, 'kvc_remote_gets_total', 'outcome="hit"')) >= 2, 'the prefiller read the prefix from the remote tier');
    // The other way: computed 1P1D first, then a hit for the single engine on another host.
    const p2 = ids(40, 2);
    const viaProxy2 = await complete('ctl', proxyUrl, p2);
    timings.push(`1P1D request (computed) ${viaProxy2.ms} ms`);
    await waitUntil('the prefiller\'s chunks on the remote tier', async () => (await metric('ctl', preUrl, 'kvc_remote_puts_total', 'outcome="written"')) >= 3, 30_000);
    const shared = await complete('ctl', sharerUrl, p2);
    assert.equal(shared.cached, 39, 'the single engine loaded the prefix computed on the prefiller\'s host');
    assert.equal(shared.text, viaProxy2.text);
  });

  it('the controller moves a prompt\'s chunks from the prefiller\'s host to the decoder\'s host', async () => {
    const p = ids(48, 3);
    await complete('ctl', proxyUrl, p);
    const lookup = async () => (await request('ctl', 'POST', `${ctlUrl}/lookup`, { tokens: p })).json;
    await waitUntil('the prefiller\'s chunks in the controller index', async () => (await lookup()).layout_detail?.['prefiller-0']?.matched_tokens >= 48, 30_000);
    const t0 = Date.now();
    const mv = await request('ctl', 'POST', `${ctlUrl}/move`, { old_position: ['prefiller-0', 'LocalCPUBackend'], new_position: ['decoder-0', 'LocalCPUBackend'], tokens: p, copy: false });
    assert.equal(mv.status, 200, mv.text);
    const id = mv.json.event_id as string;
    let ev: any;
    await waitUntil('the move to finish', async () => {
      ev = (await request('ctl', 'GET', `${ctlUrl}/events/${id}`)).json;
      return ev.status === 'finished' || ev.status === 'failed';
    }, 60_000);
    timings.push(`controller move of 3 chunks between hosts ${Date.now() - t0} ms`);
    assert.equal(ev.status, 'finished', JSON.stringify(ev));
    const after = await lookup();
    assert.ok(after.layout_detail['decoder-0']?.matched_tokens >= 48, JSON.stringify(after));
    assert.equal(after.layout_detail['prefiller-0'], undefined, 'moved, not copied');
  });

  it('the decoder\'s link cut mid-request: the request ends within a bound, nothing hangs, service resumes', async () => {
    const p = ids(60, 4);
    const inflight = request('ctl', 'POST', `${proxyUrl}/v1/completions`, { model: MODEL, prompt: p, max_tokens: 200, temperature: 0, ignore_eos: true }, 120_000);
    await new Promise((r) => setTimeout(r, 300));
    hosts.link('dec', false);
    let r: Reply;
    try {
      r = await inflight;
    } finally {
      hosts.link('dec', true);
    }
    timings.push(`request with the decoder's link cut ended after ${r.ms} ms with HTTP ${r.status}`);
    assert.ok(r.status !== 0, `the proxy answered (${r.text})`);
    if (r.status !== 200) {
      assert.ok([502, 503, 504].includes(r.status), `a clean upstream error, not ${r.status}: ${r.text}`);
      assert.equal(typeof r.json?.error?.message, 'string', `OpenAI-shaped error: ${r.text}`);
    } else {
      assert.equal(r.json.usage.completion_tokens, 200, 'a 200 carries the whole completion');
    }
    const t0 = Date.now();
    let again: Reply | undefined;
    await waitUntil('service to resume after the link is back', async () => {
      again = await request('ctl', 'POST', `${proxyUrl}/v1/completions`, { model: MODEL, prompt: ids(30, 5), max_tokens: 4, temperature: 0, ignore_eos: true }, 30_000);
      return again.status === 200;
    }, 120_000);
    timings.push(`service resumed ${Date.now() - t0} ms after the link came back`);
    for (const proc of procs) assert.equal(proc.child.exitCode, null, `${proc.name} is still running`);
  });
});

// Bind and advertised addresses (src/common/address.ts): what each flag accepts and refuses, the
// default advertised address (the bind address, or the hostname for a wildcard), the cache
// instance's addresses (distributed_url's host binds; advertise_host / --advertise-host /
// the engine's address are registered), and the engine, the cache YAML and the CLI refusing a bad
// value with a message naming the flag or key.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { hostname } from 'node:os';
import { checkAdvertiseHost, checkBindHost, instanceAddresses, isWildcardHost, resolveAdvertiseHost, urlHost } from '../../src/common/address.js';
import { validateCacheConfig } from '../../src/common/config.js';
import { resolveEngineSettings } from '../../src/engine/settings.js';
import { makePlan } from '../../src/deploy/plan.js';
import { CLI } from '../../harness/proc.js';

describe('addresses', () => {
  it('bind addresses: IPs (wildcards included) and host names; anything else is refused naming the flag', () => {
    for (const ok of ['127.0.0.1', '0.0.0.0', '::', '::1', 'localhost', 'prefiller-0', 'dec-0.example.internal', '[::1]']) assert.equal(checkBindHost('--host', ok), ok);
    for (const [bad, why] of [['', /empty/], ['a b', /letters, digits/], ['http://x', /without a scheme/], ['x:80', /without a port/], ['10.0.0.256', /IPv4/], ['-x', /letters, digits/]] as const) {
      assert.throws(() => checkBindHost('--host', bad), (e: Error) => e.message.startsWith('--host: ') && why.test(e.message), bad);
    }
  });

  it('advertised addresses are never wildcards; the default is the bind address or the hostname', () => {
    assert.equal(checkAdvertiseHost('--advertise-host', '10.0.0.2'), '10.0.0.2');
    for (const w of ['0.0.0.0', '::']) {
      assert.ok(isWildcardHost(w));
      assert.throws(() => checkAdvertiseHost('--advertise-host', w), /^Error: --advertise-host: .* binds every interface/);
    }
    assert.equal(resolveAdvertiseHost('--advertise-host', undefined, '10.0.0.2'), '10.0.0.2');
    assert.equal(resolveAdvertiseHost('--advertise-host', undefined, '0.0.0.0'), hostname());
    assert.equal(resolveAdvertiseHost('--advertise-host', undefined, '::'), hostname());
    assert.equal(resolveAdvertiseHost('--advertise-host', 'node-a', '0.0.0.0'), 'node-a');
    assert.equal(urlHost('::1'), '[::1]');
    assert.equal(urlHost('10.0.0.1'), '10.0.0.1');
  });

  it("a cache instance binds distributed_url's host (else the engine's --host) and registers the advertised one", () => {
    const engine = (bindHost: string, advertiseHost: string, advertiseExplicit: boolean) => ({ bindHost, advertiseHost, advertiseExplicit });
    // As before --advertise-host existed: a concrete distributed_url is both.
    assert.deepEqual(instanceAddresses({ distributed_url: '10.0.0.2:7800' }, engine('127.0.0.1', '127.0.0.1', false)), { bindHost: '10.0.0.2', advertiseHost: '10.0.0.2' });
    // A wildcard bind registers the engine's advertised address.
    assert.deepEqual(instanceAddresses({ distributed_url: '0.0.0.0:7800' }, engine('0.0.0.0', 'pre-0', true)), { bindHost: '0.0.0.0', advertiseHost: 'pre-0' });
    assert.deepEqual(instanceAddresses({ distributed_url: '0.0.0.0:7800' }, engine('10.0.0.2', '10.0.0.2', false)), { bindHost: '0.0.0.0', advertiseHost: '10.0.0.2' });
    // An explicit --advertise-host names the instance too; the YAML's advertise_host wins over both.
    assert.deepEqual(instanceAddresses({ distributed_url: '10.0.0.2:7800' }, engine('0.0.0.0', 'pre-0', true)), { bindHost: '10.0.0.2', advertiseHost: 'pre-0' });
    assert.deepEqual(instanceAddresses({ distributed_url: '0.0.0.0:7800', advertise_host: 'cache-a' }, engine('0.0.0.0', 'pre-0', true)), { bindHost: '0.0.0.0', advertiseHost: 'cache-a' });
    // Without distributed_url the worker port binds the engine's --host (no assumed 127.0.0.1).
    assert.deepEqual(instanceAddresses({ distributed_url: null }, engine('10.0.0.7', '10.0.0.7', false)), { bindHost: '10.0.0.7', advertiseHost: '10.0.0.7' });
  });

  it('the cache YAML key advertise_host accepts an address and refuses a wildcard, naming the key', () => {
    assert.equal(validateCacheConfig({ advertise_host: 'node-a' }).config.advertise_host, 'node-a');
    assert.equal(validateCacheConfig({}).config.advertise_host, null);
    assert.throws(() => validateCacheConfig({ advertise_host: '0.0.0.0' }, 'c.yaml'), /c\.yaml: key "advertise_host": expected the IP address or host name peers reach this instance at/);
    assert.throws(() => validateCacheConfig({ advertise_host: 7 }, 'c.yaml'), /key "advertise_host"/);
  });

  it('engine settings: --advertise-host defaults and refusals name the flag', () => {
    const s = resolveEngineSettings({ host: '0.0.0.0' });
    assert.equal(s.advertiseHost, hostname());
    assert.equal(s.advertiseExplicit, false);
    assert.equal(resolveEngineSettings({ host: '0.0.0.0', advertiseHost: 'p0' }).advertiseHost, 'p0');
    assert.throws(() => resolveEngineSettings({ advertiseHost: '::' }), /^Error: --advertise-host: :: binds every interface/);
    assert.throws(() => resolveEngineSettings({ host: 'bad host' }), /^Error: --host: expected an IP address or host name/);
  });

  it('a one-machine plan binds --host and hands out --advertise-host', () => {
    const plan = makePlan({ prefillers: 1, decoders: 1, model: 'builtin:tiny', portOffset: 0, controller: true, host: '0.0.0.0', advertiseHost: 'box-1', placement: { kind: 'shared' } });
    const p = plan.engines[0]!;
    assert.equal(p.cacheConfig.controller_url, 'box-1:9001');
    assert.equal(p.cacheConfig.xfer_proxy_host, 'box-1');
    assert.equal(p.cacheConfig.distributed_url, '0.0.0.0:7800');
    // The loopback default still gives the examples' files and no --advertise-host flag.
    const local = makePlan({ prefillers: 1, decoders: 1, model: 'builtin:tiny', portOffset: 0, controller: true, host: '127.0.0.1' });
    assert.equal(local.engines[1]!.cacheConfig.xfer_peer_host, '127.0.0.1');
  });

  it('every process refuses a bad --host or --advertise-host at start, naming the flag', () => {
    const run = (args: string[]) => spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 30_000 });
    for (const [args, re] of [
      [['controller', '--advertise-host', '0.0.0.0'], /--advertise-host: 0\.0\.0\.0 binds every interface/],
      [['controller', '--host', 'a b'], /--host: expected an IP address or host name/],
      [['proxy', '--advertise-host', 'x:80'], /--advertise-host: .*without a port/],
      [['proxy', '--proxy-host', 'http://x'], /--proxy-host: .*without a scheme/],
      [['engine', '--advertise-host', '::'], /--advertise-host: :: binds every interface/],
    ] as const) {
      const r = run([...args]);
      assert.notEqual(r.status, 0, args.join(' '));
      assert.match(r.stderr, re, args.join(' '));
    }
  });
});

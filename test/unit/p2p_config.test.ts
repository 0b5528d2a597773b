// The P2P switch (docs/p2p.md) is never silently ignored: enable_p2p needs the controller,
// p2p_timeout_ms needs enable_p2p, --enable-p2p needs a cache instance and the controller, and
// the LMCache name enable_p2p is kvc's own key (accepted on and off).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { P2P_DEFAULTS, validateCacheConfig } from '../../src/common/config.js';
import { resolveEngineSettings } from '../../src/engine/settings.js';
import { makePlan } from '../../src/deploy/plan.js';
import { tempDir } from '../../harness/temp_dir.js';

const CTL = { enable_controller: true, controller_url: '127.0.0.1:9001', kvc_worker_port: 7700 };

test('enable_p2p needs the controller; p2p_timeout_ms needs enable_p2p', () => {
  assert.throws(() => validateCacheConfig({ enable_p2p: true }), /key "enable_p2p": needs the controller/);
  assert.throws(() => validateCacheConfig({ ...CTL, p2p_timeout_ms: 500 }), /key "p2p_timeout_ms": only meaningful with enable_p2p/);
  assert.throws(() => validateCacheConfig({ ...CTL, enable_p2p: true, p2p_timeout_ms: 0 }), /key "p2p_timeout_ms"/);
  assert.throws(() => validateCacheConfig({ ...CTL, enable_p2p: 'yes' }), /key "enable_p2p"/);
  const on = validateCacheConfig({ ...CTL, enable_p2p: true }).config;
  assert.equal(on.enable_p2p, true);
  assert.equal(on.p2p_timeout_ms, null);
  assert.equal(P2P_DEFAULTS.p2p_timeout_ms, 1000);
  assert.equal(validateCacheConfig({ ...CTL, enable_p2p: true, p2p_timeout_ms: 250 }).config.p2p_timeout_ms, 250);
  assert.equal(validateCacheConfig({ enable_p2p: false }).config.enable_p2p, false);
  // LMCache's lookup_url is still only accepted off: kvc asks the controller of controller_url.
  assert.throws(() => validateCacheConfig({ ...CTL, enable_p2p: true, lookup_url: 'localhost:8100' }), /key "lookup_url"/);
});

test('--enable-p2p sets enable_p2p, and says why it cannot', () => {
  const dir = tempDir('kvc-p2p-cfg-');
  const withCtl = join(dir, 'ctl.yaml');
  writeFileSync(withCtl, 'enable_controller: true\ncontroller_url: 127.0.0.1:9001\nkvc_worker_port: 7700\np2p_timeout_ms: 300\n');
  const plain = join(dir, 'plain.yaml');
  writeFileSync(plain, 'chunk_size: 64\n');
  const s = resolveEngineSettings({ enablePrefixCaching: true, enableP2p: true, env: { KVC_CONFIG_FILE: withCtl } });
  assert.equal(s.cacheConfig?.enable_p2p, true);
  assert.equal(s.cacheConfig?.p2p_timeout_ms, 300, 'a key that needs enable_p2p is accepted when the flag sets it');
  // Without the flag the same file is refused (p2p_timeout_ms would do nothing).
  assert.throws(() => resolveEngineSettings({ enablePrefixCaching: true, env: { KVC_CONFIG_FILE: withCtl } }), /p2p_timeout_ms/);
  assert.throws(() => resolveEngineSettings({ enablePrefixCaching: true, enableP2p: true, env: { KVC_CONFIG_FILE: plain } }), /^Error: --enable-p2p: .*key "enable_p2p": needs the controller/);
  assert.throws(() => resolveEngineSettings({ enableP2p: true, env: {} }), /--enable-p2p: needs a cache instance/);
});

test('kvc up turns P2P on for every engine when it runs a controller, and only then', () => {
  const on = makePlan({ prefillers: 2, decoders: 2, model: 'builtin:tiny', portOffset: 0, controller: true, host: '127.0.0.1' });
  for (const e of on.engines) assert.equal(validateCacheConfig(e.cacheConfig, e.name).config.enable_p2p, true, e.name);
  const off = makePlan({ prefillers: 1, decoders: 1, model: 'builtin:tiny', portOffset: 0, controller: false, host: '127.0.0.1' });
  for (const e of off.engines) assert.equal(validateCacheConfig(e.cacheConfig, e.name).config.enable_p2p, false, e.name);
  // kvc up --no-p2p: the controller without P2P.
  const noP2p = makePlan({ prefillers: 1, decoders: 1, model: 'builtin:tiny', portOffset: 0, controller: true, p2p: false, host: '127.0.0.1' });
  for (const e of noP2p.engines) {
    const c = validateCacheConfig(e.cacheConfig, e.name).config;
    assert.deepEqual([c.enable_controller, c.enable_p2p], [true, false], e.name);
  }
});

// LMCache-compatible configuration: an LMCache YAML and connector JSON start as they are (their
// names mapped to kvc's), file:// paths become directories, LMCache features kvc lacks are
// accepted only switched off, and a typo stops start-up with the closest key.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cacheConfigFromEnv, loadCacheConfig, parseConnectorConfig, validateCacheConfig } from '../../src/common/config.js';
import { CACHE_KEY_ALIASES } from '../../src/common/config_aliases.js';

const dir = mkdtempSync(join(tmpdir(), 'kvc-config-alias-'));
const yaml = (name: string, text: string) => {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
};

test('an LMCache decoder YAML loads with its names mapped, and says which', () => {
  const p = yaml(
    'lmcache-decoder.yaml',
    `chunk_size: 256
local_cpu: true
max_local_cpu_size: 2
local_disk: "file:///tmp/kvc-lm-disk/"
max_local_disk_size: 1
remote_serde: "naive"
save_decode_cache: false
enable_blending: false
enable_controller: true
lmcache_instance_id: "decoder-1"
controller_url: "localhost:9001"
lmcache_worker_port: 8002
enable_nixl: true
enable_xpyd: true
nixl_role: "receiver"
nixl_peer_host: "localhost"
nixl_peer_init_port: 7300
nixl_peer_alloc_port: 7400
nixl_buffer_size: 2147483648
nixl_buffer_device: "cpu"
nixl_backends: ["tcp"]
`,
  );
  const { config, notes, warnings } = loadCacheConfig(p);
  assert.deepEqual(warnings, []);
  assert.equal(config.local_disk, '/tmp/kvc-lm-disk/');
  assert.equal(config.kvc_instance_id, 'decoder-1');
  assert.equal(config.kvc_worker_port, 8002);
  assert.equal(config.enable_xfer, true);
  assert.equal(config.xfer_role, 'receiver');
  assert.equal(config.xfer_peer_init_port, 7300);
  assert.equal(config.xfer_buffer_size, 2147483648);
  assert.ok(notes.some((n) => /LMCache key "lmcache_worker_port" read as "kvc_worker_port"/.test(n)));
  assert.ok(notes.some((n) => /local_disk file:\/\/\/tmp\/kvc-lm-disk\/ read as the directory \/tmp\/kvc-lm-disk\//.test(n)));
});

test('every alias maps to a kvc key', () => {
  const known = new Set(Object.keys(validateCacheConfig({}).config));
  for (const [from, to] of Object.entries(CACHE_KEY_ALIASES)) assert.ok(known.has(to), `${from} → ${to}`);
});

test('lmcache_worker_ports with one port is the worker port; more is refused', () => {
  assert.equal(validateCacheConfig({ lmcache_worker_ports: [8100] }).config.kvc_worker_port, 8100);
  assert.throws(() => validateCacheConfig({ lmcache_worker_ports: [8100, 8101] }), /lmcache_worker_ports": LMCache lists one value per tensor-parallel rank; a kvc instance has one worker/);
});

test('an LMCache feature switched on is refused with the reason; off is accepted', () => {
  assert.throws(() => validateCacheConfig({ enable_blending: true }), /key "enable_blending": only false is accepted \(CacheBlend is not implemented\); found true/);
  assert.throws(() => validateCacheConfig({ save_decode_cache: true }), /save_decode_cache/);
  assert.throws(() => validateCacheConfig({ remote_serde: 'cachegen', remote_url: 'redis://127.0.0.1:6379' }), /remote_serde.*cachegen and kivi are GPU codecs/);
  assert.throws(() => validateCacheConfig({ cache_policy: 'LFU' }), /cache_policy.*eviction is LRU/);
  assert.equal(validateCacheConfig({ cache_policy: 'LRU', use_layerwise: false, enable_p2p: false }).config.chunk_size, 256);
});

test('a key under both names, a non-file URL, and typos are errors', () => {
  assert.throws(() => validateCacheConfig({ kvc_instance_id: 'a', lmcache_instance_id: 'b' }, 'x.yaml'), /x\.yaml: key "kvc_instance_id" is given twice \(also as "lmcache_instance_id"\)/);
  assert.throws(() => validateCacheConfig({ local_disk: 's3://bucket/x' }), /local_disk": expected a directory or a file:\/\/ URL/);
  assert.equal(validateCacheConfig({ local_disk: '/var/kvc' }).config.local_disk, '/var/kvc');
  assert.throws(() => validateCacheConfig({ max_local_cpu_sise: 1 }), /unknown key "max_local_cpu_sise" \(did you mean "max_local_cpu_size"\?\)/);
  assert.throws(() => validateCacheConfig({ lmcache_instance: 'x' }), /did you mean "lmcache_instance_id"/);
  assert.throws(() => validateCacheConfig({ totally_unrelated_setting: 1 }), (e: Error) => /unknown key "totally_unrelated_setting"/.test(e.message) && !/did you mean/.test(e.message));
});

test('an LMCache connector JSON is read as kvc\'s', () => {
  const c = parseConnectorConfig('{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_producer","kv_connector_extra_config":{"discard_partial_chunks":false,"lmcache_rpc_port":"producer1"}}');
  assert.equal(c.config.kv_connector, 'KvcConnectorV1');
  assert.equal(c.config.kv_connector_extra_config.kvc_rpc_port, 'producer1');
  assert.equal(c.notes.length, 2);
});

test('LMCACHE_CONFIG_FILE is read when KVC_CONFIG_FILE is unset; two different files are an error', () => {
  const p = yaml('lm-env.yaml', 'chunk_size: 64\n');
  assert.equal(cacheConfigFromEnv({ LMCACHE_CONFIG_FILE: p }).config.chunk_size, 64);
  assert.equal(cacheConfigFromEnv({ LMCACHE_CONFIG_FILE: p, KVC_CONFIG_FILE: p }).config.chunk_size, 64);
  assert.throws(() => cacheConfigFromEnv({ LMCACHE_CONFIG_FILE: p, KVC_CONFIG_FILE: '/other.yaml' }), /KVC_CONFIG_FILE and LMCACHE_CONFIG_FILE are set to different values/);
});

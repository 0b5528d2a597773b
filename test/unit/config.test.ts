// Cache YAML and connector JSON validation (keys: docs/configuration.md).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadCacheConfig, parseConnectorConfig, validateCacheConfig, ConfigError } from '../../src/common/config.js';
import { tempDir } from '../../harness/temp_dir.js';

const dir = tempDir();
function yaml(name: string, text: string): string {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
}

test('the reference prefiller YAML loads with every key typed', () => {
  const p = yaml(
    'prefiller.yaml',
    `chunk_size: 256
local_cpu: true
max_local_cpu_size: 5
max_local_disk_size: 0
enable_controller: true
kvc_instance_id: prefiller0
controller_url: "localhost:9001"
kvc_worker_port: 8001
distributed_url: "localhost:8101"
enable_xfer: true
enable_xpyd: true
xfer_role: sender
xfer_proxy_host: localhost
xfer_proxy_port: 7500
xfer_buffer_size: 1073741824
xfer_buffer_device: cuda
`,
  );
  const { config, warnings } = loadCacheConfig(p);
  assert.deepEqual(warnings, []);
  assert.equal(config.chunk_size, 256);
  assert.equal(config.max_local_cpu_size, 5);
  assert.equal(config.xfer_role, 'sender');
  assert.equal(config.xfer_proxy_port, 7500);
  assert.equal(config.local_disk, null);
});

test('the reference decoder YAML (receiver) loads; sizes accept floats', () => {
  const { config } = validateCacheConfig({
    chunk_size: 256, local_cpu: false, max_local_cpu_size: 0.5, enable_xfer: true, enable_xpyd: true, xfer_role: 'receiver',
    xfer_peer_host: 'localhost', xfer_peer_init_port: 7300, xfer_peer_alloc_port: 7400, xfer_buffer_size: 2147483648,
    xfer_buffer_device: 'cuda', xfer_backends: ['tcp'],
  });
  assert.equal(config.max_local_cpu_size, 0.5);
  assert.equal(config.xfer_peer_alloc_port, 7400);
});

test('a wrong type names the file, the key, what was expected and what was found', () => {
  const p = yaml('bad.yaml', 'chunk_size: "big"\n');
  assert.throws(() => loadCacheConfig(p), (e: Error) => {
    assert.ok(e instanceof ConfigError);
    assert.match(e.message, new RegExp(`^${p.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: key "chunk_size": .*number.*found the string "big"`));
    return true;
  });
  assert.throws(() => validateCacheConfig({ chunk_size: 0 }, 'x.yaml'), /x.yaml: key "chunk_size".*found number 0/);
  assert.throws(() => validateCacheConfig({ max_local_cpu_size: -1 }), /key "max_local_cpu_size": expected a size in GiB >= 0/);
  assert.throws(() => validateCacheConfig({ xfer_role: 'both' }), /key "xfer_role"/);
  assert.throws(() => validateCacheConfig({ controller_url: 'localhost' }), /key "controller_url": expected "host:port"/);
  assert.throws(() => validateCacheConfig({ local_cpu: 'yes' }), /key "local_cpu".*found the string "yes"/);
});

test('a bad value inside a nested key reports that value, not its container', () => {
  const p = yaml('nested.yaml', 'xfer_backends: [1]\n');
  assert.throws(() => loadCacheConfig(p), (e: Error) => {
    assert.match(e.message, /key "xfer_backends\[0\]": .*found number 1$/);
    assert.doesNotMatch(e.message, /array/);
    return true;
  });
  assert.throws(() => validateCacheConfig({ xfer_backends: ['tcp', true] }), /key "xfer_backends\[1\]".*found (the )?boolean true/);
});

test('cross-key rules: receivers need ports, disk needs a directory, unknown backends refused', () => {
  assert.throws(() => validateCacheConfig({ enable_xfer: true, xfer_role: 'receiver', xfer_peer_host: 'h', xfer_peer_init_port: 1 }), /xfer_peer_alloc_port/);
  assert.throws(() => validateCacheConfig({ max_local_disk_size: 1 }), /key "local_disk": required/);
  assert.throws(
    () => validateCacheConfig({ enable_xfer: true, xfer_role: 'receiver', xfer_peer_host: 'h', xfer_peer_init_port: 1, xfer_peer_alloc_port: 2, xfer_backends: ['nixl'] }),
    /key "xfer_backends": unknown backend "nixl"/,
  );
  assert.throws(() => validateCacheConfig({ enable_controller: true }), /controller_url/);
});

test('unknown keys stop start-up with a did-you-mean; an empty file gives defaults; bad YAML is an error', () => {
  assert.throws(() => loadCacheConfig(yaml('unk.yaml', 'chunk_sise: 16\n')), /unk\.yaml: unknown key "chunk_sise" \(did you mean "chunk_size"\?\)/);
  assert.equal(loadCacheConfig(yaml('empty.yaml', '')).config.local_cpu, true);
  assert.throws(() => loadCacheConfig(yaml('broken.yaml', 'a: [1, 2\n')), /not valid YAML/);
  assert.throws(() => loadCacheConfig(join(dir, 'missing.yaml')), /cannot read cache configuration/);
  assert.throws(() => loadCacheConfig(yaml('list.yaml', '- 1\n- 2\n')), /expected a mapping/);
});

test('connector JSON: spec roles parse, defaults fill in, errors name the key', () => {
  const p = parseConnectorConfig(
    '{"kv_connector":"KvcConnectorV1","kv_role":"kv_consumer","kv_connector_extra_config":{"discard_partial_chunks":false,"kvc_rpc_port":"consumer1","skip_last_n_tokens":1}}',
  );
  assert.equal(p.config.kv_role, 'kv_consumer');
  assert.equal(p.config.kv_connector_extra_config.skip_last_n_tokens, 1);
  const both = parseConnectorConfig('{"kv_connector":"KvcConnectorV1","kv_role":"kv_both"}');
  assert.equal(both.config.kv_connector_extra_config.discard_partial_chunks, false);
  assert.throws(() => parseConnectorConfig('{"kv_connector":"Other","kv_role":"kv_both"}'), /key "kv_connector": expected "KvcConnectorV1"/);
  assert.throws(() => parseConnectorConfig('{"kv_connector":"KvcConnectorV1","kv_role":"kv_x"}'), /key "kv_role"/);
  assert.throws(
    () => parseConnectorConfig('{"kv_connector":"KvcConnectorV1","kv_role":"kv_both","kv_connector_extra_config":{"skip_last_n_tokens":-1}}'),
    /key "kv_connector_extra_config.skip_last_n_tokens"/,
  );
  assert.throws(() => parseConnectorConfig('{nope'), /not valid JSON/);
  assert.throws(() => parseConnectorConfig('{"kv_connector":"KvcConnectorV1","kv_role":"kv_both","extra":1}'), /unknown key "extra"/);
  assert.throws(
    () => parseConnectorConfig('{"kv_connector":"KvcConnectorV1","kv_role":"kv_both","kv_connector_extra_config":{"skip_last_n_token":1}}'),
    /unknown key "kv_connector_extra_config.skip_last_n_token" \(did you mean "skip_last_n_tokens"\?\)/,
  );
});

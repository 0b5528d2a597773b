// LMCache's current configuration names (pd_*, transfer_channel, p2p_host/p2p_init_ports,
// controller_pull_url, scalar lmcache_worker_ports) and cache keys set as LMCACHE_<KEY> /
// KVC_<KEY> variables: honoured where kvc can do what they mean, refused by name otherwise, and a
// variable that disagrees with the file stops start-up naming both.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cacheConfigFromEnv, loadCacheConfig, validateCacheConfig } from '../../src/common/config.js';

const dir = mkdtempSync(join(tmpdir(), 'kvc-lmcache-names-'));
const yaml = (name: string, text: string) => {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
};

// The shape of LMCache's disaggregated-prefill example (examples/disagg_prefill/1p1d/configs).
const PREFILLER = `local_cpu: False
max_local_cpu_size: 0
max_local_disk_size: 0
remote_serde: NULL
enable_pd: True
transfer_channel: "nixl"
pd_role: "sender"
pd_proxy_host: "localhost"
pd_proxy_port: 7500
pd_buffer_size: 1073741824
pd_buffer_device: "cpu"
`;
const DECODER = `local_cpu: False
max_local_cpu_size: 0
enable_pd: True
transfer_channel: "nixl"
pd_role: "receiver"
pd_peer_host: "localhost"
pd_peer_init_port: [7300]
pd_peer_alloc_port: 7400
pd_buffer_size: 2147483648
pd_buffer_device: "cpu"
nixl_backends: [UCX]
`;

test("LMCache's disaggregated-prefill example files load with their current names, each alias said once", () => {
  const p = loadCacheConfig(yaml('prefiller.yaml', PREFILLER));
  assert.equal(p.config.enable_xfer, true);
  assert.equal(p.config.xfer_role, 'sender');
  assert.equal(p.config.xfer_proxy_host, 'localhost');
  assert.equal(p.config.xfer_proxy_port, 7500);
  assert.equal(p.config.xfer_buffer_size, 1073741824);
  assert.ok(p.notes.some((n) => /"transfer_channel" "nixl" read as kvc's TCP transfer \(xfer\); NIXL itself is not used/.test(n)), p.notes.join('\n'));
  assert.equal(p.notes.filter((n) => /"pd_role" read as "xfer_role"/.test(n)).length, 1);
  const d = loadCacheConfig(yaml('decoder.yaml', DECODER));
  assert.equal(d.config.xfer_role, 'receiver');
  assert.equal(d.config.xfer_peer_init_port, 7300, 'a one-rank list is the port');
  assert.equal(d.config.xfer_peer_alloc_port, 7400);
  assert.deepEqual(d.config.xfer_backends, ['tcp']);
  assert.ok(d.notes.some((n) => /nixl_backends.*UCX.*NIXL backends are not used/.test(n)));
});

test('per-rank lists take one value (kvc runs one worker); more are refused by name', () => {
  assert.equal(validateCacheConfig({ enable_controller: true, controller_pull_url: 'localhost:8300', lmcache_worker_ports: 8500 }).config.kvc_worker_port, 8500);
  assert.equal(validateCacheConfig({ enable_controller: true, controller_pull_url: 'localhost:8300', lmcache_worker_ports: [8500] }).config.controller_url, 'localhost:8300');
  assert.throws(() => validateCacheConfig({ lmcache_worker_ports: [8500, 8501] }), /key "lmcache_worker_ports": LMCache lists one value per tensor-parallel rank; a kvc instance has one worker/);
  assert.throws(() => validateCacheConfig({ pd_peer_init_port: [7300, 7301] }), /key "pd_peer_init_port"/);
  assert.throws(() => validateCacheConfig({ lmcache_worker_port: 1, lmcache_worker_ports: 2 }), /given twice/);
  assert.throws(() => validateCacheConfig({ enable_pd: true, enable_nixl: true }), /key "enable_xfer" is given twice/);
});

test("p2p_host + p2p_init_ports are this instance's peer address (distributed_url)", () => {
  const c = validateCacheConfig({ p2p_host: 'localhost', p2p_init_ports: 8200 }).config;
  assert.equal(c.distributed_url, 'localhost:8200');
  assert.equal(validateCacheConfig({ p2p_host: '10.0.0.2', p2p_init_ports: [8200] }).config.distributed_url, '10.0.0.2:8200');
  assert.throws(() => validateCacheConfig({ p2p_host: 'localhost' }), /keys "p2p_host" and "p2p_init_ports": give both/);
  assert.throws(() => validateCacheConfig({ p2p_host: 'h', p2p_init_ports: 1, distributed_url: 'h:2' }), /"distributed_url" is given twice/);
});

test('what kvc cannot do is refused by name with the reason, never dropped', () => {
  const cases: [Record<string, unknown>, RegExp][] = [
    [{ transfer_channel: 'mooncake' }, /key "transfer_channel": expected "nixl" or "tcp".*found "mooncake"/],
    [{ controller_reply_url: 'localhost:8400' }, /key "controller_reply_url": only null is accepted \(an instance and the controller talk over one connection/],
    [{ p2p_lookup_ports: 8201 }, /key "p2p_lookup_ports": only null is accepted \(P2P asks the controller/],
    [{ enable_async_loading: true }, /key "enable_async_loading": only false is accepted/],
    [{ lmcache_worker_ids: [1] }, /key "lmcache_worker_ids"/],
  ];
  for (const [doc, re] of cases) assert.throws(() => validateCacheConfig(doc), re);
  assert.equal(validateCacheConfig({ lmcache_worker_ids: [0], controller_reply_url: null }).config.chunk_size, 256);
});

test("LMCache's P2P + controller example is refused naming the first key kvc cannot honour", () => {
  const p = yaml(
    'p2p_example1.yaml',
    `chunk_size: 256
local_cpu: True
max_local_cpu_size: 5
enable_async_loading: True
enable_p2p: True
p2p_host: "localhost"
p2p_init_ports: 8200
p2p_lookup_ports: 8201
transfer_channel: "nixl"
enable_controller: True
lmcache_instance_id: "lmcache_instance_1"
controller_pull_url: "localhost:8300"
controller_reply_url: "localhost:8400"
lmcache_worker_ports: 8500
extra_config:
  lookup_backoff_time: 0.001
`,
  );
  assert.throws(() => loadCacheConfig(p), /p2p_example1\.yaml: key "enable_async_loading": only false is accepted \(asynchronous loading is not implemented\)/);
});

test('every cache key is settable as LMCACHE_<KEY> or KVC_<KEY>, typed as the key is', () => {
  const c = cacheConfigFromEnv({ LMCACHE_CHUNK_SIZE: '64', KVC_LOCAL_CPU: 'False', LMCACHE_MAX_LOCAL_CPU_SIZE: '0.5', LMCACHE_XFER_BACKENDS: 'tcp' });
  assert.equal(c.config.chunk_size, 64);
  assert.equal(c.config.local_cpu, false);
  assert.equal(c.config.max_local_cpu_size, 0.5);
  assert.deepEqual(c.config.xfer_backends, ['tcp']);
  assert.ok(c.notes.includes('LMCACHE_CHUNK_SIZE read as cache key "chunk_size"'), c.notes.join('\n'));
  // LMCache's names too, through the same aliases as in the file.
  const d = cacheConfigFromEnv({ LMCACHE_ENABLE_CONTROLLER: 'true', LMCACHE_CONTROLLER_PULL_URL: 'localhost:8300', LMCACHE_LMCACHE_WORKER_PORTS: '8500', LMCACHE_LOCAL_DISK: 'file:///tmp/kvc-env-disk/', LMCACHE_MAX_LOCAL_DISK_SIZE: '1' });
  assert.equal(d.config.controller_url, 'localhost:8300');
  assert.equal(d.config.kvc_worker_port, 8500);
  assert.equal(d.config.local_disk, '/tmp/kvc-env-disk/');
  assert.equal(cacheConfigFromEnv({ KVC_FUZZ_SEED: '3' }).config.chunk_size, 256, 'a KVC_ variable far from every key is not a cache key');
});

test('bad and unknown variables are refused naming the variable', () => {
  assert.throws(() => cacheConfigFromEnv({ LMCACHE_CHUNK_SIZE: 'big' }), /LMCACHE_CHUNK_SIZE: expected a number, found "big"/);
  assert.throws(() => cacheConfigFromEnv({ LMCACHE_LOCAL_CPU: 'maybe' }), /LMCACHE_LOCAL_CPU: expected true or false/);
  assert.throws(() => cacheConfigFromEnv({ LMCACHE_CHUNK_SIZE: '0' }), /key "chunk_size"/);
  assert.throws(() => cacheConfigFromEnv({ LMCACHE_USE_EXPERIMENTAL: 'True' }), /LMCACHE_USE_EXPERIMENTAL: not a cache key/);
  assert.throws(() => cacheConfigFromEnv({ KVC_CHUNK_SIZ: '64' }), /KVC_CHUNK_SIZ: not a cache key \(did you mean KVC_CHUNK_SIZE\?\)/);
  assert.throws(() => cacheConfigFromEnv({ LMCACHE_CHUNK_SIZE: '64', KVC_CHUNK_SIZE: '32' }), /KVC_CHUNK_SIZE and LMCACHE_CHUNK_SIZE set cache key "chunk_size" to different values/);
  assert.equal(cacheConfigFromEnv({ LMCACHE_CHUNK_SIZE: '64', KVC_CHUNK_SIZE: '64' }).config.chunk_size, 64);
});

test('with a file: a variable may set what the file leaves unset; both setting a key must agree', () => {
  const p = yaml('with-env.yaml', 'chunk_size: 128\nlmcache_instance_id: "a"\n');
  const ok = cacheConfigFromEnv({ KVC_CONFIG_FILE: p, LMCACHE_MAX_LOCAL_CPU_SIZE: '1', LMCACHE_CHUNK_SIZE: '128', KVC_KVC_INSTANCE_ID: 'a' });
  assert.equal(ok.config.max_local_cpu_size, 1);
  assert.equal(ok.config.chunk_size, 128);
  assert.throws(() => cacheConfigFromEnv({ KVC_CONFIG_FILE: p, LMCACHE_CHUNK_SIZE: '64' }), /LMCACHE_CHUNK_SIZE=64 and key "chunk_size" of .*with-env\.yaml \(128\) set "chunk_size" differently/);
  // Under another name of the same key, too.
  assert.throws(() => cacheConfigFromEnv({ KVC_CONFIG_FILE: p, KVC_KVC_INSTANCE_ID: 'b' }), /key "lmcache_instance_id" of .* set "kvc_instance_id" differently/);
});

test('docs/configuration.md lists every LMCache name kvc reads', async () => {
  const { readFileSync } = await import('node:fs');
  const { LMCACHE_NAMES } = await import('../../src/common/config_aliases.js');
  const page = readFileSync(join(process.cwd(), 'docs/configuration.md'), 'utf8');
  for (const n of LMCACHE_NAMES) assert.ok(page.includes(`\`${n}\``), `${n} is documented`);
});

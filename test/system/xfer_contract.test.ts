// The transfer contract on real processes (docs/xfer.md "Every transfer ends"): a decoder
// (kv_consumer) whose sender stalls in the middle of a chunk, or is killed there, still answers
// the request with the greedy tokens of a plain engine; the transfer ends by its deadline
// (xfer_deadline_floor_ms + bytes / 16 MiB/s), counted by outcome in kvc_xfer_transfers_total,
// and no reservation is left behind (kvc_xfer_reservations and kvc_xfer_reserved_bytes back to 0).
// The sender is a real process speaking the xfer protocol (harness/stalled_sender.ts).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fork, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stringify } from 'yaml';
import { chunkBytes, DType } from '../../src/common/chunk.js';
import { chunkKeys } from '../../src/common/keys.js';
import { freePortRange } from '../../harness/ports.js';
import { modelIdOf } from '../../src/engine/model_spec.js';
import { BUILTIN_MODELS } from '../../src/engine/model/formats/builtin.js';
import { postJson, startKvc, waitHttp, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

const here = dirname(fileURLToPath(import.meta.url));
const CHUNK = 16;
const spec = BUILTIN_MODELS.tiny!;
const layout = { dtype: DType.f32, numLayers: spec.numLayers, numKvHeads: spec.numKvHeads, headDim: spec.headDim };
const procs: Proc[] = [];
const senders: ChildProcess[] = [];
let base = 0;
// ports: base+0 plain engine, base+1 decoder, base+2 init, base+3 alloc
const url = (i: number) => `http://127.0.0.1:${base + i}`;

before(async () => {
  base = await freePortRange(4);
  const dir = tempDir('kvc-xfer-contract-');
  const cfg = join(dir, 'd.yaml');
  writeFileSync(
    cfg,
    stringify({
      chunk_size: CHUNK,
      local_cpu: false,
      max_local_cpu_size: 0,
      max_local_disk_size: 0,
      enable_xfer: true,
      xfer_role: 'receiver',
      xfer_peer_host: '127.0.0.1',
      xfer_peer_init_port: base + 2,
      xfer_peer_alloc_port: base + 3,
      xfer_buffer_size: 67108864,
      xfer_deadline_floor_ms: 1000,
    }),
  );
  const common = ['engine', '--model', 'builtin:tiny', '--max-num-seqs', '4', '--max-model-len', '1024'];
  procs.push(startKvc([...common, '--port', String(base)]));
  const connector = JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_consumer', kv_connector_extra_config: { discard_partial_chunks: false, kvc_rpc_port: 'decoder1' } });
  procs.push(startKvc([...common, '--port', String(base + 1), '--kv-transfer-config', connector], { KVC_CONFIG_FILE: cfg }));
  await Promise.all([0, 1].map((i) => waitHttp(`${url(i)}/health`, 120_000)));
});

after(async () => {
  for (const s of senders) if (s.exitCode === null) s.kill('SIGKILL');
  await Promise.all(procs.map((p) => p.kill()));
});

/** Starts a sender process that reserves `prompt`'s chunks for `reqId` and stops mid-chunk. */
async function stalledSender(reqId: string, prompt: number[]): Promise<ChildProcess> {
  const spans = chunkKeys(prompt, { modelId: modelIdOf('builtin:tiny'), chunkSize: CHUNK, seed: 0n });
  const chunks = spans.map((s) => [s.key, chunkBytes(layout, s.end - s.start)]);
  const args = { host: '127.0.0.1', initPort: base + 2, allocPort: base + 3, modelId: modelIdOf('builtin:tiny'), chunkSize: CHUNK, layout, reqId, chunks };
  const child = fork(join(here, '..', '..', 'harness', 'stalled_sender.js'), [JSON.stringify(args)], { stdio: 'inherit' });
  senders.push(child);
  const first = await new Promise<any>((resolve, reject) => {
    child.once('message', resolve);
    child.once('exit', (code) => reject(new Error(`stalled sender exited (${code}) before stalling`)));
  });
  assert.equal(first.stalled, true, JSON.stringify(first));
  return child;
}

async function metrics(): Promise<(name: string, labels?: string) => number> {
  const text = await (await fetch(`${url(1)}/metrics`, { signal: AbortSignal.timeout(10_000) })).text();
  // Series carry the engine's model_name label too: match the name and the wanted label.
  return (name, label = '') => {
    const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(label));
    assert.ok(line, `metric ${name}{${label}} missing`);
    return Number(line.split(' ').pop());
  };
}

function promptOf(seed: number): number[] {
  return Array.from({ length: 200 }, (_, i) => 5 + ((i * 37 + seed * 101) % 3000));
}

async function complete(i: number, prompt: number[], params?: Record<string, unknown>): Promise<string[]> {
  const r = await postJson(`${url(i)}/v1/completions`, { model: 'builtin:tiny', prompt, max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: 0, ...(params ? { kv_transfer_params: params } : {}) }, 120_000);
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json.choices[0].logprobs.tokens;
}

const disagg = (reqId: string) => ({ disagg_spec: { req_id: reqId, receiver_host: '127.0.0.1', receiver_init_port: base + 2, receiver_alloc_port: base + 3 } });

test('a sender stalled mid-chunk: the transfer is abandoned at its deadline, its connection cut, the decoder computes the prompt', async () => {
  const prompt = promptOf(1);
  const want = await complete(0, prompt);
  const m0 = await metrics();
  const sender = await stalledSender('stall-1', prompt);
  const cut = new Promise((resolve) => sender.on('message', (m: any) => m.cut && resolve(true)));
  const m1 = await metrics();
  assert.equal(m1('kvc_xfer_transfers_in_flight'), 1);
  assert.ok(m1('kvc_xfer_reserved_bytes') > 0);
  assert.deepEqual(await complete(1, prompt, disagg('stall-1')), want);
  assert.equal(await cut, true, 'the stalled connection was cut');
  const m2 = await metrics();
  assert.equal(m2('kvc_xfer_transfers_total', 'outcome="abandoned"') - m0('kvc_xfer_transfers_total', 'outcome="abandoned"'), 1);
  assert.equal(m2('kvc_xfer_transfers_in_flight'), 0);
  assert.equal(m2('kvc_xfer_reservations'), 0);
  assert.equal(m2('kvc_xfer_reserved_bytes'), 0);
  sender.kill('SIGKILL');
});

test('a sender killed mid-chunk: the transfer fails at once, the decoder computes the prompt, nothing stays reserved', async () => {
  const prompt = promptOf(2);
  const want = await complete(0, prompt);
  const m0 = await metrics();
  const sender = await stalledSender('killed-1', prompt);
  const gone = new Promise((resolve) => sender.once('exit', resolve));
  sender.kill('SIGKILL');
  await gone;
  assert.deepEqual(await complete(1, prompt, disagg('killed-1')), want);
  const m1 = await metrics();
  assert.equal(m1('kvc_xfer_transfers_total', 'outcome="failed"') - m0('kvc_xfer_transfers_total', 'outcome="failed"'), 1);
  assert.equal(m1('kvc_xfer_transfers_in_flight'), 0);
  assert.equal(m1('kvc_xfer_reservations'), 0);
  assert.equal(m1('kvc_xfer_reserved_bytes'), 0);
});

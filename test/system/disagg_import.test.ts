// A decoder keeps its rhythm while it receives and imports a long prefix for another request:
// a kv_producer process (pinned to the first CPU) prefills a 4,000-token prompt and sends its KV
// (chunk_size 16: 250 chunks) to a kv_consumer process (pinned to the last CPU) that is
// streaming another sequence; the consumer then imports the received prefix. The check is read
// from the consumer's own step metric (kvc_engine_decode_step_gap_cpu_seconds: the time from the end
// of one decode step to the start of the next, i.e. the work run between them): no gap above the
// bound, while the
// import was cut into slices (kvc_engine_kv_import_slices_total) and all 3,999 tokens came from
// the transfer. No wall-clock timing is measured by the test itself.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Pull } from 'zeromq';
import { stringify } from 'yaml';
import { machineCpus } from '../../src/common/cpu_set.js';
import { freePortRange } from '../../harness/ports.js';
import { startKvc, waitHttp, postJson, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

/** The bound on the gap between two decode steps (seconds): a bucket of the step histogram. */
const BOUND_S = 0.05;
const CHUNK = 16;
const LONG = 4000;
const procs: Proc[] = [];
let pull: Pull | null = null;
let base = 0;
const url = (i: number) => `http://127.0.0.1:${base + i}`;
// ports: base+0 producer, base+1 consumer, base+2 init, base+3 alloc, base+4 notify (this test's PULL)

function connector(role: string, extra: Record<string, unknown>): string {
  return JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: role, kv_connector_extra_config: { discard_partial_chunks: false, ...extra } });
}

before(async () => {
  base = await freePortRange(5);
  const dir = tempDir('kvc-disagg-import-');
  const yaml = (name: string, o: Record<string, unknown>) => {
    const p = join(dir, name);
    writeFileSync(p, stringify({ chunk_size: CHUNK, local_cpu: false, max_local_cpu_size: 0, max_local_disk_size: 0, enable_xfer: true, ...o }));
    return p;
  };
  const prefiller = yaml('p.yaml', { xfer_role: 'sender', xfer_proxy_host: '127.0.0.1', xfer_proxy_port: base + 4, xfer_buffer_size: 268435456 });
  const decoder = yaml('d.yaml', {
    xfer_role: 'receiver',
    xfer_peer_host: '127.0.0.1',
    xfer_peer_init_port: base + 2,
    xfer_peer_alloc_port: base + 3,
    xfer_buffer_size: 268435456,
    xfer_backends: ['tcp'],
  });
  pull = new Pull({ linger: 0 });
  await pull.bind(`tcp://127.0.0.1:${base + 4}`);
  void (async () => {
    // Drain the transfer notices (nothing to check here; the golden test checks them).
    try {
      for await (const _ of pull!) void _;
    } catch {
      /* closed */
    }
  })();
  const cpus = machineCpus();
  const first = String(cpus[0]);
  const last = String(cpus[cpus.length - 1]);
  const common = ['engine', '--model', 'builtin:tiny', '--max-num-seqs', '4', '--max-model-len', '4096'];
  procs.push(startKvc([...common, '--port', String(base), '--cpus', first, '--kv-transfer-config', connector('kv_producer', { kvc_rpc_port: 'producer1' })], { KVC_CONFIG_FILE: prefiller }));
  procs.push(startKvc([...common, '--port', String(base + 1), '--cpus', last, '--kv-transfer-config', connector('kv_consumer', { kvc_rpc_port: 'consumer1', skip_last_n_tokens: 1 })], { KVC_CONFIG_FILE: decoder }));
  await Promise.all([0, 1].map((i) => waitHttp(`${url(i)}/health`, 120_000)));
});

after(async () => {
  await Promise.all(procs.map((p) => p.kill()));
  pull?.close();
});

interface Snapshot {
  /** Gaps between decode steps observed, and how many were at most BOUND_S. */
  intervals: number;
  withinBound: number;
  slices: number;
  transferTokens: number;
  /** The histogram's bucket lines (for the failure message). */
  buckets: string;
  /** Cumulative counts by upper bound of the CPU gap histogram. */
  cumulative: Map<string, number>;
}

async function snapshot(): Promise<Snapshot> {
  const text = await (await fetch(`${url(1)}/metrics`, { signal: AbortSignal.timeout(10_000) })).text();
  const num = (re: RegExp) => {
    const m = text.match(re);
    return m ? Number(m[1]) : 0;
  };
  return {
    intervals: num(/^kvc_engine_decode_step_gap_cpu_seconds_count\{[^}]*\} (\d+)/m),
    withinBound: num(new RegExp(`^kvc_engine_decode_step_gap_cpu_seconds_bucket\\{le="${BOUND_S}"[^}]*\\} (\\d+)`, 'm')),
    slices: num(/^kvc_engine_kv_import_slices_total\{[^}]*\} (\d+)/m),
    transferTokens: num(/^kvc_engine_tokens_loaded_by_source_total\{[^}]*source="transfer"[^}]*\} (\d+)/m),
    cumulative: new Map([...text.matchAll(/^kvc_engine_decode_step_gap_cpu_seconds_bucket\{le="([^"]+)"[^}]*\} (\d+)/gm)].map((m) => [m[1]!, Number(m[2])])),
    buckets: text.split('\n').filter((l) => l.startsWith('kvc_engine_decode_step_gap_cpu_seconds_bucket') || l.startsWith('kvc_engine_step_duration_seconds_bucket')).join('\n'),
  };
}

test(`a decoder receiving and importing a ${LONG}-token prefix keeps every gap between decode steps within ${BOUND_S * 1000} ms`, async (t) => {
  // A sequence that decodes for the whole test (aborted at the end).
  const streamAbort = new AbortController();
  const res = await fetch(`${url(1)}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'builtin:tiny', prompt: [5, 6, 7, 8, 9, 10, 11, 12], max_tokens: 4000, ignore_eos: true, temperature: 0, stream: true }),
    signal: streamAbort.signal,
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  let received = 0;
  const pump = (async () => {
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        received += value.byteLength;
      }
    } catch {
      /* aborted */
    }
  })();
  // Wait for the stream to be decoding before taking the first snapshot.
  for (let i = 0; i < 200 && received === 0; i++) await new Promise((r) => setTimeout(r, 25));
  assert.ok(received > 0, 'the streaming sequence produced nothing');
  const s0 = await snapshot();

  const tokens = Array.from({ length: LONG }, (_, i) => 5 + ((i * 37) % 3000));
  const disagg_spec = { req_id: `import-${Date.now()}`, receiver_host: '127.0.0.1', receiver_init_port: base + 2, receiver_alloc_port: base + 3 };
  const req = { model: 'builtin:tiny', prompt: tokens, temperature: 0, ignore_eos: true };
  const pre = await postJson(`${url(0)}/v1/completions`, { ...req, max_tokens: 1, kv_transfer_params: { disagg_spec } }, 120_000);
  assert.equal(pre.status, 200, JSON.stringify(pre.json));
  assert.equal(pre.json.kv_transfer_params?.xfer?.ok, true, JSON.stringify(pre.json.kv_transfer_params));
  const dec = await postJson(`${url(1)}/v1/completions`, { ...req, max_tokens: 2, kv_transfer_params: { ...pre.json.kv_transfer_params, disagg_spec } }, 120_000);
  assert.equal(dec.status, 200, JSON.stringify(dec.json));
  const s1 = await snapshot();
  streamAbort.abort();
  await pump;

  assert.equal(s1.transferTokens - s0.transferTokens, LONG - 1, 'every prompt token but the last is loaded from the transfer');
  // The distribution during the test (bucket upper bound: gaps at most that long), for the log.
  t.diagnostic(`CPU time between decode steps: ${[...s1.cumulative].map(([le, n]) => `<=${le}s: ${n - (s0.cumulative.get(le) ?? 0)}`).join(', ')}`);
  const intervals = s1.intervals - s0.intervals;
  const over = intervals - (s1.withinBound - s0.withinBound);
  assert.ok(intervals >= 10, `too few decode steps ran during the transfer and import (${intervals})`);
  assert.equal(over, 0, `${over} of ${intervals} gaps between decode steps exceeded ${BOUND_S * 1000} ms while the prefix was received and imported\nbefore:\n${s0.buckets}\nafter:\n${s1.buckets}`);
  assert.ok(s1.slices - s0.slices >= 2, `the import was not cut into slices (${s1.slices - s0.slices} yields)`);

});

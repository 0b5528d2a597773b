// Chunk codecs on real processes: a `kvc controller` and a `kvc engine` (built-in model) whose
// disk tier holds int8 chunks (local_disk_serde) and whose CPU tier is naive. The disk tier holds
// the same chunks in ~0.28× the bytes; POST /compress re-encodes the CPU tier's chunks in place (int8, then int8_asym)
// (lookups keep finding them, the engine serves the prompt from them), /decompress restores the
// naive bytes; a CPU tier cleared leaves the int8 disk copies, which the engine loads. Once per
// 16- or 32-bit engine KV dtype (harness/kv_dtype.ts; 8-bit KV is never re-encoded). Bad requests
// are refused naming the field.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePortRange } from '../../harness/ports.js';
import { postJson, startKvc, waitHttp, waitUntil as waitFor, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';
import { CODEC_DTYPE_FLAGS } from '../../harness/kv_dtype.js';

const CHUNK = 32;
const CONNECTOR = JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both' });
const ID = 'codec-A';

for (const kvDtype of CODEC_DTYPE_FLAGS) {
  // int8 bytes over naive bytes, with room for the CPU tier's size classes.
  const int8Share = kvDtype === 'float32' ? 0.35 : 0.65;
  const ID = `codec-${kvDtype}`;
  describe(`--kv-cache-dtype ${kvDtype}`, () => {
  let ctl: Proc;
  let engine: Proc;
  let ctlUrl = '';
  let engineUrl = '';
  let workerUrl = '';

  const waitUntil = <T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 20_000) => waitFor(what, fn, timeoutMs, 100);
  const complete = async (prompt: string, max_tokens = 4) => {
    const r = await postJson(`${engineUrl}/v1/completions`, { model: 'builtin:tiny', prompt, max_tokens, temperature: 0 }, 120_000);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return r.json.choices[0].text as string;
  };
  const tokenize = async (prompt: string) => (await postJson(`${engineUrl}/tokenize`, { model: 'builtin:tiny', prompt })).json.tokens as number[];
  const lookup = async (tokens: number[]) => (await postJson(`${ctlUrl}/lookup`, { tokens })).json as { layout_detail: Record<string, { matched_tokens: number; locations: Record<string, number> }> };
  const loadedTokens = async () => {
    const m = await (await fetch(`${engineUrl}/metrics`)).text();
    return Number(m.match(/^kvc_engine_tokens_loaded_total(?:\{[^}]*\})? (\d+(?:\.\d+)?)/m)?.[1] ?? 'NaN');
  };
  const usedBytes = async (loc: string) => {
    const h = await (await fetch(`${workerUrl}/health`)).json();
    return (h.locations as { location: string; usedBytes: number }[]).find((l) => l.location === loc)!.usedBytes;
  };
  const finished = async (event_id: string) =>
    waitUntil(`event ${event_id}`, async () => {
      const r = await postJson(`${ctlUrl}/check_finish`, { event_id });
      return r.json.status === 'finished' || r.json.status === 'failed' ? r.json : undefined;
    });

  before(async () => {
    const base = await freePortRange(4);
    ctlUrl = `http://127.0.0.1:${base}`;
    ctl = startKvc(['controller', '--port', String(base), '--monitor-port', String(base + 1)]);
    await ctl.waitFor(/kvc controller ready/, 20_000);
    const dir = tempDir('kvc-codec-e2e-');
    const yaml = join(dir, 'A.yaml');
    writeFileSync(
      yaml,
      [
        `chunk_size: ${CHUNK}`,
        'local_cpu: true',
        'max_local_cpu_size: 0.05',
        `local_disk: ${join(dir, 'disk')}`,
        'max_local_disk_size: 0.05',
        'local_disk_serde: int8',
        'enable_controller: true',
        `kvc_instance_id: ${ID}`,
        `controller_url: 127.0.0.1:${base + 1}`,
        `kvc_worker_port: ${base + 2}`,
      ].join('\n'),
    );
    workerUrl = `http://127.0.0.1:${base + 2}`;
    engineUrl = `http://127.0.0.1:${base + 3}`;
    engine = startKvc(['engine', '--port', String(base + 3), '--kv-transfer-config', CONNECTOR, '--kv-cache-dtype', kvDtype], { KVC_CONFIG_FILE: yaml });
    await waitHttp(`${engineUrl}/health`, 120_000);
    await waitUntil('engine registered', async () => (await (await fetch(`${ctlUrl}/instances`)).json()).instances.length === 1);
  });

  after(async () => {
    await engine?.kill();
    await ctl?.kill();
  });

  test(`${kvDtype} KV: int8 disk tier, /compress (int8, then int8_asym) and /decompress in place, lookups and loads keep working`, async () => {
    const prompt = 'Chunk codecs keep more prompts in the same bytes. ' + Array.from({ length: 50 }, (_, i) => `word${i}`).join(' ');
    await complete(prompt);
    const tokens = await tokenize(prompt);
    const held = await waitUntil('prompt indexed in both tiers', async () => {
      const d = (await lookup(tokens)).layout_detail[ID];
      return d && d.locations.LocalCPUBackend === d.locations.LocalDiskBackend && d.locations.LocalCPUBackend! >= 2 * CHUNK ? d.matched_tokens : undefined;
    });

    // The disk tier holds the int8 encoding: (32 + 4) / (4 · 32) = 0.28 of the f32 payload, 0.56 of f16.
    const cpuNaive = await usedBytes('LocalCPUBackend');
    const disk = await usedBytes('LocalDiskBackend');
    assert.ok(disk < int8Share * cpuNaive, `disk (int8) ${disk} bytes vs CPU (naive) ${cpuNaive}`);

    const c = await postJson(`${ctlUrl}/compress`, { instance_id: ID, location: 'LocalCPUBackend', method: 'int8', tokens });
    assert.equal(c.status, 200, JSON.stringify(c.json));
    assert.equal(c.json.num_tokens, held);
    const cf = await finished(c.json.event_id);
    assert.equal(cf.status, 'finished', JSON.stringify(cf));
    const cpuInt8 = await usedBytes('LocalCPUBackend');
    assert.ok(cpuInt8 < int8Share * cpuNaive, `CPU tier after /compress: ${cpuInt8} bytes, before ${cpuNaive}`);
    assert.equal((await lookup(tokens)).layout_detail[ID]?.locations.LocalCPUBackend, held, 'lookups keep finding compressed chunks');

    const before = await loadedTokens();
    await complete(prompt);
    assert.ok((await loadedTokens()) - before >= held - CHUNK, 'the prompt is served from the compressed chunks');

    // int8 → int8_asym in place (decoded, then encoded): the same bytes, still found and served.
    const a = await postJson(`${ctlUrl}/compress`, { instance_id: ID, location: 'LocalCPUBackend', method: 'int8_asym', tokens });
    assert.equal(a.status, 200, JSON.stringify(a.json));
    assert.equal((await finished(a.json.event_id)).status, 'finished');
    assert.equal(await usedBytes('LocalCPUBackend'), cpuInt8, 'int8_asym chunks take int8 chunks\' bytes');
    assert.equal((await lookup(tokens)).layout_detail[ID]?.locations.LocalCPUBackend, held, 'lookups keep finding int8_asym chunks');
    const beforeAsym = await loadedTokens();
    await complete(prompt);
    assert.ok((await loadedTokens()) - beforeAsym >= held - CHUNK, 'the prompt is served from the int8_asym chunks');

    const d = await postJson(`${ctlUrl}/decompress`, { instance_id: ID, location: 'LocalCPUBackend', tokens });
    assert.equal(d.status, 200, JSON.stringify(d.json));
    assert.equal((await finished(d.json.event_id)).status, 'finished');
    assert.equal(await usedBytes('LocalCPUBackend'), cpuNaive, 'decompressed chunks take their naive bytes again');

    // Only the int8 disk copies left: the engine loads them (decoded to its dtype).
    const cl = await postJson(`${ctlUrl}/clear`, { instance_id: ID, location: 'LocalCPUBackend' });
    assert.equal((await finished(cl.json.event_id)).status, 'finished');
    const before2 = await loadedTokens();
    await complete(prompt);
    assert.ok((await loadedTokens()) - before2 >= held - CHUNK, 'the prompt is served from the int8 disk tier');
  });

  test('compress and decompress refuse bad fields and change nothing', async () => {
    const tokens = [1, 2, 3];
    const bad = await postJson(`${ctlUrl}/compress`, { instance_id: ID, location: 'LocalCPUBackend', method: 'cachegen', tokens });
    assert.equal(bad.status, 400);
    assert.match(JSON.stringify(bad.json), /method.*int8/);
    const noMethod = await postJson(`${ctlUrl}/compress`, { instance_id: ID, location: 'LocalCPUBackend', tokens });
    assert.equal(noMethod.status, 400);
    assert.match(JSON.stringify(noMethod.json), /method/);
    const loc = await postJson(`${ctlUrl}/decompress`, { instance_id: ID, location: 'GPU', tokens });
    assert.equal(loc.status, 404);
    assert.match(JSON.stringify(loc.json), /location/);
    const who = await postJson(`${ctlUrl}/compress`, { instance_id: 'nobody', location: 'LocalCPUBackend', method: 'int8', tokens });
    assert.equal(who.status, 404);
    const extra = await postJson(`${ctlUrl}/decompress`, { instance_id: ID, location: 'LocalCPUBackend', tokens, level: 3 });
    assert.equal(extra.status, 400);
    assert.match(JSON.stringify(extra.json), /level/);
  });

});
}

// `kvc up` passes engine and cache settings through to every engine, and restarts a process
// that dies: a killed decoder is restarted with backoff (printed and counted in
// deployment.json) and the deployment serves through it again without a hand. The generated
// configs start without warnings. Restart backoff and give-up are also checked on a Child
// directly with a tiny command.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { makePlan, engineArgs, type PlanOptions } from '../../src/deploy/plan.js';
import { superviseRestarts } from '../../src/deploy/restart.js';
import { Child } from '../../src/deploy/supervisor.js';
import { upOnFreeOffset } from '../../harness/deployment.js';
import { postJson, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

describe('kvc up plan: settings passed through', () => {
  test('engine flags and cache settings reach every engine; bad combinations are refused', () => {
    const plan = makePlan({
      prefillers: 1, decoders: 2, model: 'builtin:tiny', portOffset: 0, controller: false, host: '127.0.0.1',
      engine: { maxModelLen: 512, servedModelName: 'tiny', dtype: 'float32', maxNumSeqs: 4, maxNumBatchedTokens: 128, kvCacheMemory: 0.25 },
      cache: { chunkSize: 64, maxLocalCpuSize: 1.5, localDisk: '/var/kvc', maxLocalDiskSize: 2 },
    });
    for (const e of plan.engines) {
      const args = engineArgs(plan, e, '{}').join(' ');
      assert.match(args, /--max-model-len 512 --dtype float32 --max-num-seqs 4 --max-num-batched-tokens 128 --kv-cache-memory 0.25/);
      assert.match(args, /--served-model-name tiny/);
      assert.equal(e.cacheConfig.chunk_size, 64);
      assert.equal(e.cacheConfig.max_local_cpu_size, 1.5);
      assert.equal(e.cacheConfig.local_cpu, true);
      assert.equal(e.cacheConfig.local_disk, `/var/kvc/${e.name}`);
      assert.equal(e.cacheConfig.max_local_disk_size, 2);
      assert.equal(e.cacheConfig.xfer_buffer_device, 'cpu');
    }
    const base = { prefillers: 1, decoders: 1, model: 'm', portOffset: 0, controller: false, host: 'h' };
    assert.throws(() => makePlan({ ...base, cache: { maxLocalDiskSize: 1 } }), /--max-local-disk-size: needs --local-disk/);
    assert.throws(() => makePlan({ ...base, cache: { localDisk: '/x' } }), /--local-disk: needs --max-local-disk-size/);
    const noCpu = makePlan({ ...base, cache: { maxLocalCpuSize: 0 } });
    assert.equal(noCpu.engines[0]!.cacheConfig.local_cpu, false);
  });
});

describe('restart policy on a small child', () => {
  test('a process that keeps dying is restarted with doubling backoff, counted, then given up on', async () => {
    const dir = tempDir('kvc-restart-');
    const script = join(dir, 'die.mjs');
    writeFileSync(script, 'process.exit(3)\n');
    // A health URL nothing answers: every run dies before it is healthy.
    const c = new Child({ name: 'dier', args: [], env: process.env, logPath: join(dir, 'dier.log'), healthUrl: 'http://127.0.0.1:9/health' }, script);
    const lines: string[] = [];
    let gaveUp = false;
    c.start();
    const t0 = Date.now();
    await superviseRestarts(c, { maxRestarts: 3, baseDelayMs: 50, maxDelayMs: 1000, stableMs: 60_000, healthyWithinMs: 5_000 }, { say: (l) => lines.push(l), recovered: () => undefined, gaveUp: () => (gaveUp = true) }, () => false, new Promise(() => undefined));
    assert.ok(gaveUp);
    assert.equal(c.restarts, 3);
    const delays = lines.filter((l) => /restart #\d+ in/.test(l)).map((l) => l.match(/restart #(\d+) in/)![1]);
    assert.deepEqual(delays, ['1', '2', '3']);
    assert.match(lines[0]!, /dier \(pid \d+\) exited with code 3; see its log: .*dier\.log; restart #1 in 0 s/);
    assert.match(lines.at(-1)!, /3 restarts in a row failed, giving up on it/);
    assert.ok(Date.now() - t0 >= 50 + 100 + 200, 'backoff waited 50 + 100 + 200 ms');
  });
});

describe('kvc up restarts a killed decoder (built-in model, 1P1D)', () => {
  let up: Proc;
  let offset = 0;
  let logDir = '';
  const base = { prefillers: 1, decoders: 1, model: 'builtin:tiny', controller: false, host: '127.0.0.1' };

  before(async () => {
    // Other test runs share this machine: a port found free can be taken before `kvc up` binds it.
    ({ up, offset } = await upOnFreeOffset(base, (off) => {
      logDir = tempDir('kvc-up-restart-');
      return ['up', '--no-controller', '--port-offset', String(off), '--log-dir', logDir, '--startup-timeout', '150', '--max-model-len', '384', '--chunk-size', '32', '--max-local-cpu-size', '0.1', '--served-model-name', 'tiny'];
    }, 170_000, {}, 50));
  });
  after(async () => {
    await up?.kill('SIGTERM');
  });

  test('settings reached the engines; the generated configs started without a warning', async () => {
    const yaml = parseYaml(readFileSync(join(logDir, 'prefiller-0.yaml'), 'utf8'));
    assert.equal(yaml.chunk_size, 32);
    assert.equal(yaml.max_local_cpu_size, 0.1);
    const models = await (await fetch(`http://127.0.0.1:${9100 + offset}/v1/models`)).json();
    assert.equal(models.data[0].id, 'tiny');
    assert.equal(models.data[0].max_model_len, 384);
    for (const n of ['prefiller-0', 'decoder-0']) {
      const log = readFileSync(join(logDir, `${n}.log`), 'utf8');
      assert.doesNotMatch(log, / WARN /, `${n}.log has no warning:\n${log}`);
    }
  });

  test('a killed decoder is restarted, counted, and the deployment serves again', async () => {
    const proxy = `http://127.0.0.1:${9100 + offset}`;
    const body = { model: 'tiny', prompt: 'The deployment heals itself', max_tokens: 4, temperature: 0 };
    const before = await postJson(`${proxy}/v1/completions`, body);
    assert.equal(before.status, 200, JSON.stringify(before.json));
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number }[] };
    const victim = dep.processes.find((p) => p.name === 'decoder-0')!;
    process.kill(victim.pid, 'SIGKILL');
    await up.waitFor(new RegExp(`decoder-0 \\(pid ${victim.pid}\\) killed by SIGKILL; see its log: .*; restart #1 in 1 s`), 10_000);
    await up.waitFor(/decoder-0 serving again \(pid \d+, restart #1\)/, 150_000);
    const after = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number; restarts: number }[] };
    const d = after.processes.find((p) => p.name === 'decoder-0')!;
    assert.equal(d.restarts, 1);
    assert.notEqual(d.pid, victim.pid);
    // The proxy's health check brings the decoder back into rotation within a few seconds.
    let r = await postJson(`${proxy}/v1/completions`, body);
    for (let i = 0; i < 40 && r.status !== 200; i++) {
      await new Promise((res) => setTimeout(res, 500));
      r = await postJson(`${proxy}/v1/completions`, body);
    }
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.choices[0].text, before.json.choices[0].text);
  });
});

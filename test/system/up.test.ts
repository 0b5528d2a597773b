// `kvc up` in 1P1D on the built-in model, with real processes on a test port offset:
// the openai client through the proxy (completions and chat, streamed and not) gives the same
// greedy output as a single engine (float16 KV on every engine: 16-bit chunks cross xfer); the
// decoder really loaded the prefiller's KV; statistics
// lines, health, metrics; ports already taken are refused before anything starts; a process
// that fails to start is named with its log and the rest is stopped; SIGTERM stops everything.
// Also: the committed examples are exactly what `kvc up` generates.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { startKvc, waitHttp, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';
import { repoRoot } from '../../harness/repo_files.js';
import { freePortRange, isPortFree } from '../../harness/ports.js';
import { makePlan, cacheYaml, connectorJson, type PlanOptions } from '../../src/deploy/plan.js';
import { freePortOffset } from '../../src/deploy/free_offset.js';
import { validateCacheConfig, parseConnectorConfig } from '../../src/common/config.js';
import { parse as parseYaml } from 'yaml';

const root = repoRoot();

/** Exit code of a started process, or a failure after `ms` (the process is then killed). */
async function exitCode(p: Proc, ms: number): Promise<number | null> {
  if (p.child.exitCode !== null) return p.child.exitCode;
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      new Promise<number | null>((r) => p.child.once('exit', (c) => r(c))),
      new Promise<never>((_, rej) => {
        timer = setTimeout(() => rej(new Error(`no exit within ${ms} ms; output:\n${p.output().slice(-3000)}`)), ms);
      }),
    ]);
  } catch (e) {
    await p.kill('SIGKILL');
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('examples', () => {
  for (const [dir, p, d] of [['1p1d', 1, 1], ['2p2d', 2, 2]] as const) {
    test(`examples/${dir} holds exactly what kvc up generates, and it validates`, () => {
      const plan = makePlan({ prefillers: p, decoders: d, model: 'builtin:tiny', portOffset: 0, controller: true, host: '127.0.0.1' });
      const files = readdirSync(join(root, 'examples', dir)).filter((f) => f !== 'README.md').sort();
      assert.deepEqual(files, plan.engines.flatMap((e) => [`${e.name}.connector.json`, `${e.name}.yaml`]).sort());
      for (const e of plan.engines) {
        const yaml = readFileSync(join(root, 'examples', dir, `${e.name}.yaml`), 'utf8');
        assert.equal(yaml, cacheYaml(e));
        const { config, warnings } = validateCacheConfig(parseYaml(yaml), e.name);
        assert.deepEqual(warnings, []);
        assert.equal(config.chunk_size, 256);
        assert.equal(config.enable_controller, true);
        assert.equal(config.controller_url, '127.0.0.1:9001');
        // With the controller every engine fetches prefixes it lacks from the engine that holds them.
        assert.equal(config.enable_p2p, true);
        // generated configs start without warnings: the CPU engine's transfer buffer is host memory
        assert.equal(config.xfer_buffer_device, 'cpu');
        // Every engine, prefiller and decoder, 1P1D and XpYd, keeps a CPU tier by default.
        assert.equal(config.local_cpu, true);
        assert.equal(config.max_local_cpu_size, 5);
        const conn = parseConnectorConfig(readFileSync(join(root, 'examples', dir, `${e.name}.connector.json`), 'utf8').trim()).config;
        assert.equal(connectorJson(e), JSON.stringify(e.connector));
        assert.equal(conn.kv_connector_extra_config.discard_partial_chunks, false);
        if (e.role === 'prefiller') {
          assert.equal(conn.kv_role, 'kv_producer');
          assert.equal(config.xfer_role, 'sender');
          assert.equal(config.xfer_proxy_port, 7500);
          assert.equal(config.xfer_buffer_size, 1073741824);
        } else {
          assert.equal(conn.kv_role, 'kv_consumer');
          assert.equal(conn.kv_connector_extra_config.skip_last_n_tokens, 1);
          assert.equal(config.xfer_role, 'receiver');
          assert.equal(config.xfer_peer_init_port, 7300 + e.index);
          assert.equal(config.xfer_peer_alloc_port, 7400 + e.index);
          assert.equal(config.xfer_buffer_size, 2147483648);
        }
      }
      const urls = plan.engines.map((e) => e.cacheConfig.distributed_url);
      assert.equal(new Set(urls).size, urls.length, 'distributed_url distinct per instance');
      const workers = plan.engines.map((e) => e.cacheConfig.kvc_worker_port);
      assert.equal(new Set(workers).size, workers.length, 'kvc_worker_port distinct per instance');
    });
  }
});

describe('kvc up 1P1D (built-in model)', () => {
  let up: Proc;
  let ref: Proc;
  let offset = 0;
  let proxyUrl = '';
  let refUrl = '';
  let logDir = '';
  let client: OpenAI;
  let refClient: OpenAI;
  const base = { prefillers: 1, decoders: 1, model: 'builtin:tiny', controller: true, host: '127.0.0.1' };

  before(async () => {
    offset = await freePortOffset(base);
    logDir = tempDir('kvc-up-');
    // float16 KV everywhere (kvc up passes --kv-cache-dtype to its engines): the prefiller's
    // 16-bit chunks cross xfer, and the decoder's output equals a float16 engine's. The proxy's
    // statistics lines every second (--stats-interval, passed to it), not every 5 s.
    up = startKvc(['up', '--port-offset', String(offset), '--log-dir', logDir, '--startup-timeout', '150', '--kv-cache-dtype', 'float16', '--stats-interval', '1']);
    const refPort = await freePortRange(1, 40000, 50000);
    ref = startKvc(['engine', '--port', String(refPort), '--kv-cache-dtype', 'float16']);
    refUrl = `http://127.0.0.1:${refPort}`;
    await up.waitFor(/kvc up: ready/, 170_000);
    await waitHttp(`${refUrl}/health`, 120_000);
    proxyUrl = `http://127.0.0.1:${9100 + offset}`;
    client = new OpenAI({ baseURL: `${proxyUrl}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
    refClient = new OpenAI({ baseURL: `${refUrl}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
  });
  after(async () => {
    await up?.kill('SIGTERM');
    await ref?.kill('SIGTERM');
  });

  test('ready output names every endpoint, log and a curl; deployment.json lists the pids', () => {
    const o = up.output();
    assert.match(o, new RegExp(`OpenAI-compatible endpoint: http://127\\.0\\.0\\.1:${9100 + offset}/v1`));
    for (const n of ['controller', 'prefiller-0', 'decoder-0', 'proxy']) assert.match(o, new RegExp(`${n} +pid \\d+ .* log ${logDir}/${n}\\.log`));
    assert.match(o, /curl -N http:\/\/127\.0\.0\.1:\d+\/v1\/completions/);
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8'));
    assert.equal(dep.processes.length, 4);
    for (const p of dep.processes) assert.ok(alive(p.pid), `${p.name} alive`);
  });

  test('each health route names its process, so kvc up never takes another process for its child', async () => {
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number; url: string }[] };
    for (const p of dep.processes) {
      const r = await fetch(`${p.url}${p.name === 'controller' ? '/healthz' : '/health'}`);
      await r.arrayBuffer();
      assert.equal(r.headers.get('kvc-pid'), String(p.pid), p.name);
    }
  });

  test('the controller runs with its young generation sized; the decoder config names its ports', () => {
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8'));
    // The controller runs with its young generation sized (src/common/young_gen.ts).
    const ctlPid = dep.processes.find((p: { name: string }) => p.name === 'controller').pid;
    assert.match(readFileSync(`/proc/${ctlPid}/cmdline`, 'utf8').split('\0').join(' '), /--max-semi-space-size=1 \S*main\.js controller /);
    const yaml = parseYaml(readFileSync(join(logDir, 'decoder-0.yaml'), 'utf8'));
    assert.equal(yaml.xfer_peer_init_port, 7300 + offset);
    assert.equal(yaml.controller_url, `127.0.0.1:${9001 + offset}`);
  });

  const prompt = 'The proxy sends each prompt to a prefiller first, then a decoder continues it with the transferred cache.';

  test('completions through the proxy equal a single engine (greedy, streamed and not)', async () => {
    const req = { model: 'builtin:tiny', prompt, max_tokens: 12, temperature: 0 };
    const want = await refClient.completions.create(req);
    const got = await client.completions.create(req);
    assert.equal(got.choices[0]!.text, want.choices[0]!.text);
    assert.equal(got.usage?.prompt_tokens, want.usage?.prompt_tokens);
    assert.equal(got.usage?.completion_tokens, 12);
    // The decoder loaded the prefiller's KV instead of computing it (all but skip_last_n_tokens):
    // reported as the transfer, not as a cache read (nothing was reused from an earlier request).
    type Details = { prompt_tokens_details: { cached_tokens: number; kv_transfer_tokens: number } };
    const first = (got.usage as unknown as Details).prompt_tokens_details;
    assert.equal(first.cached_tokens, 0, `a new prompt reuses nothing: ${JSON.stringify(first)}`);
    assert.ok(first.kv_transfer_tokens > 0, `decoder loaded transferred KV: ${JSON.stringify(first)}`);
    // The same prompt again is a cache read (the decoder's CPU tier, or the prefiller's).
    const again = (await client.completions.create(req)).usage as unknown as Details;
    assert.ok(again.prompt_tokens_details.cached_tokens > 0, `the repeat reuses the prompt's KV: ${JSON.stringify(again.prompt_tokens_details)}`);
    let streamed = '';
    let events = 0;
    for await (const ev of await client.completions.create({ ...req, stream: true })) {
      streamed += ev.choices[0]?.text ?? '';
      events++;
    }
    assert.equal(streamed, want.choices[0]!.text);
    assert.ok(events >= 2, 'streamed in several events');
  });

  test('chat through the proxy equals a single engine (greedy, streamed and not)', async () => {
    const req = { model: 'builtin:tiny', messages: [{ role: 'user' as const, content: 'Tell me about caches.' }], max_tokens: 10, temperature: 0 };
    const want = await refClient.chat.completions.create(req);
    const got = await client.chat.completions.create(req);
    assert.equal(got.object, 'chat.completion');
    assert.equal(got.choices[0]!.message.content, want.choices[0]!.message.content);
    let streamed = '';
    for await (const ev of await client.chat.completions.create({ ...req, stream: true })) streamed += ev.choices[0]?.delta?.content ?? '';
    assert.equal(streamed, want.choices[0]!.message.content);
  });

  test('statistics lines reach kvc up output; health and metrics', async () => {
    await up.waitFor(/TTFT prefiller-0\(127\.0\.0\.1:\d+\): [1-9]\d* requests in last 1s \(total \d+\), avg [\d.]+ ms, median [\d.]+ ms, p99 [\d.]+ ms/, 12_000);
    const h = (await (await fetch(`${proxyUrl}/health`)).json()) as { status: string };
    assert.equal(h.status, 'ok');
    const m = await (await fetch(`${proxyUrl}/metrics`)).text();
    assert.match(m, /kvc_proxy_ttft_seconds_count\{endpoint="\/v1\/completions"\} [1-9]/);
    assert.match(m, /kvc_proxy_xfer_notices_total\{ok="true"\} [1-9]/, 'xfer notices arrive on the notify port');
    const models = await client.models.list();
    assert.equal(models.data[0]!.id, 'builtin:tiny');
  });

  test('transfer metrics on the prefiller and the decoder; both instances and their figures on the controller dashboard', async () => {
    const metricsOf = async (port: number) => (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    const num = (text: string, re: RegExp) => Number(re.exec(text)?.[1] ?? 'NaN');
    const pre = await metricsOf(7100 + offset);
    assert.ok(num(pre, /^kvc_xfer_sent_chunks_total\{[^}]*\} (\d+)/m) > 0, 'the prefiller handed chunks to xfer');
    assert.ok(num(pre, /^kvc_xfer_sent_bytes_total\{[^}]*\} (\d+)/m) > 0);
    assert.ok(num(pre, /^kvc_xfer_send_duration_seconds_count\{[^}]*outcome="ok"[^}]*\} (\d+)/m) > 0, 'sends completed');
    const dec = await metricsOf(7200 + offset);
    assert.ok(num(dec, /^kvc_xfer_received_chunks_total\{[^}]*\} (\d+)/m) > 0, 'the decoder imported received chunks');
    assert.ok(num(dec, /^kvc_xfer_receive_wait_seconds_count\{[^}]*outcome="received"[^}]*\} (\d+)/m) > 0);
    // The dashboard's snapshot: both instances with workers and the decoder's transferred tokens.
    const ctl = `http://127.0.0.1:${9000 + offset}`;
    assert.match(await (await fetch(`${ctl}/`)).text(), /<title>kvc controller<\/title>/);
    const end = Date.now() + 30_000;
    for (;;) {
      const st = (await (await fetch(`${ctl}/dashboard/state`)).json()) as { instances: { instance_id: string }[]; engine_samples: Record<string, { transferred_tokens: number }[]> };
      const received = Object.values(st.engine_samples).some((samples) => (samples.at(-1)?.transferred_tokens ?? 0) > 0);
      if (st.instances.length === 2 && received) break;
      if (Date.now() > end) assert.fail(`dashboard state: ${JSON.stringify(st).slice(0, 2000)}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  });

  test('with its only prefiller killed (-9), the decoder prefills alone: same greedy output', async () => {
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number }[] };
    process.kill(dep.processes.find((p) => p.name === 'prefiller-0')!.pid, 'SIGKILL');
    const req = { model: 'builtin:tiny', prompt: `${prompt} Without a prefiller.`, max_tokens: 8, temperature: 0 };
    const want = await refClient.completions.create(req);
    const got = await client.completions.create(req);
    assert.equal(got.choices[0]!.text, want.choices[0]!.text);
    let streamed = '';
    for await (const ev of await client.completions.create({ ...req, stream: true })) streamed += ev.choices[0]?.text ?? '';
    assert.equal(streamed, want.choices[0]!.text);
    const m = await (await fetch(`${proxyUrl}/metrics`)).text();
    assert.match(m, /kvc_proxy_decoder_only_total [1-9]/);
    // Their statistics line carries the decoder's real time to first token, not 0 ms.
    const line = await up.waitFor(/TTFT decoder-only: [1-9]\d* requests in last 1s \(total \d+\), avg ([\d.]+) ms, median ([\d.]+) ms, p99 ([\d.]+) ms/, 12_000);
    assert.ok(Number(line[2]) > 0, `decoder-only median TTFT > 0: ${line[0]}`);
    await up.waitFor(/prefiller-0 \(pid \d+\) killed by SIGKILL; see its log/, 5_000);
  });

  test('a second kvc up on the same ports is refused before starting anything', async () => {
    const second = startKvc(['up', '--port-offset', String(offset), '--log-dir', tempDir('kvc-up2-')]);
    const code = await exitCode(second, 30_000);
    assert.equal(code, 3);
    assert.match(second.output(), new RegExp(`ports already in use, nothing started:[\\s\\S]*${9100 + offset} \\(proxy HTTP\\)`));
    assert.doesNotMatch(second.output(), /kvc up: ready/);
  });

  test('a process that fails to start is named with its log, and the rest is stopped', async () => {
    // Other test runs share this machine: a port found free can be taken before `kvc up` checks it
    // (exit 3, nothing started). Then try another offset; the assertions below are unchanged.
    let o2 = 0;
    let dir = '';
    let bad: Proc | undefined;
    let code: number | null = null;
    for (let attempt = 0; attempt < 3; attempt++) {
      o2 = await freePortOffset({ ...base, controller: false });
      dir = tempDir('kvc-upfail-');
      bad = startKvc(['up', '--port-offset', String(o2), '--log-dir', dir, '--no-controller', '--model', join(dir, 'no-such-model'), '--startup-timeout', '60']);
      code = await exitCode(bad, 90_000);
      if (!(code === 3 && /ports already in use, nothing started/.test(bad.output()))) break;
    }
    assert.equal(code, 1, bad!.output().slice(-2000));
    assert.match(bad!.output(), new RegExp(`(prefiller|decoder)-0 failed to start: exited with code \\d+\\n  log: ${dir}/(prefiller|decoder)-0\\.log`));
    assert.match(bad!.output(), /stopping the other processes/);
    // Released: polled (bounded) rather than checked once, since on a loaded machine the kernel
    // may still be closing a stopped process's sockets when `kvc up` has exited.
    for (const p of makePlan({ ...base, controller: false, portOffset: o2 }).ports) {
      const deadline = Date.now() + 20_000;
      while (!(await isPortFree(p.port)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      assert.ok(await isPortFree(p.port), `port ${p.port} (${p.what}) released`);
    }
  });

  test('SIGTERM stops every process', async () => {
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number }[] };
    const code = await up.kill('SIGTERM');
    assert.equal(code, 0);
    assert.match(up.output(), /kvc up: all processes stopped/);
    for (const p of dep.processes) assert.equal(alive(p.pid), false, `${p.name} (pid ${p.pid}) stopped`);
  });
});

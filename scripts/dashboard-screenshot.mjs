// Renders docs/dashboard.png: a controller and two engines (built-in model, caches attached to the
// controller) on free loopback ports, about a minute of mixed traffic (repeated prompts hit the
// cache, new ones miss), a copy from one instance to the other and a pin, then a screenshot of
// the dashboard in headless Chromium. Run after `npm run build`:
//   node scripts/dashboard-screenshot.mjs [out.png]
// Every process it starts is stopped by pid at the end.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { freePortRange } from '../dist/src/common/ports.js';

const out = process.argv[2] ?? 'docs/dashboard.png';
const CLI = 'dist/src/cli/main.js';
const dir = mkdtempSync(join(tmpdir(), 'kvc-shot-'));
const procs = [];

function start(args, env = {}) {
  const child = spawn(process.execPath, [CLI, ...args], { env: { ...process.env, PYTHONHASHSEED: '0', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let text = '';
  child.stdout.on('data', (d) => (text += d));
  child.stderr.on('data', (d) => (text += d));
  procs.push(child);
  return { child, output: () => text };
}

async function until(what, fn, ms = 120_000) {
  const end = Date.now() + ms;
  for (;;) {
    if (await fn().catch(() => false)) return;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const post = async (url, body) => {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return r.json();
};

try {
  const base = await freePortRange(9);
  const ctl = `http://127.0.0.1:${base}`;
  start(['controller', '--port', String(base), '--monitor-port', String(base + 1), '--heartbeat-timeout', '4']);
  await until('the controller', async () => (await fetch(`${ctl}/healthz`)).ok);
  const engines = {};
  for (const [i, id] of ['engine-A', 'engine-B'].entries()) {
    const yaml = join(dir, `${id}.yaml`);
    writeFileSync(yaml, [
      'chunk_size: 16', 'local_cpu: true', `max_local_cpu_size: ${i === 0 ? 0.004 : 0.002}`,
      `local_disk: ${join(dir, `${id}-disk`)}`, 'max_local_disk_size: 0.01',
      'enable_controller: true', `kvc_instance_id: ${id}`, `controller_url: 127.0.0.1:${base + 1}`,
      `kvc_worker_port: ${base + 2 + 3 * i}`, `distributed_url: 127.0.0.1:${base + 3 + 3 * i}`,
    ].join('\n'));
    const port = base + 4 + 3 * i;
    start(['engine', '--port', String(port), '--disable-log-requests', '--kv-transfer-config', JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both' })], { KVC_CONFIG_FILE: yaml });
    engines[id] = `http://127.0.0.1:${port}`;
  }
  for (const url of Object.values(engines)) await until(`engine ${url}`, async () => (await fetch(`${url}/health`)).ok);

  const browser = await chromium.launchPersistentContext(join(dir, 'profile'), {
    executablePath: '/usr/bin/chromium', headless: true, viewport: { width: 1400, height: 1250 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = browser.pages()[0] ?? (await browser.newPage());
  await page.goto(`${ctl}/`);

  const topics = ['caches', 'transfers', 'schedulers', 'tokenizers', 'attention', 'controllers', 'disks', 'proxies'];
  const prompt = (t, n) => `A long shared system prompt about ${t}: ` + Array.from({ length: 30 }, (_, j) => `${t}${j}`).join(' ') + ` question ${n}`;
  const t0 = Date.now();
  for (let round = 0; Date.now() - t0 < 60_000; round++) {
    // Each round: some prompts seen before (cache hits on their shared prefix), some new.
    const reqs = [];
    for (const [k, url] of Object.values(engines).entries()) {
      const topic = topics[(round + k * 3) % (round < 4 ? 2 + round : topics.length)];
      reqs.push(post(`${url}/v1/completions`, { model: 'builtin:tiny', prompt: prompt(topic, round % 3), max_tokens: 8, temperature: 0 }));
    }
    await Promise.all(reqs);
    await new Promise((r) => setTimeout(r, 400));
  }
  const tokens = (await post(`${engines['engine-A']}/tokenize`, { model: 'builtin:tiny', prompt: prompt('caches', 0) })).tokens;
  // One operation after the other: each acts on what the previous one left.
  const run = async (path, body) => {
    const { event_id } = await post(`${ctl}${path}`, body);
    await until(`event ${event_id}`, async () => ['finished', 'failed'].includes((await post(`${ctl}/check_finish`, { event_id })).status), 60_000);
  };
  await run('/move', { old_position: ['engine-A', 'LocalCPUBackend'], new_position: ['engine-B', 'LocalCPUBackend'], tokens, copy: true });
  await run('/pin', { tokens, instance_id: 'engine-B', location: 'LocalCPUBackend' });
  await run('/move', { old_position: ['engine-A', 'LocalCPUBackend'], new_position: ['engine-A', 'LocalDiskBackend'], tokens });
  await page.selectOption('#act-op', 'copy');
  await new Promise((r) => setTimeout(r, 3000));
  await page.screenshot({ path: out, fullPage: true });
  await browser.close();
  console.log(`wrote ${out}`);
} finally {
  for (const p of procs) if (p.exitCode === null) p.kill('SIGTERM');
  await Promise.all(procs.map((p) => (p.exitCode !== null ? null : new Promise((r) => p.once('exit', r)))));
  rmSync(dir, { recursive: true, force: true });
}

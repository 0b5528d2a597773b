// The controller dashboard in a real browser: Debian's `chromium` driven by playwright-core,
// against a real `kvc controller` and a real `kvc engine` (built-in model, cache attached to the
// controller). The page must load with no console error, show the registered instance, update
// after requests (chunks, engine figures, a hit-rate and a TTFT point), run a pin through its form
// (with the typed deployment secret sent as `Authorization: Bearer`) and show the refusal of bad
// input; the move/copy fields show only for move and copy; one request stays readable in the
// charts for their 30 s window (several points, not one isolated spike).
// Skipped, saying which package to install, when /usr/bin/chromium is absent.
//
// Every wait is for a state the page must reach, bounded; nothing asserts on speed.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { freePortRange } from '../../harness/ports.js';
import { postJson, startKvc, waitHttp, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';

// KVC_CHROMIUM points at another Chromium binary (or at none, to see the skip).
const CHROMIUM = process.env.KVC_CHROMIUM ?? '/usr/bin/chromium';
const SKIP = existsSync(CHROMIUM) ? false : `${CHROMIUM} not found: install Debian's "chromium" package (apt-get install -y chromium); skipped`;
const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];
const WAIT_MS = 60_000;
const CHUNK = 16;

describe('controller dashboard in headless Chromium', () => {
  let ctl: Proc;
  let engine: Proc;
  let ctlUrl = '';
  let engineUrl = '';
  let browser: BrowserContext;
  let page: Page;
  let profile = '';
  const consoleErrors: string[] = [];
  const authSeen: string[] = [];

  const complete = async (prompt: string) => {
    const r = await postJson(`${engineUrl}/v1/completions`, { model: 'builtin:tiny', prompt, max_tokens: 4, temperature: 0 }, 120_000);
    assert.equal(r.status, 200, JSON.stringify(r.json));
  };

  before(async () => {
    if (SKIP) return; // each test reports itself skipped, naming the package
    const base = await freePortRange(5);
    ctlUrl = `http://127.0.0.1:${base}`;
    // A 2 s heartbeat timeout: instances report every 0.5 s, so the page sees changes soon.
    ctl = startKvc(['controller', '--port', String(base), '--monitor-port', String(base + 1), '--heartbeat-timeout', '2']);
    await ctl.waitFor(/kvc controller ready/, 20_000);
    const yaml = join(tempDir('kvc-dashboard-'), 'cache.yaml');
    writeFileSync(yaml, [
      `chunk_size: ${CHUNK}`,
      'local_cpu: true',
      'max_local_cpu_size: 0.01',
      'max_local_disk_size: 0',
      'enable_controller: true',
      'kvc_instance_id: engine-A',
      `controller_url: 127.0.0.1:${base + 1}`,
      `kvc_worker_port: ${base + 2}`,
      `distributed_url: 127.0.0.1:${base + 3}`,
    ].join('\n'));
    engineUrl = `http://127.0.0.1:${base + 4}`;
    engine = startKvc(['engine', '--port', String(base + 4), '--kv-transfer-config', JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both' })], { KVC_CONFIG_FILE: yaml });
    await waitHttp(`${engineUrl}/health`, 120_000);

    profile = mkdtempSync(join(tmpdir(), 'kvc-chromium-'));
    browser = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS, viewport: { width: 1400, height: 1100 } });
    page = browser.pages()[0] ?? (await browser.newPage());
    page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(`${m.text()} @ ${m.location().url}`); });
    page.on('pageerror', (e) => consoleErrors.push(`page error: ${e.message}`));
    page.on('requestfailed', (r) => consoleErrors.push(`request failed: ${r.url()} ${r.failure()?.errorText ?? ''}`));
    page.on('request', (r) => { const a = r.headers().authorization; if (a) authSeen.push(`${r.method()} ${new URL(r.url()).pathname} ${a}`); });
  });

  after(async () => {
    await browser?.close().catch(() => {});
    if (profile) rmSync(profile, { recursive: true, force: true });
    await engine?.kill();
    await ctl?.kill();
  });

  test('loads with no console error and shows the registered instance', { skip: SKIP }, async () => {
    await page.goto(ctlUrl + '/');
    await page.waitForSelector('#instances tr[data-instance="engine-A"][data-location="LocalCPUBackend"]', { timeout: WAIT_MS });
    assert.match(await page.textContent('#instances tbody') ?? '', /127\.0\.0\.1:\d+/);
    assert.equal(await page.textContent('#tile-instances'), '1');
    assert.deepEqual(consoleErrors, []);
  });

  test('updates after requests: chunks and bytes, engine figures, hit-rate and TTFT points', { skip: SKIP }, async () => {
    const chunksCell = '#instances tr[data-instance="engine-A"][data-location="LocalCPUBackend"] td.chunks';
    assert.equal(await page.textContent(chunksCell), '0');
    const prompt = Array.from({ length: 40 }, (_, i) => `word${i}`).join(' ');
    await complete(prompt);
    await page.waitForFunction((sel) => Number(document.querySelector(sel)?.textContent?.replace(/,/g, '')) > 0, chunksCell, { timeout: WAIT_MS });
    // Bytes come with the heartbeat after the store changed.
    await page.waitForFunction(() => /KiB|MiB/.test(document.querySelector('#tile-bytes')?.textContent ?? ''), undefined, { timeout: WAIT_MS });
    await page.waitForFunction(() => Number(document.querySelector('#engines tr[data-instance="engine-A"] td.prompt-tokens')?.textContent?.replace(/,/g, '')) > 0, undefined, { timeout: WAIT_MS });
    // Sparse traffic stays readable: one request is a point at every heartbeat of its 30 s window.
    await page.waitForFunction(() => Number((document.querySelector('#chart-ttft') as HTMLElement).dataset.points) >= 3, undefined, { timeout: WAIT_MS });
    // The same prompt again is a prefix-cache hit: a hit-rate point above 0 and a TTFT point.
    await complete(prompt);
    await page.waitForFunction(() => Number(document.querySelector('#engines tr[data-instance="engine-A"] td.cached-tokens')?.textContent?.replace(/,/g, '')) > 0, undefined, { timeout: WAIT_MS });
    await page.waitForFunction(() => Number((document.querySelector('#chart-hit') as HTMLElement).dataset.max) > 0, undefined, { timeout: WAIT_MS });
    await page.waitForFunction(() => Number((document.querySelector('#chart-ttft') as HTMLElement).dataset.points) > 0, undefined, { timeout: WAIT_MS });
    const state = await (await fetch(`${ctlUrl}/dashboard/state`)).json() as { engine_samples: Record<string, { cached_tokens: number; query_tokens: number }[]> };
    const last = state.engine_samples['engine-A']!.at(-1)!;
    assert.ok(last.cached_tokens > 0 && last.cached_tokens <= last.query_tokens, `the second request was served from the cache: ${JSON.stringify(last)}`);
    assert.deepEqual(consoleErrors, []);
  });

  test('pin through the form: sent with the typed key, event shown finished; bad token ids refused in the page', { skip: SKIP }, async () => {
    const tokens = (await postJson(`${engineUrl}/tokenize`, { model: 'builtin:tiny', prompt: Array.from({ length: 40 }, (_, i) => `word${i}`).join(' ') })).json.tokens as number[];
    assert.match(await page.getAttribute('#secret', 'placeholder') ?? '', /kvc-logs\/deployment\.secret/);
    assert.match(await page.textContent('header label.key') ?? '', /deployment secret/);
    await page.fill('#secret', 'dashboard-test-key');
    await page.dispatchEvent('#secret', 'change');
    // The destination fields are for move and copy only; the token ids not for clear.
    const visible = async () => page.evaluate(() => [...document.querySelectorAll('#action-form label')].filter((l) => (l as HTMLElement).offsetParent !== null).map((l) => l.firstChild!.textContent!.trim()));
    for (const op of ['pin', 'unpin', 'clear', 'move', 'copy']) {
      await page.selectOption('#act-op', op);
      const want = ['operation', 'instance', 'location', ...(op === 'move' || op === 'copy' ? ['to instance', 'to location'] : []), ...(op === 'clear' ? [] : ['prompt or token ids'])];
      assert.deepEqual(await visible(), want, `fields shown for ${op}`);
    }
    await page.selectOption('#act-op', 'pin');
    await page.selectOption('#act-instance', 'engine-A');
    await page.selectOption('#act-location', 'LocalCPUBackend');
    await page.fill('#act-tokens', tokens.join(', '));
    await page.click('#action-form button[type=submit]');
    await page.waitForFunction(() => /^pin: event pin-/.test(document.querySelector('#act-result')?.textContent ?? ''), undefined, { timeout: WAIT_MS });
    const eventId = (await page.textContent('#act-result'))!.match(/event (\S+)/)![1]!;
    await page.waitForSelector(`#events tr[data-event="${eventId}"] .badge.finished`, { timeout: WAIT_MS });
    assert.ok(authSeen.some((a) => a === 'POST /pin Bearer dashboard-test-key'), `Authorization sent with the action: ${authSeen.join('; ')}`);

    // A typed prompt is tokenized by the instance's engine (POST /dashboard/tokenize).
    await page.fill('#act-tokens', Array.from({ length: 40 }, (_, i) => `word${i}`).join(' '));
    await page.click('#action-form button[type=submit]');
    await page.waitForFunction((n) => new RegExp(`^pin: event pin-\\S+ \\([1-9]\\d* tokens held of the prompt's ${n}\\)`).test(document.querySelector('#act-result')?.textContent ?? ''), tokens.length, { timeout: WAIT_MS });
    const promptEvent = (await page.textContent('#act-result'))!.match(/event (\S+)/)![1]!;
    await page.waitForSelector(`#events tr[data-event="${promptEvent}"] .badge.finished`, { timeout: WAIT_MS });

    // The tokenize route itself: the engine's tokens; bad input named.
    const direct = await postJson(`${ctlUrl}/dashboard/tokenize`, { instance_id: 'engine-A', prompt: Array.from({ length: 40 }, (_, i) => `word${i}`).join(' ') });
    assert.deepEqual(direct.json.tokens, tokens);
    assert.equal((await postJson(`${ctlUrl}/dashboard/tokenize`, { instance_id: 'ghost', prompt: 'x' })).json.error.code, 'unknown_instance');
    assert.match((await postJson(`${ctlUrl}/dashboard/tokenize`, { instance_id: 'engine-A', prompt: '' })).json.error.message, /field `prompt`: expected a non-empty prompt/);
    await page.fill('#act-tokens', '');
    await page.click('#action-form button[type=submit]');
    await page.waitForFunction(() => /enter a prompt or token ids/.test(document.querySelector('#act-result')?.textContent ?? ''), undefined, { timeout: WAIT_MS });
    await page.fill('#act-tokens', '1, 2, 99999999999');
    await page.click('#action-form button[type=submit]');
    await page.waitForFunction(() => /token ids: "99999999999" is not a non-negative integer/.test(document.querySelector('#act-result')?.textContent ?? ''), undefined, { timeout: WAIT_MS });
    assert.deepEqual(consoleErrors, []);
    // A refusal by the controller is shown with its message (Chromium logs the 400 itself: the
    // only console error allowed, and only for that request).
    await page.selectOption('#act-op', 'move');
    await page.selectOption('#act-target-instance', 'engine-A');
    await page.selectOption('#act-target-location', 'LocalCPUBackend');
    await page.fill('#act-tokens', '1, 2');
    await page.click('#action-form button[type=submit]');
    await page.waitForFunction(() => /move refused \(HTTP 400\): .*new_position/.test(document.querySelector('#act-result')?.textContent ?? ''), undefined, { timeout: WAIT_MS });
    assert.deepEqual(consoleErrors, [`Failed to load resource: the server responded with a status of 400 (Bad Request) @ ${ctlUrl}/move`]);

    const shot = process.env.KVC_DASHBOARD_SCREENSHOT;
    if (shot) {
      mkdirSync(dirname(shot), { recursive: true });
      await page.screenshot({ path: shot, fullPage: true });
    }
  });
});

// What a new user meets in the first hour, on one real `kvc up` 1P1D deployment (issue 36): the
// README's and examples/controller's commands run as pasted (pins travel with a move, /clear says
// what it removed and kept); a request that cannot fit is refused before any prefill with the
// engine's own code; one error code per condition at the proxy and the engine; the `developer`
// role; cached_tokens counts reuse only; a 401 that says where the secret is; quiet, timestamped
// proxy logs; non-streamed requests out of the TTFT histogram; a log directory per deployment.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { CLI, postJson, type Proc } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';
import { upOnFreeOffset } from '../../harness/deployment.js';

function findRoot(): string {
  let d = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(d, 'package.json')) && dirname(d) !== d) d = dirname(d);
  return d;
}
const repoRoot = findRoot();

/** The fenced blocks of a markdown file written in `lang`, in order. */
function blocks(file: string, lang: string, from?: string): string[] {
  let text = readFileSync(join(repoRoot, file), 'utf8');
  if (from) text = text.slice(text.indexOf(from));
  return [...text.matchAll(new RegExp('```' + lang + '\\n([\\s\\S]*?)```', 'g'))].map((m) => m[1]!);
}

/** Runs shell commands as a user pastes them, from `cwd` with `kvc` on the PATH; returns the output. */
function paste(script: string, cwd: string): string {
  const r = spawnSync('bash', ['-e', '-o', 'pipefail', '-c', script], { cwd, encoding: 'utf8', timeout: 180_000 });
  assert.equal(r.status, 0, `pasted commands failed (exit ${r.status}):\n${script}\n--- output:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

const num = (text: string, re: RegExp) => Number(re.exec(text)?.[1] ?? NaN);

describe('the first hour on a kvc up deployment', () => {
  let up: Proc;
  let cwd = '';
  let logDir = '';
  let offset = 0;
  let proxy = '';
  let ctl = '';
  let prefiller = '';
  let decoder = '';
  const MAX_LEN = 1024;
  /** The proxy's statistics interval (s): short, so that two idle intervals pass quickly. */
  const STATS_S = 1;

  before(async () => {
    const plan = { prefillers: 1, decoders: 1, model: 'builtin:tiny', controller: true, host: '127.0.0.1' };
    ({ up, offset } = await upOnFreeOffset(plan, (off) => {
      // The user's working directory holds kvc-logs/, as `npm start` makes it.
      cwd = tempDir('kvc-first-hour-');
      logDir = join(cwd, 'kvc-logs');
      return ['up', '--port-offset', String(off), '--log-dir', logDir, '--max-model-len', String(MAX_LEN), '--stats-interval', String(STATS_S), '--startup-timeout', '200'];
    }, 220_000));
    const dep = JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { proxy: string; controller: string; processes: { name: string; url: string }[] };
    proxy = dep.proxy;
    ctl = dep.controller;
    prefiller = dep.processes.find((p) => p.name === 'prefiller-0')!.url;
    decoder = dep.processes.find((p) => p.name === 'decoder-0')!.url;
  });
  after(async () => {
    await up?.kill('SIGTERM');
  });

  test('cached_tokens of a new prompt is 0; its transfer is kv_transfer_tokens; the developer role is a system prompt', async () => {
    const client = new OpenAI({ baseURL: `${proxy}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
    const r = await client.completions.create({ model: 'builtin:tiny', prompt: 'A fresh prompt nobody sent before, about caches.', max_tokens: 4, temperature: 0 });
    const d = (r.usage as unknown as { prompt_tokens_details: { cached_tokens: number; kv_transfer_tokens: number } }).prompt_tokens_details;
    assert.equal(d.cached_tokens, 0, JSON.stringify(d));
    assert.ok(d.kv_transfer_tokens > 0, JSON.stringify(d));
    const ask = (role: 'system' | 'developer') =>
      client.chat.completions.create({ model: 'builtin:tiny', messages: [{ role, content: 'Answer briefly.' }, { role: 'user', content: 'What is a KV cache?' }], max_tokens: 6, temperature: 0 });
    const dev = await ask('developer');
    assert.equal(dev.choices[0]!.message.content, (await ask('system')).choices[0]!.message.content, 'developer = system');
  });

  test('a request that cannot fit is refused before any prefill, with the engine\'s code and message', async () => {
    const prefills = async () => num(await (await fetch(`${prefiller}/metrics`)).text(), /^kvc_engine_requests_total\{[^}]*endpoint="\/v1\/completions"[^}]*\} (\d+)/m);
    const before = await prefills();
    // A prompt that fits the context alone, but not with 100 tokens more.
    const count = async (text: string) => (await postJson(`${decoder}/tokenize`, { prompt: text })).json.count as number;
    const perWord = (await count('word '.repeat(100))) / 100;
    const prompt = 'word '.repeat(Math.floor((MAX_LEN - 50) / perWord));
    const n = await count(prompt);
    assert.ok(n < MAX_LEN && n + 100 > MAX_LEN, `a prompt of ${n} tokens`);
    const body = { model: 'builtin:tiny', prompt, max_tokens: 100 };
    const viaProxy = await postJson(`${proxy}/v1/completions`, body);
    const direct = await postJson(`${decoder}/v1/completions`, body);
    assert.equal(viaProxy.status, 400);
    assert.equal(viaProxy.json.error.code, 'context_length_exceeded');
    assert.deepEqual(viaProxy.json, direct.json, 'the same error body from the proxy and from the engine');
    assert.match(viaProxy.json.error.message, /field `max_tokens`: 100 tokens requested with a \d+-token prompt; this model's maximum context length is 1024 tokens/);
    assert.equal(await prefills(), before, 'the prefiller computed nothing');
  });

  test('one error code per condition: the proxy answers what the engine answers', async () => {
    const cases: [string, Record<string, unknown>][] = [
      ['/v1/completions', { model: 'builtin:tiny', prompt: Array.from({ length: MAX_LEN + 10 }, (_, i) => `w${i % 50}`).join(' ') }],
      ['/v1/completions', { model: 'builtin:tiny', prompt: 'a', max_tokens: 0 }],
      ['/v1/completions', { model: 'builtin:tiny', prompt: 'a', stream: 'yes' }],
      ['/v1/completions', { model: 'builtin:tiny', prompt: 'a', max_tokns: 3 }],
      ['/v1/completions', { model: 'builtin:tiny', prompt: 'a', tools: [{}] }],
      ['/v1/completions', { model: 'nope', prompt: 'a' }],
      ['/v1/chat/completions', { model: 'builtin:tiny', messages: [] }],
      ['/v1/chat/completions', { model: 'builtin:tiny', messages: [{ role: 'user', content: 'hi' }], max_completion_tokens: MAX_LEN }],
    ];
    for (const [path, body] of cases) {
      const p = await postJson(`${proxy}${path}`, body);
      const e = await postJson(`${decoder}${path}`, body);
      const what = `${path} ${JSON.stringify(body).slice(0, 120)}`;
      assert.ok(p.status >= 400 && p.status < 500, `${what}: ${p.status}`);
      assert.deepEqual([p.status, p.json.error.code, p.json.error.type], [e.status, e.json.error.code, e.json.error.type], `${what}: proxy ${JSON.stringify(p.json)} engine ${JSON.stringify(e.json)}`);
    }
  });

  test('non-streamed requests stay out of the TTFT histogram; streamed ones are in it', async () => {
    const count = async () => num(await (await fetch(`${proxy}/metrics`)).text(), /^kvc_proxy_ttft_seconds_count\{endpoint="\/v1\/chat\/completions"\} (\d+)/m) || 0;
    const c0 = await count();
    const body = { model: 'builtin:tiny', messages: [{ role: 'user', content: 'Count to three.' }], max_tokens: 3 };
    assert.equal((await postJson(`${proxy}/v1/chat/completions`, body)).status, 200);
    assert.equal(await count(), c0, 'a non-streamed request is not a TTFT sample');
    const s = await fetch(`${proxy}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }) });
    await s.text();
    assert.equal(await count(), c0 + 1);
  });

  test('the README controller commands and examples/controller run as pasted; pins travel with a move; /clear reports removed and kept', () => {
    const readme = blocks('README.md', 'sh', '## The controller')[0]!;
    const out = paste(readme, cwd);
    // (The lookup reads the controller's index, which follows the instances a moment later: its
    // answer is shown, not checked; the pin asks the instance itself.)
    assert.match(out, /\{"event_id":"pin-[^"]+","num_tokens":[1-9]\d*\}/, `README pin: ${out}`);
    const example = blocks('examples/controller/README.md', 'bash').join('\n');
    const ex = paste(example, cwd);
    assert.match(ex, /\["decoder-0","prefiller-0"\]/, 'both instances registered');
    // Pinned on decoder-0, moved to prefiller-0: the first clear of prefiller-0 keeps the pinned chunks.
    const clears = [...ex.matchAll(/^\[(\d+),(\d+)\]$/gm)].map((m) => [Number(m[1]), Number(m[2])]);
    assert.equal(clears.length, 2, ex);
    assert.ok(clears[0]![1] >= 3, `the pins moved with the chunks (kept ${clears[0]![1]}): ${ex}`);
    assert.equal(clears[1]![1], 0, 'unpinned, they are removed');
    assert.ok(clears[1]![0] >= 3, `the same clear removes them after /unpin: ${ex}`);
    assert.match(ex, /\["copy","finished",\d+\]/);
    assert.match(ex, new RegExp(`send "Authorization: Bearer <secret>" \\(this deployment's secret is the first line of ${logDir}/deployment\\.secret\\)`));
  });

  test('proxy log lines are timestamped and an idle proxy prints no statistics', async () => {
    const log = () => readFileSync(join(logDir, 'proxy.log'), 'utf8').split('\n').filter(Boolean);
    // (`# <time> <command>`: the line kvc up writes before each start of the process.)
    for (const l of log()) assert.match(l, /^(# )?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z /, `untimestamped line: ${l}`);
    assert.match(log()[0]!, new RegExp(`^# \\S+ kvc proxy .* --stats-interval ${STATS_S}( |$)`), 'kvc up passed --stats-interval to the proxy');
    // After the earlier requests' interval is printed (two intervals on: at least one ended since
    // the last request), two more idle intervals add no line.
    await new Promise((r) => setTimeout(r, 2.5 * STATS_S * 1000));
    const n = log().length;
    await new Promise((r) => setTimeout(r, 2.5 * STATS_S * 1000));
    assert.deepEqual(log().slice(n), [], 'nothing printed while idle');
    assert.ok(log().some((l) => / KV hit rate: .* of [1-9]\d* prompt tokens/.test(l)), 'the hit-rate line of a busy interval, timestamped');
  });

  test('the README\'s sample statistics lines have the shape of the real ones', async () => {
    const shape = (l: string) => l.replace(/^\S+Z /, 'T ').replace(/\d+(\.\d+)?/g, 'N');
    const text = readFileSync(join(repoRoot, 'README.md'), 'utf8');
    const samples = text.split('\n').filter((l) => /^\d{4}-\d\d-\d\dT.*Z (TTFT prefiller|KV hit rate)/.test(l));
    assert.equal(samples.length, 2, 'the README shows a TTFT and a KV hit rate line');
    const real = up.output().split('\n').filter((l) => /Z (TTFT prefiller-0|KV hit rate)/.test(l));
    for (const want of samples) {
      assert.ok(real.some((l) => shape(l) === shape(want)), `README line ${want}\nhas no real twin among:\n${real.join('\n')}`);
    }
  });

  test('a log directory belongs to one running deployment; the default follows --port-offset', () => {
    const again = spawnSync(process.execPath, [CLI, 'up', '--port-offset', String(offset + 1), '--log-dir', logDir, '--config-only'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(again.status, 3, again.stderr);
    assert.match(again.stderr, new RegExp(`--log-dir ${logDir} belongs to a running deployment \\(kvc up pid ${up.child.pid}\\); nothing was started`));
    // The running deployment's files are untouched, and the default of another offset is its own.
    assert.equal(readFileSync(join(logDir, 'kvc-up.pid'), 'utf8').trim(), String(up.child.pid));
    const own = spawnSync(process.execPath, [CLI, 'up', '--port-offset', String(offset + 1), '--config-only'], { cwd, encoding: 'utf8', timeout: 60_000 });
    assert.equal(own.status, 0, own.stderr);
    assert.ok(existsSync(join(cwd, `kvc-logs-${offset + 1}`, 'decoder-0.yaml')), own.stdout);
  });
});

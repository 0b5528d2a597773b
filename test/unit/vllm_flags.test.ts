// vLLM's flags kvc does not implement are refused by name ("not supported by kvc (CPU engine):
// <flag>"), also in their --no- and short forms; none of them is a flag kvc implements; and
// --chat-template takes a file or an inline template, as vLLM's does.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { unsupportedVllmFlag, VLLM_UNSUPPORTED } from '../../src/cli/vllm_flags.js';
import { longFlag, parseChatTemplate, SETTINGS, type Setting } from '../../src/common/flags.js';
import { tempDir } from '../../harness/temp_dir.js';

test('unsupported vLLM flags are named, with the reason when there is one', () => {
  assert.equal(unsupportedVllmFlag(['m', '--tensor-parallel-size', '2']), 'not supported by kvc (CPU engine): --tensor-parallel-size (one process computes the whole model)');
  assert.equal(unsupportedVllmFlag(['--kv-cache-dtype', 'float16']), null, 'implemented');
  assert.match(unsupportedVllmFlag(['-tp', '2'])!, /: -tp \(one process/);
  assert.match(unsupportedVllmFlag(['--revision', 'main'])!, /: --revision \(models are local/);
  assert.match(unsupportedVllmFlag(['--seed', '1'])!, /: --seed/);
  assert.match(unsupportedVllmFlag(['--log-level', 'debug'])!, /: --log-level \(set KVC_LOG_LEVEL\)/);
  assert.match(unsupportedVllmFlag(['--no-enable-chunked-prefill'])!, /: --no-enable-chunked-prefill/);
  assert.equal(unsupportedVllmFlag(['--enable-chunked-prefill', '--port', '1', '--api-key', 'k']), null, 'what kvc does is accepted');
  assert.equal(unsupportedVllmFlag(['--', '--seed']), null);
});

test('no refused flag is one kvc engine implements', () => {
  const ours = new Set((Object.values(SETTINGS) as Setting<unknown>[]).filter((s) => s.commands.includes('engine')).map((s) => longFlag(s)));
  for (const f of Object.keys(VLLM_UNSUPPORTED)) assert.ok(!ours.has(f), f);
});

test('--chat-template: a file is read, a template is taken inline, anything else is refused', () => {
  const dir = tempDir('kvc-chat-template-');
  const file = join(dir, 'template.jinja');
  writeFileSync(file, '{{ messages[0].content }}');
  assert.equal(parseChatTemplate(file), '{{ messages[0].content }}');
  assert.equal(parseChatTemplate('{% for m in messages %}{{ m.content }}{% endfor %}'), '{% for m in messages %}{{ m.content }}{% endfor %}');
  assert.throws(() => parseChatTemplate(join(dir, 'missing.jinja')), /--chat-template: ".*missing\.jinja" is neither a readable file nor a template/);
});

test('docs/coming-from-lmcache-vllm.md lists every refused vLLM flag', async () => {
  const { readFileSync } = await import('node:fs');
  const page = readFileSync(join(process.cwd(), 'docs/coming-from-lmcache-vllm.md'), 'utf8');
  // The data-parallel flags are listed together as `--data-parallel-*`.
  for (const f of Object.keys(VLLM_UNSUPPORTED)) assert.ok(page.includes(`\`${f}\``) || (f.startsWith('--data-parallel-') && page.includes('`--data-parallel-*`')), f);
});

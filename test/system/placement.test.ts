// run-tests: exclusive — an engine at idle CPU priority (SCHED_IDLE) gets no CPU while other files' processes want it, so it starts only when it runs alone.
// CPU placement: cpulists (`kvc engine --cpus`), the plans of `kvc up --placement`, and
// `kvc up --prefillers 0` (colocated kv_both engines behind the proxy). Unknown CPUs and malformed
// lists are clear start errors naming the flag; a started engine really runs on its set, and at
// idle CPU priority when asked (`--cpu-priority idle`, what `kvc up` gives prefillers sharing CPUs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { formatCpuList, machineCpus, parseCpuList, validateCpuList } from '../../src/common/cpu_set.js';
import { freePortRange } from '../../harness/ports.js';
import { controllerArgs, engineArgs, makePlan, proxyArgs, type PlanOptions } from '../../src/deploy/plan.js';
import { parsePlacement, placeEngines } from '../../src/deploy/placement.js';
import { parseTopology } from '../../src/proxy/topology.js';
import { startKvc, waitHttp } from '../../harness/proc.js';

const base: PlanOptions = { prefillers: 1, decoders: 1, model: 'builtin:tiny', portOffset: 0, controller: true, host: '127.0.0.1' };

test('cpulists parse, format and name what is wrong', () => {
  assert.deepEqual(parseCpuList('--cpus', '0-1'), [0, 1]);
  assert.deepEqual(parseCpuList('--cpus', ' 3,0-1,1 '), [0, 1, 3]);
  assert.equal(formatCpuList([5, 0, 1, 2]), '0-2,5');
  assert.throws(() => parseCpuList('--cpus', ''), /--cpus: expected a CPU list/);
  assert.throws(() => parseCpuList('--cpus', '1-x'), /--cpus: .*"1-x" is not a CPU number or range/);
  assert.throws(() => parseCpuList('--cpus', '3-1'), /--cpus: range "3-1" .* runs backwards/);
  assert.deepEqual(validateCpuList('--cpus', '1', [0, 1]), [1]);
  assert.throws(() => validateCpuList('--cpus', '0,7-8', [0, 1]), /--cpus: CPU 7-8 are not on this machine \(its CPUs are 0-1\), found "0,7-8"/);
  assert.ok(machineCpus().length >= 1);
});

test('kvc up --placement: split (default), shared, explicit, colocated', () => {
  const pl = (prefill: string | null, decoders: (string | null)[], prefillIdle = false, services: string | null = null) => ({ prefill, decoders, prefillIdle, services });
  // split: the proxy and the controller go with the prefillers, off the decoders' CPUs.
  const split = (prefill: string, decoders: string[]) => pl(prefill, decoders, false, prefill);
  assert.deepEqual(placeEngines({ kind: 'split' }, 1, 1, [0, 1]), split('0', ['1']));
  assert.deepEqual(placeEngines({ kind: 'split' }, 2, 2, [0, 1, 2, 3]), split('0-1', ['2-3', '2-3']));
  assert.deepEqual(placeEngines({ kind: 'split' }, 3, 1, [0, 1, 2, 3]), split('0-2', ['3']));
  // split keeps the parts disjoint even when two decoders then share a CPU; decode-first gives
  // each decoder its own and the prefillers every CPU at idle priority.
  assert.deepEqual(placeEngines({ kind: 'split' }, 2, 2, [0, 1]), split('0', ['1', '1']));
  assert.deepEqual(placeEngines({ kind: 'decode-first' }, 2, 2, [0, 1]), pl('0-1', ['0', '1'], true));
  assert.deepEqual(placeEngines({ kind: 'decode-first' }, 1, 2, [0, 1]), pl('0-1', ['0', '1'], true));
  assert.deepEqual(placeEngines({ kind: 'decode-first' }, 1, 1, [0, 1, 2]), pl('0-2', ['2'], true));
  assert.throws(() => placeEngines({ kind: 'decode-first' }, 1, 3, [0, 1]), /--placement decode-first: 3 decoders need a CPU each, the machine has 2/);
  assert.deepEqual(parsePlacement('decode-first', [0, 1]), { kind: 'decode-first' });
  assert.deepEqual(placeEngines({ kind: 'split' }, 1, 3, [0, 1]), split('0', ['1', '1', '1']), 'more decoders than CPUs: they share the decoders\' part');
  assert.deepEqual(placeEngines({ kind: 'split' }, 1, 1, [0]), pl(null, [null]), 'one CPU: nothing to split');
  assert.deepEqual(placeEngines({ kind: 'split' }, 0, 2, [0, 1]), pl(null, [null, null]), 'colocated engines share every CPU');
  assert.deepEqual(placeEngines({ kind: 'shared' }, 1, 1, [0, 1]), pl(null, [null]));
  assert.deepEqual(parsePlacement('prefill=0/decode=1', [0, 1]), { kind: 'explicit', prefill: '0', decode: '1' });
  assert.deepEqual(parsePlacement('split', [0, 1]), { kind: 'split' });
  assert.throws(() => parsePlacement('prefill=0/decode=3', [0, 1]), /--placement decode=3: CPU 3 is not on this machine \(its CPUs are 0-1\)/);
  assert.throws(() => parsePlacement('half', [0, 1]), /--placement: expected "split", "decode-first", "shared" or "prefill=LIST\/decode=LIST"/);
  assert.throws(() => parsePlacement('prefill=0', [0, 1]), /"decode=LIST" is missing/);
  assert.throws(() => placeEngines(parsePlacement('prefill=0/decode=1', [0, 1]), 0, 2, [0, 1]), /given with --prefillers 0/);
  assert.throws(() => placeEngines(parsePlacement('decode=1', [0, 1]), 1, 1, [0, 1]), /"prefill=LIST" is missing/);

  // The plan hands each engine its --cpus.
  const plan = makePlan({ ...base, machineCpus: [0, 1] });
  const byName = Object.fromEntries(plan.engines.map((e) => [e.name, engineArgs(plan, e, '{}')]));
  assert.deepEqual(byName['prefiller-0']!.slice(-2), ['--cpus', '0']);
  assert.deepEqual(byName['decoder-0']!.slice(-2), ['--cpus', '1']);
  assert.ok(!byName['prefiller-0']!.includes('--cpu-priority'), 'a prefiller on its own CPUs keeps normal priority');
  // The proxy and the controller are pinned with the prefillers (split), nowhere else.
  const cpusOf = (args: string[]) => (args.includes('--cpus') ? args[args.indexOf('--cpus') + 1] : null);
  assert.equal(cpusOf(proxyArgs(plan)), '0');
  assert.equal(cpusOf(controllerArgs(plan)), '0');
  const shared = makePlan({ ...base, machineCpus: [0, 1], placement: { kind: 'shared' } });
  for (const e of shared.engines) assert.ok(!engineArgs(shared, e, '{}').includes('--cpus'));
  assert.equal(cpusOf(proxyArgs(shared)), null);
  assert.equal(cpusOf(controllerArgs(shared)), null);
  const twoByTwoSplit = makePlan({ ...base, prefillers: 2, decoders: 2, machineCpus: [0, 1] });
  for (const e of twoByTwoSplit.engines) assert.ok(!engineArgs(twoByTwoSplit, e, '{}').includes('--cpu-priority'), `${e.name}: split keeps normal priority`);
  const twoByTwo = makePlan({ ...base, prefillers: 2, decoders: 2, machineCpus: [0, 1], placement: { kind: 'decode-first' } });
  const args2 = Object.fromEntries(twoByTwo.engines.map((e) => [e.name, engineArgs(twoByTwo, e, '{}')]));
  for (const p of ['prefiller-0', 'prefiller-1']) assert.deepEqual(args2[p]!.slice(-4), ['--cpus', '0-1', '--cpu-priority', 'idle']);
  assert.deepEqual(args2['decoder-0']!.slice(-2), ['--cpus', '0']);
  assert.deepEqual(args2['decoder-1']!.slice(-2), ['--cpus', '1']);
  assert.equal(cpusOf(proxyArgs(twoByTwo)), null, 'decode-first: every CPU runs a decoder, the proxy is not pinned');
  const colocated = makePlan({ ...base, prefillers: 0, decoders: 2, machineCpus: [0, 1] });
  assert.equal(cpusOf(proxyArgs(colocated)), null);
});

test('kvc up --prefillers 0: kv_both engines behind a proxy with --num-prefillers 0', () => {
  const plan = makePlan({ ...base, prefillers: 0, decoders: 2, machineCpus: [0, 1] });
  assert.deepEqual(plan.engines.map((e) => e.name), ['engine-0', 'engine-1']);
  for (const e of plan.engines) {
    assert.equal((e.connector as { kv_role: string }).kv_role, 'kv_both');
    assert.equal(e.cacheConfig.enable_xfer, undefined, 'colocated engines have no xfer');
    assert.equal(e.cpus, null, 'both engines on every CPU');
  }
  assert.ok(!plan.ports.some((p) => /xfer (init|alloc)/.test(p.what)), 'no xfer receiver port is reserved');
  const args = proxyArgs(plan);
  assert.equal(args[args.indexOf('--num-prefillers') + 1], '0');
  assert.equal(args[args.indexOf('--num-decoders') + 1], '2');
  const topo = parseTopology({
    prefillerHost: '127.0.0.1', prefillerPort: '7100', numPrefillers: '0',
    decoderHost: '127.0.0.1', decoderPort: '7200', numDecoders: '2', decoderInitPort: '7300', decoderAllocPort: '7400',
  });
  assert.equal(topo.prefillers.length, 0);
  assert.equal(topo.decoders.length, 2);
  assert.throws(() => makePlan({ ...base, prefillers: -1 }), /--prefillers: expected an integer 0\.\.50/);
});

test('kvc engine --cpus: an unknown CPU is a start error naming the flag (nothing is loaded)', async () => {
  const [port] = [await freePortRange(1)];
  const bad = String(Math.max(...machineCpus()) + 1);
  const p = startKvc(['engine', '--port', String(port), '--cpus', bad]);
  const code = await new Promise<number | null>((r) => p.child.once('exit', (c) => r(c)));
  assert.equal(code, 1);
  assert.match(p.output(), new RegExp(`--cpus: CPU ${bad} is not on this machine \\(its CPUs are ${formatCpuList(machineCpus())}\\)`));
  assert.doesNotMatch(p.output(), /model .* loaded/);
  const q = startKvc(['engine', '--port', String(port), '--cpus', '0-']);
  assert.equal(await new Promise<number | null>((r) => q.child.once('exit', (c) => r(c))), 1);
  assert.match(q.output(), /--cpus: expected a CPU list/);
});

test('kvc engine --cpu-priority idle: every thread runs in SCHED_IDLE; a bad level is a start error', async () => {
  const port = await freePortRange(1);
  const bad = startKvc(['engine', '--port', String(port), '--cpu-priority', 'low']);
  assert.notEqual(await new Promise<number | null>((r) => bad.child.once('exit', (c) => r(c))), 0);
  assert.match(bad.output(), /--cpu-priority/);
  assert.match(bad.output(), /normal.*idle|idle.*normal/);
  const p = startKvc(['engine', '--port', String(port), '--cpu-priority', 'idle']);
  try {
    await waitHttp(`http://127.0.0.1:${port}/health`, 120_000);
    assert.match(p.output(), /idle CPU priority \(SCHED_IDLE\)/);
    const pid = p.child.pid!;
    const tasks = readdirSync(`/proc/${pid}/task`);
    assert.ok(tasks.length > 1);
    for (const t of tasks) {
      const out = execFileSync('chrt', ['-p', t]).toString();
      assert.match(out, /SCHED_IDLE/, `thread ${t}: ${out}`);
    }
  } finally {
    await p.kill();
  }
});

/** The process said it runs on `cpu` alone, and every one of its threads has that affinity. */
function assertPinned(p: ReturnType<typeof startKvc>, cpu: number): void {
  assert.match(p.output(), new RegExp(`running on CPUs ${cpu} \\(1 available to this process\\)`));
  const tasks = readdirSync(`/proc/${p.child.pid!}/task`);
  assert.ok(tasks.length > 1);
  for (const t of tasks) {
    const out = execFileSync('taskset', ['-c', '-p', t]).toString();
    assert.match(out, new RegExp(`list: ${cpu}\\s*$`), `thread ${t}: ${out}`);
  }
}

test('kvc engine --cpus: every thread of the engine runs on the set', async () => {
  const cpus = machineCpus();
  const last = cpus[cpus.length - 1]!;
  const port = await freePortRange(1);
  const p = startKvc(['engine', '--port', String(port), '--cpus', String(last)]);
  try {
    await waitHttp(`http://127.0.0.1:${port}/health`, 120_000);
    assertPinned(p, last);
  } finally {
    await p.kill();
  }
});

test('kvc controller and kvc proxy --cpus: every thread runs on the set; an unknown CPU is a start error naming the flag', async () => {
  const cpus = machineCpus();
  const last = cpus[cpus.length - 1]!;
  const [port, monitor] = await freePortRange(2).then((p) => [p, p + 1]);
  const bad = startKvc(['proxy', '--port', String(port), '--cpus', String(last + 1)]);
  assert.notEqual(await new Promise<number | null>((r) => bad.child.once('exit', (c) => r(c))), 0);
  assert.match(bad.output(), new RegExp(`--cpus: CPU ${last + 1} is not on this machine`));
  const p = startKvc(['controller', '--port', String(port), '--monitor-port', String(monitor), '--cpus', String(last)]);
  try {
    await waitHttp(`http://127.0.0.1:${port}/healthz`, 60_000);
    assertPinned(p, last);
  } finally {
    await p.kill();
  }
});

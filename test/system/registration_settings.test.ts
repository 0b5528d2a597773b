// No silent 0 % hit rate (docs/controller.md "Registration"): a real `kvc controller` process
// refuses an instance whose chunk size, hash seed or KV dtype differs from its model group's (the
// first registered instance of the model, and the controller's seed), with a message naming the
// setting; another model forms its own group; GET /deployment states the settings and refusals. Instances speak the monitor
// protocol over their own DEALER sockets, as engines do.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Dealer } from 'zeromq';
import { decode } from '@msgpack/msgpack';
import { freePortRange } from '../../harness/ports.js';
import { encodeMsg, PROTOCOL_VERSION } from '../../src/protocol/monitor.js';
import { startKvc } from '../../harness/proc.js';
import { keySettingsDiffer } from '../../src/proxy/key_settings.js';

interface Reg {
  id: string;
  chunk?: number;
  model?: string;
  seed?: string;
  dtype?: 'f32' | 'f16' | 'bf16' | '';
}

test('the controller refuses an instance whose keys could never match, naming the setting', { timeout: 120_000 }, async () => {
  const http = await freePortRange(2);
  const monitor = http + 1;
  const ctl = startKvc(['controller', '--port', String(http), '--monitor-port', String(monitor), '--heartbeat-timeout', '30'], { PYTHONHASHSEED: '7' });
  const socks: Dealer[] = [];
  try {
    await ctl.waitFor(/kvc controller ready/, 60_000);
    const register = async (r: Reg): Promise<Record<string, unknown>> => {
      const d = new Dealer({ routingId: `reg-${r.id}`, linger: 0 });
      d.connect(`tcp://127.0.0.1:${monitor}`);
      socks.push(d);
      await d.send(encodeMsg({
        t: 'register', v: PROTOCOL_VERSION, instance_id: r.id, worker_id: 0, session: `reg-${r.id}`, ip: '127.0.0.1', worker_port: 1, distributed_url: null,
        chunk_size: r.chunk ?? 16, model_id: r.model ?? 'tiny', seed: r.seed ?? '7', ...(r.dtype === '' ? {} : { kv_dtype: r.dtype ?? 'f32' }), locations: ['LocalCPUBackend'], pid: 1,
      }));
      const [reply] = await d.receive();
      return decode(reply!) as Record<string, unknown>;
    };
    assert.equal((await register({ id: 'first' })).t, 'welcome');
    const refusals: [Reg, RegExp][] = [
      [{ id: 'chunk', chunk: 32 }, /chunk size \(chunk_size\) 32 differs from the deployment's 16 \(set by first\/0/],
      [{ id: 'seed', seed: '0' }, /hash seed \(PYTHONHASHSEED\) 0 differs from the deployment's 7/],
      [{ id: 'dtype', dtype: 'f16' }, /holds KV as f16, but instance "first" of model "tiny" holds f32/],
    ];
    for (const [r, msg] of refusals) {
      const reply = await register(r);
      assert.equal(reply.t, 'error', `${r.id}: ${JSON.stringify(reply)}`);
      assert.match(String(reply.message), /^registration refused: /);
      assert.match(String(reply.message), msg);
    }
    // Same settings (and an instance without a model, which reports no dtype: f32) are welcome;
    // another model is its own group, with its own chunk size.
    assert.equal((await register({ id: 'second' })).t, 'welcome');
    assert.equal((await register({ id: 'model', model: 'other', chunk: 64 })).t, 'welcome');
    assert.equal((await register({ id: 'cache-only', dtype: '' })).t, 'welcome');
    const dep = (await (await fetch(`http://127.0.0.1:${http}/deployment`)).json()) as { seed: string; model_id: string; chunk_size: number; kv_dtype: string; groups: { model_id: string; chunk_size: number }[]; refused: { instance: string; message: string }[] };
    assert.deepEqual([dep.seed, dep.model_id, dep.chunk_size, dep.kv_dtype], ['7', 'tiny', 16, 'f32']);
    assert.deepEqual(dep.groups.map((g) => [g.model_id, g.chunk_size]), [['tiny', 16], ['other', 64]]);
    assert.deepEqual(dep.refused.map((x) => x.instance).sort(), ['chunk/0', 'dtype/0', 'seed/0']);
    const inst = (await (await fetch(`http://127.0.0.1:${http}/instances`)).json()) as { instances: unknown[] };
    assert.equal(inst.instances.length, 4, JSON.stringify(inst));
    const metrics = await (await fetch(`http://127.0.0.1:${http}/metrics`)).text();
    assert.match(metrics, /^kvc_controller_refused_registrations_total 3$/m);
  } finally {
    for (const d of socks) d.close();
    await ctl.kill('SIGTERM');
  }
});

test("the proxy's comparison names the setting that differs", () => {
  const dep = { seed: '0', model_id: 'tiny', chunk_size: 256, kv_dtype: 'f32' };
  const e = { seed: '0', model_id: 'tiny', chunk_size: 256, kv_dtype: 'f32' };
  assert.equal(keySettingsDiffer(e, dep), null);
  assert.match(keySettingsDiffer({ ...e, chunk_size: 64 }, dep)!, /chunk size 64 differs from the deployment's 256/);
  assert.match(keySettingsDiffer({ ...e, seed: '3' }, dep)!, /hash seed \(PYTHONHASHSEED\) 3 differs/);
  assert.match(keySettingsDiffer({ ...e, model_id: 'x' }, dep)!, /model id "x"/);
  assert.match(keySettingsDiffer({ ...e, kv_dtype: 'f16' }, dep)!, /KV dtype f16/);
  // Before any instance registered, only the seed is known.
  assert.equal(keySettingsDiffer({ ...e, chunk_size: 64 }, { seed: '0', model_id: null, chunk_size: null, kv_dtype: null }), null);
});

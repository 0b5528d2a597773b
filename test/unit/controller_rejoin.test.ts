// An engine restarted within the controller's heartbeat timeout re-registers from the same address
// under a new session: the new registration must replace the old one and stay (the old record's
// removal must not take the new one's worker map with it), so the controller keeps operating on it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Registry } from '../../src/controller/registry.js';
import { PROTOCOL_VERSION } from '../../src/protocol/monitor.js';

const register = (session: string) => ({
  t: 'register',
  v: PROTOCOL_VERSION,
  instance_id: 'decoder-0',
  worker_id: 0,
  session,
  ip: '127.0.0.1',
  worker_port: 7750,
  distributed_url: '127.0.0.1:7850',
  chunk_size: 256,
  model_id: 'm',
  seed: '0',
  locations: ['LocalCPUBackend'],
  pid: 1,
});

test('a restart within the heartbeat timeout replaces the old registration and keeps the new one', () => {
  const reg = new Registry({ heartbeatTimeoutMs: 10_000, seed: 0n });
  const t0 = 1_000_000;
  assert.equal(reg.handle('old-session', register('old-session'), t0)?.t, 'welcome');
  // Killed and restarted 2 s later: same address, new session.
  assert.equal(reg.handle('new-session', register('new-session'), t0 + 2_000)?.t, 'welcome');
  const rec = reg.instances.get('decoder-0')?.get(0);
  assert.ok(rec, 'decoder-0/0 is registered');
  assert.equal(rec.routingId, 'new-session');
  assert.equal(reg.workers().length, 1, 'one worker record, the new one');
  // Heartbeats of the new session keep it alive past the old record's timeout.
  for (let t = t0 + 4_000; t <= t0 + 30_000; t += 2_000) {
    assert.equal(reg.handle('new-session', { t: 'hb' }, t)?.t, 'hb_ack');
    reg.reap(t);
  }
  assert.equal(reg.instances.get('decoder-0')?.get(0)?.routingId, 'new-session', 'still registered after the old record would have expired');
  // The old session is gone: its heartbeats are told to re-register, not acknowledged.
  assert.equal(reg.handle('old-session', { t: 'hb' }, t0 + 30_000)?.t, 'reregister');
});

// Ports picked for test and benchmark servers stay below the kernel's ephemeral range: a port
// there, found free, can be taken by any process's next outgoing connection before the server
// binds it (a full test run once failed `kvc up` with EADDRINUSE that way).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { ephemeralPortLow, freePortRange, isPortFree } from '../../src/common/ports.js';
import { freePortOffset } from '../../src/deploy/free_offset.js';
import { makePlan } from '../../src/deploy/plan.js';

const RANGE_FILE = '/proc/sys/net/ipv4/ip_local_port_range';

test('ephemeralPortLow is the first port of the kernel range (32768 where there is no such file)', () => {
  const expected = existsSync(RANGE_FILE) ? Number(readFileSync(RANGE_FILE, 'utf8').trim().split(/\s+/)[0]) : 32768;
  assert.equal(ephemeralPortLow(), expected);
});

test('freePortRange picks consecutive free ports below the ephemeral range by default', async () => {
  for (let i = 0; i < 20; i++) {
    const base = await freePortRange(5);
    assert.ok(base >= 20000 && base + 4 < ephemeralPortLow(), `ports ${base}..${base + 4} below ${ephemeralPortLow()}`);
    for (let k = 0; k < 5; k++) assert.ok(await isPortFree(base + k));
  }
  await assert.rejects(freePortRange(10, 30000, 30005), /\[30000, 30005\) cannot hold 10 consecutive ports/);
});

test('freePortOffset: every port of the plan is free and below the ephemeral range; shift keeps callers apart', async () => {
  const o = { prefillers: 2, decoders: 2, model: 'builtin:tiny', controller: true, host: '127.0.0.1' };
  for (const shift of [0, 50]) {
    for (let i = 0; i < 10; i++) {
      const off = await freePortOffset(o, shift);
      assert.equal(off % 100, shift);
      for (const p of makePlan({ ...o, portOffset: off }).ports) {
        assert.ok(p.port < ephemeralPortLow(), `${p.what} ${p.port} below ${ephemeralPortLow()}`);
        assert.ok(await isPortFree(p.port), `${p.what} ${p.port} free`);
      }
    }
  }
});

// A move and a copy between two cache instances in their own processes, interrupted at each step of
// the peer transfer (docs/controller.md, "Peer-to-peer transfer"): the source keeps every chunk and
// the destination is left clean (nothing stored, no room kept reserved, nothing pinned). The
// transfer runs through a relay in the test process that cuts both connections at a chosen point
// of the stream (the frames are followed byte by byte, so the cut is exact, not timed):
//   hello      right after HELLO reached the destination, before its answer reaches the source;
//   chunk      in the middle of the second chunk's bytes;
//   commit     after every chunk was acknowledged, instead of forwarding COMMIT;
//   commit_ok  after the destination committed, before its COMMIT_OK reaches the source: the source
//              cannot know the move is safe and keeps its chunks; the destination holds the whole
//              transfer (a complete extra copy, never a partial one).
// (The delete phase, after COMMIT_OK, is covered by controller.test.ts with an injected clock.)
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { DType, type KvLayout } from '../../src/common/chunk.js';
import { chunkKeys } from '../../src/common/keys.js';
import { freePortRange } from '../../harness/ports.js';
import { PEER_FRAME_HEAD, PeerFrame } from '../../src/protocol/peer_frames.js';
import { postJson, startKvc, waitUntil, type Proc } from '../../harness/proc.js';

const CHILD = fileURLToPath(new URL('../../harness/instance_child.js', import.meta.url));
const MODEL = 'interrupt-model';
// 256 KiB chunks (4 layers × 8 KV heads × 128, f16, 16 tokens): each spans several socket reads.
const LAYOUT: KvLayout = { dtype: DType.f16, numLayers: 4, numKvHeads: 8, headDim: 128 };
const CHUNK = 16;
const N = 8;
const TOKENS = Array.from({ length: N * CHUNK }, (_, i) => 7000 + i);
const KEYS = chunkKeys(TOKENS, { modelId: MODEL, chunkSize: CHUNK, seed: 0n }).map((s) => s.key);

type Step = 'hello' | 'chunk' | 'commit' | 'commit_ok' | 'none';

/**
 * Follows the frames (u32le length, u8 type, body) of one direction of a connection: `onHead` may
 * throw to cut before a frame, `onBody` may return how many bytes of a piece of a body pass before
 * the cut.
 */
function frameTracker(onHead: (type: number, len: number) => void, onBody: (type: number, at: number, n: number) => number | null) {
  const head = Buffer.alloc(PEER_FRAME_HEAD);
  let fill = 0;
  let type = 0;
  let left = 0;
  let at = 0;
  /** Returns how many bytes of `d` may pass before the cut (d.length: all). */
  return (d: Buffer): number => {
    let off = 0;
    while (off < d.length) {
      if (left === 0) {
        const n = Math.min(PEER_FRAME_HEAD - fill, d.length - off);
        d.copy(head, fill, off, off + n);
        fill += n;
        if (fill < PEER_FRAME_HEAD) return d.length;
        fill = 0;
        type = head.readUInt8(4);
        left = head.readUInt32LE(0);
        at = 0;
        const headAt = off; // (the head may have begun in an earlier piece: those bytes passed, harmless)
        off += n;
        try {
          onHead(type, left);
        } catch {
          return headAt;
        }
        continue;
      }
      const n = Math.min(left, d.length - off);
      const cut = onBody(type, at, n);
      if (cut !== null) return off + cut;
      at += n;
      left -= n;
      off += n;
    }
    return d.length;
  };
}

class Cut extends Error {}

/** Forwards each connection to `target` and cuts both sockets at `step`. */
async function relay(target: string, step: Step): Promise<{ url: string; cuts: () => number; close(): Promise<void> }> {
  const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))];
  let cuts = 0;
  const server = net.createServer((src) => {
    const dst = net.connect({ host, port });
    let open = true;
    // The destination gets what was forwarded, then the end of the stream; the source a reset.
    const cut = () => {
      if (!open) return;
      open = false;
      cuts++;
      src.destroy();
      dst.end();
    };
    let chunks = 0;
    const up = frameTracker(
      (type) => {
        if (type === PeerFrame.Chunk) chunks++;
        if (step === 'commit' && type === PeerFrame.Commit) throw new Cut();
      },
      (type, at, n) => {
        // Half of the second chunk's bytes pass, then the cut.
        if (step === 'chunk' && type === PeerFrame.Chunk && chunks === 2 && at + n > 128 * 1024) return Math.max(0, 128 * 1024 - at);
        return null;
      },
    );
    const down = frameTracker(
      (type) => {
        if (step === 'hello' && type === PeerFrame.HelloOk) throw new Cut();
        if (step === 'commit_ok' && type === PeerFrame.CommitOk) throw new Cut();
      },
      () => null,
    );
    src.on('data', (d: Buffer) => {
      if (!open) return;
      const pass = up(d);
      if (pass > 0) dst.write(d.subarray(0, pass));
      if (pass < d.length) cut();
    });
    dst.on('data', (d: Buffer) => {
      if (!open) return;
      const pass = down(d);
      if (pass > 0) src.write(d.subarray(0, pass));
      if (pass < d.length) cut();
    });
    src.on('error', () => {});
    dst.on('error', () => {});
    src.on('close', () => open && dst.destroy());
    dst.on('close', () => src.destroy());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    cuts: () => cuts,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

interface Child {
  child: ChildProcess;
  out: () => string;
}

function startInstance(id: string, monitorPort: number, tokens: number[], cpuGiB?: number): Child {
  const child = spawn(process.execPath, [CHILD, JSON.stringify({ id, monitorPort, modelId: MODEL, chunkSize: CHUNK, layout: LAYOUT, tokens, cpuGiB })], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  return { child, out: () => out };
}

describe('a move and a copy interrupted at each step of the transfer', () => {
  let ctl: Proc;
  let url: string;
  let S: Child;
  let D: Child;
  let sWorker: string;
  let dWorker: string;
  let dPeer: string;

  const held = async (worker: string) => {
    const r = await postJson(`${worker}/lookup`, { keys: KEYS, location: 'LocalCPUBackend' });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return r.json.count as number;
  };
  const move = (target: string, copy: boolean) =>
    postJson(`${sWorker}/move`, { keys: KEYS, location: 'LocalCPUBackend', copy, target: { location: 'LocalCPUBackend', distributed_url: target }, deadline_ms: 30_000 });
  /** Clears a location; pinned chunks stay (so `removed` also says nothing was left pinned). */
  const clear = async (worker: string) => (await postJson(`${worker}/clear`, { location: 'LocalCPUBackend' })).json.removed as number;

  before(async () => {
    const http = await freePortRange(2);
    url = `http://127.0.0.1:${http}`;
    ctl = startKvc(['controller', '--port', String(http), '--monitor-port', String(http + 1), '--heartbeat-timeout', '30']);
    await ctl.waitFor(/kvc controller ready/, 60_000);
    S = startInstance('int-src', http + 1, TOKENS);
    // Room for the N chunks and not one more (each takes 256 KiB + its 4 KiB-rounded header): a
    // reservation an interrupted transfer left behind shows at once as no room for the next one.
    D = startInstance('int-dst', http + 1, [], (N * (256 + 4) * 1024 + 1024) / 2 ** 30);
    await waitUntil('both instances registered and stored', async () => /stored 8/.test(S.out()) && /stored 0/.test(D.out()), 60_000, 50);
    const { instances: list } = (await (await fetch(`${url}/instances`)).json()) as { instances: { instance_id: string; workers: { ip: string; worker_port: number; distributed_url: string }[] }[] };
    const w = (id: string) => list.find((i) => i.instance_id === id)!.workers[0]!;
    sWorker = `http://${w('int-src').ip}:${w('int-src').worker_port}`;
    dWorker = `http://${w('int-dst').ip}:${w('int-dst').worker_port}`;
    dPeer = w('int-dst').distributed_url;
    assert.equal(await held(sWorker), N);
    assert.equal(await held(dWorker), 0);
  });

  after(async () => {
    for (const c of [S, D]) if (c && c.child.exitCode === null) c.child.kill('SIGKILL');
    await ctl?.kill();
  });

  for (const copy of [false, true]) {
    for (const step of ['hello', 'chunk', 'commit', 'commit_ok'] as const) {
      test(`${copy ? 'copy' : 'move'} cut at ${step}: the source keeps every chunk, the destination ${step === 'commit_ok' ? 'holds the committed copy' : 'is left clean'}`, async () => {
        const r = await relay(dPeer, step);
        try {
          const res = await move(r.url, copy);
          assert.ok(res.status >= 500, `the interrupted ${copy ? 'copy' : 'move'} answered ${res.status} ${JSON.stringify(res.json)}`);
          assert.match(res.json.error.message, /source kept intact/);
          assert.equal(r.cuts(), 1, 'the relay cut the transfer once');
          assert.equal(await held(sWorker), N, 'the source lost chunks');
          if (step === 'commit_ok') {
            // Committed at the destination: all of it, never part of it.
            await waitUntil('the destination committed', async () => (await held(dWorker)) === N, 10_000, 20);
            assert.equal(await clear(dWorker), N, 'the committed chunks are not left pinned');
          } else {
            // Nothing of an uncommitted transfer stays: no chunk, no pin (clear removes 0, leaves 0).
            assert.equal(await held(dWorker), 0, 'the destination kept chunks of an uncommitted transfer');
            assert.equal(await clear(dWorker), 0);
          }
          // Its room is all there: a whole copy of the N chunks fits (no reservation was left behind).
          const whole = await move(dPeer, true);
          assert.equal(whole.status, 200, JSON.stringify(whole.json));
          assert.equal(await clear(dWorker), N);
        } finally {
          await r.close();
        }
      });
    }
  }

  test('afterwards, the same copy and move go through whole; nothing was left pinned or reserved', async () => {
    const r = await relay(dPeer, 'none');
    try {
      const c = await move(r.url, true);
      assert.equal(c.status, 200, JSON.stringify(c.json));
      assert.equal(await held(sWorker), N);
      assert.equal(await held(dWorker), N);
      await clear(dWorker);
      const m = await move(r.url, false);
      assert.equal(m.status, 200, JSON.stringify(m.json));
      assert.equal(await held(sWorker), 0);
      assert.equal(await held(dWorker), N);
      assert.equal(await clear(dWorker), N, 'a moved chunk was left pinned at the destination');
      assert.equal(r.cuts(), 0);
    } finally {
      await r.close();
    }
  });
});

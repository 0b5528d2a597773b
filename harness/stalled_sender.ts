// A transfer sender that stops in the middle of a chunk, in its own process, for the transfer
// contract's tests (test/system/xfer_contract.test.ts). It speaks the real xfer protocol to a
// decoder's receiver: HELLO (with the deployment secret when one is set), an ALLOC for the given
// chunks, then a DATA frame of the first chunk of which only half the body is written. Then it
// reports {stalled: true} over IPC and keeps the connections open without sending anything more,
// until the receiver cuts them or the test kills it.
//
//   fork('dist/harness/stalled_sender.js', [JSON.stringify({host, initPort, allocPort, modelId,
//        chunkSize, layout, reqId, chunks: [[key, bytes], ...]})])
import net from 'node:net';
import { deploymentSecret } from '../src/common/auth.js';
import { seal } from '../src/common/replay.js';
import type { KvLayout } from '../src/common/chunk.js';
import { FrameParser, FrameType, PROTOCOL_VERSION, writeFrame, type HelloMeta } from '../src/protocol/xfer_frames.js';

interface Args {
  host: string;
  initPort: number;
  allocPort: number;
  modelId: string;
  chunkSize: number;
  layout: KvLayout;
  reqId: string;
  chunks: [string, number][];
}

function connect(host: string, port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, host, () => resolve(s));
    s.once('error', reject);
  });
}

/** Resolves with the meta of the next frame of `type` arriving on `sock`. */
function nextFrame(sock: net.Socket, type: FrameType): Promise<any> {
  return new Promise((resolve) => {
    const parser = new FrameParser(0, () => null, (t, meta) => {
      if (t === type) {
        sock.off('data', feed);
        resolve(meta);
      }
    });
    const feed = (d: Buffer) => parser.push(d);
    sock.on('data', feed);
  });
}

/** The bytes writeFrame would put on the wire. */
function frameBytes(type: FrameType, meta: object, body: Uint8Array): Buffer {
  const parts: Buffer[] = [];
  const sink = { write: (b: Uint8Array) => (parts.push(Buffer.from(b)), true), cork() {}, uncork() {} } as unknown as net.Socket;
  writeFrame(sink, type, meta, body);
  return Buffer.concat(parts);
}

async function main(): Promise<void> {
  const a = JSON.parse(process.argv[2]!) as Args;
  const init = await connect(a.host, a.initPort);
  const alloc = await connect(a.host, a.allocPort);
  const hello: HelloMeta = seal(deploymentSecret(), 'xfer-hello', {
    version: PROTOCOL_VERSION,
    sender_id: 'stalled-sender',
    model_id: a.modelId,
    chunk_size: a.chunkSize,
    dtype: a.layout.dtype,
    num_layers: a.layout.numLayers,
    num_kv_heads: a.layout.numKvHeads,
    head_dim: a.layout.headDim,
  });
  const helloReply = nextFrame(init, FrameType.HelloReply);
  writeFrame(init, FrameType.Hello, hello);
  const h = await helloReply;
  if (!h.ok) throw new Error(`handshake refused: ${h.error}`);
  const allocReply = nextFrame(alloc, FrameType.AllocReply);
  writeFrame(alloc, FrameType.Alloc, { id: 1, session: h.session, req_id: a.reqId, chunks: a.chunks, wait_ms: 10_000 });
  const r = await allocReply;
  if (!r.ok) throw new Error(`ALLOC refused: ${r.error}`);
  const [key, bytes] = a.chunks[0]!;
  const whole = frameBytes(FrameType.Data, { req_id: a.reqId, key }, new Uint8Array(bytes));
  init.write(whole.subarray(0, whole.byteLength - Math.floor(bytes / 2)));
  init.once('close', () => process.send!({ cut: true }));
  process.send!({ stalled: true, session: h.session });
  setInterval(() => undefined, 60_000); // stays alive, sending nothing, until killed
}

process.on('disconnect', () => process.exit(0)); // parent gone: never linger
main().catch((e) => {
  process.send!({ stalled: false, error: (e as Error).message });
  process.exit(1);
});

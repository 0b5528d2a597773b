// Reading an accepted TCP connection straight into buffers the frame reader chooses.
//
// Node reads a socket into a fresh 64 KiB ArrayBuffer per read and hands it to 'data' listeners.
// At transfer rates that is tens of thousands of short-lived external buffers a second: V8 counts
// them as external memory, and once the process's old generation is past V8's incremental-marking
// threshold (8 MiB: any real engine process, or merely zod's schemas in a bare receiver) that
// pressure turns into a full mark-compact every ~30 MB received — the 2× CPU per byte of issue 10.
// A socket created with the `onread` option instead reads into a buffer we return, every time:
// the reader's scratch buffer for headers, the reserved slot itself for a chunk's body
// (FrameReader.readBuffer in src/protocol/frame_reader.ts). No allocation per read, and no copy of the body.
//
// `onread` is an option of the Socket constructor only (net.createServer has none), so a server
// accepted with pauseOnConnect (nothing read yet) hands its connection's handle to a new Socket
// made with it. Without a handle to take (not a libuv stream), the connection is read the usual way.
import net from 'node:net';

export interface PullReader {
  readBuffer(): Uint8Array;
  readDone(n: number): void;
  push(data: Buffer): void;
}

/**
 * Takes over `accepted` (from a server created with pauseOnConnect) and reads it through `reader`.
 * Returns the socket to use from now on; `onError` gets what the reader threw (the caller closes).
 */
export function readDirect(accepted: net.Socket, reader: PullReader, onError: (e: Error) => void): net.Socket {
  const internals = accepted as unknown as { _handle: unknown };
  const handle = internals._handle;
  if (!handle || typeof (handle as { useUserBuffer?: unknown }).useUserBuffer !== 'function') {
    accepted.on('data', (d: Buffer) => feed(() => reader.push(d), onError));
    accepted.resume();
    return accepted;
  }
  internals._handle = null; // the accepted socket gives its handle up and closes without touching it
  accepted.destroy();
  return new net.Socket({
    handle,
    onread: {
      buffer: () => reader.readBuffer(),
      callback: (n: number) => {
        feed(() => reader.readDone(n), onError);
        return true;
      },
    },
  } as net.SocketConstructorOpts);
}

function feed(f: () => void, onError: (e: Error) => void): void {
  try {
    f();
  } catch (e) {
    onError(e as Error);
  }
}

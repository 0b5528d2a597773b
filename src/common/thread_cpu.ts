// CPU time of the calling thread, for measurements of one thread's work that must not count the
// other threads of the process: V8's background GC threads, the ZeroMQ and libuv I/O threads
// (a transfer being received), the kernel's helper thread. process.cpuUsage() adds them all up,
// and Node 20 has no per-thread CPU clock, so on Linux this reads the first field of
// /proc/thread-self/schedstat (the thread's time on a CPU, in ns) through a descriptor kept open
// (one pread per call, a few µs). The descriptor names the thread that opened it: module state is
// per thread (each worker has its own copy of this module), so each thread reads its own clock.
// Where that file does not exist, it falls back to the process's CPU time (`threadCpuExact`
// says which one is in use).
import { openSync, readSync } from 'node:fs';

let fd: number | null | undefined;
const buf = Buffer.alloc(96);

function open(): number | null {
  try {
    return openSync('/proc/thread-self/schedstat', 'r');
  } catch {
    return null;
  }
}

/** True when threadCpuMicros() measures this thread only (Linux), false when the whole process. */
export function threadCpuExact(): boolean {
  if (fd === undefined) fd = open();
  return fd !== null;
}

/** CPU time of the calling thread so far, in µs (the whole process's where threadCpuExact() is false). */
export function threadCpuMicros(): number {
  if (fd === undefined) fd = open();
  if (fd !== null) {
    try {
      const n = readSync(fd, buf, 0, buf.length, 0);
      let ns = 0;
      for (let i = 0; i < n; i++) {
        const d = buf[i]! - 48;
        if (d < 0 || d > 9) break;
        ns = ns * 10 + d;
      }
      return ns / 1000;
    } catch {
      fd = null; // never again: fall back for good rather than mix two clocks
    }
  }
  const u = process.cpuUsage();
  return u.user + u.system;
}

// Where a soak process's memory is, and how much of it is the cache's own (bench/soak.ts).
import { readFileSync } from 'node:fs';

const MiB = 1048576;

/** Sum of a metric's samples whose line contains `label` ('' = all), by its exact name. */
export function gauge(text: string, name: string, label = ''): number {
  let sum = 0;
  for (const l of text.split('\n')) if ((l.startsWith(`${name}{`) || l.startsWith(`${name} `)) && l.includes(label)) sum += Number(l.slice(l.lastIndexOf(' ') + 1));
  return sum;
}

/**
 * A Node process metric (prom-client's default metrics) whatever the process's prefix
 * (kvc_engine_, kvc_proxy_, kvc_controller_): `suffix` is the name after it, e.g.
 * nodejs_heap_size_used_bytes.
 */
export function nodeGauge(text: string, suffix: string, label = ''): number {
  const m = new RegExp(`^(kvc_[a-z]+_${suffix})[ {]`, 'm').exec(text);
  return m ? gauge(text, m[1]!, label) : NaN;
}

/**
 * The KV cache's own bytes in an engine, each bounded by its configured size: its CPU tier's
 * (kvc_cache_bytes of LocalCPUBackend; the disk tier is not resident, the Redis tier is another
 * process), the resident part of its paged KV pool (pages touched once stay resident), and on a
 * decoder the receive buffer's held slots (kvc_xfer_buffer_held_bytes: KV on its way in; slots
 * used once stay resident until the receiver is idle, so a slow link that made many transfers
 * wait at once leaves them held). Filling these up to their size is the cache doing its job, so
 * memory is judged net of them; the soak prints each.
 */
export function cacheBytes(metrics: string): number {
  return gauge(metrics, 'kvc_cache_bytes', 'location="LocalCPUBackend"') + gauge(metrics, 'kvc_engine_kv_cache_resident_bytes') + gauge(metrics, 'kvc_xfer_buffer_held_bytes');
}

/**
 * Where a process's resident memory is (MiB): anonymous and file-backed (/proc/PID/status), the
 * malloc main arena's brk heap ([heap] in /proc/PID/smaps), and from its /metrics the V8 heap in
 * use and committed (js_heap_total), the V8 young generation's size (new_space: it grows with
 * the allocation rate, 1 to 16 MiB per semi-space, and costs RSS without holding anything), V8's
 * external memory, and an engine's cache bytes one by one (tier, kv_resident, and on a decoder
 * xfer_held; see cacheBytes).
 */
export function memDetail(pid: number, metrics: string): Record<string, number> {
  const out: Record<string, number> = {};
  try {
    const st = readFileSync(`/proc/${pid}/status`, 'utf8');
    for (const [k, f] of [['anon', 'RssAnon'], ['file', 'RssFile']] as const) {
      const m = new RegExp(`^${f}:\\s+(\\d+) kB`, 'm').exec(st);
      if (m) out[k] = Math.round(Number(m[1]) / 1024);
    }
    let inHeap = false;
    for (const l of readFileSync(`/proc/${pid}/smaps`, 'utf8').split('\n')) {
      if (/^[0-9a-f]+-[0-9a-f]+ /.test(l)) inHeap = l.endsWith('[heap]');
      else if (inHeap && l.startsWith('Rss:')) out.brk_heap = Math.round(Number(l.split(/\s+/)[1]) / 1024);
    }
  } catch {
    // the process is gone (a fault killed it): its figures are missing this minute
  }
  if (metrics) {
    const put = (k: string, v: number) => {
      if (Number.isFinite(v)) out[k] = Math.round(v / MiB);
    };
    put('js_heap_used', nodeGauge(metrics, 'nodejs_heap_size_used_bytes'));
    // V8's committed heap (every space): above js_heap_used by what V8 keeps for later and the
    // fragmentation; resident once touched.
    put('js_heap_total', nodeGauge(metrics, 'nodejs_heap_size_total_bytes'));
    put('new_space', nodeGauge(metrics, 'nodejs_heap_space_size_total_bytes', 'space="new"'));
    put('external', nodeGauge(metrics, 'nodejs_external_memory_bytes'));
    // An engine's cache bytes, each (cacheBytes): CPU tier, resident paged KV, held receive buffer.
    if (metrics.includes('kvc_engine_kv_cache_resident_bytes')) {
      put('tier', gauge(metrics, 'kvc_cache_bytes', 'location="LocalCPUBackend"'));
      put('kv_resident', gauge(metrics, 'kvc_engine_kv_cache_resident_bytes'));
    }
    if (metrics.includes('kvc_xfer_buffer_held_bytes')) put('xfer_held', gauge(metrics, 'kvc_xfer_buffer_held_bytes'));
  }
  return out;
}

// The engine's periodic statistics line, like vLLM's: every interval (10 s), the prompt and
// generation throughput of that interval, running and waiting requests, paged-KV usage and the
// prefix-cache hit rate (prompt tokens loaded from the cache instance / prompt tokens looked up
// in it; both counted at the lookup, so an interval never shows more hits than lookups). An idle
// engine is quiet: an interval with no token and nothing running or waiting prints nothing,
// except one closing line when the engine just became idle (so the last line shows 0 running).
//
// The figures are read from the engine's own metrics (EngineMetrics.sample), so the line and
// /metrics always agree. `--disable-log-stats` turns the line off.
import { logger, type LogFields } from '../common/log.js';
import type { EngineSample } from '../protocol/instance_stats.js';
import type { EngineMetrics } from './metrics.js';

const log = logger('engine.stats');

export const STATS_INTERVAL_MS = 10_000;

export interface StatsLine {
  text: string;
  fields: LogFields;
  /** Something happened in the interval or is still running/waiting (false for the closing line). */
  active: boolean;
}

const pct = (x: number | null) => (x === null ? '-' : `${(100 * x).toFixed(1)}%`);
const rate = (n: number, s: number) => (s > 0 ? n / s : 0);

/**
 * The line for the interval from `prev` to `cur` (`seconds` long), or null when the engine was
 * idle through it and already idle before (`wasActive` false).
 */
export function statsLine(prev: EngineSample, cur: EngineSample, seconds: number, wasActive: boolean): StatsLine | null {
  const prompt = Math.max(0, cur.prompt_tokens - prev.prompt_tokens);
  const gen = Math.max(0, cur.generation_tokens - prev.generation_tokens);
  const cached = Math.max(0, cur.cached_tokens - prev.cached_tokens);
  const queried = Math.max(0, cur.query_tokens - prev.query_tokens);
  const transferred = Math.max(0, cur.transferred_tokens - prev.transferred_tokens);
  const active = prompt > 0 || gen > 0 || cur.requests_running > 0 || cur.requests_waiting > 0;
  if (!active && !wasActive) return null;
  const hit = queried > 0 ? Math.min(1, cached / queried) : null;
  const received = prompt > 0 ? Math.min(1, transferred / prompt) : null;
  const promptTps = rate(prompt, seconds);
  const genTps = rate(gen, seconds);
  let text =
    `Avg prompt throughput: ${promptTps.toFixed(1)} tokens/s, Avg generation throughput: ${genTps.toFixed(1)} tokens/s, ` +
    `Running: ${cur.requests_running} reqs, Waiting: ${cur.requests_waiting} reqs, KV cache usage: ${pct(cur.kv_usage_ratio)}, ` +
    `Prefix cache hit rate: ${pct(hit)}`;
  // Only engines that receive KV (decoders) say how much of their prompts arrived that way.
  if (cur.transferred_tokens > 0) text += `, KV received by transfer: ${pct(received)}`;
  return {
    text,
    active,
    fields: {
      interval_s: Math.round(seconds * 10) / 10,
      prompt_throughput_tps: Math.round(promptTps * 10) / 10,
      generation_throughput_tps: Math.round(genTps * 10) / 10,
      running: cur.requests_running,
      waiting: cur.requests_waiting,
      kv_cache_usage: Math.round(cur.kv_usage_ratio * 1000) / 1000,
      prefix_cache_hit_rate: hit === null ? null : Math.round(hit * 1000) / 1000,
      transfer_received_rate: received === null ? null : Math.round(received * 1000) / 1000,
    },
  };
}

/** Prints statsLine() every `intervalMs` until stopped. */
export class EngineStatsLog {
  private prev: EngineSample | null = null;
  private prevAt = 0;
  private wasActive = false;
  private readonly timer: NodeJS.Timeout;
  /** Settles once the first sample (the baseline of the first interval) was taken. */
  readonly ready: Promise<void>;

  constructor(
    private readonly metrics: EngineMetrics,
    intervalMs = STATS_INTERVAL_MS,
  ) {
    this.timer = setInterval(() => void this.tick(), intervalMs);
    this.timer.unref();
    this.ready = this.tick();
  }

  private busy = false;

  private async tick(): Promise<void> {
    // A slow sample must not overlap the next one (both would measure from the same baseline).
    if (this.busy) return;
    this.busy = true;
    try {
      const cur = await this.metrics.sample();
      const now = performance.now();
      if (this.prev) {
        const line = statsLine(this.prev, cur, (now - this.prevAt) / 1000, this.wasActive);
        this.wasActive = line?.active ?? false;
        if (line) log.info(line.text, line.fields);
      }
      this.prev = cur;
      this.prevAt = now;
    } catch (e) {
      log.warn(`statistics line skipped: ${(e as Error).message}`);
    } finally {
      this.busy = false;
    }
  }

  stop(): void {
    clearInterval(this.timer);
  }
}

// One log line per finished request on the engine: its id, prompt tokens and how many of them
// were cached (KV reused from an earlier request: this engine's cache instance, its tiers, P2P, or
// reused by the prefiller that sent it) or received (KV transfer from this request's prefiller),
// tokens generated,
// time to first token, total duration and why it ended. `--disable-log-requests` turns the lines
// off (as in vLLM). Under KVC_LOG_FORMAT=json the figures are also fields of the JSON line.
import { logger, type LogFields } from '../common/log.js';
import { reusedTokens } from '../protocol/disagg_spec.js';
import type { FinishReason, Sequence } from './scheduler.js';

/**
 * Where a sequence's prompt KV came from. `cached`: reused from an earlier request (loaded here
 * from the cache instance, or, of what the prefiller sent, what it had itself loaded rather than
 * computed). `received`: sent by this request's prefiller (computed or reused there).
 */
export function promptSources(seq: Sequence): { cached: number; received: number } {
  const received = seq.receivedTokens;
  const reusedByPrefiller = received > 0 ? Math.min(received, reusedTokens(seq.init.kvTransferParams)) : 0;
  return { cached: seq.loadedTokens - received + reusedByPrefiller, received };
}

const log = logger('engine.requests');

export interface FinishedRequest {
  requestId: string;
  promptTokens: number;
  /** Prompt tokens whose KV was reused from an earlier request (promptSources). */
  cachedTokens: number;
  /** Prompt tokens received from this request's prefiller. */
  receivedTokens: number;
  generatedTokens: number;
  /** Null when no token was generated (cancelled or failed before). */
  ttftMs: number | null;
  durationMs: number;
  finishReason: FinishReason;
}

const ms = (v: number) => Math.round(v * 10) / 10;

export function requestLine(r: FinishedRequest): { text: string; fields: LogFields } {
  const loaded = [`${r.cachedTokens} cached`];
  if (r.receivedTokens > 0) loaded.push(`${r.receivedTokens} received`);
  return {
    text:
      `request ${r.requestId}: prompt ${r.promptTokens} tokens (${loaded.join(', ')}), generated ${r.generatedTokens}, ` +
      `TTFT ${r.ttftMs === null ? '-' : `${ms(r.ttftMs).toFixed(1)} ms`}, duration ${ms(r.durationMs).toFixed(1)} ms, finish ${r.finishReason}`,
    fields: {
      request_id: r.requestId,
      prompt_tokens: r.promptTokens,
      cached_tokens: r.cachedTokens,
      received_tokens: r.receivedTokens,
      generated_tokens: r.generatedTokens,
      ttft_ms: r.ttftMs === null ? null : ms(r.ttftMs),
      duration_ms: ms(r.durationMs),
      finish_reason: r.finishReason,
    },
  };
}

export function logRequest(r: FinishedRequest): void {
  const { text, fields } = requestLine(r);
  log.info(text, fields);
}

/** What the line says about a sequence that just ended. */
export function finishedRequest(seq: Sequence, now = performance.now()): FinishedRequest {
  return {
    requestId: seq.init.requestId,
    promptTokens: seq.prompt.length,
    cachedTokens: promptSources(seq).cached,
    receivedTokens: seq.receivedTokens,
    generatedTokens: seq.output.length,
    ttftMs: seq.firstTokenAt ? seq.firstTokenAt - seq.arrival : null,
    durationMs: now - seq.arrival,
    finishReason: seq.finishReason ?? 'abort',
  };
}

// Prometheus counters of routing (registered in the proxy's registry beside metrics.ts), and the
// hit-rate figure the 5-second statistics line prints. "Cached" and "computed" prompt tokens
// are what the controller's index said when the request was routed: the cached prefix on the
// instance chosen to compute the prompt, and the rest.
import { Counter, Gauge, type Registry } from 'prom-client';
import { HotHistogram } from '../common/hot_histogram.js';
import { memoLabels } from './metrics.js';
import { SHARE_WINDOW, type PrefillWhere, type RouteReason } from './router.js';
import type { KeeperChoice } from './keeper.js';

export class RoutingMetrics {
  readonly decisions: Counter<'reason'>;
  readonly promptTokens: Counter<'instance' | 'kind'>;
  readonly prefills: Counter<'where' | 'instance'>;
  readonly lookups: Counter<'outcome'>;
  readonly keepers: Counter<'keeper'>;
  readonly keeperSplits: Counter;
  readonly decisionSeconds: HotHistogram;
  readonly recentDecisions: Gauge<'instance'>;
  /** Instance name → how many of the router's last SHARE_WINDOW kv-aware decisions it computed. */
  private recent: () => Iterable<[string, number]> = () => [];
  private readonly decision: (reason: string) => { inc(): void };
  private readonly tokens: (instance: string, kind: string) => { inc(n: number): void };
  private readonly prefill: (where: string, instance: string) => { inc(): void };
  private readonly lookup: (outcome: string) => { inc(): void };
  /** Prompt tokens of the current statistics interval: [cached, total]. */
  private window = { cached: 0, total: 0 };
  private totals = { cached: 0, total: 0 };

  constructor(registry: Registry) {
    const registers = [registry];
    this.decisions = new Counter({ name: 'kvc_proxy_routing_decisions_total', help: 'Routing decisions by reason (round_robin, prefix_hit, p2p_fetch, load_spread, share_cap, no_prefix, lookup_failed)', labelNames: ['reason'], registers });
    this.promptTokens = new Counter({ name: 'kvc_proxy_prompt_tokens_total', help: 'Prompt tokens per instance that computes them, by kind: cached (per the controller index) or computed', labelNames: ['instance', 'kind'], registers });
    this.prefills = new Counter({ name: 'kvc_proxy_prefills_total', help: 'Prefills by where they ran: remote (a prefiller, KV transferred) or local_* (the decoder itself, and why), and the instance that ran them', labelNames: ['where', 'instance'], registers });
    this.lookups = new Counter({ name: 'kvc_proxy_prefix_lookups_total', help: "Routing lookups on the controller's index, by outcome (ok, failed)", labelNames: ['outcome'], registers });
    this.keepers = new Counter({ name: 'kvc_proxy_keepers_total', help: "Disaggregated prompts by the instance named to keep their chunks (prefiller, decoder): docs/storage.md \"Who keeps a transferred chunk\"", labelNames: ['keeper'], registers });
    this.keeperSplits = new Counter({ name: 'kvc_proxy_keeper_splits_total', help: 'Disaggregated prompts longer than their keeper\'s tier, the chunks past it kept by the other side (kvc_keeper_split): docs/storage.md "Who keeps a transferred chunk"', registers });
    this.decisionSeconds = new HotHistogram({
      name: 'kvc_proxy_routing_decision_seconds',
      help: 'Time to decide where a request goes (controller lookup included)',
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25],
      registers,
    });
    const recent = () => this.recent();
    this.recentDecisions = new Gauge({
      name: 'kvc_proxy_routing_recent_decisions',
      help: `Of the router's last ${SHARE_WINDOW} kv-aware decisions (the share window), how many each instance computed; POST /routing/reset empties it`,
      labelNames: ['instance'],
      registers,
      collect() {
        this.reset();
        for (const [instance, n] of recent()) this.labels(instance).set(n);
      },
    });
    this.decision = memoLabels(this.decisions);
    this.tokens = memoLabels(this.promptTokens);
    this.prefill = memoLabels(this.prefills);
    this.lookup = memoLabels(this.lookups);
  }

  /** Where the share-window gauge reads its figures (the router's, by instance name). */
  watchRecent(fn: () => Iterable<[string, number]>): void {
    this.recent = fn;
  }

  /** A prefill answered: which side was named to keep the prompt's chunks. */
  keeper(k: KeeperChoice): void {
    this.keepers.inc({ keeper: k.keeper });
    if (k.split !== null) this.keeperSplits.inc();
  }

  lookedUp(ok: boolean): void {
    this.lookup(ok ? 'ok' : 'failed').inc();
  }

  routed(reason: RouteReason, where: PrefillWhere, instance: string, promptTokens: number, cachedTokens: number | null): void {
    this.decision(reason).inc();
    this.prefill(where, instance).inc();
    if (cachedTokens === null) return; // no lookup: nothing known about the cache
    const cached = Math.min(cachedTokens, promptTokens);
    if (cached) this.tokens(instance, 'cached').inc(cached);
    if (promptTokens - cached) this.tokens(instance, 'computed').inc(promptTokens - cached);
    this.window.cached += cached;
    this.window.total += promptTokens;
    this.totals.cached += cached;
    this.totals.total += promptTokens;
  }

  /** The statistics line's hit rate, for the interval since the last call (null: nothing looked up). */
  flushHitRate(intervalS: number, now: Date = new Date()): string | null {
    const { cached, total } = this.window;
    this.window = { cached: 0, total: 0 };
    // An interval without a routed prompt prints nothing: an idle proxy is quiet.
    if (total === 0) return null;
    const pct = (c: number, t: number) => (t ? `${((100 * c) / t).toFixed(1)}%` : '-');
    return `${now.toISOString()} KV hit rate: ${pct(cached, total)} of ${total} prompt tokens in last ${intervalS}s cached (total ${pct(this.totals.cached, this.totals.total)} of ${this.totals.total})`;
  }
}

// docs/metrics.md lists exactly the metrics the controller, engine and proxy registries export
// (process metrics aside), each with a type that matches the registry's: a metric added without
// its line, or a line left behind by a removed metric, fails here.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join, dirname } from 'node:path';
import { ControllerMetrics } from '../../src/controller/metrics.js';
import { EventLog } from '../../src/controller/events.js';
import { Operations } from '../../src/controller/operations.js';
import { Registry } from '../../src/controller/registry.js';
import { EngineMetrics } from '../../src/engine/metrics.js';
import { ProxyMetrics } from '../../src/proxy/metrics.js';
import { parseRemoteUrl } from '../../src/common/remote_url.js';
import { registerRemoteMetrics } from '../../src/kvc/remote_metrics.js';
import { registerTransferMetrics } from '../../src/engine/transfer_metrics.js';
import { RemoteTier } from '../../src/kvc/remote_tier.js';
import { P2pMetrics } from '../../src/kvc/p2p_metrics.js';
import { RoutingMetrics } from '../../src/proxy/routing_metrics.js';
import { LedgerMetrics } from '../../src/proxy/ledger_metrics.js';
import { KeySettingsCheck } from '../../src/proxy/key_settings.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const isProcessMetric = (name: string) => /^kvc_(controller|engine|proxy)_(process_|nodejs_)/.test(name);

/** name → type, from the rows of docs/metrics.md's tables (`| \`name{labels}\` | type | …`). */
function documented(): Map<string, string> {
  const md = readFileSync(join(root, 'docs', 'metrics.md'), 'utf8');
  const out = new Map<string, string>();
  for (const m of md.matchAll(/^\| `((?:kvc_|vllm:|lmcache:)[a-z0-9_]+)(?:\{[^}]*\})?` \| (counter|gauge|histogram) \|/gm)) {
    assert.ok(!out.has(m[1]!), `${m[1]} is listed twice`);
    out.set(m[1]!, m[2]!);
  }
  return out;
}

test('docs/metrics.md lists every exported metric with its type, and only those', async () => {
  const controller = new ControllerMetrics(new Operations(new Registry({ heartbeatTimeoutMs: 1000, seed: 0n }), new EventLog(), 0n, { commandMs: 1000, transferMs: 1000 }));
  const engine = new EngineMetrics({ model: 'm' });
  // An engine with remote_url also exports the remote tier's metrics (the tier is never connected here).
  const remote = new RemoteTier({ endpoint: parseRemoteUrl('redis://127.0.0.1:1'), modelId: 'm', timeoutMs: 100, queueBytes: 1 << 20 });
  registerRemoteMetrics(engine.registry, remote);
  // An engine with enable_p2p also exports the P2P counters.
  new P2pMetrics(engine.registry);
  registerTransferMetrics(engine.registry, () => ({ reservations: 0, reservedBytes: 0, heldBytes: 0, transfers: { done: 0, failed: 0, abandoned: 0, inFlight: 0 }, reservationsEnded: { taken: 0, released: 0, expired: 0 } }));
  const proxy = new ProxyMetrics();
  new RoutingMetrics(proxy.registry); // the proxy server registers its routing counters in the same registry
  new LedgerMetrics(proxy.registry); // and the ledger's sums
  new KeySettingsCheck('http://127.0.0.1:1', proxy.registry); // and, with a controller, the key-settings gauge
  const exported = new Map<string, string>();
  for (const reg of [controller.registry, engine.registry, proxy.registry]) {
    for (const m of await reg.getMetricsAsJSON()) if (!isProcessMetric(m.name)) exported.set(m.name, String(m.type));
  }
  const docs = documented();
  assert.ok(exported.size > 50, `expected the three registries' metrics, got ${exported.size}`);
  const missing = [...exported.keys()].filter((n) => !docs.has(n));
  const stale = [...docs.keys()].filter((n) => !exported.has(n));
  assert.deepEqual(missing, [], 'exported but not in docs/metrics.md');
  assert.deepEqual(stale, [], 'in docs/metrics.md but not exported');
  for (const [name, type] of exported) assert.equal(docs.get(name), type, `type of ${name}`);
  await remote.close();
});

test('only counters end in _total, and every counter does', async () => {
  const engine = new EngineMetrics({ model: 'm' });
  const controller = new ControllerMetrics(new Operations(new Registry({ heartbeatTimeoutMs: 1000, seed: 0n }), new EventLog(), 0n, { commandMs: 1000, transferMs: 1000 }));
  for (const reg of [controller.registry, engine.registry]) {
    for (const m of await reg.getMetricsAsJSON()) {
      assert.equal(m.name.endsWith('_total'), String(m.type) === 'counter', `${m.name} is a ${String(m.type)}`);
    }
  }
});

test('the Grafana dashboard in examples/grafana queries only metrics that exist', () => {
  const dash = JSON.parse(readFileSync(join(root, 'examples', 'grafana', 'kvc.json'), 'utf8')) as { panels: { type: string; targets?: { expr: string }[] }[] };
  const docs = documented();
  const exprs = dash.panels.flatMap((p) => p.targets ?? []).map((t) => t.expr);
  assert.ok(exprs.length >= 30, `expected the dashboard's queries, got ${exprs.length}`);
  const used = new Set<string>();
  for (const e of exprs) for (const m of e.matchAll(/(?<![\w:])(?:kvc_|vllm:|lmcache:)[a-z0-9_]+/g)) used.add(m[0].replace(/_(bucket|sum|count)$/, ''));
  const unknown = [...used].filter((n) => !docs.has(n));
  assert.deepEqual(unknown, [], 'queried but not exported');
  for (const family of ['kvc_engine_', 'kvc_cache_', 'kvc_xfer_', 'kvc_controller_', 'kvc_proxy_', 'vllm:', 'lmcache:']) {
    assert.ok([...used].some((n) => n.startsWith(family)), `the dashboard charts ${family}*`);
  }
});

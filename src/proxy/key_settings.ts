// No silent 0 % hit rate (docs/controller.md "Registration"): the proxy compares every engine's key
// settings (its /health kvc_key_settings: model id, chunk size, hash seed, KV dtype) with the
// deployment's, as the controller states them (GET /deployment). An engine whose keys could never
// match the index gets no cache affinity from kv-aware routing (its instance name is not used),
// and the proxy says so once, naming the setting, and in kvc_proxy_key_settings_differ{backend}.
import { Gauge, type Registry } from 'prom-client';
import { request } from 'undici';
import { logger } from '../common/log.js';
import type { KeySettings } from '../protocol/engine_health.js';

const log = logger('proxy.key_settings');

interface DeploymentSettings {
  seed: string;
  model_id: string | null;
  chunk_size: number | null;
  kv_dtype: string | null;
}

/** Why an engine's settings differ from the deployment's, or null (unknown settings are not compared). */
export function keySettingsDiffer(e: KeySettings, d: DeploymentSettings): string | null {
  if (e.seed !== d.seed) return `hash seed (PYTHONHASHSEED) ${e.seed} differs from the controller's ${d.seed}`;
  if (d.model_id !== null && e.model_id !== d.model_id) return `model id "${e.model_id}" differs from the deployment's "${d.model_id}"`;
  if (d.chunk_size !== null && e.chunk_size !== d.chunk_size) return `chunk size ${e.chunk_size} differs from the deployment's ${d.chunk_size}`;
  if (d.kv_dtype !== null && e.kv_dtype !== d.kv_dtype) return `KV dtype ${e.kv_dtype} differs from the deployment's ${d.kv_dtype}`;
  return null;
}

export class KeySettingsCheck {
  /** The controller's seed and its model groups (GET /deployment), null until it answered. */
  private deployment: { seed: string; groups: DeploymentSettings[] } | null = null;
  private fetching: Promise<void> | null = null;
  private readonly said = new Map<string, string>();
  private readonly gauge: Gauge<'backend'>;

  constructor(
    private readonly controllerUrl: string,
    registry: Registry,
  ) {
    this.gauge = new Gauge({ name: 'kvc_proxy_key_settings_differ', help: "1 for a backend whose key settings (model id, chunk size, hash seed, KV dtype) differ from the deployment's (docs/controller.md)", labelNames: ['backend'], registers: [registry] });
  }

  /** Fetches the deployment's settings until they are complete (an instance has registered). */
  refresh(): Promise<void> {
    if (this.deployment?.groups.length || this.fetching) return this.fetching ?? Promise.resolve();
    this.fetching = (async () => {
      try {
        const r = await request(`${this.controllerUrl}/deployment`, { headersTimeout: 2000, bodyTimeout: 2000 });
        if (r.statusCode !== 200) {
          await r.body.dump();
          return;
        }
        const b = (await r.body.json()) as { seed?: unknown; groups?: DeploymentSettings[] };
        if (typeof b.seed === 'string') this.deployment = { seed: b.seed, groups: Array.isArray(b.groups) ? b.groups : [] };
      } catch (e) {
        log.debug(`GET ${this.controllerUrl}/deployment: ${(e as Error).message}`);
      } finally {
        this.fetching = null;
      }
    })();
    return this.fetching;
  }

  /** True when `backend`'s settings may be used for routing (match, or not known yet). */
  accepts(backend: string, settings: KeySettings | undefined): boolean {
    void this.refresh();
    const d = this.deployment;
    // Compared with its model's group; a model no instance registered yet: the seed only.
    const group = settings && d ? (d.groups.find((g) => g.model_id === settings.model_id) ?? { seed: d.seed, model_id: null, chunk_size: null, kv_dtype: null }) : null;
    const why = settings && group ? keySettingsDiffer(settings, { ...group, seed: d!.seed }) : null;
    this.gauge.labels(backend).set(why ? 1 : 0);
    if (why && this.said.get(backend) !== why) log.error(`${backend}: ${why}; its chunk keys could never match the controller's index, so routing gives it no cache affinity (start it with the deployment's setting)`);
    if (why) this.said.set(backend, why);
    else this.said.delete(backend);
    return why === null;
  }
}

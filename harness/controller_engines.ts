// A `kvc controller` and two `kvc engine` processes A and B (role kv_both, built-in model) whose
// cache instances register with it, each configured by its own cache YAML: what the controller,
// P2P and KV-dtype system tests share. The ports are a free range, started again on another range
// when one was taken before it was bound (onFreePorts), so two test files side by side cannot
// fail each other.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePortRange } from './ports.js';
import { onFreePorts, postJson, startKvc, waitHttp, waitListening, waitUntil, type Proc } from './proc.js';
import { tempDir } from './temp_dir.js';

export type Who = 'A' | 'B';
export const WHO: readonly Who[] = ['A', 'B'];

const CONNECTOR = JSON.stringify({ kv_connector: 'KvcConnectorV1', kv_role: 'kv_both' });

export interface ControllerEnginesOptions {
  chunkSize: number;
  /** Each engine's cache instance id, from its name. */
  instanceId: (who: Who) => string;
  /** YAML lines after the common ones (chunk size, CPU tier, controller, ports). */
  yaml?: (who: Who) => string[];
  /** `kvc engine` arguments after --port and --kv-transfer-config. */
  engineArgs?: string[];
  /** Environment of all three processes (e.g. KVC_DEPLOYMENT_SECRET). */
  env?: NodeJS.ProcessEnv;
}

export interface ControllerEngines {
  ctl: Proc;
  ctlUrl: string;
  monitorPort: number;
  /** The engines' HTTP URLs and their P2P addresses (host:port). */
  url: Record<Who, string>;
  peerUrl: Record<Who, string>;
  /** The engine processes; a test that stops one itself sets it to null. */
  engines: Record<Who, Proc | null>;
  /** Kills the engines still running, then the controller. */
  stop(): Promise<void>;
}

/** Starts the controller and both engines; resolves once both instances are registered. */
export function startControllerEngines(o: ControllerEnginesOptions): Promise<ControllerEngines> {
  return onFreePorts(() => freePortRange(10), async (base) => {
    const ctlUrl = `http://127.0.0.1:${base}`;
    const monitorPort = base + 1;
    const env = o.env ?? {};
    const ctl = startKvc(['controller', '--port', String(base), '--monitor-port', String(monitorPort)], env);
    const engines: Record<Who, Proc | null> = { A: null, B: null };
    const url = { A: '', B: '' };
    const peerUrl = { A: '', B: '' };
    const stop = async () => {
      for (const who of WHO) await engines[who]?.kill();
      await ctl.kill();
    };
    try {
      await waitListening(ctl, base, 30_000);
      const dir = tempDir('kvc-ctl-engines-');
      for (const [i, who] of WHO.entries()) {
        const yaml = join(dir, `${who}.yaml`);
        peerUrl[who] = `127.0.0.1:${base + 3 + 3 * i}`;
        writeFileSync(yaml, [
          `chunk_size: ${o.chunkSize}`,
          'local_cpu: true',
          'enable_controller: true',
          `kvc_instance_id: ${o.instanceId(who)}`,
          `controller_url: 127.0.0.1:${monitorPort}`,
          `kvc_worker_port: ${base + 2 + 3 * i}`,
          `distributed_url: ${peerUrl[who]}`,
          ...(o.yaml?.(who) ?? []),
        ].join('\n'));
        const port = base + 4 + 3 * i;
        url[who] = `http://127.0.0.1:${port}`;
        engines[who] = startKvc(['engine', '--port', String(port), '--kv-transfer-config', CONNECTOR, ...(o.engineArgs ?? [])], { ...env, KVC_CONFIG_FILE: yaml });
      }
      await Promise.all(WHO.map((who) => waitHttp(`${url[who]}/health`, 120_000)));
      await waitUntil('both engines registered', async () => (await (await fetch(`${ctlUrl}/instances`)).json()).instances.length === 2, 30_000, 50);
    } catch (e) {
      await stop();
      throw e;
    }
    return { ctl, ctlUrl, monitorPort, url, peerUrl, engines, stop };
  });
}

/** Greedy completion of `prompt` on an engine of the built-in model; its text. */
export async function completeText(engineUrl: string, prompt: string, max_tokens = 8): Promise<string> {
  const r = await postJson(`${engineUrl}/v1/completions`, { model: 'builtin:tiny', prompt, max_tokens, temperature: 0 }, 120_000);
  if (r.status !== 200) throw new Error(`completion on ${engineUrl}: HTTP ${r.status} ${JSON.stringify(r.json)}`);
  return r.json.choices[0].text as string;
}

/** The built-in model's tokens for `prompt`, from an engine's /tokenize. */
export async function tokenizeOn(engineUrl: string, prompt: string): Promise<number[]> {
  const r = await postJson(`${engineUrl}/tokenize`, { model: 'builtin:tiny', prompt });
  if (r.status !== 200) throw new Error(`tokenize on ${engineUrl}: HTTP ${r.status} ${JSON.stringify(r.json)}`);
  return r.json.tokens as number[];
}

/** A metric's value on a server's /metrics: the sum over its series that carry every label given. */
export async function metricValue(serverUrl: string, name: string, labels: Record<string, string> = {}): Promise<number> {
  const text = await (await fetch(`${serverUrl}/metrics`)).text();
  let sum = 0;
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z0-9_:]+)(\{[^}]*\})? ([0-9.e+-]+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    if (Object.entries(labels).every(([k, v]) => (m[2] ?? '').includes(`${k}="${v}"`))) sum += Number(m[3]);
  }
  return sum;
}

/** How many of `tokens` the controller's /lookup finds on instance `id` (0 when none). */
export async function matchedOn(ctlUrl: string, tokens: number[], id: string): Promise<number> {
  const r = (await postJson(`${ctlUrl}/lookup`, { tokens })).json as { layout_detail: Record<string, { matched_tokens: number }> };
  return r.layout_detail[id]?.matched_tokens ?? 0;
}

/** Waits until a controller event (move, clear, pin, …) has finished or failed; its final status. */
export function eventDone(ctlUrl: string, event_id: string, timeoutMs = 30_000): Promise<{ status: string }> {
  return waitUntil(`event ${event_id}`, async () => {
    const r = await postJson(`${ctlUrl}/check_finish`, { event_id });
    return r.json.status === 'finished' || r.json.status === 'failed' ? r.json : undefined;
  }, timeoutMs, 50);
}

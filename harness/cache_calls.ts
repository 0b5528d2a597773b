// Calls the cache system tests make on a running deployment: a greedy completion on token ids
// (its text and cached tokens), the controller's prefix lookup per instance, and a metric's total.
import assert from 'node:assert/strict';
import { postJson } from './proc.js';

/** A greedy completion of token ids on `url`: its text and usage.prompt_tokens_details.cached_tokens. */
export async function completeIds(url: string, ids: number[], maxTokens = 6): Promise<{ text: string; cached: number }> {
  const r = await postJson(`${url}/v1/completions`, { model: 'builtin:tiny', prompt: ids, max_tokens: maxTokens, temperature: 0 }, 120_000);
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.ok(Array.isArray(r.json?.choices), `${url}: a completion without choices: ${JSON.stringify(r.json).slice(0, 300)}`);
  return { text: r.json.choices[0].text, cached: r.json.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

/** The controller's `POST /prefix_lookup` for `ids`: the prefix each instance holds, in tokens. */
export async function heldBy(controller: string, ids: number[]): Promise<Record<string, number>> {
  const r = await postJson(`${controller}/prefix_lookup`, { tokens: ids });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json.instances as Record<string, number>;
}

/** The sum of every sample of metric `name` on `url` whose labels contain `labels`. */
export async function metricTotal(url: string, name: string, labels = ''): Promise<number> {
  const text = await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
  let s = 0;
  for (const m of text.matchAll(new RegExp(`^${name}(\\{[^}]*\\})? (\\S+)$`, 'gm'))) if ((m[1] ?? '').includes(labels)) s += Number(m[2]);
  return s;
}

/** The addresses `kvc up --port-offset offset` gives its processes (first prefiller and decoder). */
export function upUrls(offset: number): { prefiller: string; decoder: string; proxy: string; controller: string } {
  const at = (port: number) => `http://127.0.0.1:${port + offset}`;
  return { prefiller: at(7100), decoder: at(7200), proxy: at(9100), controller: at(9000) };
}

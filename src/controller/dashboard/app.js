// The controller dashboard: polls GET /dashboard/state and renders instances, engines, charts and
// events; runs operations through the controller's own HTTP API. Plain ES module, no build step:
// this file is served as is. Everything a server sent is put in the page as text (textContent),
// never parsed as HTML.
/* global uPlot */

const POLL_MS = 2000;
const KEY_STORE = 'kvc-deployment-secret';

// ---- credentials -----------------------------------------------------------------------------
// The one place requests get their credentials: with a key typed into the header field (kept for
// this browser tab only), every action carries `Authorization: Bearer <key>`, which is what the
// controller's API checks when it is started with a key.
function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// ---- formatting ------------------------------------------------------------------------------
const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fmtBytes(n) {
  if (n === null || n === undefined) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

const fmtInt = (n) => (n === null || n === undefined ? '–' : Math.round(n).toLocaleString('en-US'));
const fmtPct = (x) => (x === null || x === undefined || !Number.isFinite(x) ? '–' : `${(x * 100).toFixed(1)} %`);
const fmtMs = (x) => (x === null || x === undefined || !Number.isFinite(x) ? '–' : `${x.toFixed(1)} ms`);
const fmtTime = (iso) => (iso ? new Date(iso).toLocaleTimeString('en-GB') : '–');

// ---- tables ----------------------------------------------------------------------------------
function renderTiles(state) {
  let workers = 0, chunks = 0, bytes = 0, bytesKnown = false;
  for (const inst of state.instances) {
    for (const w of inst.workers) {
      workers++;
      for (const loc of Object.values(w.locations)) {
        chunks += loc.chunks;
        if (loc.bytes !== null) { bytes += loc.bytes; bytesKnown = true; }
      }
    }
  }
  const c = state.event_counts;
  $('tile-instances').textContent = fmtInt(state.instances.length);
  $('tile-workers').textContent = fmtInt(workers);
  $('tile-chunks').textContent = fmtInt(chunks);
  $('tile-bytes').textContent = bytesKnown ? fmtBytes(bytes) : '–';
  $('tile-running').textContent = `${c.pending} / ${c.running}`;
  $('tile-failed').textContent = `${c.finished} / ${c.failed}`;
}

function renderInstances(state) {
  const body = $('instances').tBodies[0];
  body.replaceChildren();
  for (const inst of state.instances) {
    for (const w of inst.workers) {
      const locs = Object.entries(w.locations);
      const rows = Math.max(1, locs.length);
      locs.forEach(([name, loc], i) => {
        const tr = el('tr');
        tr.dataset.instance = inst.instance_id;
        tr.dataset.location = name;
        if (i === 0) {
          const lead = [
            el('td', inst.instance_id, 'mono'),
            el('td', w.worker_id, 'num'),
            el('td', `${w.ip}:${w.worker_port}`, 'mono'),
            el('td', `${w.model_id} · ${w.chunk_size}`),
          ];
          const age = el('td', `${(w.last_heartbeat_ms_ago / 1000).toFixed(1)} s ago`, `num age ${w.last_heartbeat_ms_ago > w.heartbeat_timeout_ms / 2 ? 'late' : 'ok'}`);
          age.title = `reaped after ${w.heartbeat_timeout_ms / 1000} s without a heartbeat`;
          lead.push(age);
          for (const td of lead) { td.rowSpan = rows; tr.append(td); }
        }
        const chunksTd = el('td', fmtInt(loc.chunks), 'num chunks');
        const bytesTd = el('td');
        if (loc.bytes !== null && loc.capacity_bytes) {
          const bar = el('span', undefined, 'bar');
          const fill = el('span');
          fill.style.width = `${Math.min(100, (100 * loc.bytes) / loc.capacity_bytes).toFixed(1)}%`;
          bar.append(fill);
          bytesTd.append(bar, `${fmtBytes(loc.bytes)} / ${fmtBytes(loc.capacity_bytes)}`);
        } else {
          bytesTd.textContent = loc.bytes === null ? 'awaiting heartbeat' : fmtBytes(loc.bytes);
        }
        tr.append(el('td', name), chunksTd, bytesTd, el('td', fmtInt(loc.pinned), 'num'));
        body.append(tr);
      });
    }
  }
  $('instances-empty').hidden = state.instances.length > 0;
}

/** The ledger's counts by reason ("cold 12 · evicted 3"), largest first; – when none. */
function fmtReasons(counts) {
  const parts = Object.entries(counts ?? {}).filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1]);
  return parts.length ? parts.map(([k, v]) => `${k} ${fmtInt(v)}`).join(' · ') : '–';
}

function renderEngines(state) {
  const body = $('engines').tBodies[0];
  body.replaceChildren();
  let n = 0;
  for (const [id, samples] of sortedEntries(state.engine_samples)) {
    const s = samples[samples.length - 1];
    if (!s) continue;
    n++;
    const tr = el('tr');
    tr.dataset.instance = id;
    tr.append(
      el('td', id, 'mono'),
      el('td', fmtInt(s.requests_running), 'num'),
      el('td', fmtInt(s.requests_waiting), 'num'),
      el('td', fmtPct(s.kv_usage_ratio), 'num'),
      el('td', fmtInt(s.prompt_tokens), 'num prompt-tokens'),
      el('td', fmtInt(s.cached_tokens), 'num cached-tokens'),
      el('td', fmtInt(s.transferred_tokens), 'num'),
      el('td', fmtInt(s.generation_tokens), 'num'),
      el('td', s.query_tokens > 0 ? fmtPct(s.cached_tokens / s.query_tokens) : '–', 'num'),
      el('td', s.ttft_count > 0 ? fmtMs((1000 * s.ttft_sum_seconds) / s.ttft_count) : '–', 'num'),
      el('td', fmtReasons(s.computed_chunks), 'computed-chunks'),
    );
    body.append(tr);
  }
  $('engines-empty').hidden = n > 0;
}

function renderEvents(state) {
  const body = $('events').tBodies[0];
  body.replaceChildren();
  for (const ev of state.events) {
    const tr = el('tr');
    tr.dataset.event = ev.event_id;
    const status = el('td');
    status.append(el('span', ev.status, `badge ${ev.status}`));
    tr.append(
      el('td', ev.event_id, 'mono'),
      el('td', ev.kind),
      status,
      el('td', fmtInt(ev.num_tokens), 'num'),
      el('td', `${ev.done_chunks} / ${ev.num_chunks}`, 'num'),
      el('td', fmtTime(ev.created_at)),
      el('td', ev.duration_ms === null ? '–' : fmtMs(ev.duration_ms), 'num'),
      el('td', ev.error ?? '', 'err'),
    );
    body.append(tr);
  }
  $('events-empty').hidden = state.events.length > 0;
}

// ---- charts ----------------------------------------------------------------------------------
// Each engine sample holds cumulative counters; a point at a sample is the change over the last
// WINDOW_MS before it: hit rate = cached prompt tokens / prompt tokens looked up, TTFT = Δsum /
// Δcount. A window keeps sparse traffic readable (a request stays in the series for 30 s instead
// of one isolated heartbeat-long spike); a window without requests has no point (a gap, not a
// misleading zero). A counter that went down means the engine restarted: a window never reaches
// back past that.
const WINDOW_MS = 30_000;

function restarted(a, b) {
  return b.query_tokens < a.query_tokens || b.ttft_count < a.ttft_count;
}

function seriesOf(samples, value) {
  const pts = [];
  for (let i = 1; i < samples.length; i++) {
    const b = samples[i];
    let j = i - 1;
    if (restarted(samples[j], b)) continue;
    while (j > 0 && samples[j - 1].t >= b.t - WINDOW_MS && !restarted(samples[j - 1], samples[j])) j--;
    pts.push([b.t / 1000, value(samples[j], b)]);
  }
  return pts;
}

function hitRate(a, b) {
  // Both counted when the engine looks the prompt up, so a hit never lands in a later interval.
  const dq = b.query_tokens - a.query_tokens;
  const dc = b.cached_tokens - a.cached_tokens;
  return dq > 0 && dc >= 0 ? (100 * dc) / dq : null;
}

function ttftMs(a, b) {
  const dn = b.ttft_count - a.ttft_count;
  const ds = b.ttft_sum_seconds - a.ttft_sum_seconds;
  return dn > 0 && ds >= 0 ? (1000 * ds) / dn : null;
}

/** Instances in id order, so that rows and series keep their place (and color) between polls. */
const sortedEntries = (o) => Object.entries(o).sort(([a], [b]) => a.localeCompare(b));

const COLORS = ['#2b6cb0', '#dd6b20', '#38a169', '#805ad5', '#d53f8c', '#319795'];

/**
 * uPlot wants one shared x axis: the union of every instance's sample times. An instance has no
 * value at another's times: those are `undefined`, which uPlot draws through, while `null` (an
 * interval without requests) stays a gap.
 */
function alignSeries(perInstance) {
  const xs = [...new Set(perInstance.flatMap(([, pts]) => pts.map((p) => p[0])))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = perInstance.map(([, pts]) => {
    const y = new Array(xs.length).fill(undefined);
    for (const [x, v] of pts) y[index.get(x)] = v;
    return y;
  });
  return [xs, ...ys];
}

class Chart {
  constructor(container, unit, value) {
    this.container = container;
    this.unit = unit;
    this.value = value;
    this.plot = null;
    this.names = '';
  }

  update(engineSamples) {
    const perInstance = sortedEntries(engineSamples).map(([id, samples]) => [id, seriesOf(samples, this.value)]);
    const data = alignSeries(perInstance);
    const names = perInstance.map(([id]) => id).join('\n');
    const values = data.slice(1).flatMap((ys) => ys.filter((v) => v !== null && v !== undefined));
    // For readers of the page (and its browser test): how many points, and the largest.
    this.container.dataset.points = String(values.length);
    this.container.dataset.max = String(values.length ? Math.max(...values) : 0);
    if (!this.plot || names !== this.names) {
      this.plot?.destroy();
      this.names = names;
      const width = Math.max(300, this.container.clientWidth || 560);
      this.plot = new uPlot({
        width,
        height: 220,
        scales: { x: { time: true }, y: { range: (_u, min, max) => [0, Math.max(this.unit === '%' ? 100 : 1, max ?? 0)] } },
        series: [{}, ...perInstance.map(([id], i) => ({ label: id, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: false, points: { show: true, size: 5 }, value: (_u, v) => (v === null || v === undefined ? '–' : `${v.toFixed(1)} ${this.unit}`) }))],
        axes: [{}, { values: (_u, ticks) => ticks.map((t) => `${t} ${this.unit}`), size: 70 }],
      }, data, this.container);
    } else {
      this.plot.setData(data);
    }
  }
}

// ---- actions ---------------------------------------------------------------------------------
let lastState = null;

function fillSelect(select, values) {
  const keep = select.value;
  const now = [...select.options].map((o) => o.value).join('\n');
  if (now === values.join('\n')) return;
  select.replaceChildren(...values.map((v) => { const o = el('option', v); o.value = v; return o; }));
  if (values.includes(keep)) select.value = keep;
}

function locationsOf(instanceId) {
  const inst = lastState?.instances.find((i) => i.instance_id === instanceId);
  return inst ? [...new Set(inst.workers.flatMap((w) => Object.keys(w.locations)))] : [];
}

function refreshActionChoices() {
  const ids = lastState ? lastState.instances.map((i) => i.instance_id) : [];
  fillSelect($('act-instance'), ids);
  fillSelect($('act-target-instance'), ids);
  fillSelect($('act-location'), locationsOf($('act-instance').value));
  fillSelect($('act-target-location'), locationsOf($('act-target-instance').value));
  const op = $('act-op').value;
  for (const l of document.querySelectorAll('label.target')) l.hidden = op !== 'move' && op !== 'copy';
  document.querySelector('label.tokens').hidden = op === 'clear';
}

/** Text of digits, commas, spaces and brackets only is token ids ("1, 2 3" or a JSON array). */
const looksLikeIds = (text) => /^[\d\s,[\]]+$/.test(text) && /\d/.test(text);

/** Token ids typed as "1, 2 3" or as a JSON array; { bad } naming the first that is not one. */
function parseTokens(text) {
  const parts = text.replace(/[[\]]/g, ' ').split(/[\s,]+/).filter(Boolean);
  const out = parts.map(Number);
  const bad = parts.find((p, i) => !Number.isInteger(out[i]) || out[i] < 0 || out[i] > 0xffffffff);
  return bad === undefined ? out : { bad };
}

/** The field's tokens: ids as typed, or a prompt tokenized by the instance's engine; { error } otherwise. */
async function tokensOf(text, instance) {
  if (!text.trim()) return { error: 'enter a prompt or token ids' };
  if (looksLikeIds(text)) {
    const ids = parseTokens(text);
    return Array.isArray(ids) ? { tokens: ids } : { error: `token ids: "${ids.bad}" is not a non-negative integer` };
  }
  let r;
  try {
    r = await fetch('/dashboard/tokenize', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ instance_id: instance, prompt: text }) });
  } catch (e) {
    return { error: `prompt not tokenized: ${e.message}` };
  }
  const j = await r.json().catch(() => ({}));
  return r.ok ? { tokens: j.tokens, prompt: true } : { error: `prompt not tokenized (HTTP ${r.status}): ${j.error?.message ?? r.statusText}` };
}

async function runAction(ev) {
  ev.preventDefault();
  const result = $('act-result');
  const op = $('act-op').value;
  const instance = $('act-instance').value;
  const location = $('act-location').value;
  if (!instance || !location) {
    result.className = 'result err';
    result.textContent = 'choose an instance and a location (none registered?)';
    return;
  }
  let path, body;
  let got = null;
  if (op === 'clear') {
    path = '/clear';
    body = { instance_id: instance, location };
  } else {
    got = await tokensOf($('act-tokens').value, instance);
    if (got.error) {
      result.className = 'result err';
      result.textContent = got.error;
      return;
    }
    const tokens = got.tokens;
    if (op === 'pin' || op === 'unpin') {
      path = `/${op}`;
      body = { tokens, instance_id: instance, location };
    } else {
      path = '/move';
      body = { old_position: [instance, location], new_position: [$('act-target-instance').value, $('act-target-location').value], tokens, copy: op === 'copy' };
    }
  }
  try {
    const r = await fetch(path, { method: 'POST', headers: { 'content-type': 'application/json', ...authHeaders() }, body: JSON.stringify(body) });
    const j = await r.json().catch(() => ({}));
    if (r.ok) {
      result.className = 'result ok';
      result.textContent = op === 'clear'
        ? `clear: event ${j.event_id} (${j.num_chunks} chunks removed, ${j.kept_chunks} pinned chunks kept)`
        : `${op}: event ${j.event_id} (${j.num_tokens} tokens held${got?.prompt ? ` of the prompt's ${body.tokens.length}` : ''})`;
    } else {
      result.className = 'result err';
      result.textContent = `${op} refused (HTTP ${r.status}): ${j.error?.message ?? r.statusText}`;
    }
  } catch (e) {
    result.className = 'result err';
    result.textContent = `${op} failed: ${e.message}`;
  }
  void poll();
}

// ---- polling ---------------------------------------------------------------------------------
const charts = { hit: null, ttft: null };

async function poll() {
  const status = $('status');
  try {
    const r = await fetch('/dashboard/state', { headers: authHeaders(), cache: 'no-store' });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const state = await r.json();
    lastState = state;
    renderTiles(state);
    renderInstances(state);
    renderEngines(state);
    renderEvents(state);
    refreshActionChoices();
    charts.hit.update(state.engine_samples);
    charts.ttft.update(state.engine_samples);
    status.className = 'status';
    status.textContent = `updated ${fmtTime(state.time)}`;
    document.body.dataset.updates = String(Number(document.body.dataset.updates ?? 0) + 1);
  } catch (e) {
    status.className = 'status err';
    status.textContent = `cannot reach the controller: ${e.message}`;
  }
}

function start() {
  charts.hit = new Chart($('chart-hit'), '%', hitRate);
  charts.ttft = new Chart($('chart-ttft'), 'ms', ttftMs);
  const key = $('secret');
  key.value = sessionStorage.getItem(KEY_STORE) ?? '';
  key.addEventListener('change', () => (key.value ? sessionStorage.setItem(KEY_STORE, key.value) : sessionStorage.removeItem(KEY_STORE)));
  $('action-form').addEventListener('submit', runAction);
  for (const id of ['act-op', 'act-instance', 'act-target-instance']) $(id).addEventListener('change', refreshActionChoices);
  refreshActionChoices();
  void poll();
  setInterval(poll, POLL_MS);
}

start();

// The plots of the disaggregation bench (Vega-Lite rendered to SVG) and the results.json that
// `--replot` reads back to redraw them.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as vega from 'vega';
import * as vl from 'vega-lite';
import type { stepIntervals } from './_disagg_deployment.js';
import type { CurvePoint, goodput } from './_disagg_goodput.js';
import { ATTAINMENT, BURST, LONG_MAX, LONG_MIN, pct, SHORT_RATE, SLO, type Config, type summary } from './_disagg_workload.js';

// ---- plots ------------------------------------------------------------------------------------
/** Width of the time bins of the ITL plot (s): one point per bin and statistic keeps the SVG small. */
const BIN_S = 0.5;

/** ITL samples → p50 / p99 / max per configuration and BIN_S-second bin. */
function binned(series: { config: Config; t: number; itl_ms: number }[]): { config: Config; t: number; stat: string; ms: number }[] {
  const bins = new Map<string, { config: Config; t: number; xs: number[] }>();
  for (const s of series) {
    const t = Math.floor(s.t / BIN_S) * BIN_S;
    const k = `${s.config}@${t}`;
    let b = bins.get(k);
    if (!b) bins.set(k, (b = { config: s.config, t, xs: [] }));
    b.xs.push(s.itl_ms);
  }
  const out: { config: Config; t: number; stat: string; ms: number }[] = [];
  for (const b of [...bins.values()].sort((x, y) => x.t - y.t)) {
    // Tokens that reached the client in one read have a 0 ms gap: floored at 0.1 ms for the log scale.
    const floor = (ms: number) => Math.max(0.1, ms);
    out.push({ config: b.config, t: b.t, stat: 'p50', ms: floor(pct(b.xs, 50)) });
    out.push({ config: b.config, t: b.t, stat: 'p99', ms: floor(pct(b.xs, 99)) });
    out.push({ config: b.config, t: b.t, stat: 'max', ms: floor(Math.max(...b.xs)) });
  }
  return out;
}

async function svg(spec: vl.TopLevelSpec): Promise<string> {
  const view = new vega.View(vega.parse(vl.compile(spec).spec), { renderer: 'none' });
  return view.toSVG();
}


export interface Saved {
  results: Partial<Record<Config, ReturnType<typeof summary>>>;
  goodput: Partial<Record<Config, number>>;
  /** How each goodput search ended (absent in results of older runs). */
  searches?: Partial<Record<Config, { rps: number; held: number; failed: number | null; seconds: number; stoppedBy: string }>>;
  curve: CurvePoint[];
  series: { config: Config; t: number; itl_ms: number }[];
  slo: typeof SLO;
  /** Start of each long-prompt burst of the main window (s; absent in results of older runs). */
  bursts?: number[];
  /** The first decoder's step intervals per measured window (absent in results of older runs). */
  steps?: Partial<Record<Config, ReturnType<typeof stepIntervals> & { proxy_marked_down?: number; proxy_prefills?: Record<string, number> }>>;
}

/** Writes the two SVG plots and results.json (which --replot FILE reads back to redraw them). */
export async function plots(outDir: string, saved: Saved): Promise<void> {
  const { series, curve } = saved;
  // Burst starts (s) drawn as dashed rules on the configurations that had long prompts, and the
  // SLO's 50 ms gap bound as a dotted line on every row.
  const bursts = saved.bursts ?? [];
  const marks = (['coloc', 'disagg'] as const).flatMap((config) => bursts.map((t) => ({ config, t, burst: true })));
  const itlPlot = await svg({
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: `Inter-token latency over time, per ${BIN_S} s (short requests at ${SHORT_RATE}/s; dashed: a burst of ${BURST.size} long prompts of ${LONG_MIN}-${LONG_MAX} tokens; dotted: ${SLO.itlP99Ms} ms)`,
    data: { values: [...binned(series), ...marks] },
    facet: { row: { field: 'config', type: 'nominal', title: null, sort: ['idle', 'coloc', 'disagg'] } },
    spec: {
      width: 640,
      height: 130,
      layer: [
        {
          transform: [{ filter: 'isValid(datum.stat)' }],
          mark: { type: 'line', interpolate: 'step-after' },
          encoding: {
            x: { field: 't', type: 'quantitative', title: 'time in the window (s)' },
            y: { field: 'ms', type: 'quantitative', title: 'ITL (ms, log)', scale: { type: 'log' } },
            color: { field: 'stat', type: 'nominal', title: 'per bin', sort: ['p50', 'p99', 'max'] },
          },
        },
        {
          transform: [{ filter: 'datum.burst === true' }],
          mark: { type: 'rule', strokeDash: [4, 3], color: 'gray' },
          encoding: { x: { field: 't', type: 'quantitative' } },
        },
        { mark: { type: 'rule', strokeDash: [1, 3], color: 'black' }, encoding: { y: { datum: SLO.itlP99Ms } } },
      ],
    },
  });
  const sloPlot = await svg({
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: `SLO attainment vs long-prompt arrival rate (TTFT <= ${SLO.shortTtftMs}/${SLO.longTtftMs} ms, ITL p99 <= ${SLO.itlP99Ms} ms; label: long prompts pooled)`,
    width: 520,
    height: 300,
    layer: [
      {
        data: { values: curve },
        mark: { type: 'line', point: true },
        encoding: {
          x: { field: 'rate', type: 'quantitative', title: 'long prompts per second (log: the search doubles and halves)', scale: { type: 'log' } },
          y: { field: 'attainment', type: 'quantitative', title: 'requests meeting the SLO (%, lower of short and long)', scale: { domain: [0, 100] } },
          color: { field: 'config', type: 'nominal', title: 'configuration' },
          order: { field: 'rate', type: 'quantitative' },
        },
      },
      {
        // Each point labelled with the long prompts it pooled (short requests: results.json).
        data: { values: curve },
        transform: [{ filter: 'isValid(datum.long_requests)' }, { calculate: "datum.long_requests + ' long'", as: 'label' }],
        mark: { type: 'text', dy: -9, fontSize: 9 },
        encoding: {
          x: { field: 'rate', type: 'quantitative', scale: { type: 'log' } },
          y: { field: 'attainment', type: 'quantitative' },
          text: { field: 'label', type: 'nominal' },
          color: { field: 'config', type: 'nominal' },
        },
      },
      { data: { values: [{ y: ATTAINMENT * 100 }] }, mark: { type: 'rule', strokeDash: [4, 4] }, encoding: { y: { field: 'y', type: 'quantitative' } } },
    ],
  });
  writeFileSync(join(outDir, 'itl_over_time.svg'), itlPlot);
  writeFileSync(join(outDir, 'slo_attainment.svg'), sloPlot);
  writeFileSync(join(outDir, 'results.json'), JSON.stringify(saved) + '\n');
}

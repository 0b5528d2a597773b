// The trace bench's plot: cumulative prompt tokens computed ÷ sent over the run, one line per
// routing mode and one per reference (pooled LRU bound, infinite ceiling), with vega-lite.
import type { TopLevelSpec } from 'vega-lite';
import { writeSpecSvg } from './_plot.js';

export interface SeriesPoint {
  series: string;
  /** Seconds from the start of the replay. */
  t: number;
  ratio: number;
}

export async function writeTraceSvg(path: string, title: string, points: SeriesPoint[]): Promise<string> {
  const spec: TopLevelSpec = {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title,
    data: { values: points },
    mark: { type: 'line', interpolate: 'step-after' },
    encoding: {
      x: { field: 't', type: 'quantitative', title: 'seconds into the replay' },
      y: { field: 'ratio', type: 'quantitative', title: 'prompt tokens computed ÷ sent (cumulative)', scale: { domain: [0, 1] } },
      color: { field: 'series', type: 'nominal', title: null },
      strokeDash: { field: 'series', type: 'nominal', legend: null },
    },
    width: 560,
    height: 300,
  };
  return writeSpecSvg(path, spec);
}

export interface DtypeBar {
  dtype: string;
  /** `pooled bound`, `infinite ceiling` or a routing mode. */
  series: string;
  ratio: number;
}

/** The per-dtype run (`--kv-cache-dtypes`): computed ÷ sent of each mode beside its dtype's own pooled bound, grouped by dtype. */
export async function writeDtypeSvg(path: string, title: string, bars: DtypeBar[]): Promise<string> {
  const spec: TopLevelSpec = {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title,
    data: { values: bars },
    encoding: {
      x: { field: 'dtype', type: 'nominal', title: '--kv-cache-dtype (same --max-local-cpu-size)', sort: null, axis: { labelAngle: 0 } },
      xOffset: { field: 'series', type: 'nominal', sort: null },
      y: { field: 'ratio', type: 'quantitative', title: 'prompt tokens computed ÷ sent', scale: { domain: [0, 1] } },
      color: { field: 'series', type: 'nominal', title: null, sort: null },
    },
    layer: [
      { mark: 'bar' },
      { mark: { type: 'text', dy: -6, fontSize: 9 }, encoding: { text: { field: 'ratio', type: 'quantitative', format: '.3f' } } },
    ],
    width: 480,
    height: 280,
  };
  return writeSpecSvg(path, spec);
}

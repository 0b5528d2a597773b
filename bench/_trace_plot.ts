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

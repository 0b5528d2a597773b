// SVG bar charts for benchmarks, rendered with vega-lite + vega in Node (no browser, no canvas).
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import * as vega from 'vega';
import { compile, type TopLevelSpec } from 'vega-lite';

/** Where every benchmark writes its plots and result files (ignored by git): one folder per benchmark. */
export const RESULTS_ROOT = 'bench-results';

/** `bench-results/<bench>/`, relative to the working directory (created by the writers). */
export function resultsDir(bench: string): string {
  return join(RESULTS_ROOT, bench);
}

export interface BarRow {
  /** Panel (facet column). */
  panel: string;
  /** Bar within the panel. */
  series: string;
  value: number;
}

/** Grouped bars, one panel per `panel` with its own bars and y scale; writes an SVG file and returns its path. */
export async function writeBarsSvg(path: string, title: string, rows: BarRow[], yTitle: string): Promise<string> {
  const spec: TopLevelSpec = {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title,
    data: { values: rows },
    facet: { column: { field: 'panel', type: 'nominal', title: null } },
    resolve: { scale: { x: 'independent', y: 'independent' } },
    spec: {
      width: 180,
      height: 200,
      layer: [
        {
          mark: 'bar',
          encoding: {
            x: { field: 'series', type: 'nominal', title: null, axis: { labelAngle: 0 } },
            y: { field: 'value', type: 'quantitative', title: yTitle },
            color: { field: 'series', type: 'nominal', legend: null },
          },
        },
        {
          mark: { type: 'text', dy: -6 },
          encoding: {
            x: { field: 'series', type: 'nominal' },
            y: { field: 'value', type: 'quantitative' },
            text: { field: 'value', type: 'quantitative', format: '.3~f' },
          },
        },
      ],
    },
  };
  return writeSpecSvg(path, spec);
}

/** Renders a vega-lite spec to an SVG file (its folder created); returns the path. */
export async function writeSpecSvg(path: string, spec: TopLevelSpec): Promise<string> {
  const view = new vega.View(vega.parse(compile(spec).spec), { renderer: 'none' });
  const svg = await view.toSVG();
  view.finalize();
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, svg);
  return path;
}

export interface LineRow {
  /** Panel (one row of the figure, its own y scale). */
  panel: string;
  /** Line within the panel. */
  series: string;
  x: number;
  value: number;
}

/** Lines over a shared x axis, one panel per `panel` stacked vertically; writes an SVG file and returns its path. */
export async function writeLinesSvg(path: string, title: string, rows: LineRow[], xTitle: string): Promise<string> {
  const spec: TopLevelSpec = {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title,
    data: { values: rows },
    facet: { row: { field: 'panel', type: 'nominal', title: null, header: { labelAngle: 0, labelAlign: 'left' } } },
    resolve: { scale: { y: 'independent' } },
    spec: {
      width: 560,
      height: 110,
      mark: { type: 'line', point: true },
      encoding: {
        x: { field: 'x', type: 'quantitative', title: xTitle },
        y: { field: 'value', type: 'quantitative', title: null, axis: { format: '~s' } },
        color: { field: 'series', type: 'nominal', title: null },
      },
    },
  };
  return writeSpecSvg(path, spec);
}

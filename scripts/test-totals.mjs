// A node:test reporter that writes one JSON line: the run's totals (the figures the spec reporter
// prints at its end) and, per test file, how many tests passed, failed and were skipped, their
// names and the time its top-level tests took. scripts/run-tests.mjs adds the tiers' totals up from it.
export default async function* totals(source) {
  const summary = {};
  const files = {};
  const fileOf = (data) => (files[data.file ?? '?'] ??= { tests: 0, pass: 0, fail: 0, skipped: 0, ms: 0, names: [] });
  for await (const event of source) {
    const { type, data } = event;
    if (type === 'test:diagnostic' && data.nesting === 0) {
      const m = /^(tests|suites|pass|fail|cancelled|skipped|todo|duration_ms) ([\d.]+)$/.exec(data.message);
      if (m) summary[m[1]] = Number(m[2]);
    } else if ((type === 'test:pass' || type === 'test:fail') && data.details?.type !== 'suite') {
      const f = fileOf(data);
      f.tests++;
      f.names.push(data.name);
      if (data.skip !== undefined || data.todo !== undefined) f.skipped++;
      else if (type === 'test:pass') f.pass++;
      else f.fail++;
    }
    if ((type === 'test:pass' || type === 'test:fail') && data.nesting === 0) fileOf(data).ms += data.details?.duration_ms ?? 0;
  }
  yield `${JSON.stringify({ summary, files })}\n`;
}

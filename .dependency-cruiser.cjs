// Import boundaries of kvc, checked by `npm run lint:deps` (part of `npm test`).
//
// Each process component talks to the others only through messages, so its code may use only the
// shared code (src/common) and the message definitions (src/protocol). A forbidden import fails the
// test command with the rule's name and comment. The layout and the reasons are in
// docs/architecture.md.

/** Components that run as (or inside) separate processes and share no code with each other. */
const COMPONENTS = ['kvc', 'controller', 'xfer', 'proxy', 'deploy'];

const componentRules = COMPONENTS.map((c) => ({
  name: `${c}-imports-only-common-and-protocol`,
  comment:
    `src/${c} may import only src/common, src/protocol, its own files, npm packages and node builtins; ` +
    `what it needs from another component must come through a message in src/protocol or shared code in src/common`,
  severity: 'error',
  from: { path: `^src/${c}/` },
  to: { path: '^src/', pathNot: [`^src/${c}/`, '^src/common/', '^src/protocol/'] },
}));

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    ...componentRules,
    {
      name: 'protocol-imports-only-common',
      comment:
        'src/protocol defines the messages between processes; it may import only src/common (and npm packages), ' +
        'so that every component can depend on it without depending on another component',
      severity: 'error',
      from: { path: '^src/protocol/' },
      to: { path: '^src/', pathNot: ['^src/protocol/', '^src/common/'] },
    },
    {
      name: 'common-imports-only-common',
      comment:
        'src/common is shared by every component; it may import nothing of the project outside src/common ' +
        '(npm packages and node builtins are fine)',
      severity: 'error',
      from: { path: '^src/common/' },
      to: { path: '^(src|test|harness|bench|scripts|examples)/', pathNot: '^src/common/' },
    },
    {
      name: 'engine-imports-only-common-protocol-kvc-xfer',
      comment:
        'src/engine hosts a cache instance (src/kvc) and the transfer plugin (src/xfer); besides those it may ' +
        'import only src/common and src/protocol, never src/controller, src/proxy, src/deploy or src/cli',
      severity: 'error',
      from: { path: '^src/engine/' },
      to: { path: '^src/', pathNot: ['^src/engine/', '^src/common/', '^src/protocol/', '^src/kvc/', '^src/xfer/'] },
    },
    {
      name: 'src-never-imports-test-harness-or-bench',
      comment: 'product code under src/ must not depend on test/, harness/ or bench/ code (helpers, stubs, fixtures)',
      severity: 'error',
      from: { path: '^src/' },
      to: { path: '^(test|harness|bench)/' },
    },
    {
      name: 'harness-imports-only-src-and-harness',
      comment:
        'harness/ holds what tests and benchmarks share (starting processes and deployments, stubs, temporary ' +
        'folders); it may import src/ and itself, never a test or a benchmark',
      severity: 'error',
      from: { path: '^harness/' },
      to: { path: '^(test|bench|scripts|examples)/' },
    },
    {
      name: 'tests-never-import-bench',
      comment: 'a test may import src/, harness/, scripts/ (the tooling it checks) and its own tier; what it shares with a benchmark belongs in harness/',
      severity: 'error',
      from: { path: '^test/' },
      to: { path: '^(bench|examples)/' },
    },
    {
      name: 'bench-never-imports-tests',
      comment: 'a benchmark may import src/, harness/ and bench/; what it shares with a test belongs in harness/',
      severity: 'error',
      from: { path: '^bench/' },
      to: { path: '^test/' },
    },
    {
      name: 'unit-tests-start-no-processes',
      comment:
        'test/unit runs concurrently and must stay pure: no child process, no socket, no process-starting ' +
        'harness module. A test that needs one belongs in test/system',
      severity: 'error',
      from: { path: '^test/unit/' },
      to: {
        path: [
          '^(node:)?(child_process|net|http|https|http2|dgram|cluster)$',
          '^harness/(?!numeric\\.ts$|temp_dir\\.ts$|repo_files\\.ts$|property\\.ts$|trace_model\\.ts$|trace_gen\\.ts$|tier_model\\.ts$|kv_quality_metrics\\.ts$|load\\.ts$|rate_load\\.ts$)',
          '^test/system/',
        ],
      },
    },
    {
      name: 'no-circular',
      comment:
        'no import cycles, type-only imports included: a cycle hides which module owns a definition; ' +
        'move the shared part into a module both can import',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    {
      name: 'imports-resolve',
      comment:
        'every import must resolve to a file or an installed package; an unresolved import would also hide ' +
        'its edge from the rules above',
      severity: 'error',
      from: {},
      to: { couldNotResolve: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    // Type-only imports count: a type shared across components is a message and belongs in src/protocol.
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'require', 'node', 'default', 'types'],
      extensions: ['.ts', '.js', '.mjs', '.cjs', '.json', '.d.ts'],
    },
  },
};

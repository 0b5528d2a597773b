// Every setting of the `kvc` commands and every environment variable kvc reads, each declared once
// (as llama.cpp's common/arg.cpp does: one record per option): its flag, help, default, parser,
// environment variable(s), which commands take it and whether `kvc up` passes it to its engines.
// Everything else is derived from this table: the commander options (src/cli/flags.ts), the
// engine's defaults (src/engine/settings.ts), `kvc up`'s pass-through (src/deploy/plan.ts), the
// defaults in the help text and the tables of docs/configuration.md (checked by a test).
import { existsSync, readFileSync, statSync } from 'node:fs';
import { DType } from './dtype.js';
import { parseChoice, parseNumber, parsePort, parseSeconds, parseText } from './parse_value.js';

export type CommandName = 'engine' | 'controller' | 'proxy' | 'up' | 'keys';

export interface Setting<T> {
  /**
   * The flag as commander takes it (`--max-num-seqs <n>`, `--enable-p2p`, `--no-controller`);
   * absent for a setting made only by an environment variable.
   */
  flags?: string;
  /** What it does; `helpIn` adds to it (or replaces it, starting with "=") for one command. */
  help: string;
  helpIn?: Partial<Record<CommandName, string>>;
  /** The value when not given (already parsed). Absent: not set, the text in `defaultText` applies. */
  default?: T;
  /** How the default is shown in help and docs (when it is not the plain default value). */
  defaultText?: string;
  /** Text → value; throws naming `name` (the flag or the variable). Absent: the text as given. */
  parse?: (raw: string, name: string) => T;
  /** Value → the text `parse` reads back (for `kvc up`'s pass-through and help); default String(v). */
  show?: (v: T) => string;
  /** Environment variables read when the flag is not given, in order; a variable setting alone. */
  env?: readonly string[];
  /** The commands that take the flag. */
  commands: readonly CommandName[];
  /** `kvc up` takes it too and passes it to every engine (help prefixed "engines: "). */
  passThrough?: boolean;
}

function setting<T>(s: Setting<T>): Setting<T> {
  return s;
}

const int = (min: number, max?: number) => (raw: string, name: string) => parseNumber(name, raw, { integer: true, min, max });
const gib = (positive: boolean) => (raw: string, name: string) => parseNumber(name, raw, { min: 0, minExclusive: positive, unit: 'GiB' });
const seconds = { parse: (raw: string, name: string) => parseSeconds(name, raw), show: (ms: number) => String(ms / 1000) };
const port = (raw: string, name: string) => parsePort(name, raw);
const text = (raw: string, name: string) => parseText(name, raw);
const choice =
  <T extends string>(choices: readonly T[]) =>
  (raw: string, name: string) =>
    parseChoice(name, raw, choices);

/** A kernel variable's value; the message says what each value does. */
const oneOf =
  <T extends string>(values: readonly T[], must: string) =>
  (raw: string, name: string): T => {
    if (!(values as readonly string[]).includes(raw)) throw new Error(`${name} ${must}; got ${JSON.stringify(raw)}`);
    return raw as T;
  };

export const DEFAULT_CHUNK_SIZE = 256;
export const DTYPES_ACCEPTED = ['auto', 'float32', 'float'] as const;
/** --chat-template: a readable file's text, or the value itself when it is a template (vLLM's rule). */
export function parseChatTemplate(raw: string, name = '--chat-template'): string {
  if (existsSync(raw) && statSync(raw).isFile()) return readFileSync(raw, 'utf8');
  if (/[{}\n]/.test(raw)) return raw;
  throw new Error(`${name}: "${raw}" is neither a readable file nor a template (a template contains {{ or {%)`);
}

const HALF_DTYPES = ['half', 'float16', 'bfloat16', 'fp16', 'bf16'];
/** --dtype: a type this CPU engine computes in; a half-precision one is refused with the reason. */
export function parseDtype(raw: string, name = '--dtype'): (typeof DTYPES_ACCEPTED)[number] {
  const why = HALF_DTYPES.includes(raw) ? ' (this CPU engine computes in float32; bf16/f16 checkpoints are widened on load)' : '';
  return parseChoice(name, raw, DTYPES_ACCEPTED, why);
}
/** --kv-cache-dtype: vLLM's flag name and values (int8 is kvc's); what the engine's paged KV and its chunks hold. */
export const KV_CACHE_DTYPES = ['auto', 'float32', 'float16', 'bfloat16', 'fp8', 'fp8_e4m3', 'fp8_e5m2', 'int8'] as const;
export type KvCacheDtypeName = (typeof KV_CACHE_DTYPES)[number];
/** The element type each --kv-cache-dtype value means: auto = float16 (llama.cpp's default), fp8 = fp8_e4m3 (as in vLLM). */
export const KV_CACHE_DTYPE_OF: Record<KvCacheDtypeName, DType> = {
  auto: DType.f16,
  float32: DType.f32,
  float16: DType.f16,
  bfloat16: DType.bf16,
  fp8: DType.fp8_e4m3,
  fp8_e4m3: DType.fp8_e4m3,
  fp8_e5m2: DType.fp8_e5m2,
  int8: DType.int8,
};
/** --kv-cache-dtype: the KV element type's name (KV_CACHE_DTYPE_OF gives its DType). */
export function parseKvCacheDtype(raw: string, name = '--kv-cache-dtype'): KvCacheDtypeName {
  return parseChoice(name, raw, KV_CACHE_DTYPES);
}
/** --kv-cache-dtype's value as the DType the paged KV and chunk keys use. */
export function kvCacheDtypeOf(raw: string, name = '--kv-cache-dtype'): DType {
  return KV_CACHE_DTYPE_OF[parseKvCacheDtype(raw, name)];
}
export const ROUTING_MODES = ['round-robin', 'kv-aware'] as const;
/** What `--routing kv-aware` uses for the conditional-disaggregation flags not given. */
export const KV_AWARE_DEFAULTS = { maxLocalPrefillTokens: 256, maxPrefillQueue: 8 } as const;
export const LOG_LEVELS = ['debug', 'info', 'warn', 'error'] as const;
export const LOG_FORMATS = ['text', 'json'] as const;

const ADVERTISE_HELP = "address other processes reach this one at, which it registers and hands out (default: --host, or this machine's hostname when --host is 0.0.0.0 or ::)";
const SECRET_FILE_HELP = 'file whose first line is the secret the processes of this deployment share (default: $KVC_DEPLOYMENT_SECRET; none: internal channels are open)';

export const SETTINGS = {
  // ---- shared by the serving processes -------------------------------------------------------
  host: setting<string>({
    flags: '--host <host>',
    help: 'address to bind (0.0.0.0: every interface)',
    helpIn: { controller: '; HTTP and monitor ports', proxy: '; HTTP port' },
    default: '127.0.0.1',
    parse: text,
    commands: ['engine', 'controller', 'proxy'],
  }),
  advertiseHost: setting<string>({
    flags: '--advertise-host <host>',
    help: ADVERTISE_HELP,
    helpIn: { engine: '; also the address its cache instance registers with the controller when bound to 0.0.0.0', proxy: "; the prefillers' xfer_proxy_host names it" },
    parse: text,
    commands: ['engine', 'controller', 'proxy'],
  }),
  deploymentSecretFile: setting<string>({ flags: '--deployment-secret-file <path>', help: SECRET_FILE_HELP, commands: ['engine', 'controller', 'proxy'] }),
  deploymentSecret: setting<string>({
    help: 'the deployment secret itself (at least 16 characters), when --deployment-secret-file is not given; `kvc up` sets it for the processes it starts',
    env: ['KVC_DEPLOYMENT_SECRET'],
    commands: [],
  }),
  replayWindow: setting<number>({
    flags: '--replay-window <seconds>',
    help: 'an internal message authenticated by the deployment secret is refused when its timestamp is further than this from the receiver\'s clock, and when its nonce was already seen within it (replay protection; also the clock skew tolerated between hosts)',
    helpIn: { up: '; given to every process it starts' },
    default: 30_000,
    ...seconds,
    env: ['KVC_REPLAY_WINDOW'],
    commands: ['engine', 'controller', 'proxy', 'up'],
  }),
  apiKey: setting<string>({
    flags: '--api-key <key>',
    help: 'clients must send "Authorization: Bearer <key>" (none: open)',
    helpIn: { proxy: '; also sent to the engines', up: '=client API key of the deployment: clients send "Authorization: Bearer <key>" to the proxy and engines (none: open)' },
    env: ['KVC_API_KEY', 'VLLM_API_KEY'],
    parse: text,
    commands: ['engine', 'proxy', 'up'],
  }),

  // ---- kvc engine ------------------------------------------------------------------------
  enginePort: setting<number>({ flags: '--port <port>', help: 'HTTP port', default: 8000, parse: port, commands: ['engine'] }),
  model: setting<string>({
    flags: '--model <model>',
    help: '"builtin:tiny" (random weights, generated at first use), a local Hugging Face checkpoint directory (config.json, tokenizer.json, *.safetensors), or a llama.cpp model file ending in .gguf; nothing is downloaded',
    helpIn: { up: '=model of every engine: builtin:tiny, a local checkpoint directory or a .gguf file' },
    default: 'builtin:tiny',
    parse: text,
    commands: ['engine', 'up'],
  }),
  servedModelName: setting<string>({ flags: '--served-model-name <name>', help: 'model name clients send', defaultText: 'the --model value', parse: text, commands: ['engine'], passThrough: true }),
  maxModelLen: setting<number>({ flags: '--max-model-len <n>', help: 'longest prompt + completion in tokens', defaultText: "the model's max_position_embeddings", parse: int(2), commands: ['engine'], passThrough: true }),
  dtype: setting<string>({
    flags: '--dtype <dtype>',
    help: `compute type: ${DTYPES_ACCEPTED.join(', ')} (this CPU engine computes in float32; bf16/f16 weights are widened on load)`,
    default: 'auto',
    parse: parseDtype,
    commands: ['engine'],
    passThrough: true,
  }),
  kvCacheDtype: setting<string>({
    flags: '--kv-cache-dtype <dtype>',
    help: `element type of the paged KV cache and of every chunk it stores, moves and sends: ${KV_CACHE_DTYPES.join(', ')} (auto = float16, llama.cpp's default; fp8 = fp8_e4m3, as in vLLM; int8 with an f16 scale per token and KV head; narrow KV is widened to f32 inside attention's gather); the default stays float32, bit-identical to earlier releases; chunk keys include it, so every engine of a model needs the same`,
    default: 'float32',
    parse: parseKvCacheDtype,
    commands: ['engine', 'keys'],
    passThrough: true,
  }),
  maxNumSeqs: setting<number>({ flags: '--max-num-seqs <n>', help: 'sequences computed concurrently', default: 16, parse: int(1), commands: ['engine'], passThrough: true }),
  maxNumBatchedTokens: setting<number>({
    flags: '--max-num-batched-tokens <n>',
    help: 'most tokens per engine step (prefill chunk + decode rows; fewer prompt tokens when a step would exceed --step-target-ms)',
    default: 512,
    parse: int(1),
    commands: ['engine'],
    passThrough: true,
  }),
  stepTargetMs: setting<number>({
    flags: '--step-target-ms <ms>',
    help: "wall time a step's prompt tokens should take at most, at the measured cost per token, so the engine answers HTTP (health probes) and decode rows between prompt chunks; 0: budget in tokens only",
    default: 200,
    parse: int(0, 60_000),
    commands: ['engine'],
    passThrough: true,
  }),
  maxQueueLen: setting<number>({ flags: '--max-queue-len <n>', help: 'requests that may wait for a slot before new ones get 503', default: 1024, parse: int(1), commands: ['engine'], passThrough: true }),
  kvCacheMemory: setting<number>({
    flags: '--kv-cache-memory <GiB>',
    help: 'paged KV budget in GiB',
    defaultText: 'max-num-seqs full-length sequences, at most 4',
    parse: gib(true),
    commands: ['engine'],
    passThrough: true,
  }),
  kvTransferConfig: setting<string>({
    flags: '--kv-transfer-config <json>',
    help: 'connector JSON, e.g. {"kv_connector":"KvcConnectorV1","kv_role":"kv_both"}; the cache instance is read from $KVC_CONFIG_FILE',
    commands: ['engine'],
  }),
  cpus: setting<string>({
    flags: '--cpus <list>',
    help: 'CPUs this process runs on, as a cpulist ("0-1", "1", "0,2"); an engine\'s GEMM threads follow the set (`kvc up` keeps the proxy and the controller off the decoders\' CPUs)',
    defaultText: 'every CPU',
    commands: ['engine', 'proxy', 'controller'],
  }),
  cpuPriority: setting<'normal' | 'idle'>({
    flags: '--cpu-priority <level>',
    help: 'CPU priority of every thread of this engine: normal, or idle (Linux SCHED_IDLE: it runs only on CPU time no normal-priority program wants; `kvc up --placement decode-first` gives it to the prefillers, so a decode step never waits behind prefill compute)',
    default: 'normal',
    parse: choice(['normal', 'idle'] as const),
    commands: ['engine'],
  }),
  enablePrefixCaching: setting<boolean>({
    flags: '--enable-prefix-caching',
    help: "reuse the KV of earlier prompts through a cache instance: without --kv-transfer-config, attaches a kv_both connector with the cache of $KVC_CONFIG_FILE (without one: a CPU tier of max_local_cpu_size GiB, taken on demand); on by default, as vLLM's prefix caching",
    default: true,
    commands: ['engine'],
  }),
  noEnablePrefixCaching: setting<boolean>({
    flags: '--no-enable-prefix-caching',
    help: 'no cache instance unless --kv-transfer-config gives one (the engine itself keeps no KV of finished requests)',
    commands: ['engine'],
  }),
  chatTemplate: setting<string>({
    flags: '--chat-template <template>',
    help: "the chat template, as a file or inline (a text with {{ or {%), used instead of the checkpoint's (tokenizer_config.json's chat_template, or chat_template.jinja beside it)",
    defaultText: "the checkpoint's; none: chat requests get a 400 saying how to give one",
    parse: parseChatTemplate,
    commands: ['engine'],
  }),
  enableP2p: setting<boolean>({
    flags: '--enable-p2p',
    help: 'on a local cache miss, fetch the following chunks from the instance the controller says holds them (sets enable_p2p of $KVC_CONFIG_FILE; needs enable_controller)',
    commands: ['engine'],
  }),
  enableChunkedPrefill: setting<boolean>({
    flags: '--enable-chunked-prefill',
    help: 'accepted for compatibility: prefill is always chunked (--max-num-batched-tokens tokens a step, bounded by --step-target-ms)',
    commands: ['engine'],
  }),
  enforceEager: setting<boolean>({ flags: '--enforce-eager', help: 'accepted for compatibility: the CPU engine always runs eagerly (it has no graph mode)', commands: ['engine'] }),
  disableLogRequests: setting<boolean>({ flags: '--disable-log-requests', help: 'do not log one line per finished request (id, tokens, cached tokens, TTFT, duration)', commands: ['engine'] }),
  disableLogStats: setting<boolean>({
    flags: '--disable-log-stats',
    help: 'do not log the periodic statistics line (throughput, running/waiting, KV usage, prefix-cache hit rate)',
    commands: ['engine'],
  }),

  // ---- kvc controller --------------------------------------------------------------------
  controllerPort: setting<number>({ flags: '--port <port>', help: 'HTTP port of the operations', default: 9000, parse: port, commands: ['controller'] }),
  monitorPort: setting<number>({ flags: '--monitor-port <port>', help: 'port cache instances connect to (controller_url)', default: 9001, parse: port, commands: ['controller'] }),
  heartbeatTimeout: setting<number>({ flags: '--heartbeat-timeout <seconds>', help: 'reap a worker silent for this long', default: 10_000, ...seconds, commands: ['controller'] }),
  commandTimeout: setting<number>({ flags: '--command-timeout <seconds>', help: 'deadline of a short command to a worker (lookup, pin, health)', default: 5_000, ...seconds, commands: ['controller'] }),
  transferTimeout: setting<number>({ flags: '--transfer-timeout <seconds>', help: 'deadline of a move, copy or clear', default: 300_000, ...seconds, commands: ['controller'] }),
  replicaHints: setting<boolean>({
    flags: '--replica-hints <on|off>',
    help: 'tell instances which of their chunks another instance holds too, so they evict duplicates first (docs/storage.md)',
    default: true,
    parse: (raw, name) => parseChoice(name, raw, ['on', 'off']) === 'on',
    show: (v) => (v ? 'on' : 'off'),
    commands: ['controller'],
  }),

  // ---- kvc proxy -------------------------------------------------------------------------
  proxyPort: setting<number>({ flags: '--port <port>', help: 'HTTP port', default: 9100, parse: port, commands: ['proxy'] }),
  prefillerHost: setting<string>({ flags: '--prefiller-host <hosts>', help: 'prefiller host(s), comma-separated', default: '127.0.0.1', commands: ['proxy'] }),
  prefillerPort: setting<string>({ flags: '--prefiller-port <ports>', help: 'prefiller port(s), comma-separated; one port + --num-prefillers N = N consecutive ports', default: '7100', commands: ['proxy'] }),
  numPrefillers: setting<number>({
    flags: '--num-prefillers <n>',
    help: 'number of prefillers (XPYD); 0: no prefiller, requests go straight to the decoders (colocated kv_both engines), round-robin',
    defaultText: 'as many as --prefiller-host/--prefiller-port list',
    parse: int(0, 1024),
    commands: ['proxy'],
  }),
  decoderHost: setting<string>({ flags: '--decoder-host <hosts>', help: 'decoder host(s), comma-separated', default: '127.0.0.1', commands: ['proxy'] }),
  decoderPort: setting<string>({ flags: '--decoder-port <ports>', help: 'decoder port(s), comma-separated; one port + --num-decoders N = N consecutive ports', default: '7200', commands: ['proxy'] }),
  numDecoders: setting<number>({ flags: '--num-decoders <n>', help: 'number of decoders', defaultText: 'as many as --decoder-host/--decoder-port list', parse: int(1, 1024), commands: ['proxy'] }),
  decoderInitPort: setting<string>({
    flags: '--decoder-init-port <ports>',
    help: "decoders' xfer receiver init port(s); one value: consecutive ports for decoders sharing a host, the same port on distinct hosts",
    default: '7300',
    commands: ['proxy'],
  }),
  decoderAllocPort: setting<string>({
    flags: '--decoder-alloc-port <ports>',
    help: "decoders' xfer receiver alloc port(s); one value: consecutive ports for decoders sharing a host, the same port on distinct hosts",
    default: '7400',
    commands: ['proxy'],
  }),
  proxyHost: setting<string>({
    flags: '--proxy-host <host>',
    help: "address the xfer notify port binds (prefillers push transfer-done notices to it at their xfer_proxy_host: this proxy's advertised address)",
    default: '127.0.0.1',
    parse: text,
    commands: ['proxy'],
  }),
  notifyPort: setting<number>({ flags: '--proxy-port <port>', help: 'xfer notify port', default: 7500, parse: port, commands: ['proxy'] }),
  prefillTimeout: setting<number>({ flags: '--prefill-timeout <s>', help: 'seconds a prefiller may take to answer before the next one is tried', default: 120_000, ...seconds, commands: ['proxy'] }),
  decodeTimeout: setting<number>({ flags: '--decode-timeout <s>', help: "seconds until the decoder's response starts (a non-streamed one: ends)", default: 300_000, ...seconds, commands: ['proxy'] }),
  idleTimeout: setting<number>({ flags: '--idle-timeout <s>', help: "longest silence in the decoder's stream, seconds", default: 60_000, ...seconds, commands: ['proxy'] }),
  tokenizeTimeout: setting<number>({ flags: '--tokenize-timeout <s>', help: 'seconds for the tokenize call', default: 10_000, ...seconds, commands: ['proxy'] }),
  healthInterval: setting<number>({ flags: '--health-interval <s>', help: 'seconds between backend health probes', default: 2_000, ...seconds, commands: ['proxy'] }),
  healthTimeout: setting<number>({
    flags: '--health-timeout <s>',
    help: 'seconds a health probe may take; a hung backend is found within interval + 2 x timeout',
    defaultText: 'the interval, clamped to 1-5 s',
    ...seconds,
    commands: ['proxy'],
  }),
  statsInterval: setting<number>({
    flags: '--stats-interval <s>',
    help: 'seconds between TTFT statistics lines',
    helpIn: { up: " of the proxy; passed to it" },
    default: 5_000,
    ...seconds,
    commands: ['proxy', 'up'],
  }),
  routing: setting<(typeof ROUTING_MODES)[number]>({
    flags: '--routing <mode>',
    help: `${ROUTING_MODES.join(' or ')}: kv-aware sends a request where its prefix is cached, weighed against load, from the controller's index (docs/routing.md)`,
    helpIn: { up: '; passed to the proxy' },
    default: 'round-robin',
    parse: choice(ROUTING_MODES),
    commands: ['proxy', 'up'],
  }),
  controllerUrl: setting<string>({ flags: '--controller-url <url>', help: "the controller's HTTP URL (http://host:9000) for the routing lookup; required by kv-aware", commands: ['proxy'] }),
  maxLocalPrefillTokens: setting<number>({
    flags: '--max-local-prefill-tokens <n>',
    help: 'send a request straight to its decoder when at most this many prompt tokens are uncached there',
    helpIn: { up: '; passed to the proxy' },
    defaultText: `kv-aware: ${KV_AWARE_DEFAULTS.maxLocalPrefillTokens}; round-robin: never`,
    parse: int(0),
    commands: ['proxy', 'up'],
  }),
  maxPrefillQueue: setting<number>({
    flags: '--max-prefill-queue <n>',
    help: 'send a request straight to its decoder when every prefiller has more than this many prefills in flight',
    helpIn: { up: '; passed to the proxy' },
    defaultText: `kv-aware: ${KV_AWARE_DEFAULTS.maxPrefillQueue}; round-robin: never`,
    parse: int(0),
    commands: ['proxy', 'up'],
  }),

  // ---- kvc up ------------------------------------------------------------------------------
  prefillers: setting<number>({
    flags: '--prefillers <n>',
    help: 'number of prefiller engines (ports 7100+i); 0: colocated kv_both engines (as many as --decoders) behind the proxy',
    default: 1,
    parse: int(0),
    commands: ['up'],
  }),
  decoders: setting<number>({ flags: '--decoders <n>', help: 'number of decoder engines (ports 7200+i)', default: 1, parse: int(0), commands: ['up'] }),
  upHost: setting<string>({ flags: '--host <addr>', help: 'address every process binds (with --hosts: 0.0.0.0 unless --bind-addresses)', default: '127.0.0.1', parse: text, commands: ['up'] }),
  upAdvertiseHost: setting<string>({
    flags: '--advertise-host <addr>',
    help: "address the processes reach each other at (default: --host, or this machine's hostname when --host is 0.0.0.0)",
    parse: text,
    commands: ['up'],
  }),
  hosts: setting<string>({
    flags: '--hosts <list>',
    help: "with --config-only: the machines of a deployment over several hosts, as name=address pairs (ctl=10.0.0.1,p0=10.0.0.2,d0=10.0.0.3) or a YAML file; prints each host's commands (docs/deploy.md)",
    commands: ['up'],
  }),
  bindAddresses: setting<boolean>({ flags: '--bind-addresses', help: "with --hosts: each process binds its host's address instead of 0.0.0.0", commands: ['up'] }),
  remoteUrl: setting<string>({ flags: '--remote-url <url>', help: 'cache: the shared remote tier of every engine (redis://host:6379/0, rediss://, valkey://)', commands: ['up'] }),
  chunkSize: setting<number>({
    flags: '--chunk-size <n>',
    help: 'tokens per KV chunk',
    helpIn: { up: '=cache: tokens per KV chunk of every engine (chunk_size)' },
    default: DEFAULT_CHUNK_SIZE,
    parse: int(1, 1 << 20),
    commands: ['up', 'keys'],
  }),
  maxLocalCpuSize: setting<number>({ flags: '--max-local-cpu-size <GiB>', help: 'cache: CPU tier per engine in GiB (0 turns it off)', default: 5, parse: gib(false), commands: ['up'] }),
  localDisk: setting<string>({ flags: '--local-disk <dir>', help: 'cache: disk tier directory; each engine uses <dir>/<engine name>', parse: text, commands: ['up'] }),
  maxLocalDiskSize: setting<number>({ flags: '--max-local-disk-size <GiB>', help: 'cache: disk tier per engine (needs --local-disk)', parse: gib(false), commands: ['up'] }),
  maxRestarts: setting<number>({
    flags: '--max-restarts <n>',
    help: 'restarts in a row (with backoff 1 s, 2 s, … 30 s) before giving up on a process that keeps dying; 0: never restart',
    default: 10,
    parse: int(0, 1000),
    commands: ['up'],
  }),
  portOffset: setting<number>({ flags: '--port-offset <n>', help: 'added to every reference port (to run beside another deployment)', default: 0, parse: int(-65535, 65535), commands: ['up'] }),
  noController: setting<boolean>({ flags: '--no-controller', help: 'do not start the controller; engines run with enable_controller: false', commands: ['up'] }),
  noP2p: setting<boolean>({ flags: '--no-p2p', help: 'engines do not fetch prefixes they lack from each other (P2P, on by default with the controller; docs/p2p.md)', commands: ['up'] }),
  noReplicaHints: setting<boolean>({
    flags: '--no-replica-hints',
    help: 'the controller does not tell engines which chunks another engine holds too (on by default: duplicates are evicted first; docs/storage.md)',
    commands: ['up'],
  }),
  logDir: setting<string>({
    flags: '--log-dir <dir>',
    help: 'where per-process logs, generated configs, deployment.json and deployment.secret go; refused while a running deployment holds it',
    defaultText: 'kvc-logs; kvc-logs-N with --port-offset N',
    parse: text,
    commands: ['up'],
  }),
  startupTimeout: setting<number>({ flags: '--startup-timeout <s>', help: 'seconds allowed for all processes to become healthy', default: 300_000, ...seconds, commands: ['up'] }),
  placement: setting<string>({
    flags: '--placement <how>',
    help: 'CPUs of the engines: split (prefillers and decoders on disjoint CPUs), decode-first (a CPU per decoder, prefillers on every CPU at idle priority), shared (no pinning) or prefill=LIST/decode=LIST',
    default: 'split',
    defaultText: 'split; shared with --hosts',
    commands: ['up'],
  }),
  configOnly: setting<boolean>({
    flags: '--config-only',
    help: 'write the cache YAML and connector JSON files and print the commands (with --hosts: per host, plus the deployment secret file); start nothing',
    commands: ['up'],
  }),

  // ---- kvc keys ----------------------------------------------------------------------------
  keysModel: setting<string>({ flags: '--model <model>', help: 'builtin:tiny, a checkpoint directory (as given to kvc engine), or a model id; with --engine: the served name', commands: ['keys'] }),
  keysEngine: setting<string>({ flags: '--engine <url>', help: 'ask this running engine for its model id (e.g. http://127.0.0.1:8000)', commands: ['keys'] }),
  discardPartialChunks: setting<boolean>({ flags: '--discard-partial-chunks', help: 'give the last, shorter chunk no key', commands: ['keys'] }),

  // ---- environment only ----------------------------------------------------------------------
  configFile: setting<string>({
    help: 'path of the cache YAML (docs/configuration.md); LMCACHE_CONFIG_FILE is read when KVC_CONFIG_FILE is unset (both set to different files: an error)',
    env: ['KVC_CONFIG_FILE', 'LMCACHE_CONFIG_FILE'],
    commands: [],
  }),
  hashSeed: setting<bigint>({
    help: 'integer seed of chunk keys (`kvc up` sets 0 for every process); every process of a deployment must use the same one',
    default: 0n,
    parse: (raw, name) => {
      if (raw !== '' && !/^\d+$/.test(raw)) throw new Error(`${name} must be a non-negative integer so that chunk keys agree across processes; found "${raw}"`);
      return BigInt(raw === '' ? 0 : raw);
    },
    env: ['PYTHONHASHSEED'],
    commands: [],
  }),
  cacheDir: setting<string>({ help: 'where the built-in model is generated (under <dir>/models) and compiled kernels are kept (<dir>/wasm)', defaultText: '~/.cache/kvc', env: ['KVC_CACHE_DIR'], commands: [] }),
  logLevel: setting<(typeof LOG_LEVELS)[number]>({
    help: 'log lines at this level and above (the proxy\'s TTFT statistics lines always go to stdout)',
    default: 'info',
    parse: choice(LOG_LEVELS),
    env: ['KVC_LOG_LEVEL'],
    commands: [],
  }),
  logFormat: setting<(typeof LOG_FORMATS)[number]>({
    help: 'text, or json: one JSON object per line ({"time", "level", "component", "msg", ...fields})',
    default: 'text',
    parse: choice(LOG_FORMATS),
    env: ['KVC_LOG_FORMAT'],
    commands: [],
  }),
  gemm: setting<'wasm' | 'js'>({
    help: 'matrix kernel: wasm (SIMD) or js (reference)',
    default: 'wasm',
    parse: oneOf(['wasm', 'js'] as const, 'must be "wasm" (default) or "js"'),
    env: ['KVC_GEMM'],
    commands: [],
  }),
  gemmThreads: setting<1 | 2>({
    help: 'kernel threads, 1 or 2',
    defaultText: '2 on a multi-core machine',
    parse: (raw, name) => Number(oneOf(['1', '2'] as const, 'must be "1" or "2" (kernel threads)')(raw, name)) as 1 | 2,
    env: ['KVC_GEMM_THREADS'],
    commands: [],
  }),
  weights4bit: setting<'q8' | 'q4'>({
    help: 'how Q4_0, Q4_1 and Q4_K weights are held: q8 (8-bit, the faster prefill) or q4 (their 4-bit values: 0.75 instead of 1.125 bytes a weight, the faster decode once weights outgrow the caches; needs FMA)',
    default: 'q8',
    parse: oneOf(['q8', 'q4'] as const, 'must be "q8" (default) or "q4" (how 4-bit weights are held)'),
    env: ['KVC_WEIGHTS_4BIT'],
    commands: [],
  }),
  wasmFma: setting<'0' | '1'>({
    help: '0: kernels without fused multiply-add; 1: FMA required (start-up fails without it)',
    defaultText: 'FMA when the CPU has it',
    parse: oneOf(['0', '1'] as const, 'must be "0" (off) or "1" (required), or unset (use when available)'),
    env: ['KVC_WASM_FMA'],
    commands: [],
  }),
} as const;

export type SettingName = keyof typeof SETTINGS;
export type ValueOf<K extends SettingName> = (typeof SETTINGS)[K] extends Setting<infer T> ? T : never;

/** The long flag of a setting (`--max-num-seqs`), or undefined for an environment-only one. */
export function longFlag(s: Setting<unknown>): string | undefined {
  return s.flags?.split(/[ ,]/)[0];
}

/** The value shown for a setting's default in help and docs, or undefined when it has none. */
export function defaultShown(s: Setting<unknown>): string | undefined {
  if (s.defaultText !== undefined) return s.defaultText;
  if (s.default === undefined) return undefined;
  return s.show ? (s.show as (v: unknown) => string)(s.default) : String(s.default);
}

/** The help of a setting as `command` shows it. */
export function helpFor(s: Setting<unknown>, command: CommandName): string {
  const extra = s.helpIn?.[command];
  const base = extra?.startsWith('=') ? extra.slice(1) : s.help + (extra ?? '');
  return command === 'up' && s.passThrough ? `engines: ${base}` : base;
}

/** The settings a command takes, in table order (`kvc up` includes the engines' pass-through). */
export function settingsOf(command: CommandName): [SettingName, Setting<unknown>][] {
  return (Object.entries(SETTINGS) as [SettingName, Setting<unknown>][]).filter(([, s]) => s.flags !== undefined && (s.commands.includes(command) || (command === 'up' && s.passThrough === true)));
}

/** The settings `kvc up` passes to every engine. */
export const PASS_THROUGH = (Object.entries(SETTINGS) as [SettingName, Setting<unknown>][]).filter(([, s]) => s.passThrough === true).map(([n]) => n);

/** Values of pass-through settings given to `kvc up`, keyed by setting name. */
export type PassThroughValues = Partial<Record<SettingName, unknown>>;

/** The `kvc engine` arguments for the pass-through values given (in table order). */
export function passThroughArgs(values: PassThroughValues): string[] {
  const out: string[] = [];
  for (const name of PASS_THROUGH) {
    const v = values[name];
    if (v === undefined) continue;
    const s = SETTINGS[name] as Setting<unknown>;
    out.push(longFlag(s)!, s.show ? s.show(v) : String(v));
  }
  return out;
}

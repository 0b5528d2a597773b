// A deliberately small logger: one line per event, prefixed with time and component,
// so that the per-process logs written by `kvc up` stay greppable.
//
// KVC_LOG_LEVEL = debug | info (default) | warn | error
// KVC_LOG_FORMAT = text (default) | json. With json every line is one JSON object
//   {"time", "level", "component", "msg", ...fields}, so a log shipper needs no parsing rules;
//   the optional `fields` of a call (e.g. a request's id and token counts) become its keys.
// Both are read once when the process starts (src/common/environment.ts); the `kvc` command checks them with logEnvErrors()
// before anything else and refuses a value it does not know, naming the variable.
import { environment, environmentOf } from './environment.js';
import type { LOG_FORMATS, LOG_LEVELS } from './flags.js';

export type Level = (typeof LOG_LEVELS)[number];
export type LogFormat = (typeof LOG_FORMATS)[number];
export type LogFields = Record<string, string | number | boolean | null>;

const order: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };

/** A variable's value, or its default when the value is bad (warnBadEnvOnce says so). */
function orDefault<T>(read: () => T | undefined, fallback: T): T {
  try {
    return read() ?? fallback;
  } catch {
    return fallback;
  }
}
const threshold = order[orDefault(() => environment().get('logLevel'), 'info')];
const format: LogFormat = orDefault(() => environment().get('logFormat'), 'text');

/** The problems with the logging environment variables, as messages naming each variable. */
export function logEnvErrors(env: NodeJS.ProcessEnv = process.env): string[] {
  const e = environmentOf(env);
  const errs: string[] = [];
  for (const name of ['logLevel', 'logFormat'] as const) {
    try {
      e.get(name);
    } catch (x) {
      errs.push((x as Error).message);
    }
  }
  return errs;
}

// A process started without the `kvc` command (tests, embedding) is not refused, but says once
// which value it could not use instead of ignoring it silently.
let envWarned = false;
function warnBadEnvOnce(): void {
  if (envWarned) return;
  envWarned = true;
  for (const e of logEnvErrors()) process.stderr.write(`${new Date().toISOString()} WARN  [log] ${e}; using the default\n`);
}

export function logFormat(): LogFormat {
  return format;
}

export interface Logger {
  debug(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
}

/** One formatted line (with its newline) as the logger writes it; exported for tests. */
export function formatLine(fmt: LogFormat, time: Date, level: Level, component: string, msg: string, fields?: LogFields): string {
  if (fmt === 'json') {
    // Fields never override the four fixed keys: a field named like one is kept under `field_<name>`.
    const out: Record<string, unknown> = { time: time.toISOString(), level, component, msg };
    if (fields) for (const [k, v] of Object.entries(fields)) out[k in out ? `field_${k}` : k] = v;
    return JSON.stringify(out) + '\n';
  }
  return `${time.toISOString()} ${level.toUpperCase().padEnd(5)} [${component}] ${msg}\n`;
}

export function logger(component: string): Logger {
  const emit = (level: Level, msg: string, fields?: LogFields) => {
    if (order[level] < threshold) return;
    warnBadEnvOnce();
    const line = formatLine(format, new Date(), level, component, msg, fields);
    (level === 'error' || level === 'warn' ? process.stderr : process.stdout).write(line);
  };
  return {
    debug: (m, f) => emit('debug', m, f),
    info: (m, f) => emit('info', m, f),
    warn: (m, f) => emit('warn', m, f),
    error: (m, f) => emit('error', m, f),
  };
}

// A deliberately small logger: one line per event, prefixed with time and component,
// so that the per-process logs written by `kvc up` stay greppable.
export type Level = 'debug' | 'info' | 'warn' | 'error';
const order: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };
const threshold = order[(process.env.KVC_LOG_LEVEL as Level) ?? 'info'] ?? order.info;

export interface Logger {
  debug(msg: string): void;
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string): void;
}

export function logger(component: string): Logger {
  const emit = (level: Level, msg: string) => {
    if (order[level] < threshold) return;
    const line = `${new Date().toISOString()} ${level.toUpperCase().padEnd(5)} [${component}] ${msg}\n`;
    (level === 'error' || level === 'warn' ? process.stderr : process.stdout).write(line);
  };
  return {
    debug: (m) => emit('debug', m),
    info: (m) => emit('info', m),
    warn: (m) => emit('warn', m),
    error: (m) => emit('error', m),
  };
}

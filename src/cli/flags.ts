// The commander options of a `kvc` command, derived from the settings table (src/common/flags.ts):
// flag, help with its default, parser (a bad value stops the command naming the flag) and the
// environment variable read when the flag is not given. Each command's file only says which
// command it is and what to do with the parsed values.
import { Option, type Command } from 'commander';
import { environment } from '../common/environment.js';
import { defaultShown, helpFor, longFlag, settingsOf, type CommandName, type Setting, type SettingName } from '../common/flags.js';

/** A flag given a value its parser refuses: `kvc` exits 2 (a usage error), as for its other refusals of what was typed. */
export class UsageError extends Error {
  override name = 'UsageError';
}

/** The commander option of one setting as `command` shows it. */
export function optionOf(s: Setting<unknown>, command: CommandName): Option {
  const upPass = command === 'up' && s.passThrough === true;
  let help = helpFor(s, command);
  if (s.env) help += ` [env: ${s.env.join(', ')}]`;
  const o = new Option(s.flags!, help);
  if (s.parse) {
    const parse = s.parse;
    const flag = longFlag(s)!;
    o.argParser((raw: string) => {
      try {
        return parse(raw, flag);
      } catch (e) {
        throw new UsageError((e as Error).message);
      }
    });
  }
  const shown = defaultShown(s);
  // `kvc up` passes an engine flag only when given, so the engine's own default applies.
  if (s.default !== undefined && !upPass) o.default(s.default, shown);
  else if (shown !== undefined) o.description += ` (default: ${upPass ? "the engine's, " : ''}${shown})`;
  return o;
}

/** Adds the options of `command` from the table, and reads their environment variables (once, see environment.ts) when a flag is not given. */
export function addSettings(cmd: Command, command: CommandName): Command {
  const withEnv: [SettingName, string][] = [];
  for (const [name, s] of settingsOf(command)) {
    const o = optionOf(s, command);
    cmd.addOption(o);
    if (s.env) withEnv.push([name, o.attributeName()]);
  }
  if (withEnv.length) {
    cmd.hook('preAction', (c) => {
      for (const [name, attr] of withEnv) {
        if (c.getOptionValueSource(attr) === 'cli') continue;
        const v = environment().get(name);
        if (v !== undefined) c.setOptionValueWithSource(attr, v, 'env');
      }
    });
  }
  return cmd;
}

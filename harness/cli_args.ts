// The real `kvc` command tree and a check of an argument list against it: used by the tests
// that generate commands (Kubernetes manifests, `kvc up --config-only --hosts`) to prove every
// printed flag exists in the CLI, takes a value when it needs one and is not repeated.
import assert from 'node:assert/strict';
import { Command, type Option } from 'commander';
import { registerController } from '../src/cli/controller.js';
import { registerEngine } from '../src/cli/engine.js';
import { registerKeys } from '../src/cli/keys.js';
import { registerProxy } from '../src/cli/proxy.js';
import { registerUp } from '../src/cli/up.js';

/** The real `kvc` command tree, built by the same register functions main.ts calls. */
export function cliProgram(): Command {
  const program = new Command().name('kvc');
  for (const register of [registerKeys, registerEngine, registerController, registerProxy, registerUp]) register(program);
  return program;
}

/** Checks an argument list against a subcommand's options; returns the flag values. */
export function checkArgs(program: Command, args: string[], where: string): Map<string, string | true> {
  const sub = program.commands.find((c) => c.name() === args[0]);
  assert.ok(sub, `${where}: "kvc ${args[0]}" is not a kvc subcommand`);
  const byLong = new Map<string, Option>();
  for (const o of sub.options) if (o.long) byLong.set(o.long, o);
  const seen = new Map<string, string | true>();
  for (let i = 1; i < args.length; i++) {
    const a = args[i]!;
    assert.ok(a.startsWith('--'), `${where}: unexpected positional argument "${a}" for kvc ${args[0]}`);
    const o = byLong.get(a);
    assert.ok(o, `${where}: kvc ${args[0]} has no option ${a} (known: ${[...byLong.keys()].join(' ')})`);
    assert.ok(!seen.has(a), `${where}: ${a} given twice`);
    if (o.required) {
      const v = args[++i];
      assert.ok(v !== undefined && !v.startsWith('--'), `${where}: ${a} needs a value`);
      seen.set(a, v);
    } else seen.set(a, true);
  }
  for (const o of sub.options) if (o.mandatory) assert.ok(seen.has(o.long!), `${where}: kvc ${args[0]} requires ${o.long}`);
  return seen;
}

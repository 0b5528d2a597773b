// The credential flags every process takes (docs/security.md): `--deployment-secret-file` (or
// KVC_DEPLOYMENT_SECRET) on all of them, `--api-key` (or KVC_API_KEY) on those clients call
// (proxy, engine). Loaded before anything starts, so a bad file or key stops the process with a
// message naming the flag; a process without a secret warns when it is not bound to loopback.
import type { Command } from 'commander';
import { loadApiKey, loadDeploymentSecret, setDeploymentSecret, warnIfOpen } from '../common/auth.js';

export function secretOption(cmd: Command): Command {
  return cmd.option('--deployment-secret-file <path>', 'file whose first line is the secret the processes of this deployment share (default: $KVC_DEPLOYMENT_SECRET; none: internal channels are open)');
}

export function apiKeyOption(cmd: Command): Command {
  return cmd.option('--api-key <key>', 'clients must send "Authorization: Bearer <key>" (default: $KVC_API_KEY; none: open)');
}

/** Sets the process's deployment secret from the flag or the environment; returns it. */
export function applySecret(flags: { deploymentSecretFile?: string }, host: string, what: string): string | null {
  const secret = loadDeploymentSecret(flags.deploymentSecretFile);
  setDeploymentSecret(secret);
  warnIfOpen(secret, host, what);
  return secret;
}

export function apiKeyFrom(flags: { apiKey?: string }): string | null {
  return loadApiKey(flags.apiKey);
}

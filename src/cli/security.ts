// The credential flags every process takes (docs/security.md): `--deployment-secret-file` (or
// KVC_DEPLOYMENT_SECRET) and `--replay-window` (or KVC_REPLAY_WINDOW) on all of them, `--api-key` (or KVC_API_KEY) on those clients call
// (proxy, engine), declared in src/common/flags.ts. Loaded before anything starts, so a bad file or key stops the process with a
// message naming the flag; a process without a secret warns when it is not bound to loopback.
import { resolve } from 'node:path';
import { loadApiKey, loadDeploymentSecret, setDeploymentSecret, warnIfOpen } from '../common/auth.js';
import { setReplayWindow } from '../common/replay.js';

/** Sets the process's deployment secret from the flag or the environment; returns it. */
export function applySecret(flags: { deploymentSecretFile?: string; replayWindow?: number }, host: string, what: string): string | null {
  const secret = loadDeploymentSecret(flags.deploymentSecretFile);
  if (flags.replayWindow !== undefined) setReplayWindow(flags.replayWindow);
  setDeploymentSecret(secret, flags.deploymentSecretFile ? resolve(flags.deploymentSecretFile) : null);
  warnIfOpen(secret, host, what);
  return secret;
}

export function apiKeyFrom(flags: { apiKey?: string }): string | null {
  return loadApiKey(flags.apiKey);
}

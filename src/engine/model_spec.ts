// What `--model` may name, checked before anything is loaded: `builtin:<name>`, a local
// checkpoint directory (config.json, tokenizer.json, *.safetensors) or a llama.cpp `.gguf` file. Nothing is downloaded at
// run time, so a Hugging Face id gets a message saying how to fetch it into a directory.
// modelIdOf() gives the id chunk keys are bound to (the same on every engine of one model).
import { existsSync, statSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { BUILTIN_MODELS, builtinDirName } from './model/formats/builtin.js';

/** Throws an Error starting with `flag` when `spec` is not a built-in model or a checkpoint directory. */
export function checkModelSpec(spec: string, flag = '--model'): void {
  if (spec.startsWith('builtin:')) {
    const name = spec.slice('builtin:'.length);
    if (!BUILTIN_MODELS[name]) throw new Error(`${flag} ${spec}: no such built-in model; built-in models: ${Object.keys(BUILTIN_MODELS).map((n) => `builtin:${n}`).join(', ')}`);
    return;
  }
  if (/\.gguf$/i.test(spec)) {
    if (!existsSync(spec) || !statSync(spec).isFile()) throw new Error(`${flag} ${spec}: no such file (a .gguf model is a local file; nothing is downloaded)`);
    return;
  }
  const isDir = existsSync(spec) && statSync(spec).isDirectory();
  if (!isDir) {
    const hfId = /^[\w.-]+\/[\w.-]+$/.test(spec) && !spec.startsWith('.') && !existsSync(spec);
    const hint = hfId
      ? ` It looks like a Hugging Face model id: kvc serves local checkpoint directories and downloads nothing. Fetch it first, e.g. \`huggingface-cli download ${spec} --local-dir ./${basename(spec)}\`, then pass --model ./${basename(spec)} (--served-model-name ${spec} keeps the name clients use).`
      : ' Expected builtin:tiny, a local checkpoint directory (config.json, tokenizer.json, *.safetensors) or a .gguf file.';
    throw new Error(`${flag} ${spec}: not a local directory.${hint}`);
  }
  if (!existsSync(join(spec, 'config.json'))) throw new Error(`${flag} ${spec}: the directory has no config.json; expected a Hugging Face checkpoint directory (config.json, tokenizer.json, *.safetensors)`);
}

/** The model id chunk keys use for `spec`: the built-in model's directory name, the checkpoint directory's name, or the .gguf file's name without the extension. */
export function modelIdOf(spec: string): string {
  if (spec.startsWith('builtin:')) {
    const b = BUILTIN_MODELS[spec.slice('builtin:'.length)];
    if (!b) throw new Error(`no such built-in model: ${spec}`);
    return builtinDirName(b);
  }
  return basename(resolve(spec)).replace(/\.gguf$/i, '');
}

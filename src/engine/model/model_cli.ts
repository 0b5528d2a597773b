// `npm run model -- <name>`: fetches and converts a model kvc knows by name (formats/stories.ts)
// into the cache directory and prints the GGUF file's path, for `kvc engine --model <path>`.
import { ensureKnownModel, KNOWN_MODELS } from './formats/stories.js';

async function main(args: string[]): Promise<void> {
  if (args.length !== 1 || args[0] === '--help' || args[0] === '-h') {
    console.error(`usage: npm run model -- <name>\nknown models: ${KNOWN_MODELS.join(', ')}\nthe GGUF is kept in $KVC_CACHE_DIR/models (default ~/.cache/kvc/models); its path is printed`);
    process.exit(args.length === 1 ? 0 : 2);
  }
  const file = await ensureKnownModel(args[0]!, process.env, (s) => console.error(s));
  console.log(file);
}

main(process.argv.slice(2)).catch((err: unknown) => {
  console.error(`error: ${(err as Error).message}`);
  process.exit(1);
});

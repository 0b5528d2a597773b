// vLLM's `vllm serve` flags that kvc's CPU engine does not implement. A vLLM user who types one
// gets "not supported by kvc (CPU engine): <flag>" by name, before anything starts, instead of
// commander's generic "unknown option" (or, for --revision, "did you mean --version?"). The list
// follows vLLM's engine and server arguments (vllm/engine/arg_utils.py, entrypoints/openai/cli_args.py);
// the flags kvc implements are in src/common/flags.ts.

/** Flag (its `--no-` form is refused too) → why kvc has no such setting, when more than "CPU engine" says. */
export const VLLM_UNSUPPORTED: Readonly<Record<string, string>> = {
  '--tensor-parallel-size': 'one process computes the whole model',
  '--pipeline-parallel-size': 'one process computes the whole model',
  '--data-parallel-size': 'run more engines behind `kvc proxy` / `kvc up` instead',
  '--data-parallel-rank': '',
  '--data-parallel-address': '',
  '--data-parallel-rpc-port': '',
  '--data-parallel-backend': '',
  '--enable-expert-parallel': '',
  '--distributed-executor-backend': '',
  '--no-enable-chunked-prefill': 'prefill is always chunked by --max-num-batched-tokens and --step-target-ms',
  '--max-num-partial-prefills': '',
  '--long-prefill-token-threshold': '',
  '--seed': 'sampling takes a per-request seed',
  '--log-level': 'set KVC_LOG_LEVEL',
  '--uvicorn-log-level': 'set KVC_LOG_LEVEL',
  '--revision': 'models are local directories or .gguf files; nothing is downloaded',
  '--code-revision': 'models are local directories or .gguf files; nothing is downloaded',
  '--tokenizer-revision': 'models are local directories or .gguf files; nothing is downloaded',
  '--download-dir': 'nothing is downloaded',
  '--hf-token': 'nothing is downloaded',
  '--tokenizer': "the tokenizer is the checkpoint's own",
  '--tokenizer-mode': "the tokenizer is the checkpoint's own",
  '--trust-remote-code': 'only the built-in Llama architecture runs',
  '--load-format': 'safetensors checkpoints and .gguf files are read by their format',
  '--config-format': '',
  '--quantization': 'quantized weights are read from the checkpoint (GGUF blocks)',
  '--gpu-memory-utilization': 'use --kv-cache-memory (GiB)',
  '--swap-space': '',
  '--cpu-offload-gb': '',
  '--block-size': '',
  '--num-gpu-blocks-override': 'use --kv-cache-memory (GiB)',
  '--max-seq-len-to-capture': 'the engine always runs eagerly',
  '--compilation-config': 'the engine always runs eagerly',
  '--cuda-graph-sizes': 'the engine always runs eagerly',
  '--device': '',
  '--disable-sliding-window': '',
  '--rope-scaling': "RoPE scaling is the checkpoint's",
  '--rope-theta': "RoPE is the checkpoint's",
  '--hf-overrides': '',
  '--enable-lora': '',
  '--lora-modules': '',
  '--max-loras': '',
  '--max-lora-rank': '',
  '--speculative-config': '',
  '--enable-auto-tool-choice': '',
  '--tool-call-parser': '',
  '--reasoning-parser': '',
  '--guided-decoding-backend': '',
  '--structured-outputs-config': '',
  '--scheduling-policy': 'requests are admitted by their `priority` field, then in arrival order',
  '--preemption-mode': '',
  '--enable-sleep-mode': '',
  '--max-logprobs': '',
  '--generation-config': '',
  '--override-generation-config': '',
  '--response-role': '',
  '--chat-template-content-format': '',
  '--ssl-keyfile': 'put a TLS-terminating proxy in front',
  '--ssl-certfile': 'put a TLS-terminating proxy in front',
  '--root-path': '',
  '--allowed-origins': '',
  '--middleware': '',
  '--lora-dtype': '',
  '--task': '',
  '--runner': '',
  '--api-server-count': '',
  '--headless': '',
  '--limit-mm-per-prompt': 'text-only models',
  '--mm-processor-kwargs': 'text-only models',
  '--otlp-traces-endpoint': '',
  '--calculate-kv-scales': 'the KV cache holds float32 or 16-bit floats, never scaled 8-bit values',
  '--prefix-caching-hash-algo': 'chunk keys are xxh64 chains (docs/configuration.md)',
  '--kv-events-config': '',
  '--async-scheduling': '',
};

/** Short forms vLLM accepts for some of them. */
const SHORT: Readonly<Record<string, string>> = { '-tp': '--tensor-parallel-size', '-pp': '--pipeline-parallel-size', '-dp': '--data-parallel-size', '-q': '--quantization', '-O': '--compilation-config' };

/** The message for the first unsupported vLLM flag in `args` (a subcommand's arguments), or null. */
export function unsupportedVllmFlag(args: readonly string[]): string | null {
  for (const a of args) {
    if (a === '--') break;
    const name = a.split('=')[0]!;
    const flag = SHORT[name] ?? (!(name in VLLM_UNSUPPORTED) && name.startsWith('--no-') && `--${name.slice(5)}` in VLLM_UNSUPPORTED ? `--${name.slice(5)}` : name);
    if (flag in VLLM_UNSUPPORTED) {
      const why = VLLM_UNSUPPORTED[flag];
      return `not supported by kvc (CPU engine): ${name}${why ? ` (${why})` : ''}`;
    }
  }
  return null;
}

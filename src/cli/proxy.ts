// `kvc proxy`: the disaggregated-prefill proxy (src/proxy). See docs/proxy.md.
import type { Command } from 'commander';
import { logger } from '../common/log.js';
import type { ProxyServer } from '../proxy/server.js';
import { parseRoutingFlags } from '../proxy/routing_flags.js';
import { parseTopology } from '../proxy/topology.js';
import { addSettings } from './flags.js';
import { pinTo } from './pin.js';
import { hostFlags } from './options.js';
import { checkBindHost, urlHost } from '../common/address.js';
import { apiKeyFrom, applySecret } from './security.js';

const log = logger('proxy');

/** The parsed flags (src/common/flags.ts); times in milliseconds. */
interface ProxyFlags {
  host: string;
  advertiseHost?: string;
  port: number;
  prefillerHost: string;
  prefillerPort: string;
  numPrefillers?: number;
  decoderHost: string;
  decoderPort: string;
  numDecoders?: number;
  decoderInitPort: string;
  decoderAllocPort: string;
  proxyHost: string;
  proxyPort: number;
  prefillTimeout: number;
  decodeTimeout: number;
  idleTimeout: number;
  tokenizeTimeout: number;
  healthInterval: number;
  healthTimeout?: number;
  statsInterval: number;
  apiKey?: string;
  deploymentSecretFile?: string;
  replayWindow: number;
  routing: 'round-robin' | 'kv-aware';
  controllerUrl?: string;
  maxLocalPrefillTokens?: number;
  maxPrefillQueue?: number;
  cpus?: string;
}


export function registerProxy(program: Command): void {
  const cmd = program
    .command('proxy')
    .description('disaggregated-prefill proxy: prefill on a prefiller (round-robin or kv-aware), decode and stream from a decoder');
  addSettings(cmd, 'proxy')
    .action(async (o: ProxyFlags) => {
      let server: ProxyServer;
      try {
        const { host, advertiseHost } = hostFlags(o);
        checkBindHost('--proxy-host', o.proxyHost);
        pinTo(o.cpus, 'proxy');
        applySecret(o, host, 'the proxy');
        const apiKey = apiKeyFrom(o);
        const topology = parseTopology({
          prefillerHost: o.prefillerHost,
          prefillerPort: o.prefillerPort,
          numPrefillers: o.numPrefillers,
          decoderHost: o.decoderHost,
          decoderPort: o.decoderPort,
          numDecoders: o.numDecoders,
          decoderInitPort: o.decoderInitPort,
          decoderAllocPort: o.decoderAllocPort,
        });
        const { routing, controllerUrl } = parseRoutingFlags(o);
        const { ProxyServer } = await import('../proxy/server.js');
        server = new ProxyServer({
          routing,
          controllerUrl,
          host,
          port: o.port,
          topology,
          notify: { host: o.proxyHost, port: o.proxyPort },
          timeouts: { tokenizeMs: o.tokenizeTimeout, prefillMs: o.prefillTimeout, decodeMs: o.decodeTimeout, idleMs: o.idleTimeout },
          healthIntervalMs: o.healthInterval,
          healthTimeoutMs: o.healthTimeout,
          statsIntervalMs: o.statsInterval,
          apiKey,
        });
        await server.start();
        log.info(
          `listening on http://${urlHost(advertiseHost)}:${server.port}${host !== advertiseHost ? ` (bound on ${host})` : ''}; prefillers ${server.prefillers.map((b) => b.url).join(', ')}; ` +
            `decoders ${topology.decoders.map((d) => `http://${d.host}:${d.port} (xfer ${d.initPort}/${d.allocPort})`).join(', ')}; ` +
            `xfer notify bound on ${o.proxyHost}:${o.proxyPort}; routing ${routing.mode}` +
            (controllerUrl ? ` (index ${controllerUrl})` : '') +
            `, local prefill when uncached <= ${routing.maxLocalPrefillTokens ?? 'never'} or every prefill queue > ${routing.maxPrefillQueue ?? 'never'}`,
        );
      } catch (e) {
        process.stderr.write(`kvc proxy: ${(e as Error).message}\n`);
        process.exit(2);
      }
      let stopping = false;
      const stop = (sig: string) => {
        if (stopping) return;
        stopping = true;
        log.info(`${sig}: stopping`);
        const t = setTimeout(() => process.exit(0), 5_000);
        t.unref();
        void server.stop().finally(() => process.exit(0));
      };
      process.on('SIGINT', () => stop('SIGINT'));
      process.on('SIGTERM', () => stop('SIGTERM'));
    });
}

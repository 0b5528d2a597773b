// `kvc proxy`: the disaggregated-prefill proxy (src/proxy). See docs/proxy.md.
import type { Command } from 'commander';
import { logger } from '../common/log.js';
import { ProxyServer } from '../proxy/server.js';
import { parseRoutingFlags } from '../proxy/routing_flags.js';
import { parsePort, parseTopology } from '../proxy/topology.js';
import { ADVERTISE_HELP, hostFlags, secondsFlag as seconds } from './options.js';
import { checkBindHost, urlHost } from '../common/address.js';
import { apiKeyFrom, applySecret } from './security.js';

const log = logger('proxy');


export function registerProxy(program: Command): void {
  program
    .command('proxy')
    .description('disaggregated-prefill proxy: prefill on a prefiller (round-robin or kv-aware), decode and stream from a decoder')
    .option('--host <host>', 'address to listen on (0.0.0.0: every interface)', '127.0.0.1')
    .option('--advertise-host <host>', ADVERTISE_HELP + '; the prefillers\' xfer_proxy_host names it')
    .option('--port <port>', 'HTTP port', '9100')
    .option('--prefiller-host <hosts>', 'prefiller host(s), comma-separated', '127.0.0.1')
    .option('--prefiller-port <ports>', 'prefiller port(s), comma-separated; one port + --num-prefillers N = N consecutive ports', '7100')
    .option('--num-prefillers <n>', 'number of prefillers (XPYD); 0: no prefiller, requests go straight to the decoders (colocated kv_both engines), round-robin')
    .option('--decoder-host <hosts>', 'decoder host(s), comma-separated', '127.0.0.1')
    .option('--decoder-port <ports>', 'decoder port(s), comma-separated; one port + --num-decoders N = N consecutive ports', '7200')
    .option('--num-decoders <n>', 'number of decoders')
    .option('--decoder-init-port <ports>', "decoders' xfer receiver init port(s); one value: consecutive ports for decoders sharing a host, the same port on distinct hosts", '7300')
    .option('--decoder-alloc-port <ports>', "decoders' xfer receiver alloc port(s); one value: consecutive ports for decoders sharing a host, the same port on distinct hosts", '7400')
    .option('--proxy-host <host>', 'address the xfer notify port binds (prefillers push transfer-done notices to it at their xfer_proxy_host: this proxy\'s advertised address)', '127.0.0.1')
    .option('--proxy-port <port>', 'xfer notify port', '7500')
    .option('--prefill-timeout <s>', 'seconds a prefiller may take to answer before the next one is tried', '120')
    .option('--decode-timeout <s>', "seconds until the decoder's response starts (a non-streamed one: ends)", '300')
    .option('--idle-timeout <s>', "longest silence in the decoder's stream, seconds", '60')
    .option('--tokenize-timeout <s>', 'seconds for the tokenize call', '10')
    .option('--health-interval <s>', 'seconds between backend health probes', '2')
    .option('--health-timeout <s>', 'seconds a health probe may take (default: the interval, clamped to 1-5 s); a hung backend is found within interval + 2 x timeout')
    .option('--stats-interval <s>', 'seconds between TTFT statistics lines', '5')
    .option('--api-key <key>', 'clients must send "Authorization: Bearer <key>"; also sent to the engines (default: $KVC_API_KEY; none: open)')
    .option('--deployment-secret-file <path>', 'file whose first line is the secret the processes of this deployment share (default: $KVC_DEPLOYMENT_SECRET; none: internal channels are open)')
    .option('--routing <mode>', 'round-robin (default) or kv-aware (cached prefix + load, from the controller index; docs/routing.md)', 'round-robin')
    .option('--controller-url <url>', "the controller's HTTP URL (http://host:9000) for the routing lookup; required by kv-aware")
    .option('--max-local-prefill-tokens <n>', 'send a request straight to its decoder when at most this many prompt tokens are uncached there (kv-aware default 256; round-robin default: never)')
    .option('--max-prefill-queue <n>', 'send a request straight to its decoder when every prefiller has more than this many prefills in flight (kv-aware default 8; round-robin default: never)')
    .action(async (o: Record<string, string>) => {
      let server: ProxyServer;
      try {
        const { host, advertiseHost } = hostFlags(o);
        checkBindHost('--proxy-host', o.proxyHost!);
        applySecret(o, host, 'the proxy');
        const apiKey = apiKeyFrom(o);
        const topology = parseTopology({
          prefillerHost: o.prefillerHost!,
          prefillerPort: o.prefillerPort!,
          numPrefillers: o.numPrefillers,
          decoderHost: o.decoderHost!,
          decoderPort: o.decoderPort!,
          numDecoders: o.numDecoders,
          decoderInitPort: o.decoderInitPort!,
          decoderAllocPort: o.decoderAllocPort!,
        });
        const { routing, controllerUrl } = parseRoutingFlags(o);
        server = new ProxyServer({
          routing,
          controllerUrl,
          host,
          port: parsePort(o.port!, '--port'),
          topology,
          notify: { host: o.proxyHost!, port: parsePort(o.proxyPort!, '--proxy-port') },
          timeouts: {
            tokenizeMs: seconds('--tokenize-timeout', o.tokenizeTimeout!),
            prefillMs: seconds('--prefill-timeout', o.prefillTimeout!),
            decodeMs: seconds('--decode-timeout', o.decodeTimeout!),
            idleMs: seconds('--idle-timeout', o.idleTimeout!),
          },
          healthIntervalMs: seconds('--health-interval', o.healthInterval!),
          healthTimeoutMs: o.healthTimeout === undefined ? undefined : seconds('--health-timeout', o.healthTimeout),
          statsIntervalMs: seconds('--stats-interval', o.statsInterval!),
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

// The Kubernetes manifests (k8s/) and the Dockerfile: the committed manifests are exactly what
// src/deploy/k8s.ts generates from the `kvc up` plan; the overlays render with `kubectl kustomize`;
// every kvc container command uses only flags the CLI really has (read from the commander
// definitions), with values the CLI accepts; every cache YAML and connector JSON validates; every
// address a process is given names a Service of the render that exposes that port.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { Command } from 'commander';
import { checkArgs, cliProgram } from '../../harness/cli_args.js';
import { parseAllDocuments } from 'yaml';
import { parseConnectorConfig, validateCacheConfig } from '../../src/common/config.js';
import { parseRemoteUrl } from '../../src/common/remote_url.js';
import { DEPLOYMENT_SECRET_FILE, DEPLOYMENT_SECRET_NAME, K8S_IMAGE, OVERLAYS, k8sManifests } from '../../src/deploy/k8s.js';
import { tempDir } from '../../harness/temp_dir.js';
import { parseTopology } from '../../src/proxy/topology.js';

const ROOT = process.cwd();
const KUBECTL_SKIP = 'kubectl is not installed (Debian package "kubernetes-client": apt-get install -y kubernetes-client)';

function which(bin: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${bin}`]).status === 0;
}

/**
 * Why the overlays cannot be rendered here, or false. They name the base as a directory under
 * `resources`, which kustomize reads from v4 on (kubectl ≥ 1.21); Debian 12's kubernetes-client is
 * kubectl 1.20 with kustomize v2.
 */
function kustomizeSkip(): string | false {
  if (!which('kubectl')) return KUBECTL_SKIP;
  const v = spawnSync('kubectl', ['version', '--client'], { encoding: 'utf8', timeout: 30_000 });
  const m = /Kustomize Version: v(\d+)/.exec(`${v.stdout}${v.stderr}`);
  if (!m) return `kubectl's kustomize version is unknown (${(v.stdout || v.stderr).trim().split('\n')[0]}); the overlays need kustomize v4 or later (kubectl 1.21+)`;
  return Number(m[1]) >= 4 ? false : `kubectl's kustomize is v${m[1]}; the overlays need v4 or later (kubectl 1.21+; Debian 12's kubernetes-client is 1.20)`;
}

function listFiles(dir: string): string[] {
  const out: string[] = [];
  for (const n of readdirSync(dir)) {
    const p = join(dir, n);
    if (statSync(p).isDirectory()) out.push(...listFiles(p));
    else out.push(p);
  }
  return out;
}

describe('Kubernetes manifests', () => {
  it('the committed k8s/ files are exactly what the generator produces from the kvc up plan (npm run k8s)', () => {
    const want = k8sManifests();
    // base/deployment.secret is the operator's (never committed): not a generated file.
    const have = listFiles(join(ROOT, 'k8s')).map((p) => relative(join(ROOT, 'k8s'), p)).filter((p) => p !== 'README.md' && p !== join('base', DEPLOYMENT_SECRET_FILE));
    assert.deepEqual(have.sort(), [...want.keys()].sort(), 'same set of files');
    for (const [rel, text] of want) assert.equal(readFileSync(join(ROOT, 'k8s', rel), 'utf8'), text, `k8s/${rel} is stale: run npm run k8s`);
  });

  it('the controller container runs with the young-generation flag `kvc up` gives it (NODE_OPTIONS), the others without', () => {
    const docs = parseAllDocuments(k8sManifests().get('base/controller.yaml')!).map((d) => d.toJS() as any);
    const sts = docs.find((d) => d.kind === 'StatefulSet');
    const env = sts.spec.template.spec.containers[0].env as { name: string; value?: string }[];
    assert.equal(env.find((e) => e.name === 'NODE_OPTIONS')?.value, '--max-semi-space-size=1');
    for (const [rel, text] of k8sManifests()) {
      if (rel === 'base/controller.yaml') continue;
      assert.doesNotMatch(text, /NODE_OPTIONS/, `${rel}: only the controller sizes its young generation`);
    }
  });

  for (const overlay of OVERLAYS) {
    it(`overlay ${overlay.name} renders and every container runs a real kvc command with valid configuration`, { skip: kustomizeSkip() }, () => {
      // A copy of k8s/ with the deployment secret file the operator writes (docs/deploy.md).
      const copy = join(tempDir('kvc-k8s-'), 'k8s');
      cpSync(join(ROOT, 'k8s'), copy, { recursive: true });
      writeFileSync(join(copy, 'base', DEPLOYMENT_SECRET_FILE), 'not-a-real-secret');
      const r = spawnSync('kubectl', ['kustomize', join(copy, 'overlays', overlay.name)], { encoding: 'utf8', timeout: 60_000 });
      assert.equal(r.status, 0, `kubectl kustomize failed: ${r.stderr}`);
      assert.doesNotMatch(r.stderr, /deprecat/i, 'no deprecated kustomize field');
      const docs = parseAllDocuments(r.stdout).map((d) => d.toJS() as any);
      const kinds = (k: string) => docs.filter((d) => d.kind === k);
      // Services by name → their ports.
      const services = new Map<string, Set<number>>(kinds('Service').map((s) => [s.metadata.name, new Set<number>(s.spec.ports.map((p: any) => p.port))]));
      const reach = (host: string, port: number, what: string) => {
        assert.ok(services.has(host), `${what}: "${host}" is not a Service of the render (${[...services.keys()].join(', ')})`);
        assert.ok(services.get(host)!.has(port), `${what}: Service ${host} does not expose port ${port}`);
      };
      const configMaps = kinds('ConfigMap');
      assert.equal(configMaps.length, 1);
      const files: Record<string, string> = configMaps[0].data;

      const sts = kinds('StatefulSet');
      const names = sts.map((s) => s.metadata.name).sort();
      const engines = [...Array.from({ length: overlay.decoders }, (_, j) => `decoder-${j}`), ...Array.from({ length: overlay.prefillers }, (_, i) => `prefiller-${i}`)];
      assert.deepEqual(names, ['controller', ...engines].sort());
      for (const s of sts) {
        const svc = kinds('Service').find((x) => x.metadata.name === s.spec.serviceName);
        assert.ok(svc, `StatefulSet ${s.metadata.name} has its governing Service`);
        assert.equal(svc.spec.clusterIP, 'None', 'headless');
      }
      assert.deepEqual(kinds('Deployment').map((d) => d.metadata.name).sort(), ['proxy', 'redis']);

      // The deployment secret: generated by kustomize from the file, its name hashed.
      const secrets = kinds('Secret');
      assert.equal(secrets.length, 1);
      const secret = secrets[0];
      assert.match(secret.metadata.name, new RegExp(`^${DEPLOYMENT_SECRET_NAME}-[a-z0-9]+$`));
      assert.equal(Buffer.from(secret.data.secret, 'base64').toString(), 'not-a-real-secret');
      // One disruption budget per engine role, selecting that role's pods.
      const pdbs = kinds('PodDisruptionBudget');
      assert.deepEqual(pdbs.map((b) => [b.metadata.name, b.spec.maxUnavailable, b.spec.selector.matchLabels['app.kubernetes.io/component']]).sort(), [['decoders', 1, 'decoder'], ['prefillers', 1, 'prefiller']]);
      for (const b of pdbs) assert.ok(sts.some((x) => x.spec.template.metadata.labels['app.kubernetes.io/component'] === b.spec.selector.matchLabels['app.kubernetes.io/component']), `${b.metadata.name} selects pods`);

      const program = cliProgram();
      let kvcContainers = 0;
      for (const w of [...sts, ...kinds('Deployment')]) {
        const pod = w.spec.template.spec;
        assert.equal(pod.securityContext?.runAsNonRoot, true, `${w.metadata.name} runs as non-root`);
        assert.equal(pod.securityContext?.seccompProfile?.type, 'RuntimeDefault', `${w.metadata.name}: the runtime's seccomp profile`);
        for (const c of pod.containers) {
          const where = `${w.kind} ${w.metadata.name} container ${c.name}`;
          for (const k of ['requests', 'limits']) for (const r of ['cpu', 'memory']) assert.ok(c.resources?.[k]?.[r], `${where}: resources.${k}.${r}`);
          if (c.image === K8S_IMAGE) {
            assert.ok(c.startupProbe?.httpGet, `${where}: a startupProbe`);
            const ann = w.spec.template.metadata.annotations ?? {};
            assert.equal(ann['prometheus.io/scrape'], 'true', `${where}: scraped by Prometheus`);
            assert.ok(c.ports.some((p: any) => String(p.containerPort) === ann['prometheus.io/port'] && p.name === 'http'), `${where}: scraped on its HTTP port`);
          }
          if (c.image !== K8S_IMAGE) {
            assert.equal(w.metadata.name, 'redis', `${where}: only Redis uses another image`);
            assert.deepEqual(c.args.slice(0, 1), ['redis-server']);
            assert.ok(c.args.includes('allkeys-lru') && c.args.includes('--maxmemory'), `${where}: the documented server settings`);
            continue;
          }
          kvcContainers++;
          assert.equal(c.command, undefined, `${where}: the image's entrypoint (kvc) runs the args`);
          const flags = checkArgs(program, c.args, where);
          // 0.0.0.0 is only ever a bind address: any other flag carrying it would hand it to a peer.
          for (const [flag, v] of flags) if (v === true ? false : String(v).includes('0.0.0.0')) assert.ok(['--host', '--proxy-host'].includes(flag), `${where}: ${flag} hands out 0.0.0.0 (${v})`);
          const env = new Map<string, string>((c.env ?? []).map((e: any) => [e.name, e.value]));
          assert.equal(env.get('PYTHONHASHSEED'), '0', `${where}: every process derives the same chunk keys`);
          // Bound to 0.0.0.0, every internal channel must be closed by the deployment secret.
          const secretRef = (c.env ?? []).find((e: any) => e.name === 'KVC_DEPLOYMENT_SECRET')?.valueFrom?.secretKeyRef;
          assert.deepEqual(secretRef, { name: secret.metadata.name, key: 'secret' }, `${where}: the deployment secret comes from the generated Secret`);
          const containerPorts = new Set<number>(c.ports.map((p: any) => p.containerPort));
          const port = (flag: string) => {
            const v = Number(flags.get(flag));
            assert.ok(Number.isInteger(v) && v >= 1 && v <= 65535, `${where}: ${flag} is a port`);
            return v;
          };
          // Every process binds 0.0.0.0 (no DNS record needed to start) and advertises its own Service.
          if (c.args[0] === 'engine' || c.args[0] === 'controller' || c.args[0] === 'proxy') {
            assert.equal(flags.get('--host'), '0.0.0.0', `${where}: binds every interface`);
            const own = w.metadata.name === 'proxy' ? 'proxy' : w.metadata.name;
            assert.equal(flags.get('--advertise-host'), own, `${where}: advertises its Service name`);
          }
          if (c.args[0] === 'engine') {
            const p = port('--port');
            assert.ok(containerPorts.has(p));
            reach(w.metadata.name, p, `${where} --port`);
            const connector = parseConnectorConfig(String(flags.get('--kv-transfer-config'))).config;
            const file = env.get('KVC_CONFIG_FILE')!;
            const text = files[file.replace('/etc/kvc/', '')];
            assert.ok(text, `${where}: KVC_CONFIG_FILE ${file} is in the ConfigMap`);
            assert.ok(c.volumeMounts.some((m: any) => m.mountPath === '/etc/kvc'), `${where}: the ConfigMap is mounted`);
            const { config, warnings } = validateCacheConfig(parseAllDocuments(text)[0]!.toJS(), file);
            assert.deepEqual(warnings, []);
            assert.equal(config.kvc_instance_id, w.metadata.name);
            const [ch, cp] = config.controller_url!.split(':');
            reach(ch!, Number(cp), `${where} controller_url`);
            const [dh, dp] = config.distributed_url!.split(':');
            // distributed_url is what the peer and worker ports bind; the instance registers the
            // engine's --advertise-host (its Service) with the same port.
            assert.equal(dh, '0.0.0.0', `${where}: distributed_url binds every interface`);
            assert.equal(config.advertise_host, null, `${where}: the instance advertises the engine's --advertise-host`);
            reach(String(flags.get('--advertise-host')), Number(dp), `${where} advertised distributed_url`);
            assert.ok(containerPorts.has(Number(dp)) && containerPorts.has(config.kvc_worker_port!));
            reach(w.metadata.name, config.kvc_worker_port!, `${where} kvc_worker_port`);
            // Prefillers and decoders share the remote tier.
            assert.ok(config.remote_url, `${where}: remote_url is set`);
            const ep = parseRemoteUrl(config.remote_url);
            reach(ep.host, ep.port, `${where} remote_url`);
            if (connector.kv_role === 'kv_producer') {
              reach(config.xfer_proxy_host!, config.xfer_proxy_port!, `${where} xfer_proxy_host`);
            } else {
              assert.equal(connector.kv_role, 'kv_consumer');
              assert.ok(containerPorts.has(config.xfer_peer_init_port!) && containerPorts.has(config.xfer_peer_alloc_port!));
              assert.equal(config.xfer_peer_host, '0.0.0.0', `${where}: the xfer receiver binds every interface`);
            }
          } else if (c.args[0] === 'controller') {
            for (const f of ['--port', '--monitor-port']) reach('controller', port(f), `${where} ${f}`);
          } else {
            assert.equal(c.args[0], 'proxy');
            reach('proxy', port('--port'), `${where} --port`);
            reach('proxy', port('--proxy-port'), `${where} --proxy-port`);
            if (flags.has('--controller-url')) {
              const u = new URL(String(flags.get('--controller-url')));
              reach(u.hostname, Number(u.port), `${where} --controller-url`);
            }
            const topo = parseTopology({
              prefillerHost: String(flags.get('--prefiller-host')),
              prefillerPort: String(flags.get('--prefiller-port')),
              numPrefillers: flags.get('--num-prefillers') as string | undefined,
              decoderHost: String(flags.get('--decoder-host')),
              decoderPort: String(flags.get('--decoder-port')),
              numDecoders: flags.get('--num-decoders') as string | undefined,
              decoderInitPort: String(flags.get('--decoder-init-port')),
              decoderAllocPort: String(flags.get('--decoder-alloc-port')),
            });
            assert.equal(topo.prefillers.length, overlay.prefillers);
            assert.equal(topo.decoders.length, overlay.decoders);
            for (const p of topo.prefillers) reach(p.host, p.port, `${where} prefiller`);
            for (const d of topo.decoders) {
              reach(d.host, d.port, `${where} decoder`);
              reach(d.host, d.initPort, `${where} decoder xfer init`);
              reach(d.host, d.allocPort, `${where} decoder xfer alloc`);
            }
          }
        }
      }
      assert.equal(kvcContainers, 2 + overlay.prefillers + overlay.decoders);
    });
  }

  it('the checker refuses a flag the CLI does not have and a missing required one', () => {
    const program = cliProgram();
    assert.throws(() => checkArgs(program, ['engine', '--port', '7100', '--no-such-flag'], 't'), /has no option --no-such-flag/);
    // No kvc option is mandatory today; the rule is checked on a command that has one.
    const withMandatory = new Command().name('kvc');
    withMandatory.command('x').requiredOption('--need <v>', 'a mandatory option');
    assert.throws(() => checkArgs(withMandatory, ['x'], 't'), /requires --need/);
    assert.throws(() => checkArgs(program, ['proxy', '--port'], 't'), /--port needs a value/);
  });
});

describe('Dockerfile', () => {
  it('is multi-stage, runs as a non-root user and has kvc as its entrypoint', () => {
    const text = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');
    const lines = text.split('\n').filter((l) => l.trim() && !l.trim().startsWith('#'));
    const froms = lines.filter((l) => /^FROM\s/i.test(l));
    assert.ok(froms.length >= 2, 'at least two stages');
    assert.match(text, /COPY --from=build /);
    const lastFrom = lines.lastIndexOf(froms[froms.length - 1]!);
    const runtime = lines.slice(lastFrom);
    const user = runtime.filter((l) => /^USER\s/i.test(l)).pop();
    assert.ok(user && !/^USER\s+(root|0)(\s|:|$)/i.test(user), `the runtime stage switches to a non-root user (${user})`);
    assert.ok(runtime.some((l) => /^ENTRYPOINT\s+\["kvc"\]/.test(l)), 'ENTRYPOINT ["kvc"]');
    assert.ok(runtime.some((l) => /ln -s \/app\/dist\/src\/cli\/main\.js \/usr\/local\/bin\/kvc/.test(l)), 'kvc is the compiled CLI');
  });
});

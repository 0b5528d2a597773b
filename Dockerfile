# kvc image: one image for every process of a deployment; the entrypoint is the `kvc` command
# (`kvc engine ...`, `kvc controller ...`, `kvc proxy ...`). Kubernetes manifests: k8s/ (docs/deploy.md).
#   docker build -t kvc:latest .
#   docker run --rm -p 7100:7100 kvc:latest engine --host 0.0.0.0 --port 7100

# Node 24, the current LTS (the suite also runs on Node 20: CONTRIBUTING.md).
# Stage 1: install every dependency and compile TypeScript.
FROM node:24-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json ./
COPY src ./src
COPY test ./test
COPY harness ./harness
COPY bench ./bench
RUN npx tsc -p tsconfig.json \
 && npm prune --omit=dev --no-audit --no-fund

# Stage 2: the runtime: production dependencies and the compiled sources only, as a non-root user.
FROM node:24-bookworm-slim
ENV NODE_ENV=production \
    KVC_CACHE_DIR=/var/cache/kvc
WORKDIR /app
COPY --from=build /app/package.json ./package.json
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist/src ./dist/src
RUN chmod 0755 dist/src/cli/main.js \
 && ln -s /app/dist/src/cli/main.js /usr/local/bin/kvc \
 && mkdir -p /var/cache/kvc \
 && chown node:node /var/cache/kvc
# `node` (uid 1000) comes with the base image; the manifests run as that uid too.
USER node
# engine 7100+/7200+, xfer 7300+/7400+, proxy notify 7500, workers 7700+/7800+, controller 9000/9001, proxy 9100
EXPOSE 7100 7200 7300 7400 7500 9000 9001 9100
ENTRYPOINT ["kvc"]
CMD ["--help"]

# syntax=docker/dockerfile:1
#
# aqw container image: the aqw binary (glibc-linked) on a distroless base.
#
#   docker build -t ghcr.io/example/aqw:0.1.0 .
#   docker run --rm --read-only \
#     -v "$PWD/app:/app:ro" \
#     -e AzureWebJobsStorage="<connection string>" \
#     -p 8080:8080 ghcr.io/example/aqw:0.1.0
#
# Needs BuildKit (the default builder since Docker 23) for the cache mounts.

ARG RUST_VERSION=1

# Base images and digests.
# TODO(issue 12): pin both FROM lines by digest (`image:tag@sha256:<digest>`).
# The digests were not available offline when this was written, and a digest
# must never be guessed. To pin (or refresh, e.g. monthly for security fixes):
#
#   docker buildx imagetools inspect rust:1-slim-bookworm          # "Digest:" line
#   docker buildx imagetools inspect gcr.io/distroless/cc-debian12:nonroot
#   # or: crane digest <image>   /   skopeo inspect docker://<image> | jq -r .Digest
#
# and write the index (multi-arch) digest after the tag, keeping the tag for
# readers: FROM gcr.io/distroless/cc-debian12:nonroot@sha256:<digest>.
# Renovate/Dependabot ("docker" ecosystem) keep pinned digests fresh.

# ---------------------------------------------------------------------------
# Build stage. The Azure SDK and reqwest use rustls (ring), so no OpenSSL and
# no pkg-config: the gcc + libc6-dev already in the slim image are enough.
# ---------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# The whole context (trimmed by .dockerignore): Cargo.toml may name test or
# example targets whose files must exist for the manifest to load.
COPY . .
# The registry and target/ live in cache mounts, so a rebuild after a source
# change recompiles only aqw itself. The binary is copied out of the cache
# mount in the same step; target/ never reaches an image layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin aqw \
 && install -D -m 0755 target/release/aqw /out/aqw

# ---------------------------------------------------------------------------
# Runtime stage: glibc + libgcc + CA certificates, no shell, no package manager.
# Debian 12 (bookworm) on both sides, so the glibc the binary was linked
# against is the one it runs with.
# ---------------------------------------------------------------------------
FROM gcr.io/distroless/cc-debian12:nonroot

LABEL org.opencontainers.image.title="aqw" \
      org.opencontainers.image.description="Azure Queue Storage worker that makes background jobs safe to retry" \
      org.opencontainers.image.licenses="MIT"

COPY --from=build /out/aqw /usr/local/bin/aqw

# The app folder (host.json, and <Function>/function.json folders if the app
# uses them) is mounted or copied at /app: a Kubernetes ConfigMap volume, a
# Container Apps secret volume, `docker run -v ./app:/app:ro`, or a derived
# image (`FROM ghcr.io/example/aqw:0.1.0` + `COPY app/ /app/`).
WORKDIR /app

# aqw writes nothing to disk (no temp files, no state: Azure Storage holds all
# of it), so the root filesystem can be mounted read-only
# (docker run --read-only, Kubernetes readOnlyRootFilesystem: true).
#
# 65532 is distroless's `nonroot` user. It is written as a number, not a name,
# so that Kubernetes `runAsNonRoot: true` can verify it without a passwd lookup.
USER 65532:65532

# Ops endpoints: /healthz, /readyz, /metrics. The port is host.json
# `aqw.http.port`; without it aqw serves no HTTP at all, so set it to 8080.
EXPOSE 8080

# No init process (tini, dumb-init) is needed: aqw is PID 1 and installs its own
# SIGTERM/SIGINT handler (tokio::signal). On SIGTERM it stops receiving, turns
# /readyz false, gives in-flight jobs aqw.shutdownTimeout (default 25 s),
# releases what is left (visible again at once) and exits 0. Give the
# orchestrator a grace period above shutdownTimeout (Kubernetes
# terminationGracePeriodSeconds, Container Apps terminationGracePeriodSeconds).
# aqw's only children are `exec` handlers, which it waits for; if a derived
# image adds exec handlers that fork grandchildren of their own, run with
# `docker run --init` or add tini there, so orphans are reaped.
ENTRYPOINT ["/usr/local/bin/aqw"]
CMD ["run", "--app", "/app"]

#!/usr/bin/env bash
# Build the binary examples/functions-app ships: a static Linux x86_64 aqw
# (musl), copied next to host.json as `aqw`, where host.json's
# customHandler.description.defaultExecutablePath ("aqw") points. This is the
# build Microsoft's Rust custom-handler quickstart ships. The Functions host
# runs it from the app root (the folder holding host.json) on Linux with
# FUNCTIONS_CUSTOMHANDLER_PORT set; it must be executable and need no shared
# library the Functions image lacks, which a static binary guarantees.
#
#   scripts/build-functions-app.sh            # musl (static), the default
#   AQW_TARGET=gnu scripts/build-functions-app.sh   # glibc, as the Dockerfile builds
#
# Needs: rustup's x86_64-unknown-linux-musl target (added here if missing) and
# a C compiler for musl (ring builds C): Debian's musl-tools (`musl-gcc`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="examples/functions-app/aqw"
case "${AQW_TARGET:-musl}" in
  musl)
    target=x86_64-unknown-linux-musl
    if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
      rustup target add "$target"
    fi
    if ! command -v musl-gcc >/dev/null; then
      echo "build-functions-app: musl-gcc not found; install Debian's musl-tools (apt-get install musl-tools)" >&2
      exit 2
    fi
    CC_x86_64_unknown_linux_musl=musl-gcc \
      cargo build --release --locked --bin aqw --target "$target"
    cp "target/$target/release/aqw" "$out"
    ;;
  gnu)
    cargo build --release --locked --bin aqw
    cp target/release/aqw "$out"
    ;;
  *) echo "build-functions-app: AQW_TARGET must be musl or gnu" >&2; exit 2 ;;
esac
chmod +x "$out"
file "$out" 2>/dev/null || true
echo "built $out: deploy the folder examples/functions-app (func azure functionapp publish <app>)"

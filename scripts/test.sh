#!/usr/bin/env bash
# The test command: installs the pinned Azurite if needed, starts it (or reuses
# a running one) on 127.0.0.1, then runs every test, unit and integration.
# Extra arguments go to `cargo test` (e.g. scripts/test.sh --test it worker::,
# the integration tests of tests/worker.rs: one test binary, tests/it.rs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/azurite.sh start
# Debian's chromium + chromium-driver for the dashboard's browser test (no-op when present).
bash scripts/browser.sh install
# promtool (Debian's prometheus package) for the shipped alert rules: checked
# and unit-tested before the Rust tests.
bash scripts/promtool.sh install
bash scripts/promtool.sh test
# A smoke run of the benchmark script (tiny sizes, one repetition): it fails
# only when something is broken, never because of speed. It runs beside the
# test schedule, mostly waiting on processes it starts, on an Azurite of its
# own (ports 10020-10022, state in .bench/azurite-smoke): the suite leaves
# thousands of queues and tables in the shared one, and Azurite scans its
# store (once it did not answer a purge's query within 30 s). Its log is
# .bench/smoke.log, printed when it fails.
smoke_pid=
stop_smoke() {
  if [ -n "$smoke_pid" ]; then
    kill -- -"$smoke_pid" 2>/dev/null || kill "$smoke_pid" 2>/dev/null || true
  fi
}
if [ $# -eq 0 ] && [ -z "${AQW_SKIP_BENCH_SMOKE:-}" ]; then
  # The smoke's binaries first (the test build's profile and features), so
  # it does not wait for the test build's lock on the target directory.
  cargo build --features failpoints --examples --bin aqw
  mkdir -p .bench
  trap stop_smoke EXIT
  set -m
  (
    export AQW_AZURITE_BLOB_PORT=10020 AQW_AZURITE_QUEUE_PORT=10021 \
      AQW_AZURITE_TABLE_PORT=10022 AQW_AZURITE_STATE="$root/.bench/azurite-smoke" \
      AQW_BENCH_BUILT=1
    status=0
    bash scripts/azurite.sh restart && bash scripts/bench.sh --smoke || status=$?
    bash scripts/azurite.sh stop || true
    exit "$status"
  ) >.bench/smoke.log 2>&1 &
  smoke_pid=$!
  set +m
fi
# failpoints: test-only crash points (compiled out of release builds). With
# no arguments, every crate of the workspace: the engine's tests on the
# in-memory store (crates/aqw-core, seconds, no Azurite) and the one
# integration target (tests/it.rs) against Azurite. Arguments go to
# `cargo test` for the aqw package (scripts/test.sh --test it worker::).
# With cargo-nextest (on this project's CI machine; .config/nextest.toml) every
# test binary shares one schedule, several tests at once; without it, cargo
# test runs the same tests, one binary after another. Doc tests are cargo
# test's alone.
if [ $# -eq 0 ]; then
  if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --features failpoints
    cargo test --workspace --features failpoints --doc
  else
    cargo test --workspace --features failpoints
  fi
else
  cargo test --features failpoints "$@"
fi
# The benchmark program's own unit tests (stdlib Python, no Azurite).
python3 -m unittest discover -s bench -p 'test_*.py'
if [ -n "$smoke_pid" ]; then
  status=0
  wait "$smoke_pid" || status=$?
  smoke_pid=
  if [ "$status" -ne 0 ]; then
    echo "test.sh: the bench smoke failed (exit $status); its log, .bench/smoke.log:" >&2
    tail -60 .bench/smoke.log >&2
    exit 1
  fi
  echo "test.sh: bench smoke passed ($(grep -c '^bench: (' .bench/smoke.log) steps; .bench/smoke.md)"
fi

#!/usr/bin/env bash
# aqw benchmarks against a local Azurite, in one command (bash scripts/bench.sh
# --help for the flags and the scenarios). This driver only prepares: Azurite,
# the Python venv (for bench/python_worker.py) and the release build; the
# benchmark itself is bench/aqw_bench.py (scenarios, checks, report), which
# gets the same flags. --help and --report need no preparation.
#
#   bash scripts/bench.sh            full run (3 repetitions), rewrites BENCHMARKS.md
#   bash scripts/bench.sh --smoke    tiny sizes, 1 repetition, writes .bench/smoke.md
#   bash scripts/bench.sh --reps 5   full run with 5 repetitions
#   bash scripts/bench.sh --report .bench/full-YYYYMMDD-HHMMSS
#                                    re-render a run's report from its results.json
#
# Needs: cargo, Node.js/npm (Azurite, via scripts/azurite.sh), python3 (venv).
# Scratch: .bench/ (venv, per-run logs and raw results; the last 5 runs kept).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bench="$root/bench/aqw_bench.py"
say() { echo "bench.sh: $*" >&2; }

# The flags are parsed once, by bench/aqw_bench.py: 0 = a run, 1 = --help or
# --report (stdlib Python only), 2 = a bad flag (already reported).
status=0
python3 "$bench" --needs-setup "$@" || status=$?
case "$status" in
  0) ;;
  1) exec python3 "$bench" "$@" ;;
  *) exit "$status" ;;
esac

say "starting Azurite"
bash "$root/scripts/azurite.sh" start

venv="$root/.bench/venv"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$root/bench/requirements.txt" "$venv/.requirements.txt"; then
  say "creating the Python venv in .bench/venv"
  mkdir -p "$root/.bench"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/bench/requirements.txt"
  cp "$root/bench/requirements.txt" "$venv/.requirements.txt"
fi

case " $* " in
  *" --smoke "*)
    # The smoke run proves the benchmark works, not how fast: it reuses the
    # test build's profile and features (no second, release build).
    export AQW_BENCH_PROFILE=debug
    # scripts/test.sh has built them (AQW_BENCH_BUILT=1) before its test
    # build, which would hold cargo's lock on the target directory.
    if [ -z "${AQW_BENCH_BUILT:-}" ]; then
      say "building (cargo build --features failpoints --examples --bin aqw)"
      cargo build --quiet --features failpoints --examples --bin aqw
    fi ;;
  *)
    say "building (cargo build --release --examples --bin aqw)"
    cargo build --release --quiet --examples --bin aqw ;;
esac

exec "$venv/bin/python" "$bench" "$@"

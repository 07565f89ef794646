#!/usr/bin/env bash
# The seeded simulation for long runs (issue 50): the engine test target's
# swarm (crates/aqw-core/tests/engine/sim) over N seeds from S, in two
# halves on two threads. A failing seed prints its plan, the checker's
# verdict and the one-line command that replays it with its full trace.
#
#   scripts/sim.sh --seeds 10000 [--from 1] [--release]
# --release builds the engine's tests optimised (a few minutes once, then
# seeds run several times faster: the way to run 10,000).
set -euo pipefail
seeds=200
from=1
profile=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds="$2"; shift 2 ;;
    --from) from="$2"; shift 2 ;;
    --release) profile=(--release); shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "sim.sh: unknown argument $1 (--seeds N --from S --release)" >&2; exit 2 ;;
  esac
done
case "$seeds$from" in
  *[!0-9]*) echo "sim.sh: --seeds and --from take whole numbers" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
AQW_SIM_SEEDS="$seeds" AQW_SIM_FROM="$from" \
  cargo test "${profile[@]}" -p aqw-core --test engine sim::swarm -- --nocapture --test-threads 2

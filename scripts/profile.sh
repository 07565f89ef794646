#!/usr/bin/env bash
# Where aqw's CPU goes per keyed message, on a fixed workload whose figures do
# not depend on machine load: instructions (valgrind --tool=callgrind), a
# call-graph profile (perf record -g) and heap allocations (heaptrack).
#
#   scripts/profile.sh install            apt-get the tools (Debian: linux-perf, valgrind, heaptrack)
#   scripts/profile.sh stat  [N]          instructions per message, RUST_BACKTRACE unset and =1
#   scripts/profile.sh record [N]         perf.data + the top of the report (self cost)
#   scripts/profile.sh allocs [N]         heap allocations per message
#   AQW_PROFILE_WORKLOAD=run scripts/profile.sh stat|record|allocs [N]
#                                         the same, on `aqw run` (the release
#                                         binary as users run it, JSON logs)
#                                         with a loopback HTTP handler
#   AQW_PROFILE_WORKLOAD=run scripts/profile.sh cpu [N]
#                                         one plain run: CPU, user and system
#   scripts/profile.sh traces [N]         `aqw run`: instructions with OTLP
#                                         export off and on (a local collector)
#
# The workload: N (default 800) keyed no-op jobs put on a fresh queue by
# `ceiling enqueue`, then `bench_worker --expect N` (aqw's real worker loop
# with an in-process handler, as `scripts/bench.sh` runs it) until all are
# settled. Only the worker process is measured, never Azurite or the feeder.
#
# It starts (or reuses) a private Azurite, never the shared one on
# 10000-10002: AQW_AZURITE_QUEUE_PORT (default 22001), AQW_AZURITE_TABLE_PORT
# (22002), AQW_AZURITE_BLOB_PORT (22000), AQW_AZURITE_STATE
# (/tmp/azurite-profile). Output goes to AQW_PROFILE_DIR (target/profile).
# Extra environment for the worker (RUST_BACKTRACE, OTEL_*) passes through.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:-stat}"
n="${2:-800}"
export AQW_AZURITE_QUEUE_PORT="${AQW_AZURITE_QUEUE_PORT:-22001}"
export AQW_AZURITE_TABLE_PORT="${AQW_AZURITE_TABLE_PORT:-22002}"
export AQW_AZURITE_BLOB_PORT="${AQW_AZURITE_BLOB_PORT:-22000}"
export AQW_AZURITE_STATE="${AQW_AZURITE_STATE:-/tmp/azurite-profile}"
out="${AQW_PROFILE_DIR:-$root/target/profile}"
mkdir -p "$out"

if [ "$cmd" = install ]; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
  $sudo apt-get install -y linux-perf valgrind heaptrack
  exit 0
fi
if [ "$AQW_AZURITE_QUEUE_PORT" = 10001 ] || [ "$AQW_AZURITE_TABLE_PORT" = 10002 ]; then
  echo "profile.sh: use a private Azurite, not the shared one on 10001/10002" >&2
  exit 2
fi

key="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
export AzureWebJobsStorage="DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=$key;QueueEndpoint=http://127.0.0.1:$AQW_AZURITE_QUEUE_PORT/devstoreaccount1;TableEndpoint=http://127.0.0.1:$AQW_AZURITE_TABLE_PORT/devstoreaccount1"

# AQW_PROFILE_BIN_DIR: measure binaries built before (a saved "before"
# build, for a before/after comparison) instead of building this tree.
bins="${AQW_PROFILE_BIN_DIR:-}"
if [ -z "$bins" ]; then
  (cd "$root" && cargo build --release --quiet --example bench_worker --example ceiling)
  bins="$root/target/release/examples"
fi
worker="$bins/bench_worker"
ceiling="$bins/ceiling"
aqw="${AQW_PROFILE_AQW:-$root/target/release/aqw}"
workload="${AQW_PROFILE_WORKLOAD:-worker}"
if [ "$cmd" = traces ]; then workload=run; fi
if [ "$workload" = run ] && [ -z "${AQW_PROFILE_AQW:-}" ]; then
  (cd "$root" && cargo build --release --quiet --bin aqw)
fi
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
bash "$root/scripts/azurite.sh" start >/dev/null

# One fresh queue and tables per run, so every run does the same work.
prepare() {
  tag="p$(date +%s%N | tail -c 9)"
  app="$out/app-$tag"
  queue="prof$tag"
  mkdir -p "$app"
  local handler=""
  if [ "$workload" = run ]; then
    handler=", \"handler\": {\"type\": \"http\", \"url\": \"http://127.0.0.1:$port/effects\"}"
  fi
  cat >"$app/host.json" <<EOF
{"version": "2.0", "extensions": {"queues": {"messageEncoding": "base64"}},
 "aqw": {"functions": {"Bench": {"queue": "$queue", "key": "bench:{/id}"$handler}},
         "tables": {"keys": "k$tag", "poison": "x$tag"}}}
EOF
  "$ceiling" enqueue --queue "$queue" --count "$n" --tag "$tag" --max-depth "$n" >/dev/null
}
# The measured command, under an optional wrapper ($@: valgrind, perf,
# heaptrack and their flags). `aqw run` goes through bench/run_driver.py,
# which serves its handler (and, with OTLP=1, a collector) and stops it with
# SIGTERM after N completed jobs, read from its own log lines.
measured() {
  if [ "$workload" = run ]; then
    local otlp=()
    if [ "${OTLP:-0}" = 1 ]; then otlp=(--otlp); fi
    python3 "$root/bench/run_driver.py" --expect "$n" --port "$port" "${otlp[@]}" -- \
      "$@" "$aqw" --log-format json run --app "$app"
  else
    "$@" "$worker" --app "$app" --expect "$n"
  fi
}
cleanup() { "$ceiling" cleanup --queue "$queue" --queue "$queue-poison" --table "k$tag" --table "x$tag" >/dev/null 2>&1 || true; }

# Instructions executed by the worker, counted by callgrind (this machine's
# VM exposes no hardware counters to `perf stat`); callgrind_annotate's
# self-cost top goes to $out/top-<label>.txt.
instructions() { # $1: label; rest: env assignments
  local label="$1"; shift
  local file="$out/callgrind.$label.out"
  prepare
  ( # the rest of the arguments: VAR=value to set, -u VAR to unset
    while [ $# -gt 0 ]; do
      if [ "$1" = -u ]; then unset "$2"; shift 2; else export "${1?}"; shift; fi
    done
    measured valgrind --tool=callgrind --callgrind-out-file="$file"
  ) >"$out/worker.json" 2>"$out/valgrind.$label.log"
  cleanup
  callgrind_annotate --inclusive=no "$file" 2>/dev/null | head -40 >"$out/top-$label.txt" || true
  local ins
  ins="$(awk '/^summary:/ {print $2}' "$file")"
  python3 -c "import sys; i=int(sys.argv[2]); print(f'{sys.argv[1]}: {i} instructions, {i/int(sys.argv[3]):.0f} per message')" \
    "$label" "$ins" "$n"
}

case "$cmd" in
  stat)
    instructions backtrace-unset -u RUST_BACKTRACE
    instructions backtrace-1 RUST_BACKTRACE=1
    ;;
  traces)
    instructions traces-off -u OTEL_EXPORTER_OTLP_ENDPOINT OTEL_BSP_SCHEDULE_DELAY=200
    instructions traces-otlp OTLP=1 OTEL_BSP_SCHEDULE_DELAY=200
    ;;
  cpu)
    # No profiler: the run's own CPU (user and system apart) from
    # bench/run_driver.py's rusage; with the run workload only.
    prepare
    measured
    cleanup
    ;;
  record)
    prepare
    measured perf record -e cpu-clock -g --call-graph dwarf,16384 -F 2000 -o "$out/perf.data" \
      >"$out/worker.json" 2>/dev/null
    cleanup
    perf report -i "$out/perf.data" --no-children -g none --sort dso,symbol --stdio 2>/dev/null \
      | grep -v '^$' | grep '%' | head -40 | tee "$out/top.txt"
    ;;
  allocs)
    prepare
    measured heaptrack -o "$out/heaptrack" >"$out/worker.json" 2>/dev/null
    cleanup
    heaptrack_print "$(ls -t "$out"/heaptrack*.zst "$out"/heaptrack*.gz 2>/dev/null | head -1)" \
      >"$out/heaptrack.txt" 2>/dev/null || true
    calls="$(grep -m1 '^calls to allocation functions:' "$out/heaptrack.txt" | sed 's/.*: *\([0-9]*\).*/\1/')"
    python3 -c "import sys; c=int(sys.argv[1]); print(f'{c} allocations, {c/int(sys.argv[2]):.0f} per message')" "$calls" "$n"
    ;;
  *)
    echo "usage: [AQW_PROFILE_WORKLOAD=run] scripts/profile.sh install|stat|cpu|record|allocs|traces [N]" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Install (pinned, from tools/azurite/package-lock.json), start, check and stop
# a local Azurite on 127.0.0.1 for aqw's tests, demo and benchmarks.
#
#   scripts/azurite.sh install   npm ci the pinned version (no-op when present)
#   scripts/azurite.sh start     install if needed, start unless already up, wait until ready
#   scripts/azurite.sh status    exit 0 when queue and table ports accept connections
#   scripts/azurite.sh stop      stop the Azurite this script started
#   scripts/azurite.sh restart   stop, then start an empty one
#
# Ports: AQW_AZURITE_QUEUE_PORT (10001), AQW_AZURITE_TABLE_PORT (10002),
# AQW_AZURITE_BLOB_PORT (10000). Data is kept in memory; logs, pid and lock go
# to AQW_AZURITE_STATE (.azurite), so a second instance on other ports needs
# its own. Safe to call from many test processes at once.
#
# HTTPS and bearer tokens (a second instance only, for identity tests):
# AQW_AZURITE_CERT and AQW_AZURITE_KEY (PEM files) serve HTTPS; with
# AQW_AZURITE_OAUTH=basic Azurite also accepts Entra ID bearer tokens, checking
# their issuer, audience and lifetime but not their signature.
#
# Why restart: Azurite keeps one extent per queue message in memory and its
# garbage collector (every 60 s) deletes them one by one from a LokiJS
# collection whose index update is linear, so a pass is quadratic in the
# number of messages deleted since the last one. After some 10,000 messages it
# blocks Azurite's only thread for seconds to minutes (requests time out). The
# benchmark restarts it before every measured run.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tool="$root/tools/azurite"
state="${AQW_AZURITE_STATE:-$root/.azurite}"
queue_port="${AQW_AZURITE_QUEUE_PORT:-10001}"
table_port="${AQW_AZURITE_TABLE_PORT:-10002}"
blob_port="${AQW_AZURITE_BLOB_PORT:-10000}"
mkdir -p "$state"
tls_args=()
if [ -n "${AQW_AZURITE_CERT:-}" ]; then
  tls_args+=(--cert "$AQW_AZURITE_CERT" --key "${AQW_AZURITE_KEY:?AQW_AZURITE_KEY is needed with AQW_AZURITE_CERT}")
fi
if [ -n "${AQW_AZURITE_OAUTH:-}" ]; then
  tls_args+=(--oauth "$AQW_AZURITE_OAUTH")
fi

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# A port can accept connections before Node.js answers on it (seen once after
# a restart: the first request timed out). Ready means both services return an
# HTTP status; any status will do (the request is unsigned, so it is a 4xx).
answers() {
  local scheme=http
  if [ -n "${AQW_AZURITE_CERT:-}" ]; then scheme=https; fi
  local code
  code="$(curl -sk -o /dev/null -m 10 -w '%{http_code}' "$scheme://127.0.0.1:$1/devstoreaccount1?comp=list" 2>/dev/null || true)"
  [ -n "$code" ] && [ "$code" != "000" ]
}
listening() { port_open "$queue_port" && port_open "$table_port"; }
ready() {
  listening || return 1
  if command -v curl >/dev/null; then answers "$queue_port" && answers "$table_port"; fi
}

install() {
  if [ -x "$tool/node_modules/.bin/azurite" ]; then return 0; fi
  command -v npm >/dev/null || { echo "azurite.sh: npm is required (install Node.js 18+)" >&2; exit 2; }
  echo "azurite.sh: installing pinned Azurite with npm ci" >&2
  (cd "$tool" && npm ci --no-audit --no-fund --loglevel=error >&2)
}

start() {
  install
  exec 9>"$state/lock"
  flock 9
  if ready; then return 0; fi
  # Already listening but slow to answer (a deep queue makes Azurite slow):
  # wait for it rather than start a second one on the same ports.
  if listening; then
    for _ in $(seq 1 10); do
      if ready; then return 0; fi
      sleep 1
    done
    echo "azurite.sh: Azurite on ports $queue_port/$table_port accepts connections but does not answer" >&2
    exit 3
  fi
  echo "azurite.sh: starting Azurite on 127.0.0.1 (queue $queue_port, table $table_port)" >&2
  # setsid: Azurite outlives the test process that started it, and is not
  # killed with that process's group.
  setsid "$tool/node_modules/.bin/azurite" \
    --silent --inMemoryPersistence --skipApiVersionCheck --disableTelemetry --loose \
    --blobHost 127.0.0.1 --blobPort "$blob_port" \
    --queueHost 127.0.0.1 --queuePort "$queue_port" \
    --tableHost 127.0.0.1 --tablePort "$table_port" \
    ${tls_args[@]+"${tls_args[@]}"} \
    >"$state/azurite.log" 2>&1 </dev/null 9>&- &
  echo $! >"$state/azurite.pid"
  for _ in $(seq 1 300); do
    if ready; then return 0; fi
    if ! kill -0 "$(cat "$state/azurite.pid")" 2>/dev/null; then
      echo "azurite.sh: Azurite exited; last log lines:" >&2
      tail -20 "$state/azurite.log" >&2
      exit 3
    fi
    sleep 0.1
  done
  echo "azurite.sh: Azurite did not open its ports within 30 s" >&2
  exit 3
}

stop() {
  if [ -f "$state/azurite.pid" ]; then
    pid="$(cat "$state/azurite.pid")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    # Wait for it to be gone and its ports closed: a restart that starts
    # while the old process still holds them finds them "listening" and
    # waits on an Azurite that will never answer (seen under load).
    for _ in $(seq 1 100); do
      if ! kill -0 "$pid" 2>/dev/null && ! listening; then break; fi
      sleep 0.1
    done
    rm -f "$state/azurite.pid"
  fi
}

case "${1:-start}" in
  install) install ;;
  start) start ;;
  restart) stop; start ;;
  status) ready ;;
  stop) stop ;;
  *) echo "usage: scripts/azurite.sh install|start|restart|status|stop" >&2; exit 2 ;;
esac

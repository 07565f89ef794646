#!/usr/bin/env bash
# promtool for the shipped Prometheus rules, from Debian's `prometheus`
# package (never a downloaded release build).
#
#   scripts/promtool.sh install   apt-get install it unless promtool is on PATH (fast no-op)
#   scripts/promtool.sh test      promtool check rules + promtool test rules on deploy/monitoring/
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
present() { command -v promtool >/dev/null 2>&1; }
case "${1:-install}" in
  install)
    if present; then exit 0; fi
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
    echo "promtool.sh: installing prometheus (Debian package) for promtool" >&2
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends prometheus >&2 \
      || { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends prometheus >&2; }
    present
    ;;
  test)
    cd "$root/deploy/monitoring"
    promtool check rules aqw-alerts.yml
    promtool test rules aqw-alerts.test.yml
    ;;
  *) echo "usage: scripts/promtool.sh install|test" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Headless Chromium and ChromeDriver for the dashboard's browser test, from
# Debian's packages (chromium, chromium-driver): never a downloaded browser
# build (those fail on this machine).
#
#   scripts/browser.sh install   apt-get install them unless /usr/bin/chromedriver is there (fast no-op)
#   scripts/browser.sh status    exit 0 when both binaries are present
#
# The test (tests/dashboard_browser.rs) starts chromedriver itself on a free
# port and Chromium with --headless --no-sandbox and a fresh --user-data-dir.
set -euo pipefail
chromium=/usr/bin/chromium
driver=/usr/bin/chromedriver
present() { [ -x "$chromium" ] && [ -x "$driver" ]; }
case "${1:-install}" in
  install)
    if present; then exit 0; fi
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
    echo "browser.sh: installing chromium and chromium-driver (Debian packages)" >&2
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends chromium chromium-driver >&2 \
      || { $sudo apt-get update >&2 && $sudo apt-get install -y --no-install-recommends chromium chromium-driver >&2; }
    present
    ;;
  status) present ;;
  *) echo "usage: scripts/browser.sh install|status" >&2; exit 2 ;;
esac

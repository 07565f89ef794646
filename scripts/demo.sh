#!/usr/bin/env bash
# The demo of aqw's main job, end to end on a local Azurite:
#   jobs with idempotency keys → a failing job exhausts its attempts → poison
#   record + alert → an operator lists, shows, fixes, replays → the effect
#   happened exactly once.
# Uses the app in the repository root (host.json, handler examples/demo/send-receipt.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export AzureWebJobsStorage="UseDevelopmentStorage=true"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

say "Build aqw and start Azurite (pinned, installed with npm on first use)"
cargo build --quiet --bin aqw
aqw="$root/target/debug/aqw"
bash scripts/azurite.sh start

demo="$root/.demo"
rm -rf "$demo" && mkdir -p "$demo"
export AQW_DEMO_DIR="$demo"
python3 scripts/alert_receiver.py 18089 "$demo/alerts.log" &
receiver=$!
worker=""
cleanup() { kill "$receiver" 2>/dev/null || true; [ -n "$worker" ] && kill "$worker" 2>/dev/null || true; }
trap cleanup EXIT

# Order ids unique to this run, so the demo can be run again on the same Azurite.
run_id="$(date +%s)"
ok="A$run_id"; bad="B$run_id"
touch "$demo/fault-$bad"   # the provider rejects order $bad until an operator fixes it

open_json() { "$aqw" poison list receipts --status open --output json || true; }   # exit 1 = records open
for id in $(open_json | python3 -c "import json,sys; [print(r['messageId']) for r in json.load(sys.stdin)]"); do
  "$aqw" poison discard receipts --id "$id" --reason "left over from an earlier demo run" --by demo >/dev/null
done
enqueue() { "$aqw" enqueue receipts --output json "$@" | python3 -c "import json,sys; print(json.load(sys.stdin)['messageId'])"; }

say "Enqueue: order $ok twice (a duplicate), order $bad (its provider is failing), and a malformed job"
echo "\$ aqw enqueue receipts --payload '{\"orderId\":\"$ok\",\"amount\":42}'   (twice)"
enqueue --payload "{\"orderId\":\"$ok\",\"amount\":42}" >/dev/null
enqueue --payload "{\"orderId\":\"$ok\",\"amount\":42}" >/dev/null
echo "\$ aqw enqueue receipts --payload '{\"orderId\":\"$bad\",\"amount\":17}'"
bad_id=$(enqueue --payload "{\"orderId\":\"$bad\",\"amount\":17}")
echo "\$ aqw enqueue receipts --payload 'this is not JSON' --force"
junk_id=$(enqueue --payload "this is not JSON" --force)

say "Run the worker (maxDequeueCount 5; retries back off 0.2 s → 1 s)"
"$aqw" run > "$demo/worker.log" 2>&1 &
worker=$!
for _ in $(seq 1 300); do
  if "$aqw" poison show receipts "$bad_id" >/dev/null 2>&1 && "$aqw" poison show receipts "$junk_id" >/dev/null 2>&1; then break; fi
  sleep 0.2
done
grep -E "aqw.job|aqw.poison" "$demo/worker.log" | sed -E 's/^[^ ]+ +//' | cut -c1-200 || true

say "Step 1: the alert fired (local webhook receiver) and status exits 1"
for _ in $(seq 1 50); do [ -s "$demo/alerts.log" ] && break; sleep 0.1; done
cat "$demo/alerts.log"
set +e; run "$aqw" status; echo "(exit code $?)"; set -e

say "Step 2–3: read the error and the stored payload before changing anything"
set +e; run "$aqw" poison list receipts; set -e
run "$aqw" poison show receipts "$bad_id"

say "Step 4: fix the cause (the provider accepts order $bad again); discard the malformed job with a reason"
rm -f "$demo/fault-$bad"
run "$aqw" poison discard receipts --id "$junk_id" --reason "malformed test message" --by demo

say "Step 5–6: replay with the original key, wait until it is done"
run "$aqw" poison replay receipts --id "$bad_id" --by demo --wait 00:00:30

say "Confirm: one receipt per order at the provider, same Idempotency-Key as the failed attempts"
cat "$demo/provider.log"
n_ok=$(grep -c "order=$ok " "$demo/provider.log" || true)
n_bad=$(grep -c "order=$bad " "$demo/provider.log" || true)
run "$aqw" keys show SendReceipt "receipt:$bad"
run "$aqw" status
echo
if [ "$n_ok" = 1 ] && [ "$n_bad" = 1 ]; then
  echo "demo: OK — order $ok sent once (its duplicate skipped), order $bad sent once after replay"
else
  echo "demo: FAILED — receipts for $ok: $n_ok, for $bad: $n_bad" >&2
  exit 1
fi
kill -TERM "$worker"; wait "$worker" || true; worker=""

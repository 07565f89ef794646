#!/usr/bin/env bash
# The demo of aqw's main job, end to end on a local Azurite:
#   jobs with idempotency keys → failing jobs land in poison with their
#   error → grouped alert → an operator works the three usual cases:
#     provider outage  → fix the cause, then replay (the effect happens once);
#     business refusal → discard --close-key (a resend never runs);
#     bad producer     → poison fix with a corrected payload.
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
ok="A$run_id"; bad="B$run_id"; refused="R$run_id"; typo="T$run_id"
touch "$demo/fault-$bad"       # the provider rejects order $bad until an operator fixes it
touch "$demo/refuse-$refused"  # and refuses order $refused for good (account closed)

open_json() { "$aqw" poison list receipts --status open --output json || true; }   # exit 1 = records open
for id in $(open_json | python3 -c "import json,sys; [print(r['messageId']) for r in json.load(sys.stdin)]"); do
  "$aqw" poison discard receipts --id "$id" --reason "left over from an earlier demo run" --by demo >/dev/null
done
enqueue() { "$aqw" enqueue receipts --output json "$@" | python3 -c "import json,sys; print(json.load(sys.stdin)['messageId'])"; }

say "Enqueue: order $ok twice (a duplicate), $bad (provider outage), $refused (business refusal), and a producer's typo"
echo "\$ aqw enqueue receipts --payload '{\"orderId\":\"$ok\",\"amount\":42}'   (twice)"
enqueue --payload "{\"orderId\":\"$ok\",\"amount\":42}" >/dev/null
enqueue --payload "{\"orderId\":\"$ok\",\"amount\":42}" >/dev/null
echo "\$ aqw enqueue receipts --payload '{\"orderId\":\"$bad\",\"amount\":17}'"
bad_id=$(enqueue --payload "{\"orderId\":\"$bad\",\"amount\":17}")
echo "\$ aqw enqueue receipts --payload '{\"orderId\":\"$refused\",\"amount\":99}'"
refused_id=$(enqueue --payload "{\"orderId\":\"$refused\",\"amount\":99}")
# A producer that misspelled the key field (aqw enqueue itself would refuse it: --force).
echo "\$ aqw enqueue receipts --payload '{\"orderID\":\"$typo\",\"amount\":5}' --force"
typo_id=$(enqueue --payload "{\"orderID\":\"$typo\",\"amount\":5}" --force)

say "Run the worker (maxDequeueCount 5; retries back off 0.2 s → 1 s)"
"$aqw" run > "$demo/worker.log" 2>&1 &
worker=$!
for _ in $(seq 1 300); do
  if "$aqw" poison show receipts "$bad_id" >/dev/null 2>&1 && "$aqw" poison show receipts "$refused_id" >/dev/null 2>&1 \
     && "$aqw" poison show receipts "$typo_id" >/dev/null 2>&1; then break; fi
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

say "Case 1, provider outage: fix the cause (the provider accepts $bad again), then replay with the original key and wait until it is done"
rm -f "$demo/fault-$bad"
run "$aqw" poison replay receipts --id "$bad_id" --by demo --wait 00:00:30

say "Case 2, business refusal: discard with a reason and close the key, so a resend never runs"
run "$aqw" poison discard receipts --id "$refused_id" --reason "account closed; must never be sent" --by demo --close-key
echo "\$ aqw enqueue receipts --payload '{\"orderId\":\"$refused\",\"amount\":99}'   (the producer resends it)"
enqueue --payload "{\"orderId\":\"$refused\",\"amount\":99}" >/dev/null

say "Case 3, bad producer: put a corrected payload in place of the broken one"
run "$aqw" poison fix receipts --id "$typo_id" --payload "{\"orderId\":\"$typo\",\"amount\":5}" --by demo --wait 00:00:30
for _ in $(seq 1 100); do
  [ "$("$aqw" keys show SendReceipt "receipt:$refused" --output json | python3 -c "import json,sys; print(json.load(sys.stdin)['status'])")" = cancelled ] && break; sleep 0.1
done

say "Confirm: one receipt per order at the provider, same Idempotency-Key as the failed attempts"
cat "$demo/provider.log"
n_ok=$(grep -c "order=$ok " "$demo/provider.log" || true)
n_bad=$(grep -c "order=$bad " "$demo/provider.log" || true)
n_typo=$(grep -c "order=$typo " "$demo/provider.log" || true)
n_refused=$(grep -c "order=$refused " "$demo/provider.log" || true)
run "$aqw" keys show SendReceipt "receipt:$bad"
run "$aqw" keys show SendReceipt "receipt:$refused"
# The resent refused job is settled as a duplicate; wait until the queue is empty.
for _ in $(seq 1 150); do
  depth=$("$aqw" status --output json | python3 -c "import json,sys; print(sum(q['depth'] or 0 for q in json.load(sys.stdin)['queues']))" || true)
  [ "$depth" = 0 ] && break; sleep 0.2
done
run "$aqw" poison list receipts
run "$aqw" status
echo
if [ "$n_ok" = 1 ] && [ "$n_bad" = 1 ] && [ "$n_typo" = 1 ] && [ "$n_refused" = 0 ]; then
  echo "demo: OK — $ok sent once (its duplicate skipped), $bad once after replay, $typo once after the fix, $refused never"
else
  echo "demo: FAILED — receipts for $ok: $n_ok, $bad: $n_bad, $typo: $n_typo, $refused: $n_refused" >&2
  exit 1
fi
kill -TERM "$worker"; wait "$worker" || true; worker=""

say "The same procedure in a browser: the poison dashboard (issue 15)"
token="$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
echo "Start it (it listens on 127.0.0.1 only; actions need the token, read-only needs none):"
echo "  AQW_DASHBOARD_TOKEN=$token AQW_DASHBOARD_USER=\$USER $aqw dashboard --listen 127.0.0.1:8088"
echo "  $aqw dashboard --read-only --listen 127.0.0.1:8088"
echo "then open http://127.0.0.1:8088/ and sign in with the token."

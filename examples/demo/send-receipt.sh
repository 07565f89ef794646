#!/usr/bin/env bash
# Demo handler: "sends" an order receipt by appending it to a provider log.
# The provider dedupes on the Idempotency-Key it is given (AQW_PROVIDER_KEY),
# as Stripe or an email API would. While .demo/fault-<orderId> exists the
# provider rejects that order: the fault an operator fixes before replaying.
# While .demo/refuse-<orderId> exists the provider refuses it for good (a
# business refusal: exit 65, permanent).
set -euo pipefail
payload="$(cat)"
order="$(printf '%s' "$payload" | sed -n 's/.*"orderId"[[:space:]]*:[[:space:]]*"\{0,1\}\([^",}]*\).*/\1/p')"
dir="${AQW_DEMO_DIR:-.demo}"
mkdir -p "$dir"
if [ -e "$dir/refuse-$order" ]; then
  echo "provider refused order $order: the customer's account is closed" >&2
  exit 65
fi
if [ -e "$dir/fault-$order" ]; then
  echo "provider rejected order $order: mailbox unavailable" >&2
  exit 75   # rejected before sending: retry later (nothing happened)
fi
log="$dir/provider.log"
touch "$log"
if grep -q " $AQW_PROVIDER_KEY\$" "$log"; then
  exit 0   # the provider has seen this Idempotency-Key: no second receipt
fi
echo "receipt order=$order key=$AQW_KEY idempotency-key $AQW_PROVIDER_KEY" >> "$log"

#!/usr/bin/env bash
# Supply-chain check: cargo audit of Cargo.lock against the RustSec advisory
# database snapshot in ../shared/advisory-db (relative to the repository root),
# offline (--no-fetch). Exits non-zero on any vulnerability or on any warning
# (unmaintained / unsound / yanked / notice) that audit.toml does not ignore
# with a written reason.
#
#   scripts/audit.sh            install cargo-audit if missing, then audit
#   AQW_ADVISORY_DB=DIR scripts/audit.sh   audit against another snapshot
#
# When the snapshot folder is absent (a clone outside this workspace), it
# says so and exits 0: there is nothing offline to audit against. Online:
# `cargo audit` (fetches the current database itself).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
db="${AQW_ADVISORY_DB:-../shared/advisory-db}"
if [ ! -d "$db" ]; then
  echo "audit.sh: SKIPPED: no advisory database at $db (relative to $root);" \
       "run 'cargo audit' online or set AQW_ADVISORY_DB" >&2
  exit 0
fi
if ! cargo audit --version >/dev/null 2>&1; then
  echo "audit.sh: installing cargo-audit (cargo install cargo-audit --locked)" >&2
  cargo install cargo-audit --locked >&2
fi
# --deny warnings: an unmaintained/unsound/yanked crate fails the check too,
# unless audit.toml (repository root, cargo-audit's config format) ignores
# that advisory with its reason. cargo-audit itself only reads
# .cargo/audit.toml, so the ids are passed explicitly as --ignore.
ignores=()
if [ -f audit.toml ]; then
  while IFS= read -r id; do ignores+=(--ignore "$id"); done < <(
    sed -n 's/^[[:space:]]*"\(RUSTSEC-[0-9]*-[0-9]*\)".*/\1/p' audit.toml)
fi
exec cargo audit --db "$db" --no-fetch --deny warnings "${ignores[@]}" "$@"

#!/usr/bin/env python3
"""The public API of aqw-core as a sorted list of names, checked in CI
(issue 51 item 6): a change to what an embedder may rely on shows up as a
diff of crates/aqw-core/public-api.txt in the same commit.

    python3 scripts/public_api.py --check   # CI: fails on a difference
    python3 scripts/public_api.py --write   # accept the new surface

Why by hand: `cargo public-api` needs a nightly toolchain and
`cargo-semver-checks` compares against a published baseline; this machine
has one stable toolchain and aqw-core is not published. rustdoc's JSON
output is what both read; stable rustdoc writes it with RUSTC_BOOTSTRAP=1
(as cargo-semver-checks does). Only the format's long-stable parts are
read: `paths` (every public item's path and kind), and `index` for the
public fields of public structs and the public methods of inherent impls
of public types. One line per item: `kind path`.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAPSHOT = os.path.join(ROOT, "crates", "aqw-core", "public-api.txt")


def rustdoc_json():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    target = os.path.join(target, "public-api")
    env = dict(os.environ, RUSTC_BOOTSTRAP="1", CARGO_TARGET_DIR=target)
    subprocess.run(["cargo", "rustdoc", "--quiet", "-p", "aqw-core", "--lib", "--",
                    "-Z", "unstable-options", "--output-format", "json"],
                   cwd=ROOT, env=env, check=True)
    with open(os.path.join(target, "doc", "aqw_core.json"), encoding="utf-8") as f:
        return json.load(f)


def surface(doc):
    """The sorted `kind path` lines of the local crate's public items."""
    paths = {k: p for k, p in doc["paths"].items() if p["crate_id"] == 0}
    index = doc["index"]
    lines = {f"{p['kind']} {'::'.join(p['path'])}" for p in paths.values()}
    for key, p in paths.items():
        item = index.get(key)
        if item is None:
            continue
        owner = "::".join(p["path"])
        inner = item["inner"]
        kind = next(iter(inner))
        if kind == "struct":
            plain = inner["struct"]["kind"]
            for fid in (plain.get("plain") or {}).get("fields", []):
                f = index.get(str(fid))
                if f and f.get("visibility") == "public" and f.get("name"):
                    lines.add(f"field {owner}::{f['name']}")
        if kind in ("struct", "enum", "trait"):
            for iid in inner[kind].get("impls", []):
                imp = index.get(str(iid), {}).get("inner", {}).get("impl")
                if not imp or imp.get("trait") is not None or imp.get("blanket_impl") or imp.get("is_synthetic"):
                    continue
                for mid in imp.get("items", []):
                    m = index.get(str(mid))
                    if m and m.get("visibility") == "public" and m.get("name"):
                        lines.add(f"method {owner}::{m['name']}")
    return sorted(lines)


def main(argv):
    if len(argv) != 2 or argv[1] not in ("--check", "--write"):
        print(__doc__.strip().splitlines()[4].strip(), file=sys.stderr)
        print("usage: scripts/public_api.py --check|--write", file=sys.stderr)
        return 2
    now = surface(rustdoc_json())
    text = "".join(line + "\n" for line in now)
    if argv[1] == "--write":
        with open(SNAPSHOT, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"public_api: {len(now)} items written to {os.path.relpath(SNAPSHOT, ROOT)}")
        return 0
    try:
        with open(SNAPSHOT, encoding="utf-8") as f:
            before = f.read().splitlines()
    except FileNotFoundError:
        before = []
    gone = sorted(set(before) - set(now))
    new = sorted(set(now) - set(before))
    if not gone and not new:
        print(f"public_api: aqw-core's public API matches its snapshot ({len(now)} items)")
        return 0
    print("public_api: aqw-core's public API differs from crates/aqw-core/public-api.txt:", file=sys.stderr)
    for line in gone:
        print(f"  - {line}", file=sys.stderr)
    for line in new:
        print(f"  + {line}", file=sys.stderr)
    print("If the change is meant, run python3 scripts/public_api.py --write and commit the file.",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

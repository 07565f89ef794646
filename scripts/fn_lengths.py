#!/usr/bin/env python3
"""Lists Rust functions in src/ and crates/*/src/ longer than a limit (default 60 lines).

A function runs from its `fn` line to the line of its matching closing
brace; braces in strings, chars and comments are skipped. Test modules count
too. Exit 1 when any function is over the limit.

    python3 scripts/fn_lengths.py [--limit N] [--top N]
"""
import pathlib
import re
import sys

FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)")


def strip(line, state):
    """The line with strings, chars and comments blanked; `state` carries a block comment."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state["block"]:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out), state
            state["block"] = False
            i = j + 2
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"] = True
            i += 2
            continue
        if c == '"' or (c == "r" and re.match(r'r#*"', line[i:])):
            m = re.match(r'(r(#*))"', line[i:])
            if m:
                end = '"' + m.group(2)
                j = line.find(end, i + len(m.group(0)))
                i = n if j < 0 else j + len(end)
                continue
            j = i + 1
            while j < n and line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            i = j + 1
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", line[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", line[i:]).group(0))
            continue
        out.append(c)
        i += 1
    return "".join(out), state


def functions(path):
    lines = path.read_text().splitlines()
    state = {"block": False}
    code = []
    for line in lines:
        s, state = strip(line, state)
        code.append(s)
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        depth, started = 0, False
        for j in range(i, len(lines)):
            for ch in code[j]:
                if ch == "{":
                    depth += 1
                    started = True
                elif ch == "}":
                    depth -= 1
            if started and depth == 0:
                yield m.group(6), i + 1, j - i + 1
                break
            if not started and code[j].rstrip().endswith(";"):
                break


def main():
    args = sys.argv[1:]
    limit = int(args[args.index("--limit") + 1]) if "--limit" in args else 60
    top = int(args[args.index("--top") + 1]) if "--top" in args else 0
    repo = pathlib.Path(__file__).resolve().parent.parent
    trees = [repo / "src"] + sorted(repo.glob("crates/*/src"))
    found = []
    for tree in trees:
        for p in sorted(tree.rglob("*.rs")):
            for name, line, length in functions(p):
                found.append((length, f"{p.relative_to(repo)}:{line}", name))
    found.sort(reverse=True)
    for length, where, name in found[:top]:
        print(f"{length:5}  {where}  {name}")
    over = [f for f in found if f[0] > limit]
    for length, where, name in over:
        print(f"over {limit}: {length} lines  {where}  {name}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())

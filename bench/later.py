"""(o) issue 49: an outage and a rate limit never poison.

The engine's simulation (crates/aqw-core/tests/engine, memory store, paused
tokio time, so its figures are counts, not timings, and the test profile's
build serves: no release build of the tests), its printed figures parsed:

- the breaker on fleet-wide evidence: 200 jobs at once over 16 replicas, a
  90 s outage (every call 503), aqw's default retry: poisoned, provider
  calls during the outage and per job, own trips;
- a provider answering a bare 429 (no Retry-After) beyond 10 calls/s, 50
  replicas, 600 jobs, the adaptive rate on: when the fleet converged (the
  first 5 s window under 20 % refused), the 429 share after it, poisoned;
- the same provider's limit moving 10 -> 3 -> 20 calls/s under 12 replicas:
  the 429 share per phase.

Then the happy path of (a) (examples/bench_worker, keyed no-op jobs) with
the adaptive rate on (the default) and off (`aqw.adaptiveRate: false`):
storage requests and CPU per message. The limiter is inactive until a
throttle, so both must make the same requests per message.

Each simulation is seeded (`Env::seeded`: the engine's randomness and wall
clock pinned, as the seeded swarm's), so it gives the same figures every
run; a full run still runs each several times, and min = max shows it.
"""
import os
import random
import re

from figures import fmt, per_message, stats
from harness import log

ENGINE_TESTS = ["cargo", "test", "-p", "aqw-core", "--test", "engine"]
if os.environ.get("AQW_BENCH_PROFILE") == "debug":
    # The smoke run reuses the test build (its features), not a second build.
    ENGINE_TESTS = ["cargo", "test", "-p", "aqw-core", "--features", "failpoints", "--test", "engine"]
SPREAD_TEST = "spread::an_outage_spread_over_16_replicas_poisons_nothing"
BARE_429_TEST = "later::a_bare_429_fleet_converges_under_the_limit_and_poisons_none"
LIMIT_CHANGE_TEST = "later::a_limit_that_changes_mid_run_is_followed"
HAPPY_TEST = "later::the_adaptive_rate_costs_no_request_on_the_happy_path"
# Runs of each simulation.
RUNS = dict(smoke=1, full=3)
MODES = ("on", "off")


def seconds(text):
    """A Rust `Duration` Debug (`7s`, `1.5s`, `500ms`, `0ns`) in seconds, or None."""
    m = re.fullmatch(r"([\d.]+)(ns|µs|us|ms|s)", text)
    if m is None:
        return None
    scale = dict(ns=1e-9, µs=1e-6, us=1e-6, ms=1e-3, s=1.0)[m.group(2)]
    return float(m.group(1)) * scale


def parse_spread(text):
    """`16 replica(s), 200 jobs every 0ns, 90s outage: P poisoned, C provider
    calls during the outage (X per job), T trip(s)`: a dict, or a string
    saying what is missing."""
    pat = (r"(\d+) replica\(s\), (\d+) jobs every \S+, (\S+) outage: (\d+) poisoned, (\d+) provider calls "
           r"during the outage \(([\d.]+) per job\), (\d+) trip\(s\)")
    m = re.search(pat, text)
    if m is None:
        return "no `N replica(s), J jobs ... outage: ...` line in its output"
    return dict(replicas=int(m.group(1)), jobs=int(m.group(2)), outage_s=seconds(m.group(3)),
                poisoned=int(m.group(4)), calls=int(m.group(5)), per_job=float(m.group(6)), trips=int(m.group(7)))


def parse_bare_429(text):
    """`bare 429 at 10/s, 50 replicas, 600 jobs: C calls over D, 429 share S %
    overall; converged after D, then A % of N calls answered 429`."""
    pat = (r"bare 429 at (\d+)/s, (\d+) replicas, (\d+) jobs: (\d+) calls over (\S+), 429 share ([\d.]+) % "
           r"overall; converged after (\S+), then ([\d.]+) % of (\d+) calls answered 429")
    m = re.search(pat, text)
    if m is None:
        return "no `bare 429 at ...` line in its output"
    return dict(limit=int(m.group(1)), replicas=int(m.group(2)), jobs=int(m.group(3)), calls=int(m.group(4)),
                seconds=seconds(m.group(5)), share_overall=float(m.group(6)), converged_s=seconds(m.group(7)),
                share_after=float(m.group(8)), calls_after=int(m.group(9)))


def parse_limit_change(text):
    """`limit 10 → 3 → 20/s, 12 replicas, J jobs in D: 429 share per phase
    ["S % of N calls, R done/s", ...]`."""
    m = re.search(r"limit 10 → 3 → 20/s, (\d+) replicas, (\d+) jobs in (\S+): 429 share per phase \[(.*)\]", text)
    if m is None:
        return "no `limit 10 → 3 → 20/s ...` line in its output"
    phases = [dict(share=float(s), calls=int(n), done_per_s=float(r))
              for s, n, r in re.findall(r"([\d.]+) % of (\d+) calls, ([\d.]+) done/s", m.group(4))]
    if len(phases) != 3:
        return f"not three phases in {m.group(0)!r}"
    return dict(replicas=int(m.group(1)), jobs=int(m.group(2)), seconds=seconds(m.group(3)), phases=phases)


def parse_happy(text):
    """`happy path, 200 keyed jobs on one replica: X storage requests per
    message with the adaptive rate on, Y off`."""
    m = re.search(r"happy path, (\d+) keyed jobs on one replica: ([\d.]+) storage requests per message with the "
                  r"adaptive rate on, ([\d.]+) off", text)
    if m is None:
        return "no `happy path, N keyed jobs ...` line in its output"
    return dict(jobs=int(m.group(1)), on=float(m.group(2)), off=float(m.group(3)))


def sim(b, test, label, parse, runs):
    """`runs` runs of one engine test: its parsed figures per run (a run whose
    test failed still gives its figures, and the failure is reported)."""
    out = []
    cmd = [*ENGINE_TESTS, "--manifest-path", os.path.join(b.root, "Cargo.toml"), "--", "--exact", test,
           "--nocapture"]
    b.commands.setdefault(f"(o) {label}", b.show(cmd))
    for run in range(runs):
        log(f"(o) {label}: run {run + 1}/{runs}")
        name = f"later-{label}-{run}"
        r = b.proc(cmd, name, timeout=1800).wait()
        with open(os.path.join(b.work, f"{name}.out")) as f:
            text = f.read()
        if r["timed_out"] or r["rc"] != 0:
            b.fail(f"(o) {label} run {run + 1}: `{test}` failed (exit {r['rc']}): see {name}.out")
        elif not re.search(r"test result: ok\. 1 passed", text):
            b.fail(f"(o) {label}: `{test}` did not run (renamed?)")
            continue
        got = parse(text)
        if isinstance(got, str):
            b.fail(f"(o) {label}: {got}")
            continue
        got["passed"] = r["rc"] == 0 and not r["timed_out"]
        out.append(got)
    return out


def happy_run(b, mode, n, rep):
    """n keyed jobs through bench_worker with the adaptive rate `mode`."""
    from scenarios import keyed_run  # scenarios imports this module's caller
    label = f"adaptive-{mode}-{rep}"
    log(f"(o) adaptive rate {mode} rep {rep + 1}/{b.reps}: {n} keyed jobs")
    extra = None if mode == "on" else {"adaptiveRate": False}
    res = keyed_run(b, "aqw-default", n, rep, label=label, aqw_extra=extra)
    if res is None:
        return None
    j = res["json"]
    oc = j.get("outcomes", {})
    if oc.get("completed", 0) != n or j.get("handled") != n:
        b.fail(f"(o) {label}: outcomes {oc}, handled {j.get('handled')} (expected {n} completed)")
        return None
    return dict(mode=mode, n=n, cpu_ms=j["cpu_s"] * 1000 / j["handled"],
                requests_per_message=per_message(j.get("requests"), n), rps=res["rps"])


def later(b):
    """(o): the simulations, then the happy-path pair in random order per repetition."""
    runs = RUNS[b.mode]
    log("(o) building the engine's tests (cargo test --no-run)")
    build = b.run([*ENGINE_TESTS, "--manifest-path", os.path.join(b.root, "Cargo.toml"), "--no-run"],
                  "later-build", timeout=1800)
    out = dict(runs=runs, spread=[], bare_429=[], limit_change=[], happy={m: [] for m in MODES})
    if build is not None:
        out["spread"] = sim(b, SPREAD_TEST, "outage-16-replicas", parse_spread, runs)
        out["bare_429"] = sim(b, BARE_429_TEST, "bare-429-50-replicas", parse_bare_429, runs)
        out["limit_change"] = sim(b, LIMIT_CHANGE_TEST, "limit-10-3-20", parse_limit_change, 1)
        out["happy_sim"] = sim(b, HAPPY_TEST, "happy-path-memory-store", parse_happy, 1)
    n = b.sizes["flow"]
    for rep in range(b.reps):
        order = list(MODES)
        random.shuffle(order)
        for mode in order:
            out["happy"][mode].append(happy_run(b, mode, n, rep))
    return out


def row(name, values, unit="", digits=2):
    s = stats(values)
    if s is None:
        return f"| {name} | n/a | | | {unit} |"
    return f"| {name} | {fmt(s[0], digits)} | {fmt(s[1], digits)} | {fmt(s[2], digits)} | {unit} |"


def section(o, N):
    """(o)'s Markdown."""
    if not o:
        return []
    lines = ["## (o) Issue 49: an outage and a rate limit never poison", "",
             "| figure | median | min | max | unit |", "|---|---|---|---|---|"]
    sp = o.get("spread") or []
    if sp:
        x = sp[0]
        head = f"{x['replicas']} replicas, {x['jobs']} jobs at once, a {fmt(x['outage_s'], 0)} s outage"
        lines.append(row(f"{head}: provider calls during the outage", [r["calls"] for r in sp], "calls", 0))
        lines.append(row(f"{head}: calls per job during the outage", [r["per_job"] for r in sp], "calls/job"))
        lines.append(row(f"{head}: poisoned", [r["poisoned"] for r in sp], "jobs", 0))
        lines.append(row(f"{head}: breaker trips (own `open`)", [r["trips"] for r in sp], "trips", 0))
    b4 = o.get("bare_429") or []
    if b4:
        x = b4[0]
        head = f"bare 429 beyond {x['limit']}/s, {x['replicas']} replicas, {x['jobs']} jobs"
        lines.append(row(f"{head}: converged after (first 5 s window under 20 % refused)",
                         [r["converged_s"] for r in b4], "s", 0))
        lines.append(row(f"{head}: 429 share after convergence", [r["share_after"] for r in b4], "%", 1))
        lines.append(row(f"{head}: 429 share overall", [r["share_overall"] for r in b4], "%", 1))
        lines.append(row(f"{head}: calls per job", [r["calls"] / r["jobs"] for r in b4], "calls/job"))
        lines.append(row(f"{head}: simulated time to drain", [r["seconds"] for r in b4], "s", 0))
    for lc in o.get("limit_change") or []:
        for name, p in zip(("10/s (first 20 s)", "3/s (next 30 s)", "20/s (to the end)"), lc["phases"]):
            lines.append(row(f"limit 10 → 3 → 20/s, {lc['replicas']} replicas, {lc['jobs']} jobs: 429 share "
                             f"while the limit is {name}, of {p['calls']} calls", [p["share"]], "%", 1))
    for h in o.get("happy_sim") or []:
        for mode in MODES:
            lines.append(row(f"happy path on the memory store, {h['jobs']} keyed jobs, one replica, adaptive rate "
                             f"{mode}: storage requests per message", [h[mode]], "requests", 3))
    happy = o.get("happy") or {}
    for mode in MODES:
        xs = [x for x in happy.get(mode) or [] if x]
        if xs:
            lines.append(row(f"happy path, adaptive rate {mode}: storage requests per message",
                             [x["requests_per_message"] for x in xs], "requests", 3))
            lines.append(row(f"happy path, adaptive rate {mode}: CPU per message (work loop)",
                             [x["cpu_ms"] for x in xs], "ms", 3))
    runs = o.get("runs")
    lines += ["", f"The simulations are the engine's tests `{SPREAD_TEST}`, `{BARE_429_TEST}` and "
              f"`{LIMIT_CHANGE_TEST}` (in-memory store, paused time, so counts do not depend on the build; {runs} run(s) each, the last "
              "once), aqw's default retry, breaker and adaptive rate, their printed lines parsed. Each is seeded "
              "(the engine's randomness and wall clock from a fixed seed), so its figures are the same every run. "
              "Convergence: "
              "the first 5-second window, in 1 s steps from the start, in which under 20 % of the calls started were "
              "answered 429; the share after counts every call started from there to the drain. The happy path is "
              f"(a)'s `examples/bench_worker` (no-op in-process handler, {N.get('flow')} keyed jobs fed in waves) "
              "with `aqw.adaptiveRate` on (the default) and `false`: the limiter stays inactive until a throttle, so "
              "both must make the same storage requests per message.", ""]
    return lines

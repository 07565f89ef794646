"""aqw benchmarks against a local Azurite, in one command.

  bash scripts/bench.sh            full run (3 repetitions), rewrites BENCHMARKS.md
  bash scripts/bench.sh --smoke    tiny sizes, 1 repetition, writes .bench/smoke.md
  bash scripts/bench.sh --reps 5   full run with 5 repetitions
  bash scripts/bench.sh --smoke --only breaker
                                   only scenario (h), report in .bench/only-breaker.md
  bash scripts/bench.sh --only users
                                   only scenario (k), report in .bench/only-users.md
  bash scripts/bench.sh --smoke --only fleet
                                   only scenario (l), report in .bench/only-fleet.md
  bash scripts/bench.sh --only later
                                   only scenario (o), report in .bench/only-later.md
  bash scripts/bench.sh --report .bench/full-YYYYMMDD-HHMMSS
                                   re-render a run's report from its results.json

Scenarios:
  (a) throughput and CPU on keyed jobs: aqw (examples/bench_worker, in-process
      no-op handler) with default settings and tuned (batchSize 32,
      newBatchThreshold 32); the ceiling loop (examples/ceiling.rs run); the
      Python asyncio worker (bench/python_worker.py, official Azure SDKs).
  (b) storage requests per message, from aqw's own aqw_storage_requests_total:
      keyed, keyless ("key": "none"), duplicates (every job enqueued twice),
      poisoned (`aqw run` with an exec handler that exits 65).
  (c) idle receive calls per hour: `aqw run` on an empty queue with the
      default maxPollingInterval, in the background for the whole bench (at
      least 10 minutes; 10 s in --smoke); steady state after a 150 s warm-up.
  (d) replay: N open poison records, `aqw poison replay QUEUE --all --rate 1000` (a durable operation) against
      a minimal receive/put/delete loop (examples/ceiling.rs replay-loop).
  (e) pickup latency, enqueue -> handler start: a steady feed at 100/s into a
      running worker (p50, p99), and, in the background, one job after each
      idle minute.
  (f) scale-out: 1, 2 and 4 worker processes on 2,000 jobs: throughput and
      Azurite's CPU (is the storage the limit?).
  (g) traces: `aqw run` with an HTTP handler, trace export off / OTLP on /
      collector down: CPU per message (completion read from aqw's own log
      lines, no ops port: nothing scraped).
  (h) breaker: the same, with the circuit breaker on (default) and off:
      CPU per message, as a ratio (the breaker's cost on the happy path).
  (i) purge: N done keys, then one `aqw keys purge`: storage requests and
      CPU per purged key, against a naive one-DELETE-per-key purge.
  (j) dashboard: the poison list of `aqw dashboard --read-only` at 100 and
      at 10,000 open records (rows by examples/seed_poison): its time as a
      ratio, and a search (which reads every payload) against it.
  (k) as users run it: 800 keyed jobs (all enqueued first) through the
      release `aqw --log-format json run` calling an HTTP handler (a loopback
      server in the bench process), with RUST_BACKTRACE unset and =1, against
      the Python worker (--handler-url) calling the same handler: CPU per
      message of the worker process (start-up included; completion read from
      aqw's own log lines, nothing scraped), the ratios, at least 5
      repetitions in a full run.
  (l) fleet (issue 37): the engine's deterministic fleet simulation
      (crates/aqw-core/tests/engine, `cargo test -p aqw-core --release`, its
      printed figures parsed): handler calls during a provider outage at 12
      and at 50 replicas, idle storage requests per replica-minute with 1 and
      with 20 functions, the fleet-wide rate limit; then the happy path of (a)
      (examples/bench_worker) with flow limits off and on
      (`{"callsPerSecond": 1000, "inFlight": 10000}`): CPU and storage
      requests per message, the on / off ratio.
  (m) durable operations (issue 40), full runs only: `aqw ops discard` of
      2,000 open records at a 10,000-deep poison queue (records and copies
      seeded by examples/seed_poison --with-copies), and of 2,000 at a
      2,000-deep one, at the configured rate (50/s): records per second
      against that rate, the deep / shallow wall time per record, CPU per
      record.
  (n) claim-check (issue 42): the same keyed no-op jobs put inline and with a
      64 KiB body in a blob (a reference on the queue): the worker's storage
      requests and CPU per job, the producer's requests per job.
  (o) issue 49 (bench/later.py): the engine's simulation (test profile, fixed sizes,
      several runs): provider calls and poisoned jobs during a 90 s outage
      over 200 jobs at 16 replicas; a bare-429 provider at 10/s under 50
      replicas: convergence time and the 429 share after it; a limit moving
      10 -> 3 -> 20/s; then (a)'s happy path with the adaptive rate on and
      off: storage requests and CPU per message.
--only breaker|purge|dashboard|users|traces|fleet|ops|claim-check|replay|later runs one of (h), (i), (j), (k), (g), (l), (m), (n), (d), (o) by itself.
Azurite: the default ports, or AQW_AZURITE_QUEUE_PORT / AQW_AZURITE_TABLE_PORT /
AQW_AZURITE_BLOB_PORT (with AQW_AZURITE_STATE) for an instance of one's own;
the workers connect to the same ports.

Every run uses a fresh random queue and fresh tables (deleted afterwards),
and queues are fed in waves that keep them under ~900 messages (Azurite
slows as a queue deepens). CPU comes from the kernel's rusage of each worker
process (wait4), peak RSS from its VmHWM (polled every 20 ms). The exit
status is non-zero only when something is broken (a process failed, a count
did not match), never because of speed. Azurite is left running.

Needs: cargo, Node.js/npm (Azurite, via scripts/azurite.sh), python3 (venv).
Scratch: .bench/ (venv, per-run logs and raw results; the last 5 runs kept).
"""
# scripts/bench.sh starts Azurite, makes the venv and builds the binaries,
# then runs this with the same flags; --help and --report need none of that
# (this program is stdlib only: the venv is for bench/python_worker.py).
# Modules: harness.py (processes, Azurite, feeder), scenarios.py (a)–(m),
# figures.py (the arithmetic and the targets), report.py (the Markdown).
import json
import os
import re
import subprocess
import sys
import time

import later
import report
import scenarios
from harness import CORES, Bench, dev_connection, log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Usage(Exception):
    """A bad flag: reported as `bench.sh: <message>`, exit status 2."""


def parse_args(argv):
    """The flags of scripts/bench.sh, read left to right as it always did
    (`--smoke` sets 1 repetition, so a later `--reps` wins). Returns
    dict(mode, reps, report, help), plus only when --only is given."""
    opts = dict(mode="full", reps="3", report="", help=False)
    only = ""
    it = iter(argv)
    for arg in it:
        if arg == "--smoke":
            opts.update(mode="smoke", reps="1")
        elif arg == "--reps":
            opts["reps"] = next(it, "")
            if not opts["reps"]:
                raise Usage("--reps needs a number")
        elif arg.startswith("--reps="):
            opts["reps"] = arg[len("--reps="):]
        elif arg == "--report":
            opts["report"] = next(it, "")
            if not opts["report"]:
                raise Usage("--report needs a run folder")
        elif arg == "--only":
            only = next(it, "")
            if only not in ONLY:
                raise Usage(f"--only takes one of: {', '.join(ONLY)}")
        elif arg in ("-h", "--help"):
            opts["help"] = True
            return opts
        else:
            raise Usage(f"unknown argument {arg} (try --help)")
    if not re.fullmatch(r"[0-9]+", opts["reps"]) or opts["reps"] == "0":
        raise Usage("--reps must be a positive integer")
    opts["reps"] = int(opts["reps"])
    if only:
        opts["only"] = only
    return opts


# Scenarios `--only` runs by themselves (without the background probes).
ONLY = ("breaker", "purge", "dashboard", "users", "traces", "fleet", "ops", "claim-check", "replay", "later")


def profile_dir():
    """The cargo profile's folder: `release`, or `debug` when scripts/bench.sh
    built the smoke run in the dev profile (AQW_BENCH_PROFILE=debug): the
    smoke proves the benchmark runs, not how fast, so it reuses the test
    build instead of a release build."""
    return "debug" if os.environ.get("AQW_BENCH_PROFILE") == "debug" else "release"


def target_dir():
    """Where cargo put the binaries (CARGO_TARGET_DIR, as cargo reads it)."""
    return os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR") or "target", profile_dir())


def prune_runs(state, keep=5):
    runs = sorted(d for d in os.listdir(state) if re.fullmatch(r"(smoke|full)-\d{8}-\d{6}", d))
    for d in runs[:-keep]:
        subprocess.run(["rm", "-rf", os.path.join(state, d)], check=False)


def run_all(b):
    """Every scenario, b.reps times: the results (the shape of results.json)."""
    b.azurite("restart", b.probe_azurite)
    idle = scenarios.IdleProbe(b)
    idle_latency = scenarios.IdleLatencyProbe(b)
    a = scenarios.throughput(b)
    rb = dict(keyless=[], keyless_tuned=[], duplicates=[], poisoned=[])
    d = []
    for rep in range(b.reps):
        rb["keyless"].append(scenarios.keyless_run(b, rep))
        rb["keyless_tuned"].append(scenarios.keyless_run(b, rep, tuned=True))
        rb["duplicates"].append(scenarios.duplicates_run(b, rep))
        rb["poisoned"].append(scenarios.poisoned_run(b, rep))
    for rep in range(b.reps):
        d.append(scenarios.replay_run(b, rep))
    e = dict(busy=[scenarios.latency_busy_run(b, rep) for rep in range(b.reps)])
    scale = {}
    for rep in range(b.reps):
        for procs in (1, 2, 4):
            scale.setdefault(procs, []).append(scenarios.scale_run(b, procs, rep))
    g = scenarios.traces(b)
    h = scenarios.breaker(b)
    i = [scenarios.purge_run(b, rep) for rep in range(b.reps)]
    j = scenarios.dashboard(b)
    k = scenarios.users(b)
    l_ = scenarios.fleet(b)
    # (m) seeds 10,000 records and their copies: full runs only.
    m_ = None if b.smoke else scenarios.ops(b)
    n_ = scenarios.claim_check(b)
    o_ = later.later(b)
    # A probe failing must not lose the whole run's figures.
    try:
        e["idle"] = idle_latency.finish(b.sizes["latency_idle_samples"])
    except Exception as ex:  # noqa: BLE001
        b.fail(f"(e) idle latency probe: {ex!r}")
        e["idle"] = list(idle_latency.samples)
    try:
        c = idle.finish()
    except Exception as ex:  # noqa: BLE001
        b.fail(f"(c) idle probe: {ex!r}")
        c = None
    b.azurite("stop", b.probe_azurite)
    return dict(a=a, b=rb, c=c, d=d, e=e, f=scale, g=g, h=h, i=i, j=j, k=k, l=l_, m=m_, n=n_, o=o_)


def run_only(b, only):
    """One scenario by itself (`--only`)."""
    if only == "purge":
        return dict(i=[scenarios.purge_run(b, rep) for rep in range(b.reps)])
    if only == "dashboard":
        return dict(j=scenarios.dashboard(b))
    if only == "users":
        return dict(k=scenarios.users(b))
    if only == "traces":
        return dict(g=scenarios.traces(b))
    if only == "fleet":
        return dict(l=scenarios.fleet(b))
    if only == "ops":
        return dict(m=scenarios.ops(b))
    if only == "claim-check":
        return dict(n=scenarios.claim_check(b))
    if only == "later":
        return dict(o=later.later(b))
    if only == "replay":
        return dict(d=[scenarios.replay_run(b, rep) for rep in range(b.reps)])
    assert only == "breaker"
    return dict(h=scenarios.breaker(b))


def bench(mode, reps, only=None):
    """A full or smoke run: every scenario (or the `--only` one), results.json, the report."""
    os.environ["AzureWebJobsStorage"] = dev_connection()
    # Contenders that want a backtrace setting say so (scenarios.CONTENDER_ENV).
    for var in ("RUST_BACKTRACE", "RUST_LIB_BACKTRACE"):
        os.environ.pop(var, None)
    b = Bench(ROOT, target_dir(), mode, reps)
    os.makedirs(b.work, exist_ok=True)
    started = time.monotonic()
    m = report.machine(ROOT)
    prune_runs(b.state)
    for exe in (b.aqw, b.bench_worker, b.ceiling_exe, b.seed_exe):
        if not os.access(exe, os.X_OK):
            log(f"missing {exe}: build it with cargo build --release --examples --bin aqw")
            return 3
    log(f"mode {b.mode}, {b.reps} repetition(s), {CORES} cores; logs in {os.path.relpath(b.work, ROOT)}")
    results = run_only(b, only) if only else run_all(b)
    total = time.monotonic() - started
    data = dict(mode=b.mode, reps=b.reps, sizes=b.sizes, **results, errors=b.errors, only=only,
                commands=b.commands, machine=m, total_seconds=total)
    with open(os.path.join(b.work, "results.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)
    return report.write(data, os.path.basename(b.work), ROOT)


def main(argv):
    # `--needs-setup FLAGS...`: scripts/bench.sh asks before its slow setup.
    # Exit 0: a run (Azurite, the venv and a build first); 1: --help or
    # --report (none of them); 2: a bad flag (already reported).
    needs_setup = argv[:1] == ["--needs-setup"]
    try:
        opts = parse_args(argv[1:] if needs_setup else argv)
    except Usage as e:
        print(f"bench.sh: {e}", file=sys.stderr)
        return 2
    if needs_setup:
        return 1 if opts["help"] or opts["report"] else 0
    if opts["help"]:
        print(__doc__.strip())
        return 0
    os.makedirs(os.path.join(ROOT, ".bench"), exist_ok=True)
    if opts["report"]:
        run_dir = opts["report"]
        return report.write(report.load(run_dir, ROOT), os.path.basename(os.path.abspath(run_dir)), ROOT)
    return bench(opts["mode"], opts["reps"], opts.get("only"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Tests of the bench's pure parts: flags, the arithmetic, the targets check,
and rendering a report from a small synthetic results.json. No Azurite, no
build: python3 -m unittest discover -s bench -p 'test_*.py'"""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import aqw_bench  # noqa: E402
import figures  # noqa: E402
import harness  # noqa: E402
import later  # noqa: E402
import report  # noqa: E402
import scenarios  # noqa: E402


class Flags(unittest.TestCase):
    def parse(self, *argv):
        return aqw_bench.parse_args(list(argv))

    def test_defaults_are_a_full_run_of_three(self):
        self.assertEqual(self.parse(), dict(mode="full", reps=3, report="", help=False))

    def test_smoke_is_one_repetition_and_a_later_reps_wins(self):
        self.assertEqual(self.parse("--smoke")["reps"], 1)
        self.assertEqual(self.parse("--smoke", "--reps", "2"), dict(mode="smoke", reps=2, report="", help=False))
        self.assertEqual(self.parse("--reps", "5", "--smoke")["reps"], 1)

    def test_reps_both_spellings(self):
        self.assertEqual(self.parse("--reps", "5")["reps"], 5)
        self.assertEqual(self.parse("--reps=7")["reps"], 7)

    def test_report_and_help(self):
        self.assertEqual(self.parse("--report", ".bench/full-x")["report"], ".bench/full-x")
        self.assertTrue(self.parse("-h")["help"])
        # --help stops reading: what follows is not checked.
        self.assertTrue(self.parse("--help", "--bogus")["help"])

    def test_bad_flags(self):
        for argv, msg in ((["--bogus"], "unknown argument --bogus (try --help)"),
                          (["--reps"], "--reps needs a number"),
                          (["--reps", "0"], "--reps must be a positive integer"),
                          (["--reps=x"], "--reps must be a positive integer"),
                          (["--reps", "-1"], "--reps must be a positive integer"),
                          (["--report"], "--report needs a run folder"),
                          (["--bogus", "--help"], "unknown argument --bogus (try --help)")):
            with self.subTest(argv=argv):
                with self.assertRaises(aqw_bench.Usage) as cm:
                    self.parse(*argv)
                self.assertEqual(str(cm.exception), msg)

    def test_only_runs_one_scenario(self):
        self.assertEqual(self.parse("--smoke", "--only", "breaker")["only"], "breaker")
        self.assertNotIn("only", self.parse("--smoke"))
        for argv in (["--only"], ["--only", "nope"]):
            with self.subTest(argv=argv):
                with self.assertRaises(aqw_bench.Usage) as cm:
                    self.parse(*argv)
                self.assertEqual(str(cm.exception), "--only takes one of: breaker, purge, dashboard, users, traces, fleet, ops, claim-check, replay, later")

    def test_needs_setup(self):
        def status(*argv):
            with contextlib.redirect_stderr(io.StringIO()):
                return aqw_bench.main(["--needs-setup", *argv])
        self.assertEqual(status(), 0)
        self.assertEqual(status("--smoke"), 0)
        self.assertEqual(status("--help"), 1)
        self.assertEqual(status("--report", "x"), 1)
        self.assertEqual(status("--reps", "0"), 2)


class Purge(unittest.TestCase):
    def test_only_purge_is_the_one_scenario_flag(self):
        self.assertEqual(aqw_bench.parse_args(["--smoke", "--only", "purge"])["only"], "purge")
        with self.assertRaises(aqw_bench.Usage):
            aqw_bench.parse_args(["--only", "throughput"])

    def test_purge_figures_are_ratios_within_the_run(self):
        f = figures.purge_figures(dict(deleted=1000, requests=257 + 16, cpu=0.5))
        self.assertAlmostEqual(f["requests_per_key"], 0.273)
        self.assertAlmostEqual(f["naive_requests_per_key"], 1.257)
        self.assertAlmostEqual(f["vs_naive"], 273 / 1257)
        self.assertAlmostEqual(f["cpu_ms_per_key"], 0.5)
        self.assertIsNone(figures.purge_figures(dict(deleted=0, requests=257, cpu=0.1)))
        md = "\n".join(report.purge_section([dict(deleted=1000, requests=273, cpu=0.5)], dict(purge=1000)))
        self.assertIn("(i) Purge", md)

    def test_ops_figures_compare_the_rate_and_the_depths(self):
        run = lambda depth, wall: dict(n=2000, depth=depth, rate=50, wall=wall, cpu=2.0)
        f = figures.ops_figures(dict(deep=[run(10000, 50.0), None], shallow=[run(2000, 40.0)]))
        self.assertAlmostEqual(f["deep"]["rps"], 40.0)
        self.assertAlmostEqual(f["deep"]["vs_rate"], 0.8)
        self.assertAlmostEqual(f["shallow"]["rps"], 50.0)
        self.assertAlmostEqual(f["deep_vs_shallow"], 1.25)
        self.assertAlmostEqual(f["deep"]["cpu_ms_per_record"], 1.0)
        self.assertIsNone(figures.ops_figures(dict(deep=[None], shallow=[run(2000, 40.0)])))
        md = "\n".join(report.ops_section(dict(deep=[run(10000, 50.0)], shallow=[run(2000, 40.0)])))
        self.assertIn("(m) Durable group discard: 2000 records at a 10000-deep poison queue", md)

    def test_claim_check_figures_count_the_blob_requests_per_job(self):
        def run(requests, feed, cpu_s):
            return dict(n=10, json=dict(requests=requests, cpu_s=cpu_s), feed=dict(requests=feed))
        inline = run({"queue.receive:200": 1, "table.insert:204": 10, "table.update:204": 10,
                      "queue.delete:204": 10, "queue.create:201": 1}, {"queue.put:201": 10}, 0.01)
        claim = run({"queue.receive:200": 1, "table.insert:204": 10, "table.update:204": 10,
                     "queue.delete:204": 10, "blob.get:200": 10}, {"queue.put:201": 10, "blob.put:201": 10,
                                                                   "blob.admin:201": 1}, 0.015)
        f = figures.claim_check_figures(claim)
        self.assertAlmostEqual(f["requests"], 4.1)
        self.assertAlmostEqual(f["producer"], 2.0, msg="the container's creation is one-off")
        self.assertAlmostEqual(f["cpu_ms"], 1.5)
        self.assertAlmostEqual(figures.claim_check_figures(inline)["requests"], 3.1)
        md = "\n".join(report.claim_check_section({"inline": [inline], "claim-check": [claim]},
                                                    dict(claim_check=10)))
        self.assertIn("(n) Claim-check", md)
        self.assertIn("| 1.50 |", md)
        self.assertEqual(report.claim_check_section({"inline": [None]}, {}), [])

    def test_the_connection_follows_the_azurite_ports(self):
        self.assertEqual(harness.dev_connection({}), "UseDevelopmentStorage=true")
        c = harness.dev_connection(dict(AQW_AZURITE_QUEUE_PORT="20001", AQW_AZURITE_TABLE_PORT="20002",
                                        AQW_AZURITE_BLOB_PORT="20000"))
        self.assertIn("QueueEndpoint=http://127.0.0.1:20001/", c)
        self.assertIn("TableEndpoint=http://127.0.0.1:20002/", c)


class Arithmetic(unittest.TestCase):
    def test_percentile_is_nearest_rank(self):
        v = list(range(1, 101))
        self.assertEqual(figures.percentile(v, 50), 50)
        # rank = round(q/100 × n + 0.5), Python's round (half to even): 100 of 100 here.
        self.assertEqual(figures.percentile(v, 99), 100)
        self.assertEqual(figures.percentile(v, 90), 90)
        self.assertEqual(figures.percentile([48, 50], 50), 50)
        self.assertEqual(figures.percentile([3, 1, 2], 50), 2)
        self.assertEqual(figures.percentile([3, 1, 2], 99), 3)
        self.assertEqual(figures.percentile([7], 1), 7)
        self.assertIsNone(figures.percentile([], 50))

    def test_stats_skip_missing_and_nan(self):
        self.assertEqual(figures.stats([3, None, float("nan"), 1, 2]), (2, 1, 3))
        self.assertEqual(figures.stats([1, 2]), (1.5, 1, 2))
        self.assertIsNone(figures.stats([None]))
        self.assertIsNone(figures.median([]))

    def test_ratio(self):
        self.assertEqual(figures.ratio(1, 4), 0.25)
        self.assertIsNone(figures.ratio(None, 4))
        self.assertIsNone(figures.ratio(1, 0))
        self.assertIsNone(figures.ratio(1, None))

    def test_requests_per_message_leave_admin_calls_out(self):
        req = {"queue.receive:200": 10, "queue.delete:204": 100, "table.insert:201": 100,
               "table.admin:201": 1, "queue.create:201": 1, "queue.metadata:200": 4}
        self.assertEqual(figures.data_plane(req), {"queue.receive:200": 10, "queue.delete:204": 100,
                                                   "table.insert:201": 100})
        self.assertAlmostEqual(figures.per_message(req, 100), 2.1)
        self.assertNotEqual(figures.per_message(req, 0), figures.per_message(req, 0))  # NaN

    def test_fmt(self):
        self.assertEqual(figures.fmt(None), "n/a")
        self.assertEqual(figures.fmt(float("nan")), "n/a")
        self.assertEqual(figures.fmt(1234.5), "1,234")
        self.assertEqual(figures.fmt(3.14159), "3.14")
        self.assertEqual(figures.fmt(3.14159, 1), "3.1")

    def test_idle_figures(self):
        # The counter moves at 10 s (ramp), then at 150, 210 and 270 s.
        samples = [(t, n, 2) for t, n in ((0, 0), (10, 1), (150, 2), (210, 3), (270, 4), (300, 4))]
        f = scenarios.idle_figures(samples, 300.0, 150)
        self.assertEqual((f["ramp_receives"], f["steady_receives"]), (1, 3))
        self.assertEqual(f["intervals"], [60, 60])
        self.assertEqual(f["steady_per_hour"], 60)
        self.assertEqual(f["counted_per_hour"], 3 / 150 * 3600)
        self.assertEqual(f["metadata_per_hour"], 0)
        self.assertIsNone(scenarios.idle_figures([], 10.0, 150)["steady_per_hour"])

    def test_metrics_parsing(self):
        m = harness.parse_metrics(
            '# TYPE aqw_storage_requests_total counter\n'
            'aqw_storage_requests_total{operation="queue.receive",status="200"} 3\n'
            'aqw_storage_requests_total{operation="queue.receive",status="503"} 1\n'
            'aqw_messages_total{outcome="poisoned",function="Bench"} 2\n')
        self.assertEqual(harness.metric_by(m, "aqw_storage_requests_total", "operation"), {"queue.receive": 4})
        self.assertEqual(harness.metric_by(m, "aqw_storage_requests_total", "operation", "status"),
                         {"queue.receive:200": 3, "queue.receive:503": 1})
        self.assertEqual(harness.metric_by(m, "aqw_messages_total", "outcome"), {"poisoned": 2})

    def test_last_json_line(self):
        self.assertEqual(harness.last_json('noise\n{"a": 1}\n{"b": 2}\ntrailer\n'), {"b": 2})
        self.assertEqual(harness.last_json('[\n {"x": 1}\n]\n'), [{"x": 1}])
        self.assertIsNone(harness.last_json("nothing here\n"))


def worker(n, seconds, cpu, rss, requests, **extra):
    return dict(rc=0, wall=seconds + 0.5, cpu=cpu, rss_mb=rss, timed_out=False, n=n, rps=n / seconds,
                json=dict(seconds=seconds, cpu_s=cpu * 0.9, requests=requests, **extra))


def users_run(kind, cpu_ms, n=800):
    return dict(rc=0, wall=9.0, cpu=cpu_ms * n / 1000, rss_mb=15.0, json=None, timed_out=False, n=n,
                seconds=8.0, rps=n / 8.0, cpu_ms=cpu_ms, kind=kind, handler_calls=n)


def users_results():
    """(k) over three repetitions: medians 0.5 (aqw run), 0.6 (RUST_BACKTRACE=1)
    and 10 ms (Python) per message, but per repetition RUST_BACKTRACE=1 ÷
    unset is 1.05, 1.2, 1.05: the paired median (1.05) and the ratio of the
    medians (1.2) differ."""
    return {"aqw-run": [users_run("aqw-run", c) for c in (0.4, 0.5, 0.8)],
            "aqw-run-backtrace": [users_run("aqw-run-backtrace", c) for c in (0.42, 0.6, 0.84)],
            "python-http": [users_run("python-http", c) for c in (8.0, 10.0, 12.0)]}


def synthetic(mode="full", errors=()):
    """A one-repetition results.json with round numbers."""
    n, nk, nd = 100, 50, 50
    keyed = {"queue.receive:200": 10, "table.insert:204": 100, "table.merge:204": 100, "queue.delete:204": 100,
             "table.admin:201": 2}
    keyless = {"queue.receive:200": 5, "queue.delete:204": 50}
    a = {"aqw-default": [worker(n, 2.0, 0.05, 12.0, keyed)],
         "aqw-backtrace": [worker(n, 2.0, 0.054, 12.0, keyed)],
         "aqw-tuned": [worker(n, 1.6, 0.05, 14.0, keyed)],
         "ceiling": [worker(n, 2.0, 0.04, 9.0, keyed)],
         "python": [worker(n, 4.0, 1.0, 57.0, {})]}
    dup_first = worker(nd, 1.0, 0.02, 11.0, {"queue.receive:200": 5, "table.insert:204": 50,
                                              "table.merge:204": 50, "queue.delete:204": 50})
    dup_second = worker(nd, 1.0, 0.02, 11.0, {"queue.receive:200": 5, "table.insert:409": 50,
                                               "queue.delete:204": 50})
    b = dict(keyless=[worker(nk, 1.0, 0.01, 10.0, keyless)], keyless_tuned=[worker(nk, 1.0, 0.01, 10.0, keyless)],
             duplicates=[[dup_first, dup_second]],
             poisoned=[dict(rc=0, wall=3.0, cpu=0.1, rss_mb=12.0, json=None, timed_out=False, n=2,
                            requests={"queue.receive:200": 2, "queue.put:201": 2, "queue.delete:204": 2,
                                      "table.insert:204": 4})])
    c = dict(rc=0, wall=700.0, cpu=0.5, rss_mb=10.0, json=None, timed_out=False, window=700.0, warmup=150,
             receives=30, metadata=24, ramp_receives=20, steady_receives=10, steady_window=550.0,
             intervals=[60.0] * 9, mean_interval=60.0, min_interval=59.0, max_interval=61.0,
             steady_per_hour=60.0, counted_per_hour=65.0, naive_per_hour=154.0, metadata_per_hour=113.0)
    d = [dict(n=20, aqw=dict(rc=0, wall=2.0, cpu=0.1, rss_mb=10.0, json={"replayed": 20}, timed_out=False),
              raw=dict(rc=0, wall=1.0, cpu=0.1, rss_mb=8.0, json={"messages": 20}, timed_out=False))]
    e = dict(busy=[dict(n=20, rate=20, p50=90.0, p99=150.0, max=160.0)], idle=[48000.0, 50000.0])
    f = {"1": [dict(procs=1, n=40, seconds=2.0, rps=20.0, worker_cpu_ms=0.5, azurite_cpu_ms=2.0,
                    azurite_util=0.9, per_process=[40])],
         "2": [dict(procs=2, n=40, seconds=2.0, rps=20.0, worker_cpu_ms=0.6, azurite_cpu_ms=None,
                    azurite_util=None, per_process=[20, 20])]}
    g = {m: [dict(rc=0, wall=5.0, cpu=c * 100 / 1000, rss_mb=14.0, json=None, timed_out=False, n=100, mode=m,
                  rps=50.0, cpu_ms=c, exports=e, export_bytes=e * 1000)]
         for m, c, e in (("off", 1.0, 0), ("otlp", 1.2, 9), ("otlp-down", 1.1, 0))}
    k = users_results()
    sizes = harness.sizes(mode == "smoke")
    sizes.update(throughput=n, keyless=nk, duplicates=nd, poisoned=2, replay=20, users=800)
    machine = dict(nproc="2", model="Test CPU", mem_gib=4.0, kernel="Linux 6.0", rustc="rustc 1.90.0",
                   python="3.11.7", node="v20.0.0", azurite="3.35.0", commit="abc1234",
                   date="2026-01-02 03:04 UTC")
    commands = {"aqw-default": "target/release/examples/bench_worker --app $APP --expect 100"}
    return dict(mode=mode, reps=1, sizes=sizes, a=a, b=b, c=c, d=d, e=e, f=f, g=g, k=k, errors=list(errors),
                commands=commands, machine=machine, total_seconds=123.4)


class Targets(unittest.TestCase):
    def test_targets_from_synthetic_results(self):
        data = synthetic()
        got = {t: (v, ok) for t, v, ok in figures.targets(figures.derive(data), data["c"])}
        self.assertEqual(len(got), 13)
        # (k), the binary as users run it: 0.5 ms / 10 ms per message; the
        # backtrace target reads the paired median, 1.05 (medians: 0.6 / 0.5).
        self.assertEqual(got["CPU per keyed message, `aqw run` + HTTP handler ÷ Python peer + same handler "
                             "≤ 0.08× (stretch 0.05×)"], ("0.050 (stretch 0.05×: met)", True))
        self.assertEqual(got["RUST_BACKTRACE=1 ÷ unset < 1.10 on `aqw run` (CPU per message, median of the "
                             "paired repetitions)"], ("1.05 (ratio of medians 1.20)", True))
        # The in-process harness (a): aqw 0.5 ms / Python 10 ms per message.
        self.assertEqual(got["in-process harness (a): worker CPU per message ≤ 0.1× the Python worker's "
                             "(no handler in either)"], ("0.05", True))
        self.assertEqual(got["throughput ≥ 0.9× the ceiling loop's (default settings)"], ("1.00", True))
        # 3 data-plane requests per keyed message (the admin call left out).
        self.assertEqual(got["≤ 3.05 storage requests per keyed message, default settings (batchSize 16)"],
                         ("3.10", False))
        self.assertEqual(got["≤ 1.05 without keys, batchSize 32"], ("1.10", False))
        self.assertEqual(got["idle: ≤ 60 receive calls per hour per queue (default maxPollingInterval)"],
                         ("60.0", True))
        self.assertEqual(got["peak RSS ≤ 30 MiB with up to 32 (default) or 64 (tuned) jobs in flight"],
                         ("14.0 MiB", True))
        self.assertEqual(got["replay ≥ 0.8× the raw put+delete loop (records/s ÷ messages/s)"], ("0.50", False))
        # CPU with RUST_BACKTRACE=1: 0.54 ms / 0.5 ms; traces: 1.2 ms / 1.0 ms per message.
        self.assertEqual(got["in-process harness (a): CPU per message with RUST_BACKTRACE=1 within 10 % of "
                             "unset (ratio ≤ 1.10)"], ("1.08", True))
        self.assertEqual(got["`aqw run` CPU per message, trace export OTLP on ≤ 1.15× off"], ("1.20", False))

    def test_missing_figures_are_not_applicable(self):
        data = synthetic()
        data["a"] = {k: [] for k in data["a"]}
        data["d"] = [None]
        del data["k"]  # results from before (k) existed
        rows = figures.targets(figures.derive(data), None)
        self.assertEqual(rows[0], ("CPU per keyed message, `aqw run` + HTTP handler ÷ Python peer + same handler "
                                   "≤ 0.08× (stretch 0.05×)", "n/a", None))
        self.assertEqual(rows[1][1:], ("n/a", None))
        self.assertEqual(rows[2], ("in-process harness (a): worker CPU per message ≤ 0.1× the Python worker's "
                                   "(no handler in either)", "n/a", None))
        self.assertEqual(figures.verdict(None), "n/a")
        self.assertEqual(figures.verdict(True), "met")
        self.assertEqual(figures.verdict(False), "**missed**")
        # Only the keyless figures remain (b), at 1.10 requests per message,
        # and the traces ratio (g), 1.2 / 1.0.
        self.assertEqual([(v, ok) for _, v, ok in rows if ok is not None],
                         [("1.10", False), ("1.10", False), ("1.20", False)])


class Report(unittest.TestCase):
    def write_run(self, root, data, name="full-20260102-030405"):
        run_dir = os.path.join(root, ".bench", name)
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, "results.json"), "w") as f:
            json.dump(data, f)
        return run_dir

    def rerender(self, data, name="full-20260102-030405"):
        with tempfile.TemporaryDirectory() as root:
            run_dir = self.write_run(root, data, name)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = report.write(report.load(run_dir, root), name, root)
            written = {}
            for p in ("BENCHMARKS.md", ".bench/smoke.md", ".bench/failed.md"):
                if os.path.exists(os.path.join(root, p)):
                    with open(os.path.join(root, p)) as f:
                        written[p] = f.read()
            return status, out.getvalue(), written

    def test_full_run_renders_to_benchmarks_md(self):
        status, text, written = self.rerender(synthetic())
        self.assertEqual(status, 0)
        self.assertEqual(written, {"BENCHMARKS.md": text[:-1]})  # printed with a newline more
        headings = [line for line in text.splitlines() if line.startswith("#")]
        self.assertEqual(headings, [
            "# aqw benchmarks",
            "## Targets (from the benchmark issue, this run)",
            "## Summary",
            "## (a) Throughput and CPU: 100 keyed jobs",
            "## (b) Storage requests per message (aqw_storage_requests_total)",
            "## (c) Idle: receive calls on an empty queue (`aqw run`, default maxPollingInterval 00:01:00)",
            "## (d) Replay of 20 open poison records",
            "## (e) Pickup latency: enqueue → handler start (aqw default settings)",
            "## (f) Scale-out: 2000 keyed jobs, 1, 2 and 4 worker processes on one queue",
            "## (g) Traces: 500 keyed jobs through `aqw run` and an HTTP handler",
            "## (k) As users run it: 800 keyed jobs through `aqw run` and an HTTP handler, against the Python "
            "peer calling the same handler",
            "## Commands",
            "# aqw-default",
        ])
        self.assertIn("Measured 2026-01-02 03:04 UTC on 2 cores (Test CPU), 4.0 GiB memory, Linux 6.0; "
                      "rustc 1.90.0; Python 3.11.7; Node v20.0.0, Azurite 3.35.0 (in-memory, on the same "
                      "machine); aqw commit abc1234. 1 repetition(s) per figure ((k): 3): median, min and max. "
                      "Total bench time 123 s.", text)
        self.assertIn("| in-process harness (a): worker CPU per message ≤ 0.1× the Python worker's (no handler in "
                      "either) | 0.05 | met |", text)
        self.assertIn("| CPU per keyed message, `aqw run` + HTTP handler ÷ Python peer + same handler ≤ 0.08× "
                      "(stretch 0.05×) | 0.050 (stretch 0.05×: met) | met |", text)
        self.assertIn("| `aqw run` + HTTP handler / Python peer + same handler, CPU per message (k) | 0.050 |", text)
        self.assertIn("| `aqw run`, RUST_BACKTRACE=1 / unset, CPU per message (k; paired median) | 1.05 |", text)
        self.assertIn("| replay ≥ 0.8× the raw put+delete loop (records/s ÷ messages/s) | 0.50 | **missed** |", text)
        self.assertIn("| aqw / ceiling throughput (default settings) | 1.00 |", text)
        self.assertIn("| storage requests per keyed message, default / tuned (batchSize 16 / 32) | 3.10 / 3.10 |",
                      text)
        self.assertIn("| keyed, first delivery (100 jobs) | 3.10 | 3.10 | 3.10 | requests/message |", text)
        self.assertIn("| job enqueued twice, both deliveries | 5.20 | 5.20 | 5.20 | requests/job |", text)
        self.assertIn("- keyed: `queue.delete:204` 1.000, `queue.receive:200` 0.100, `table.insert:204` 1.000, "
                      "`table.merge:204` 1.000", text)
        self.assertIn("| **receive calls per hour, steady state** (3600 / mean interval) | **60** |", text)
        self.assertIn("| pickup latency after an idle minute, p50 (s) | 50.0 |", text)
        self.assertIn("| scale-out throughput, 2 / 1 and 4 / 1 processes | 1.00 / n/a |", text)
        self.assertIn("| 2 | Azurite CPU busy | n/a | | | % of one core |", text)
        self.assertIn("| `aqw run` CPU per message, trace export OTLP on / off, collector down / off | 1.20 / 1.10 |",
                      text)
        self.assertIn("CPU per message, OTLP on / off: 1.20; collector down / off: 1.10. Exports received per run "
                      "(OTLP on): 9.", text)
        self.assertIn("```sh\nbash scripts/bench.sh --reps 1\n```", text)
        self.assertIn("Raw per-run data: `.bench/full-20260102-030405/results.json`.", text)
        self.assertNotIn("## Errors", text)

    def test_errors_go_to_failed_md_and_fail(self):
        status, text, written = self.rerender(synthetic(errors=["(a) python: completed 99 of 100"]))
        self.assertEqual(status, 1)
        self.assertEqual(list(written), [".bench/failed.md"])
        self.assertTrue(text.rstrip().endswith("## Errors\n\n- (a) python: completed 99 of 100"))

    def test_smoke_goes_to_smoke_md(self):
        status, text, written = self.rerender(synthetic(mode="smoke"), name="smoke-20260102-030405")
        self.assertEqual(status, 0)
        self.assertEqual(list(written), [".bench/smoke.md"])
        self.assertTrue(text.startswith("# aqw benchmarks (smoke run: tiny sizes, figures are not meaningful)"))
        self.assertIn("```sh\nbash scripts/bench.sh --smoke\n```", text)

    def test_reps_other_than_three_are_in_the_command(self):
        data = dict(synthetic(), reps=5, f={})
        self.assertIn("```sh\nbash scripts/bench.sh --reps 5\n```", report.render(data, "x"))

    def test_rendering_in_memory_and_from_results_json_agree(self):
        data = synthetic()
        in_memory = dict(data, f={int(k): v for k, v in data["f"].items()})
        _, text, _ = self.rerender(data)
        self.assertEqual(report.render(in_memory, "full-20260102-030405") + "\n", text)


class BreakerBench(unittest.TestCase):
    def test_the_breaker_section_gives_the_on_off_ratio(self):
        import report
        run = lambda cpu: dict(cpu_ms=cpu, rps=100.0)
        h = {"on": [run(1.1), run(1.0)], "off": [run(1.0), run(1.0)]}
        text = "\n".join(report.breaker_section(h, {"breaker": 40}))
        self.assertIn("## (h) Circuit breaker: 40 keyed jobs", text)
        self.assertIn("breaker on / off: 1.05", text)
        self.assertEqual(report.breaker_section({}, {}), [])


class UsersBench(unittest.TestCase):
    """(k): `aqw run` + an HTTP handler against the Python peer + the same handler."""

    def test_only_users(self):
        self.assertEqual(aqw_bench.parse_args(["--smoke", "--only", "users"])["only"], "users")

    def test_figures_are_medians_ratios_and_paired_ratios(self):
        f = figures.users_figures(users_results())
        self.assertEqual(f["cpu_ms"], {"aqw-run": 0.5, "aqw-run-backtrace": 0.6, "python-http": 10.0})
        self.assertEqual(f["rps"]["aqw-run"], 100.0)
        self.assertAlmostEqual(f["aqw_vs_python"], 0.05)
        self.assertAlmostEqual(f["backtrace_vs_python"], 0.06)
        self.assertAlmostEqual(f["backtrace_vs_unset"], 1.2)
        for got, want in zip(f["paired_backtrace"], (1.05, 1.2, 1.05)):
            self.assertAlmostEqual(got, want)
        self.assertAlmostEqual(f["paired_backtrace_median"], 1.05)
        self.assertAlmostEqual(f["paired_python_median"], 0.05)
        self.assertIsNone(figures.users_figures(None))
        self.assertIsNone(figures.users_figures({}))

    def test_pairs_skip_failed_repetitions(self):
        run = lambda c: dict(cpu_ms=c)  # noqa: E731
        self.assertEqual(figures.paired_ratios([run(2.0), None, run(3.0)], [run(1.0), run(1.0), None]), [2.0])
        self.assertEqual(figures.paired_ratios([run(2.0)], [run(0.0)]), [])
        # A contender that never ran: no medians, no ratios.
        f = figures.users_figures({"aqw-run": [run(1.0) | dict(rps=1.0)], "python-http": [None]})
        self.assertIsNone(f["aqw_vs_python"])
        self.assertIsNone(f["paired_backtrace_median"])

    def test_backtrace_target_is_strictly_below_1_10(self):
        data = synthetic()
        # Per repetition 1.05, 1.1 (exactly, in floating point) and 1.125.
        data["k"]["aqw-run-backtrace"] = [users_run("aqw-run-backtrace", c) for c in (0.42, 0.55, 0.9)]
        rows = {t: (v, ok) for t, v, ok in figures.targets(figures.derive(data), data["c"])}
        v, ok = rows["RUST_BACKTRACE=1 ÷ unset < 1.10 on `aqw run` (CPU per message, median of the paired "
                     "repetitions)"]
        self.assertEqual((v, ok), ("1.10 (ratio of medians 1.10)", False))

    def test_the_section_says_what_was_measured(self):
        text = "\n".join(report.users_section(users_results(), {"users": 800}))
        self.assertIn("| `aqw run`, RUST_BACKTRACE unset | CPU per message, worker process | 0.500 | 0.400 | 0.800 | ms |",
                      text)
        self.assertIn("| Python peer (official async SDKs) + the same handler | throughput | 100 | 100 | 100 | msg/s |",
                      text)
        self.assertIn("| `aqw run` ÷ Python peer | 0.050 | 0.050 | 0.050, 0.050, 0.067 |", text)
        self.assertIn("| `aqw run` RUST_BACKTRACE=1 ÷ unset | 1.20 | 1.05 | 1.05, 1.20, 1.05 |", text)
        self.assertIn("3 repetition(s)", text)
        for phrase in ("`aqw --log-format json run --app APP`", "no ops port", "CPU is the kernel's rusage of the "
                       "worker process only", "start-up", "`aqw.job.completed`", "called exactly once per job"):
            self.assertIn(phrase, text)
        self.assertEqual(report.users_section({}, {}), [])

    def test_only_users_renders_its_section(self):
        data = dict(synthetic(mode="smoke"), only="users")
        text = report.render_only(data, "smoke-x")
        self.assertTrue(text.startswith("# aqw benchmarks, only (users) (smoke run: tiny sizes)"))
        self.assertIn("## (k) As users run it: 800 keyed jobs", text)
        self.assertIn("; 1 repetition(s) ((k): 3). Raw data:", text)
        self.assertEqual(report.users_reps_note(dict(k=[None] * 5), 5), "")
        self.assertEqual(report.users_reps_note(None, 3), "")

    def test_python_peer_is_told_the_handler(self):
        class B:
            python, py_worker = "py", "bench/python_worker.py"
        cmd = scenarios.worker_cmd(B, "python", dict(queue="q", keys="t"), None, 5)
        self.assertEqual(cmd[:2], ["py", "bench/python_worker.py"])
        self.assertEqual(scenarios.CONTENDER_ENV["aqw-run-backtrace"], {"RUST_BACKTRACE": "1"})
        self.assertNotIn("aqw-run", scenarios.CONTENDER_ENV)

    def test_reps_are_at_least_five_in_a_full_run(self):
        class B:
            smoke, reps = False, 3
        self.assertEqual(scenarios.users_reps(B), 5)
        B.reps = 7
        self.assertEqual(scenarios.users_reps(B), 7)
        B.smoke = True
        self.assertEqual(scenarios.users_reps(B), 1)


class LogLines(unittest.TestCase):
    """Completion is read from a worker's own log lines (its stderr file)."""

    def test_counts_only_whole_lines_with_the_event(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "w.err")
            tail = harness.LogTail(path, scenarios.COMPLETED_EVENT)
            self.assertEqual(tail.poll(), 0)  # no file yet
            with open(path, "w") as f:
                f.write('{"level":"INFO","event":"aqw.job.completed","outcome":"completed"}\n'
                        '{"level":"INFO","event":"aqw.job.poisoned"}\n'
                        '{"level":"INFO","event":"aqw.job.comp')
            self.assertEqual(tail.poll(), 1)
            with open(path, "a") as f:
                f.write('leted"}\n{"event":"aqw.job.completed"}\n')
            self.assertEqual(tail.poll(), 3)
            self.assertEqual(tail.poll(), 3)  # nothing new

    def test_wait_log_count_gives_up_when_the_process_exits(self):
        import time
        with tempfile.TemporaryDirectory() as d:
            p = harness.Proc([sys.executable, "-c", "import sys; [print('\"aqw.job.completed\"', "
                              "file=sys.stderr) for _ in range(3)]"], os.path.join(d, "p"), "p", 30)
            self.assertIsNotNone(harness.wait_log_count(p, scenarios.COMPLETED_EVENT, 3, 20))
            p.wait()
            t0 = time.monotonic()
            self.assertIsNone(harness.wait_log_count(p, scenarios.COMPLETED_EVENT, 4, 20))
            self.assertLess(time.monotonic() - t0, 5)


FLEET_OUT = """
running 1 test
fleet seed 1: 12 replicas at peak, 300 jobs, outage 6s..83s: 11.35 storage requests per message, 63 handler \
calls during the outage for 300 jobs (90 % of them within 1.369s of its start), 6 breaker trip(s) alerted by the \
fleet, 3 job crash(es), 32.8 idle storage requests per replica-minute, 21 poisoned (the failing shard had 21 jobs)
test fleet::a_fleet_through_outages_scaling_and_a_quiet_day_loses_and_doubles_nothing ... ok
"""
IDLE_OUT = ('idle storage requests per replica-minute: 1 function 32 ({"queue.receive": 1, "table.query": 30, '
            '"table.update": 1}), 20 functions 70 ({"queue.receive": 20, "table.query": 30, "table.update": 20})\n')
RATE_OUT = ("fleet rate limit: 150 calls for 150 jobs in 14.9 s: 10.00 calls/s against a limit of 10; "
            "0 answered 429\n")


def flow_run(mode, cpu_ms, requests, n=40):
    return dict(rc=0, wall=3.0, cpu=cpu_ms * 2 * n / 1000, rss_mb=13.0, timed_out=False, n=n, rps=200.0,
                mode=mode, cpu_ms=cpu_ms, process_cpu_ms=cpu_ms * 2,
                requests_per_message=figures.per_message(requests, n),
                json=dict(handled=n, cpu_s=cpu_ms * n / 1000, requests=requests))


def fleet_results():
    off = {"queue.receive:200": 4, "table.insert:204": 40, "table.merge:204": 40, "queue.delete:204": 40}
    on = dict(off, **{"table.get:200": 8, "table.update:204": 8})
    at50 = [FLEET_OUT.replace("12 replicas", "50 replicas").replace("63 handler", f"{c} handler")
            for c in (264, 195, 233)]
    return dict(hours=1, build_seconds=2.0, runs=3,
                sim=[*(dict(scenarios.parse_fleet(FLEET_OUT), replicas=12, run=i) for i in range(3)),
                     *(dict(scenarios.parse_fleet(t), replicas=50, run=i) for i, t in enumerate(at50))],
                idle=scenarios.parse_idle(IDLE_OUT), rate=scenarios.parse_rate(RATE_OUT),
                limits={"off": [flow_run("off", 0.5, off), flow_run("off", 0.4, off)],
                        "on": [flow_run("on", 0.6, on), flow_run("on", 0.44, on)]})


class FleetBench(unittest.TestCase):
    """(l), issue 37: the engine's fleet figures and the flow limits pair."""

    def test_only_fleet(self):
        self.assertEqual(aqw_bench.parse_args(["--smoke", "--only", "fleet"])["only"], "fleet")

    def test_the_fleet_line_is_parsed(self):
        f = scenarios.parse_fleet(FLEET_OUT)
        self.assertEqual(f, dict(seed=1, replicas=12, jobs=300, outage="6s..83s", requests_per_message=11.35,
                                 outage_calls=63, outage_calls_p90_s=1.369, trips=6, crashes=3,
                                 idle_per_replica_minute=32.8, poisoned=21, shard_jobs=21))
        # The figures the issue asks for are enough: the others may come and go.
        short = ("fleet seed 2: 63 handler calls during the outage for 300 jobs, "
                 "32.8 idle storage requests per replica-minute\n")
        self.assertEqual({k: v for k, v in scenarios.parse_fleet(short).items() if v is not None},
                         dict(seed=2, outage_calls=63, idle_per_replica_minute=32.8))

    def test_a_missing_line_or_figure_says_so(self):
        self.assertEqual(scenarios.parse_fleet("running 0 tests\n"), "no `fleet seed N: ...` line in its output")
        broken = scenarios.parse_fleet(FLEET_OUT.replace("handler calls during the outage", "calls"))
        self.assertTrue(broken.startswith("no outage calls in its line"), broken)
        self.assertTrue(scenarios.parse_idle("x\n").startswith("no `idle storage requests"))
        self.assertTrue(scenarios.parse_idle(IDLE_OUT.split(", 20 functions")[0] + "\n")
                        .startswith("no figure for 20 function(s)"))
        self.assertEqual(scenarios.parse_rate(""), "no `fleet rate limit: ...` line in its output")

    def test_the_idle_and_rate_lines_are_parsed(self):
        idle = scenarios.parse_idle(IDLE_OUT)
        self.assertEqual(idle["1"], dict(total=32, by_operation={"queue.receive": 1, "table.query": 30,
                                                                 "table.update": 1}))
        self.assertEqual(idle["20"]["total"], 70)
        self.assertEqual(scenarios.parse_rate(RATE_OUT), dict(rate=10.0, limit=10.0, calls=150, jobs=150,
                                                             seconds=14.9, answered_429=0))

    def test_flow_figures_are_on_off_ratios(self):
        f = figures.flow_figures(fleet_results()["limits"])
        self.assertAlmostEqual(f["cpu_ratio"], 0.52 / 0.45)
        self.assertEqual(f["paired_cpu"], [0.6 / 0.5, 0.44 / 0.4])
        self.assertAlmostEqual(f["requests_ratio"], 3.5 / 3.1)
        self.assertIsNone(figures.flow_figures(None))

    def test_the_section_gives_every_figure_of_the_issue(self):
        text = "\n".join(report.fleet_section(fleet_results(), {"flow": 40}))
        self.assertIn("## (l) Fleet (issue 37)", text)
        self.assertIn("| 12 | **handler calls during a full provider outage** (300 jobs) | 63 | 63 | 63 | calls |",
                      text)
        self.assertIn("| 50 | **handler calls during a full provider outage** (300 jobs) | 233 | 195 | 264 | calls |",
                      text)
        self.assertIn("| 12 | 90 % of those calls within, from the outage's start | 1.37 | 1.37 | 1.37 | s |", text)
        self.assertIn("3 run(s) per size of seed 1", text)
        self.assertIn("| fleet-wide rate limit over 12 replicas: handler calls per second (limit; answered 429) | "
                      "10.00 (10; 0 of 150 calls) |", text)
        self.assertIn("| **idle storage requests per replica-minute, one replica with 1 function** | **32** (", text)
        self.assertIn("| **idle storage requests per replica-minute, one replica with 20 functions** | **70** (",
                      text)
        self.assertIn("CPU per message, flow limits on / off: 1.16**", text)
        self.assertIn("- on: `queue.delete:204` 1.000, `queue.receive:200` 0.100, `table.get:200` 0.200", text)
        self.assertEqual(report.fleet_section(None, {}), [])

    def test_a_full_report_with_l_has_the_section_and_summary_rows(self):
        data = dict(synthetic(), l=fleet_results())
        text = report.render(dict(data, f={int(k): v for k, v in data["f"].items()}), "x")
        self.assertIn("| handler calls during a provider outage (300 jobs), 12 / 50 replicas at peak (l; median of "
                      "the runs) | 63 / 233 |", text)
        self.assertIn("| idle storage requests per replica-minute, 1 / 20 functions (l) | 32 / 70 |", text)
        self.assertIn("| CPU per message, flow limits on / off (l; work loop) | 1.16 |", text)
        headings = [x for x in text.splitlines() if x.startswith("## ")]
        self.assertEqual(headings[-2:], ["## (l) Fleet (issue 37): the engine's fleet simulation, and flow limits "
                                         "on the happy path", "## Commands"])


class LaterBench(unittest.TestCase):
    """(o), issue 49: the engine tests' lines parsed, the section rendered."""

    SPREAD = ("16 replica(s), 200 jobs every 0ns, 90s outage: 0 poisoned, 165 provider calls during the outage "
              "(0.82 per job), 7 trip(s)")
    BARE = ("bare 429 at 10/s, 50 replicas, 600 jobs: 2229 calls over 132.5s, 429 share 73.1 % overall; converged "
            "after 7s, then 16.3 % of 669 calls answered 429")
    CHANGE = ('limit 10 → 3 → 20/s, 12 replicas, 500 jobs in 182.1s: 429 share per phase ["97.4 % of 300 calls, '
              '0.4 done/s", "35.2 % of 100 calls, 2.1 done/s", "0.0 % of 200 calls, 5.0 done/s"]')

    def test_the_lines_parse(self):
        s = later.parse_spread(self.SPREAD)
        self.assertEqual((s["replicas"], s["poisoned"], s["calls"], s["per_job"], s["trips"]), (16, 0, 165, 0.82, 7))
        b = later.parse_bare_429(self.BARE)
        self.assertEqual((b["converged_s"], b["share_after"], b["calls_after"]), (7.0, 16.3, 669))
        c = later.parse_limit_change(self.CHANGE)
        self.assertEqual([p["share"] for p in c["phases"]], [97.4, 35.2, 0.0])
        self.assertIsInstance(later.parse_spread("nothing"), str)
        self.assertIsInstance(later.parse_bare_429("nothing"), str)
        self.assertEqual(later.seconds("500ms"), 0.5)
        self.assertEqual(later.seconds("0ns"), 0.0)
        self.assertIsNone(later.seconds("soon"))

    def test_the_section_has_the_issues_figures(self):
        happy = dict(on=[dict(requests_per_message=3.07, cpu_ms=0.2)],
                     off=[dict(requests_per_message=3.07, cpu_ms=0.2), None])
        sim = later.parse_happy("happy path, 200 keyed jobs on one replica: 3.105 storage requests per message with "
                                "the adaptive rate on, 3.105 off")
        o = dict(runs=1, spread=[later.parse_spread(self.SPREAD)], bare_429=[later.parse_bare_429(self.BARE)],
                 limit_change=[later.parse_limit_change(self.CHANGE)], happy=happy, happy_sim=[sim])
        text = "\n".join(later.section(o, {"flow": 40}))
        self.assertIn("| 16 replicas, 200 jobs at once, a 90 s outage: calls per job during the outage | 0.82 |", text)
        self.assertIn("converged after (first 5 s window under 20 % refused) | 7 |", text)
        self.assertIn("429 share after convergence | 16.3 |", text)
        self.assertIn("| happy path, adaptive rate off: storage requests per message | 3.070 |", text)
        self.assertIn("one replica, adaptive rate off: storage requests per message | 3.105 |", text)
        self.assertEqual(later.section(None, {}), [])

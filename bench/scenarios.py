"""The bench's scenarios (a)–(l): each runs its contenders against Azurite,
checks the counts (a mismatch is an error, never a slow run) and returns the
raw figures results.json keeps."""
import json
import os
import random
import re
import signal
import statistics
import threading
import time

from figures import per_message, percentile
from harness import (DEFAULT_THRESHOLD, PROBE_ENV, Feeder, free_port, log, metric_by, rand, scrape, subs,
                     wait_http, wait_log_count, write_app)

TUNED = {"batchSize": 32, "newBatchThreshold": 32}
# aqw-backtrace is aqw-default as many container images run it: with
# RUST_BACKTRACE=1 (the bench unsets it for everyone else); aqw-run-backtrace
# is the same for `aqw run` in (k).
CONTENDER_ENV = {"aqw-backtrace": {"RUST_BACKTRACE": "1"}, "aqw-run-backtrace": {"RUST_BACKTRACE": "1"}}


# ---------------------------------------------------------------------------
# (a) throughput and CPU
# ---------------------------------------------------------------------------

def worker_cmd(b, kind, r, app_dir, n):
    if kind in ("aqw-default", "aqw-tuned", "aqw-backtrace"):
        return [b.bench_worker, "--app", app_dir, "--expect", str(n)]
    if kind == "ceiling":
        return [b.ceiling_exe, "run", "--queue", r["queue"], "--table", r["keys"], "--batch", "16",
                "--threshold", str(DEFAULT_THRESHOLD), "--expect", str(n)]
    if kind == "python":
        return [b.python, b.py_worker, "--queue", r["queue"], "--table", r["keys"], "--batch", "16",
                "--threshold", str(DEFAULT_THRESHOLD), "--expect", str(n)]
    raise ValueError(kind)


def keyed_run(b, kind, n, rep, r=None, tag=None, queues=None, label=None, limits=None, feed=None, aqw_extra=None):
    """Feed n keyed jobs and run one worker until all n are settled (`limits`:
    the function's `aqw.functions.Bench.limits`, none by default; `feed`:
    more flags of `ceiling enqueue`; `aqw_extra`: more `aqw` settings)."""
    r = r or b.fresh()
    tag = tag or r["tag"]
    label = label or f"{kind}-{rep}"
    app_dir = os.path.join(b.work, label)
    qs = dict(queues or {})
    if kind == "aqw-tuned":
        qs.update(batchSize=32, newBatchThreshold=32)
    write_app(app_dir, r["queue"], r["keys"], r["poison"], queues=qs, limits=limits, aqw_extra=aqw_extra)
    feeder = Feeder(b, r["queue"], n, tag, f"{label}-enqueue", extra=feed)
    if not feeder.wait_ready():
        feeder.finish()
        return None
    cmd = worker_cmd(b, kind, r, app_dir, n)
    b.commands.setdefault(kind, b.show(cmd, subs(r, app_dir)))
    p = b.proc(cmd, label, env=CONTENDER_ENV.get(kind))
    res = p.wait()
    if res["rc"] != 0 or res["timed_out"] or res["json"] is None:
        feeder.kill()  # it would wait for room on the queue forever
        b.fail(f"{label}: worker exited {res['rc']}{' (timed out)' if res['timed_out'] else ''}: {p.tail()}")
        return None
    fed = feeder.finish()
    if not fed:
        return None
    j = res["json"]
    settled = j.get("settled", j.get("messages"))
    if settled != n:
        b.fail(f"{label}: settled {settled} of {n} messages")
    left = b.queue_count(r["queue"], f"{label}-count")
    if left not in (0, None):
        b.fail(f"{label}: {left} messages left on the queue after the run")
    res["n"] = n
    res["rps"] = n / j["seconds"] if j.get("seconds") else float("nan")
    res["feed"] = feeder.result
    return res


def throughput(b):
    n = b.sizes["throughput"]
    kinds = ("aqw-default", "aqw-backtrace", "aqw-tuned", "ceiling", "python")
    # --smoke stays tiny: the RUST_BACKTRACE=1 rerun is for full runs only.
    results = {k: [] for k in kinds if not (b.mode == "smoke" and k == "aqw-backtrace")}
    for rep in range(b.reps):
        order = list(results)
        random.shuffle(order)  # no contender always runs first on a warm Azurite
        for kind in order:
            r = b.fresh()
            log(f"(a) {kind} rep {rep + 1}/{b.reps}: {n} keyed jobs")
            res = keyed_run(b, kind, n, rep, r)
            b.cleanup_run(r)
            if res is None:
                continue
            j = res["json"]
            if kind.startswith("aqw"):
                oc = j.get("outcomes", {})
                if oc.get("completed", 0) != n or j.get("handled") != n:
                    b.fail(f"(a) {kind}: outcomes {oc}, handled {j.get('handled')} (expected {n} completed)")
            elif j.get("completed") != n:
                b.fail(f"(a) {kind}: completed {j.get('completed')} of {n}")
            results[kind].append(res)
    return results


# ---------------------------------------------------------------------------
# (b) storage requests per message
# ---------------------------------------------------------------------------

def stop_aqw_run(b, proc, label):
    proc.signal(signal.SIGTERM)
    res = proc.wait()
    if res["rc"] != 0:
        b.fail(f"{label}: aqw run exited {res['rc']} after SIGTERM (expected 0): {proc.tail()}")
    return res


def keyless_run(b, rep, tuned=False):
    n = b.sizes["keyless"]
    r = b.fresh()
    label = f"keyless{'-tuned' if tuned else ''}-{rep}"
    app_dir = os.path.join(b.work, label)
    write_app(app_dir, r["queue"], r["keys"], r["poison"], key="none", queues=TUNED if tuned else None)
    log(f"(b) keyless{' tuned' if tuned else ''} rep {rep + 1}/{b.reps}: {n} jobs")
    feeder = Feeder(b, r["queue"], n, r["tag"], f"{label}-enqueue")
    res = None
    if feeder.wait_ready():
        cmd = [b.bench_worker, "--app", app_dir, "--expect", str(n)]
        b.commands.setdefault("aqw-keyless" + ("-tuned" if tuned else ""), b.show(cmd, subs(r, app_dir)))
        res = b.run(cmd, label)
    if res is None:
        feeder.kill()
    else:
        feeder.finish()
    if res and res["json"]:
        oc = res["json"].get("outcomes", {})
        if oc.get("completed", 0) != n:
            b.fail(f"(b) keyless: outcomes {oc} (expected {n} completed)")
    b.cleanup_run(r)
    return res


def duplicates_run(b, rep):
    n = b.sizes["duplicates"]
    r = b.fresh()
    log(f"(b) duplicates rep {rep + 1}/{b.reps}: {n} jobs, each enqueued twice")
    first = keyed_run(b, "aqw-default", n, rep, r, label=f"dup-first-{rep}")
    second = None
    if first is not None:
        second = keyed_run(b, "aqw-default", n, rep, r, tag=r["tag"], label=f"dup-second-{rep}")
        if second is not None:
            oc = second["json"].get("outcomes", {})
            if oc.get("duplicate", 0) != n or second["json"].get("handled") != 0:
                b.fail(f"(b) duplicates: second pass outcomes {oc}, handled {second['json'].get('handled')} "
                       f"(expected {n} duplicates, handler never called)")
    b.cleanup_run(r)
    return first, second


def poisoned_run(b, rep):
    n = b.sizes["poisoned"]
    r = b.fresh()
    label = f"poisoned-{rep}"
    app_dir = os.path.join(b.work, label)
    port = free_port()
    write_app(app_dir, r["queue"], r["keys"], r["poison"],
              handler={"type": "exec", "command": ["sh", "-c", "exit 65"]},
              queues={"maxPollingInterval": "00:00:01"}, http_port=port)
    log(f"(b) poisoned rep {rep + 1}/{b.reps}: {n} jobs whose handler exits 65")
    # The poison queue exists already, as after a function's first poisoned job
    # (its creation on first use is a one-off: a queue.put 404 + create + put).
    if not b.ceiling("enqueue", "--queue", r["queue"] + "-poison", "--count", "0", name=f"{label}-create"):
        return None
    if not b.ceiling("enqueue", "--queue", r["queue"], "--count", str(n), "--tag", r["tag"],
                     name=f"{label}-enqueue"):
        return None
    cmd = [b.aqw, "run", "--app", app_dir]
    b.commands.setdefault("aqw-run-poison", b.show(cmd, subs(r, app_dir)))
    proc = b.proc(cmd, label)
    at_done = None
    if wait_http(port, proc):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not proc.exited():
            m = scrape(port)
            if metric_by(m, "aqw_messages_total", "outcome").get("poisoned", 0) >= n:
                at_done = m
                break
            time.sleep(0.1)
    res = stop_aqw_run(b, proc, label)
    if at_done is None:
        b.fail(f"(b) poisoned: {n} poisoned outcomes not seen within 60 s: {proc.tail()}")
    else:
        res["requests"] = metric_by(at_done, "aqw_storage_requests_total", "operation", "status")
        res["n"] = n
        lst = b.run([b.aqw, "poison", "list", r["queue"], "--app", app_dir, "--output", "json"],
                    f"{label}-list", ok_codes=(0, 1))
        if lst is not None:
            records = lst["json"] if isinstance(lst["json"], list) else None
            if records is None or len(records) != n:
                b.fail(f"(b) poisoned: aqw poison list shows {None if records is None else len(records)} records, "
                       f"expected {n}")
        depth = b.queue_count(r["queue"] + "-poison", f"{label}-count")
        if depth != n:
            b.fail(f"(b) poisoned: poison queue holds {depth} messages, expected {n}")
    b.cleanup_run(r)
    return res if at_done is not None else None


# ---------------------------------------------------------------------------
# (c) idle receives
# ---------------------------------------------------------------------------

def idle_figures(samples, window, warmup):
    """The idle figures from (t, receives, metadata) samples of /metrics taken
    over `window` seconds: the steady state is read after `warmup`."""
    receives = samples[-1][1] if samples else 0
    metadata = samples[-1][2] if samples else 0
    # Times at which the receive counter moved (1 s resolution).
    moves, prev = [], None
    for t, n, _ in samples:
        if prev is not None and n > prev:
            moves.append(t)
        prev = n
    steady_moves = [t for t in moves if t >= warmup]
    intervals = [b - a for a, b in zip(steady_moves, steady_moves[1:])]
    mean = statistics.mean(intervals) if intervals else None
    steady_window = window - warmup
    return dict(
        window=window, warmup=warmup, receives=receives, metadata=metadata,
        ramp_receives=len([t for t in moves if t < warmup]),
        steady_receives=len(steady_moves), steady_window=steady_window,
        intervals=intervals, mean_interval=mean,
        min_interval=min(intervals) if intervals else None,
        max_interval=max(intervals) if intervals else None,
        steady_per_hour=3600 / mean if mean else None,
        counted_per_hour=len(steady_moves) / steady_window * 3600 if steady_window > 0 else None,
        naive_per_hour=receives / window * 3600 if window else None,
        # The sampler's first tick (2 calls) comes at start-up.
        metadata_per_hour=max(metadata - 2, 0) / window * 3600 if window else None,
    )


class IdleProbe:
    """`aqw run` on an empty queue for the whole bench (idle costs no CPU the
    other scenarios would notice), its receive counter sampled every second.

    The Functions back-off needs about 100 s of empty polls to reach the 60 s
    maxPollingInterval cap, so the first WARMUP seconds are the ramp and the
    steady state is measured after it: receives per hour = 3600 / the mean
    interval between receives after the warm-up.
    """

    WARMUP = 150

    def __init__(self, b):
        self.b = b
        self.r = b.fresh(restart=False)
        self.app_dir = os.path.join(b.work, "idle")
        self.port = free_port()
        write_app(self.app_dir, self.r["queue"], self.r["keys"], self.r["poison"],
                  handler={"type": "exec", "command": ["sh", "-c", "exit 0"]}, http_port=self.port)
        cmd = [b.aqw, "run", "--app", self.app_dir]
        b.commands.setdefault("aqw-run-idle", b.show(cmd, subs(self.r, self.app_dir)))
        log(f"(c) idle: aqw run on an empty queue in the background for at least {b.sizes['idle_seconds']} s")
        self.proc = b.proc(cmd, "idle", timeout=b.timeout + 3 * 3600, env=PROBE_ENV)
        self.samples = []  # (t, receives, metadata)
        self.stop_flag = threading.Event()
        self.ok = wait_http(self.port, self.proc)
        self.t0 = time.monotonic()
        if not self.ok:
            b.fail(f"(c) idle: aqw run did not serve /metrics: {self.proc.tail()}")
            return
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self):
        while not self.stop_flag.is_set() and not self.proc.exited():
            try:
                ops = metric_by(scrape(self.port), "aqw_storage_requests_total", "operation")
                self.samples.append((time.monotonic() - self.t0, ops.get("queue.receive", 0),
                                     ops.get("queue.metadata", 0)))
            except Exception:  # a missed sample only coarsens the interval
                pass
            self.stop_flag.wait(1.0)

    def finish(self):
        if not self.ok:
            stop_aqw_run(self.b, self.proc, "idle")
            return None
        left = self.b.sizes["idle_seconds"] - (time.monotonic() - self.t0)
        if left > 0:
            log(f"(c) idle: waiting {left:.0f} s more for the idle window")
            self.stop_flag.wait(left)
        self.stop_flag.set()
        self.thread.join()
        window = time.monotonic() - self.t0
        res = stop_aqw_run(self.b, self.proc, "idle")
        res.update(idle_figures(self.samples, window, self.WARMUP))
        return res


# ---------------------------------------------------------------------------
# (e) pickup latency: enqueue -> handler start
# ---------------------------------------------------------------------------

def read_latencies(path, prefix):
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[0].startswith(prefix):
                    out.append(float(parts[1]))
    except OSError:
        pass
    return out


def wait_latency(path, prefix, proc, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not proc.exited():
        got = read_latencies(path, prefix)
        if got:
            return got[0]
        time.sleep(0.05)
    return None


def latency_busy_run(b, rep):
    """A steady feed below capacity (RATE/s) into a running aqw worker (default
    settings): the latency of every message, enqueue -> handler start."""
    n, rate = b.sizes["latency_busy"], b.sizes["latency_rate"]
    r = b.fresh()
    label = f"latency-busy-{rep}"
    app_dir = os.path.join(b.work, label)
    write_app(app_dir, r["queue"], r["keys"], r["poison"])
    logf = os.path.join(b.work, f"{label}.lat")
    log(f"(e) pickup latency while busy rep {rep + 1}/{b.reps}: {n} jobs at {rate}/s")
    cmd = [b.bench_worker, "--app", app_dir, "--expect", str(n + 1), "--latency-log", logf]
    b.commands.setdefault("aqw-latency", b.show(cmd, subs(r, app_dir, **{logf: "$RUN_DIR/latency.log"})))
    worker = b.proc(cmd, label)
    # One warm-up job first, so the feed starts against a worker that is polling.
    b.ceiling("enqueue", "--queue", r["queue"], "--count", "1", "--tag", "warm", name=f"{label}-warm")
    out = None
    if wait_latency(logf, "warm-", worker, 60) is None:
        b.fail(f"(e) latency: the warm-up job was not picked up: {worker.tail()}")
        worker.signal(signal.SIGTERM)
    else:
        feed = [b.ceiling_exe, "enqueue", "--queue", r["queue"], "--count", str(n), "--tag", r["tag"],
                "--rate", str(rate)]
        b.commands.setdefault(f"steady feed at {rate}/s (jobs stamped with their enqueue time)",
                              b.show(feed, subs(r)))
        b.run(feed, f"{label}-feed")
    res = worker.wait()
    lat = read_latencies(logf, r["tag"] + "-")
    if len(lat) != n:
        b.fail(f"(e) latency: {len(lat)} of {n} jobs measured (worker rc {res['rc']}): {worker.tail()}")
    else:
        out = dict(n=n, rate=rate, p50=percentile(lat, 50), p99=percentile(lat, 99), max=max(lat))
    b.cleanup_run(r)
    return out


class IdleLatencyProbe:
    """A second aqw worker (default settings) in the background for the whole
    bench: every time it has been idle for a minute, one job is enqueued and
    its pickup latency recorded. The Functions back-off has by then stretched
    the polling interval towards maxPollingInterval, which is what this shows."""

    IDLE = 60

    def __init__(self, b):
        self.b = b
        self.r = b.fresh(restart=False)
        self.app_dir = os.path.join(b.work, "latency-idle")
        write_app(self.app_dir, self.r["queue"], self.r["keys"], self.r["poison"])
        self.logf = os.path.join(b.work, "latency-idle.lat")
        cmd = [b.bench_worker, "--app", self.app_dir, "--expect", "1000000", "--latency-log", self.logf,
               "--timeout", str(b.timeout + 3 * 3600)]
        self.proc = b.proc(cmd, "latency-idle", timeout=b.timeout + 3 * 3600, env=PROBE_ENV)
        self.samples = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._probe, daemon=True)
        self.thread.start()

    def _probe(self):
        k = 0
        while not self.stop_flag.wait(self.IDLE):
            tag = f"idle{k}"
            self.b.run([self.b.ceiling_exe, "enqueue", "--queue", self.r["queue"], "--count", "1", "--tag", tag],
                       f"latency-idle-put-{k}", env=PROBE_ENV)
            got = wait_latency(self.logf, tag + "-", self.proc, 150)
            if got is None:
                if not self.stop_flag.is_set():
                    self.b.fail(f"(e) idle latency: probe job {tag} not picked up within 150 s")
                return
            self.samples.append(got)
            k += 1

    def finish(self, min_samples):
        deadline = time.monotonic() + (self.IDLE + 150) * max(0, min_samples - len(self.samples))
        while len(self.samples) < min_samples and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(1)
        self.stop_flag.set()
        self.thread.join(timeout=160)
        self.proc.signal(signal.SIGTERM)
        self.proc.wait()
        return list(self.samples)


# ---------------------------------------------------------------------------
# (f) scale-out: 1, 2, 4 worker processes on one queue
# ---------------------------------------------------------------------------

def scale_run(b, procs, rep):
    n = b.sizes["scale"]
    r = b.fresh()
    label = f"scale{procs}-{rep}"
    app_dir = os.path.join(b.work, label)
    write_app(app_dir, r["queue"], r["keys"], r["poison"])
    log(f"(f) scale-out rep {rep + 1}/{b.reps}: {procs} process(es), {n} jobs")
    feeder = Feeder(b, r["queue"], n, r["tag"], f"{label}-enqueue")
    out = None
    if feeder.wait_ready():
        # Azurite's CPU sampled 10 times a second, so its busy share can be
        # taken over the span the jobs ran (not the idle-exit tail).
        az_samples, az_stop = [], threading.Event()

        def sample_azurite():
            while not az_stop.is_set():
                az_samples.append((time.monotonic() - t0, b.azurite_cpu()))
                az_stop.wait(0.1)

        t0 = time.monotonic()
        sampler = threading.Thread(target=sample_azurite, daemon=True)
        sampler.start()
        started = []
        for i in range(procs):
            cmd = [b.bench_worker, "--app", app_dir, "--exit-when-idle", "3"]
            b.commands.setdefault("aqw-scale (each process)", b.show(cmd, subs(r, app_dir)))
            started.append((time.monotonic() - t0, b.proc(cmd, f"{label}-{i}")))
        results = [(off, p.wait()) for off, p in started]
        az_stop.set()
        sampler.join()
        feeder.finish()
        ok = all(res["rc"] == 0 and res["json"] for _, res in results)
        if not ok:
            b.fail(f"(f) scale-out {procs}: a worker failed: {started[0][1].tail()}")
        else:
            handled = sum(res["json"]["handled"] for _, res in results)
            end = max(off + res["json"]["seconds"] for off, res in results)
            # Azurite's CPU from the first start to the last settle.
            az = [(t, c) for t, c in az_samples if c is not None]
            az0 = az[0][1] if az else None
            az1 = next((c for t, c in az if t >= end), az[-1][1] if az else None)
            span = end
            if handled != n:
                b.fail(f"(f) scale-out {procs}: handled {handled} of {n}")
            else:
                out = dict(procs=procs, n=n, seconds=end, rps=n / end if end else None,
                           worker_cpu_ms=sum(res["cpu"] for _, res in results) / n * 1000,
                           azurite_cpu_ms=(az1 - az0) / n * 1000 if az0 is not None and az1 is not None else None,
                           azurite_util=(az1 - az0) / span if az0 is not None and az1 is not None else None,
                           per_process=[res["json"]["handled"] for _, res in results])
    else:
        feeder.kill()
    b.cleanup_run(r)
    return out


# ---------------------------------------------------------------------------
# (d) replay
# ---------------------------------------------------------------------------

def replay_run(b, rep):
    n = b.sizes["replay"]
    r = b.fresh()
    label = f"replay-{rep}"
    app_dir = os.path.join(b.work, label)
    write_app(app_dir, r["queue"], r["keys"], r["poison"], queues={"maxDequeueCount": 1})
    log(f"(d) replay rep {rep + 1}/{b.reps}: poisoning {n} jobs")
    raw_target = rand("bq")
    out = None
    try:
        feeder = Feeder(b, r["queue"], n, r["tag"], f"{label}-enqueue")
        res = None
        if feeder.wait_ready():
            cmd = [b.bench_worker, "--app", app_dir, "--expect", str(n), "--handler", "fail"]
            b.commands.setdefault("aqw-poison-setup", b.show(cmd, subs(r, app_dir)))
            res = b.run(cmd, f"{label}-poison")
        if res is None:
            feeder.kill()
            return None
        if not feeder.finish():
            return None
        oc = res["json"].get("outcomes", {})
        if oc.get("poisoned", 0) != n:
            b.fail(f"(d) replay setup: outcomes {oc} (expected {n} poisoned)")
            return None
        depth = b.queue_count(r["queue"] + "-poison", f"{label}-count0")
        if depth != n:
            b.fail(f"(d) replay setup: poison queue holds {depth}, expected {n}")
            return None
        log(f"(d) replay rep {rep + 1}/{b.reps}: aqw poison replay --all ({n} records)")
        # The operation's top rate: its default (50/s) is a provider's pace, not the tool's.
        cmd = [b.aqw, "poison", "replay", r["queue"], "--all", "--rate", "1000", "--by", "bench", "--app", app_dir,
               "--output", "json"]
        b.commands.setdefault("aqw-replay", b.show(cmd, subs(r, app_dir)))
        rep_res = b.run(cmd, f"{label}-aqw")
        if rep_res is None:
            return None
        j = rep_res["json"] or {}
        if j.get("replayed") != n or j.get("failed", 0) != 0:
            b.fail(f"(d) aqw poison replay: replayed {j.get('replayed')} of {n}, failed {j.get('failed')}")
        src = b.queue_count(r["queue"], f"{label}-count1")
        left = b.queue_count(r["queue"] + "-poison", f"{label}-count2")
        if src != n or left != 0:
            b.fail(f"(d) after replay: source queue {src} (expected {n}), poison queue {left} (expected 0)")
        log(f"(d) replay rep {rep + 1}/{b.reps}: raw put+delete loop ({n} messages)")
        cmd = [b.ceiling_exe, "replay-loop", "--from", r["queue"], "--to", raw_target, "--expect", str(n)]
        b.commands.setdefault("raw-replay", b.show(cmd, subs(r, app_dir, **{raw_target: "$QUEUE2"})))
        raw = b.run(cmd, f"{label}-raw")
        if raw is None:
            return None
        if (raw["json"] or {}).get("messages") != n:
            b.fail(f"(d) raw loop moved {(raw['json'] or {}).get('messages')} of {n}")
        out = dict(aqw=rep_res, raw=raw, n=n)
    finally:
        b.cleanup_run(r, raw_target)
    return out


# ---------------------------------------------------------------------------
# (g) traces: `aqw run` with a real HTTP handler, export off / OTLP on / collector down
# ---------------------------------------------------------------------------

class LocalHttp:
    """A loopback HTTP server in this process answering every POST with 200:
    the job handler (path /effects) and an OTLP collector (path /v1/traces)
    at once. Counts requests and bytes by path; its CPU is the bench's, not
    the worker's."""

    def __init__(self, port=0):
        import http.server
        counts = self.counts = {}
        lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (the stdlib's name)
                n = int(self.headers.get("content-length") or 0)
                self.rfile.read(n)
                with lock:
                    c = counts.setdefault(self.path, [0, 0])
                    c[0] += 1
                    c[1] += n
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


TRACE_MODES = ("off", "otlp", "otlp-down")


# The `event` of the one log line `aqw run` writes per completed job
# (src/job/outcome.rs), as it appears in a --log-format json line.
COMPLETED_EVENT = '"aqw.job.completed"'


def show_env(b, cmd, subs_, env=None):
    """A command as the report prints it, with the environment it adds."""
    return " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), b.show(cmd, subs_)])


def http_run(b, label, n, http, env=None, breaker=None, command=None):
    """n keyed jobs (all on the queue before the worker starts) through `aqw
    run` (release binary, JSON logs at info, one line per job, as deployed) to
    the HTTP handler; the aqw process's figures, or None. No ops port: the
    jobs are seen complete in aqw's own log lines (its stderr file, read every
    20 ms), so nothing is scraped and the bench adds no work to aqw; SIGTERM
    after the n-th completed line, and aqw must exit 0."""
    r = b.fresh()
    app_dir = os.path.join(b.work, label)
    write_app(app_dir, r["queue"], r["keys"], r["poison"],
              handler={"type": "http", "url": http.url + "/effects"}, breaker=breaker)
    if not b.ceiling("enqueue", "--queue", r["queue"], "--count", str(n), "--tag", r["tag"],
                     name=f"{label}-enqueue"):
        return None
    env = env or {}
    cmd = [b.aqw, "--log-format", "json", "run", "--app", app_dir]
    b.commands.setdefault(command or f"aqw-run-{label.rsplit('-', 1)[0]}",
                          show_env(b, cmd, subs(r, app_dir), env))
    proc = b.proc(cmd, label, env=env)
    done_at = wait_log_count(proc, COMPLETED_EVENT, n, 120 if b.smoke else 600)
    res = stop_aqw_run(b, proc, label)
    b.cleanup_run(r)
    if done_at is None:
        b.fail(f"{label}: {n} completed jobs not seen in aqw's log lines: {proc.tail()}")
        return None
    if res["rc"] != 0:
        return None  # stop_aqw_run reported it
    seconds = done_at - proc.t0
    res.update(n=n, seconds=seconds, rps=n / max(seconds, 1e-9), cpu_ms=res["cpu"] * 1000 / n)
    return res


def traces_run(b, mode, rep, http):
    """(g) with trace export `mode`; CPU of the aqw process per message."""
    n = b.sizes["traces"]
    log(f"(g) traces {mode} rep {rep + 1}/{b.reps}: {n} keyed jobs through aqw run")
    env = {"OTEL_BSP_SCHEDULE_DELAY": "200"}
    if mode == "otlp":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = http.url
    elif mode == "otlp-down":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"  # nothing listens
    exported_before = http.counts.get("/v1/traces", [0, 0])[:]
    res = http_run(b, f"traces-{mode}-{rep}", n, http, env=env)
    if res is None:
        return None
    exported = http.counts.get("/v1/traces", [0, 0])
    res.update(mode=mode, exports=exported[0] - exported_before[0], export_bytes=exported[1] - exported_before[1])
    if mode == "otlp" and res["exports"] == 0:
        b.fail("(g) traces otlp: the collector received no export")
    return res


def traces(b):
    http = LocalHttp()
    out = {m: [] for m in TRACE_MODES}
    try:
        for rep in range(b.reps):
            order = list(TRACE_MODES)
            random.shuffle(order)
            for mode in order:
                out[mode].append(traces_run(b, mode, rep, http))
    finally:
        http.close()
    return out


# ---------------------------------------------------------------------------
# (h) breaker: the happy path with the circuit breaker on (the default) and off
# ---------------------------------------------------------------------------

BREAKER_MODES = ("on", "off")


def breaker(b):
    """(h): the same keyed jobs through `aqw run` and an HTTP handler that
    always answers 200, with the breaker on (default settings) and off
    (`"breaker": false`), in random order per repetition."""
    http = LocalHttp()
    out = {m: [] for m in BREAKER_MODES}
    n = b.sizes["breaker"]
    try:
        for rep in range(b.reps):
            order = list(BREAKER_MODES)
            random.shuffle(order)
            for mode in order:
                log(f"(h) breaker {mode} rep {rep + 1}/{b.reps}: {n} keyed jobs through aqw run")
                res = http_run(b, f"breaker-{mode}-{rep}", n, http,
                               breaker=None if mode == "on" else False)
                if res is not None:
                    res.update(mode=mode)
                out[mode].append(res)
    finally:
        http.close()
    return out


# ---------------------------------------------------------------------------
# (i) purge
# ---------------------------------------------------------------------------

# Retention for the purge run: keys older than a second may go (the testing
# override; production refuses anything under TTL + 7 days), no sweep.
PURGE_RETENTION = {"retention": {"keys": "00:00:01", "unsafeShortRetention": True, "sweep": {"enabled": False}}}


def purge_run(b, rep):
    """n keyed jobs settle (n done keys), then one `aqw keys purge` deletes
    them: its requests and CPU per purged key."""
    n = b.sizes["purge"]
    r = b.fresh()
    log(f"(i) purge rep {rep + 1}/{b.reps}: {n} done keys, then aqw keys purge")
    if keyed_run(b, "aqw-default", n, rep, r=r, label=f"purge-fill-{rep}") is None:
        b.cleanup_run(r)
        return None
    app_dir = os.path.join(b.work, f"purge-{rep}")
    write_app(app_dir, r["queue"], r["keys"], r["poison"], aqw_extra=PURGE_RETENTION)
    dry = [b.aqw, "keys", "purge", "--app", app_dir, "--dry-run", "--output", "json"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until every key is past the 1 s cutoff
        d = b.run(dry, f"purge-dry-{rep}")
        if d is None or (d["json"] and d["json"][0]["scanned"] >= n):
            break
        time.sleep(0.5)
    cmd = [b.aqw, "keys", "purge", "--app", app_dir, "--output", "json"]
    b.commands.setdefault("aqw-keys-purge", b.show(cmd, subs(r, app_dir)))
    res = b.run(cmd, f"purge-{rep}")
    b.cleanup_run(r)
    if res is None or not res["json"]:
        return None
    report = res["json"][0]
    if report["deleted"] != n:
        b.fail(f"(i) purge: deleted {report['deleted']} of {n} done keys")
    return dict(n=n, deleted=report["deleted"], requests=report["requests"], cpu=res["cpu"],
                wall=res["wall"])


# ---------------------------------------------------------------------------
# (j) the dashboard's poison list at 10,000 open records
# ---------------------------------------------------------------------------

# GETs of each page per size; the figure is their median.
DASHBOARD_GETS = 5


def get_page(url):
    """GET url: (seconds, body). The dashboard answers 200 or this raises."""
    import urllib.request
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read().decode("utf-8", "replace")
    return time.monotonic() - t0, body


def dashboard_run(b, n, rep):
    """n open records (rows written by `examples/seed_poison`, ~1 KiB payload
    each), then the release `aqw dashboard --read-only`: the wall time of its
    list page (no payload read) and of a search (reads every payload)."""
    r = b.fresh()
    label = f"dash-{n}-{rep}"
    app_dir = os.path.join(b.work, label)
    write_app(app_dir, r["queue"], r["keys"], r["poison"])
    seed = [b.seed_exe, "--app", app_dir, "--count", str(n)]
    b.commands.setdefault("seed N open poison records", b.show(seed, subs(r, app_dir)))
    if b.run(seed, f"{label}-seed", timeout=600) is None:
        b.cleanup_run(r)
        return None
    port = free_port()
    cmd = [b.aqw, "dashboard", "--read-only", "--listen", f"127.0.0.1:{port}", "--app", app_dir]
    b.commands.setdefault("aqw-dashboard", b.show(cmd, subs(r, app_dir)).replace(str(port), "$PORT"))
    proc = b.proc(cmd, label)
    base = f"http://127.0.0.1:{port}"
    out = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not proc.exited():
            try:
                get_page(base + "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        figures = {}
        for page, query in (("list", ""), ("search", "?search=o-000001")):
            times = []
            for _ in range(DASHBOARD_GETS):
                t, body = get_page(f"{base}/q/{r['queue']}{query}")
                times.append(t)
            want = f"{n} record(s)" if page == "list" else "1 record(s)"
            if want not in body:
                b.fail(f"(j) {label} {page}: {want!r} not on the page")
                return None
            figures[page + "_ms"] = statistics.median(times) * 1000
        out = dict(n=n, **figures)
    except OSError as ex:
        b.fail(f"(j) {label}: {ex!r}: {proc.tail()}")
    finally:
        proc.signal(signal.SIGTERM)
        proc.wait()
        b.cleanup_run(r)
    return out


def dashboard(b):
    """(j): the list page at 100 and at 10,000 open records, per repetition."""
    out = dict(small=[], large=[])
    for rep in range(b.reps):
        for size in ("small", "large"):
            n = b.sizes[f"dashboard_{size}"]
            log(f"(j) dashboard rep {rep + 1}/{b.reps}: the poison list at {n} open records")
            out[size].append(dashboard_run(b, n, rep))
    return out


# ---------------------------------------------------------------------------
# (k) as users run it: `aqw run` + an HTTP handler against the Python peer +
# the same handler
# ---------------------------------------------------------------------------

USERS_KINDS = ("aqw-run", "aqw-run-backtrace", "python-http")


def users_reps(b):
    """Repetitions of (k): CPU ratios on 2 cores drift ±15 % between runs, so
    a full run takes at least 5; --smoke takes 1."""
    return 1 if b.smoke else max(b.reps, 5)


def python_http_run(b, label, n, http):
    """n keyed jobs (all on the queue first) through bench/python_worker.py
    calling the same HTTP handler; the Python process's figures, or None.
    A run that timed out is tried once more on a fresh queue (one CI smoke
    run saw the Python worker hang on its 40 jobs); a second timeout is an
    error."""
    first = python_http_once(b, label, n, http, last_try=False)
    if first == "timed out":
        log(f"{label}: the python worker timed out; one more try")
        first = python_http_once(b, f"{label}-retry", n, http, last_try=True)
    return None if first == "timed out" else first


def python_http_once(b, label, n, http, last_try):
    """One try of [`python_http_run`]: its figures, None on an error, or
    "timed out" (not yet an error unless `last_try`)."""
    r = b.fresh()
    if not b.ceiling("enqueue", "--queue", r["queue"], "--count", str(n), "--tag", r["tag"],
                     name=f"{label}-enqueue"):
        b.cleanup_run(r)
        return None
    cmd = [*worker_cmd(b, "python", r, None, n), "--handler-url", http.url + "/effects"]
    b.commands.setdefault("python-http", b.show(cmd, subs(r, **{http.url: "$HANDLER"})))
    p = b.proc(cmd, label)
    res = p.wait()
    b.cleanup_run(r)
    if res["timed_out"] and not last_try:
        return "timed out"
    if res["rc"] != 0 or res["timed_out"] or res["json"] is None:
        b.fail(f"{label}: python worker exited {res['rc']}{' (timed out)' if res['timed_out'] else ''}: "
               f"{p.tail()}")
        return None
    j = res["json"]
    if j.get("completed") != n or j.get("failed"):
        b.fail(f"{label}: completed {j.get('completed')} of {n}, failed {j.get('failed')}")
        return None
    # It exits by itself once the n-th job settled: start to exit.
    res.update(n=n, seconds=res["wall"], rps=n / max(res["wall"], 1e-9), cpu_ms=res["cpu"] * 1000 / n)
    return res


def users_run(b, kind, n, rep, http):
    """One contender of (k) on a fresh queue; its figures plus the handler
    calls it made (which must be n), or None."""
    label = f"users-{kind}-{rep}"
    before = http.counts.get("/effects", [0, 0])[0]
    if kind == "python-http":
        res = python_http_run(b, label, n, http)
    else:
        res = http_run(b, label, n, http, env=CONTENDER_ENV.get(kind), command=kind)
    calls = http.counts.get("/effects", [0, 0])[0] - before
    if res is None:
        return None
    res.update(kind=kind, handler_calls=calls)
    if calls != n:
        b.fail(f"(k) {label}: the handler was called {calls} times for {n} jobs")
        return None
    return res


def users(b):
    """(k): N keyed jobs through the binary as users run it (`aqw run`, JSON
    logs, an HTTP handler), with RUST_BACKTRACE unset and =1, against the
    Python peer calling the same handler; the contenders in random order per
    repetition. {kind: [figures or None per repetition]}."""
    http = LocalHttp()
    n = b.sizes["users"]
    reps = users_reps(b)
    out = {k: [] for k in USERS_KINDS}
    try:
        for rep in range(reps):
            order = list(USERS_KINDS)
            random.shuffle(order)
            for kind in order:
                log(f"(k) {kind} rep {rep + 1}/{reps}: {n} keyed jobs through an HTTP handler")
                out[kind].append(users_run(b, kind, n, rep, http))
    finally:
        http.close()
    return out


# ---------------------------------------------------------------------------
# (l) fleet (issue 37): the engine's fleet simulation, and flow limits on the
# happy path
# ---------------------------------------------------------------------------

# The engine's test suite (crates/aqw-core/tests/engine), in release: the
# fleet simulation runs many replicas as tasks over the in-memory store on
# paused tokio time, so its figures are counts, not timings.
ENGINE_TESTS = ["cargo", "test", "-p", "aqw-core", "--release", "--test", "engine"]
if os.environ.get("AQW_BENCH_PROFILE") == "debug":
    # The smoke run (scripts/bench.sh --smoke): the test build's profile.
    ENGINE_TESTS = ["cargo", "test", "-p", "aqw-core", "--features", "failpoints", "--test", "engine"]
FLEET_TEST = "fleet::a_fleet_through_outages_scaling_and_a_quiet_day_loses_and_doubles_nothing"
IDLE_TEST = "fleet::an_idle_replicas_control_reads_do_not_grow_with_its_functions"
RATE_TEST = "flow::twelve_replicas_keep_a_fleet_wide_rate_limit"
# Replicas at the fleet's peak: the 12, and the test's default 50.
FLEET_REPLICAS = (12, 50)
# Runs of the simulation per size: one. The engine's randomness and wall
# clock are seeded (aqw_core::entropy::seed_thread, clock::simulate_from),
# so a second run of the same seed prints the same figures, bit for bit.
FLEET_RUNS = dict(smoke=1, full=1)

# Flow limits for the happy-path pair: the most each setting allows, so the
# limits do their bookkeeping (slots taken and calls reserved on control-table
# rows before each receive, each slot handed back as its job ends) but never
# hold a receive at Azurite's few hundred jobs a second.
FLOW_LIMITS = {"callsPerSecond": 1000, "inFlight": 10000}
FLOW_MODES = ("off", "on")

_FLEET_FIELDS = (
    # (name, pattern, type, required)
    ("seed", r"^fleet seed (\d+):", int, False),
    ("replicas", r"(\d+) replicas at peak", int, False),
    ("jobs", r"(\d+) jobs, outage", int, False),
    ("outage", r"outage (\S+\.\.\S+):", str, False),
    ("requests_per_message", r"([\d.]+) storage requests per message", float, False),
    ("outage_calls", r"(\d+) handler calls during the outage", int, True),
    ("outage_calls_p90_s", r"90 % of them within ([\d.]+)s", float, False),
    ("trips", r"(\d+) breaker trip\(s\)", int, False),
    ("crashes", r"(\d+) job crash", int, False),
    ("idle_per_replica_minute", r"([\d.]+) idle storage requests per replica-minute", float, True),
    ("poisoned", r"(\d+) poisoned", int, False),
    ("shard_jobs", r"failing shard had (\d+) jobs", int, False),
)


def parse_fleet(text):
    """The figures of the fleet simulation's `fleet seed N: ...` line: a dict,
    or a string saying what is missing."""
    line = next((x for x in text.splitlines() if x.startswith("fleet seed ")), None)
    if line is None:
        return "no `fleet seed N: ...` line in its output"
    out = {}
    for name, pattern, kind, required in _FLEET_FIELDS:
        m = re.search(pattern, line)
        if m is None and required:
            return f"no {name.replace('_', ' ')} in its line: {line!r}"
        out[name] = kind(m.group(1)) if m else None
    return out


def parse_idle(text):
    """`idle storage requests per replica-minute: 1 function A ({..}), 20
    functions B ({..})`: {functions: dict(total, by_operation)} for 1 and 20,
    or a string saying what is missing."""
    line = next((x for x in text.splitlines() if x.startswith("idle storage requests per replica-minute:")), None)
    if line is None:
        return "no `idle storage requests per replica-minute: ...` line in its output"
    out = {}
    for functions, total, ops in re.findall(r"(\d+) functions? (\d+) \((\{[^}]*\})\)", line):
        try:
            by_op = json.loads(ops)  # Rust's Debug of a BTreeMap<String, u64> is JSON
        except ValueError:
            by_op = None
        out[int(functions)] = dict(total=int(total), by_operation=by_op)
    missing = [str(f) for f in (1, 20) if f not in out]
    if missing:
        return f"no figure for {' and '.join(missing)} function(s) in its line: {line!r}"
    return {"1": out[1], "20": out[20]}


def parse_rate(text):
    """`fleet rate limit: C calls for J jobs in S s: R calls/s against a limit
    of L; N answered 429`: a dict, or a string saying what is missing."""
    line = next((x for x in text.splitlines() if x.startswith("fleet rate limit:")), None)
    if line is None:
        return "no `fleet rate limit: ...` line in its output"
    m = re.search(r"([\d.]+) calls/s against a limit of ([\d.]+)", line)
    if m is None:
        return f"no rate in its line: {line!r}"
    out = dict(rate=float(m.group(1)), limit=float(m.group(2)))
    for name, pattern in (("calls", r"(\d+) calls for"), ("jobs", r"for (\d+) jobs"),
                          ("seconds", r"in ([\d.]+) s:"), ("answered_429", r"(\d+) answered 429")):
        g = re.search(pattern, line)
        out[name] = float(g.group(1)) if g and name == "seconds" else (int(g.group(1)) if g else None)
    return out


def engine_test(b, name, label, env=None, command=None):
    """One test of the engine's suite (release build, `--exact`, its output
    not captured): its stdout, or None (the failure is reported)."""
    cmd = [*ENGINE_TESTS, "--manifest-path", os.path.join(b.root, "Cargo.toml"), "--", "--exact", name,
           "--nocapture"]
    b.commands.setdefault(f"(l) {command or label}", show_env(b, cmd, {}, env))
    res = b.run(cmd, f"fleet-{label}", env=env)
    if res is None:
        return None
    with open(os.path.join(b.work, f"fleet-{label}.out")) as f:
        out = f.read()
    # A name that matches no test runs none, and passes.
    if not re.search(r"test result: ok\. 1 passed", out):
        b.fail(f"(l) {label}: `{name}` did not run (renamed?): see {os.path.join(b.work, f'fleet-{label}.out')}")
        return None
    return out


def fleet_sim(b):
    """The engine's fleet figures: the simulation at each FLEET_REPLICAS, an
    idle replica with 1 and 20 functions, and the fleet-wide rate limit."""
    out = dict(sim=[], idle=None, rate=None, hours=b.sizes["fleet_hours"], runs=FLEET_RUNS[b.mode])
    log("(l) fleet: building the engine's tests in release (cargo test --no-run)")
    build = b.run([*ENGINE_TESTS, "--manifest-path", os.path.join(b.root, "Cargo.toml"), "--no-run"],
                  "fleet-build", timeout=1800)
    if build is None:
        return out
    out["build_seconds"] = build["wall"]
    for replicas in FLEET_REPLICAS:
        env = {"AQW_FLEET_REPLICAS": str(replicas), "AQW_FLEET_HOURS": str(out["hours"])}
        log(f"(l) fleet simulation: {replicas} replicas at peak, {out['hours']} quiet hour(s), "
            f"{out['runs']} run(s)")
        for run in range(out["runs"]):
            text = engine_test(b, FLEET_TEST, f"sim-{replicas}-{run}", env, command=f"sim-{replicas}")
            if text is None:
                continue
            f = parse_fleet(text)
            if isinstance(f, str):
                b.fail(f"(l) fleet simulation at {replicas} replicas: {f}")
                continue
            if f.get("replicas") not in (None, replicas):
                b.fail(f"(l) fleet simulation: asked for {replicas} replicas, it ran {f['replicas']}")
            out["sim"].append(dict(f, replicas=replicas, run=run))
    for key, test, parse, what in (("idle", IDLE_TEST, parse_idle, "idle replica"),
                                   ("rate", RATE_TEST, parse_rate, "fleet-wide rate limit")):
        log(f"(l) {what}: {test}")
        text = engine_test(b, test, key)
        if text is None:
            continue
        got = parse(text)
        if isinstance(got, str):
            b.fail(f"(l) {what}: {got}")
        else:
            out[key] = got
    return out


def flow_run(b, mode, n, rep):
    """n keyed jobs through bench_worker, the app of (a)'s default run, with
    FLOW_LIMITS on its function (`mode` "on") or none ("off"); or None."""
    r = b.fresh()
    label = f"flow-{mode}-{rep}"
    log(f"(l) flow limits {mode} rep {rep + 1}/{b.reps}: {n} keyed jobs")
    res = keyed_run(b, "aqw-default", n, rep, r, label=label, limits=FLOW_LIMITS if mode == "on" else None)
    b.cleanup_run(r)
    if res is None:
        return None
    j = res["json"]
    oc = j.get("outcomes", {})
    if oc.get("completed", 0) != n or j.get("handled") != n:
        b.fail(f"(l) {label}: outcomes {oc}, handled {j.get('handled')} (expected {n} completed)")
        return None
    res.update(mode=mode, cpu_ms=j["cpu_s"] * 1000 / j["handled"], process_cpu_ms=res["cpu"] * 1000 / n,
               requests_per_message=per_message(j.get("requests"), n))
    return res


def flow_limits(b):
    """The happy path with flow limits off and on, in a random order per
    repetition: {mode: [figures or None per repetition]}."""
    n = b.sizes["flow"]
    out = {m: [] for m in FLOW_MODES}
    for rep in range(b.reps):
        order = list(FLOW_MODES)
        random.shuffle(order)
        for mode in order:
            out[mode].append(flow_run(b, mode, n, rep))
    return out


def fleet(b):
    """(l): the engine's fleet figures, then the flow limits pair."""
    out = fleet_sim(b)
    out["limits"] = flow_limits(b)
    return out


# ---------------------------------------------------------------------------
# (m) a durable group discard (issue 40): `aqw ops discard` of 2,000 records
# at a 10,000-deep poison queue, and of 2,000 at a 2,000-deep one
# ---------------------------------------------------------------------------

def ops_run(b, depth, rep):
    """depth open records with their copies on <queue>-poison
    (`examples/seed_poison --with-copies`), 1 in depth/selected a 404; then
    one `aqw ops discard --error 'HTTP 404'` at the configured rate: records
    per second against that rate, and CPU per record."""
    n, rate = b.sizes["ops_selected"], b.sizes["ops_rate"]
    r = b.fresh()
    label = f"ops-{depth}-{rep}"
    log(f"(m) durable discard rep {rep + 1}/{b.reps}: {n} of {depth} records at {rate}/s")
    app_dir = os.path.join(b.work, label)
    write_app(app_dir, r["queue"], r["keys"], r["poison"])
    seed = [b.seed_exe, "--app", app_dir, "--count", str(depth), "--with-copies",
            "--not-found-every", str(max(depth // n, 1))]
    b.commands.setdefault("seed N open records with their poison-queue copies", b.show(seed, subs(r, app_dir)))
    if b.run(seed, f"{label}-seed", timeout=900) is None:
        b.cleanup_run(r)
        return None
    cmd = [b.aqw, "ops", "discard", r["queue"], "--error", "HTTP 404", "--reason", "bench", "--rate", str(rate),
           "--by", "bench", "--output", "json", "--app", app_dir]
    b.commands.setdefault("aqw-ops-discard", b.show(cmd, subs(r, app_dir)))
    res = b.run(cmd, label, timeout=900)
    left = b.queue_count(r["queue"] + "-poison", f"{label}-count")
    b.cleanup_run(r)
    if res is None or not res["json"]:
        return None
    op = res["json"]
    if op.get("state") != "done" or op.get("done") != n:
        b.fail(f"(m) {label}: the operation ended {op.get('state')} with {op.get('done')} of {n} done")
        return None
    if left is not None and left != depth - n:
        b.fail(f"(m) {label}: {left} copies left on the poison queue, not {depth - n}")
    return dict(n=n, depth=depth, rate=rate, wall=res["wall"], cpu=res["cpu"], left=left)


def ops(b):
    """(m): per repetition, the deep queue and the shallow one."""
    out = dict(deep=[], shallow=[])
    for rep in range(b.reps):
        out["deep"].append(ops_run(b, b.sizes["ops_depth"], rep))
        out["shallow"].append(ops_run(b, b.sizes["ops_selected"], rep))
    return out


# ---------------------------------------------------------------------------
# (n) claim-check: a job whose body sits in a blob against an inline one
# ---------------------------------------------------------------------------

CLAIM_CHECK_MODES = ("inline", "claim-check")
# Over the 48 KiB a base64 message holds: each such job goes to a blob.
CLAIM_CHECK_BYTES = 64 * 1024


def claim_check(b):
    """(n): the same keyed no-op jobs through examples/bench_worker, put
    inline and put as aqw's producer puts a job over the threshold (a
    64 KiB body in a blob, a reference on the queue), in random order per
    repetition: the worker's storage requests and CPU per job, and the
    producer's requests per job."""
    n = b.sizes["claim_check"]
    out = {m: [] for m in CLAIM_CHECK_MODES}
    for rep in range(b.reps):
        order = list(CLAIM_CHECK_MODES)
        random.shuffle(order)
        for mode in order:
            log(f"(n) claim-check {mode} rep {rep + 1}/{b.reps}: {n} keyed jobs")
            feed = ["--claim-check", str(CLAIM_CHECK_BYTES)] if mode == "claim-check" else None
            res = keyed_run(b, "aqw-default", n, rep, label=f"claim-{mode}-{rep}", feed=feed)
            if res is not None:
                res.update(mode=mode)
            out[mode].append(res)
    return out

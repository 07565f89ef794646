"""The bench's arithmetic, pure: percentiles, summaries, requests per message,
the figures the report derives from a run's results, and the targets check."""
import statistics


def percentile(values, q):
    """The nearest-rank q-th percentile (None for no values)."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q / 100 * len(v) + 0.5)) - 1))]


def stats(values):
    """(median, min, max) of the values that are numbers (not None, not NaN)."""
    values = [v for v in values if v is not None and v == v]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def median(values):
    s = stats(values)
    return s[0] if s else None


def ratio(a, b):
    return a / b if a is not None and b else None


def data_plane(requests):
    """Requests per op:status without one-off admin calls (create, metadata)."""
    return {k: v for k, v in (requests or {}).items()
            if not k.startswith(("table.admin", "queue.create", "queue.metadata", "blob.admin"))}


def per_message(requests, n):
    total = sum(data_plane(requests).values())
    return total / n if n else float("nan")


def fmt(v, digits=2):
    if v is None:
        return "n/a"
    if isinstance(v, float) and v != v:
        return "n/a"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def derive(data):
    """The per-repetition series the report and the targets read, from a
    run's results (the shape of results.json)."""
    a, b, d = data["a"], data["b"], data["d"]
    N = data["sizes"]

    def col(kind, f):
        return [f(x) for x in a.get(kind, [])]

    return dict(
        rps={k: col(k, lambda x: x["rps"]) for k in a},
        cpu_msg={k: col(k, lambda x: x["cpu"] / x["n"] * 1000) for k in a},
        loop_cpu_msg={k: col(k, lambda x: x["json"]["cpu_s"] / x["n"] * 1000) for k in a},
        rss={k: col(k, lambda x: x["rss_mb"]) for k in a},
        keyed_req=[per_message(x["json"]["requests"], x["n"]) for x in a.get("aqw-default", [])],
        keyed_tuned_req=[per_message(x["json"]["requests"], x["n"]) for x in a.get("aqw-tuned", [])],
        keyless_req=[per_message(x["json"]["requests"], N["keyless"]) for x in b["keyless"] if x and x["json"]],
        keyless_tuned_req=[per_message(x["json"]["requests"], N["keyless"])
                           for x in b.get("keyless_tuned", []) if x and x["json"]],
        dup_req=[per_message(s["json"]["requests"], N["duplicates"]) for f_, s in b["duplicates"] if s],
        dup_job_req=[(per_message(f_["json"]["requests"], 1) + per_message(s["json"]["requests"], 1))
                     / N["duplicates"] for f_, s in b["duplicates"] if f_ and s],
        poison_req=[per_message(x["requests"], x["n"]) for x in b["poisoned"] if x],
        ceiling_req=[per_message(x["json"]["requests"], x["n"]) for x in a.get("ceiling", [])],
        replay_aqw=[x["aqw"]["wall"] for x in d if x],
        replay_raw=[x["raw"]["wall"] for x in d if x],
        traces_cpu={m: [x["cpu_ms"] for x in (data.get("g") or {}).get(m, []) if x]
                    for m in ("off", "otlp", "otlp-down")},
        users=users_figures(data.get("k")),
    )


def paired_ratios(num, den, key="cpu_ms"):
    """Per repetition num[i][key] ÷ den[i][key], over the repetitions where
    both ran (None marks a failed run): pairing the contenders of one
    repetition removes the drift between repetitions."""
    return [x[key] / y[key] for x, y in zip(num, den) if x and y and y[key]]


def users_figures(k):
    """(k), from {kind: [run or None per repetition]}: medians of CPU per
    message and throughput per contender, the ratios of those medians, and
    the paired (per repetition) ratios with their medians. None without (k)."""
    if not k:
        return None
    runs = {kind: k.get(kind) or [] for kind in ("aqw-run", "aqw-run-backtrace", "python-http")}
    cpu = {kind: median([x["cpu_ms"] for x in xs if x]) for kind, xs in runs.items()}
    rps = {kind: median([x["rps"] for x in xs if x]) for kind, xs in runs.items()}
    paired_bt = paired_ratios(runs["aqw-run-backtrace"], runs["aqw-run"])
    paired_py = paired_ratios(runs["aqw-run"], runs["python-http"])
    return dict(
        cpu_ms=cpu, rps=rps,
        aqw_vs_python=ratio(cpu["aqw-run"], cpu["python-http"]),
        backtrace_vs_python=ratio(cpu["aqw-run-backtrace"], cpu["python-http"]),
        backtrace_vs_unset=ratio(cpu["aqw-run-backtrace"], cpu["aqw-run"]),
        paired_backtrace=paired_bt, paired_backtrace_median=median(paired_bt),
        paired_python=paired_py, paired_python_median=median(paired_py),
    )


def verdict(ok):
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def _le(v, t):
    return None if v is None else v <= t


def _ge(v, t):
    return None if v is None else v >= t


def _lt(v, t):
    return None if v is None else v < t


def targets(fig, c):
    """The benchmark issue's targets checked against a run: (target, this
    run's figure as text, met: True, False, or None for no figure)."""
    rps, cpu_msg, rss = fig["rps"], fig["cpu_msg"], fig["rss"]
    keyed_req, keyed_tuned_req = fig["keyed_req"], fig["keyed_tuned_req"]
    keyless_req, keyless_tuned_req = fig["keyless_req"], fig["keyless_tuned_req"]
    cpu_ratio = ratio(median(cpu_msg.get("aqw-default", [])), median(cpu_msg.get("python", [])))
    tp_ratio = ratio(median(rps.get("aqw-default", [])), median(rps.get("ceiling", [])))
    replay_rate_ratio = ratio(median(fig["replay_raw"]), median(fig["replay_aqw"]))
    rss_max = max(rss.get("aqw-default", []) + rss.get("aqw-tuned", []), default=None)
    idle_h = c.get("steady_per_hour") if c else None
    backtrace_ratio = ratio(median(cpu_msg.get("aqw-backtrace", [])), median(cpu_msg.get("aqw-default", [])))
    traces_cpu = fig.get("traces_cpu") or {}
    traces_ratio = ratio(median(traces_cpu.get("otlp", [])), median(traces_cpu.get("off", [])))
    users = fig.get("users") or {}
    users_ratio = users.get("aqw_vs_python")
    stretch = "" if users_ratio is None else f" (stretch 0.05×: {'met' if users_ratio <= 0.05 else 'missed'})"
    users_bt = users.get("paired_backtrace_median")
    users_bt_text = fmt(users_bt)
    if users_bt is not None:
        users_bt_text += f" (ratio of medians {fmt(users.get('backtrace_vs_unset'))})"
    return [
        ("CPU per keyed message, `aqw run` + HTTP handler ÷ Python peer + same handler ≤ 0.08× (stretch 0.05×)",
         fmt(users_ratio, 3) + stretch, _le(users_ratio, 0.08)),
        ("RUST_BACKTRACE=1 ÷ unset < 1.10 on `aqw run` (CPU per message, median of the paired repetitions)",
         users_bt_text, _lt(users_bt, 1.10)),
        ("in-process harness (a): worker CPU per message ≤ 0.1× the Python worker's (no handler in either)",
         fmt(cpu_ratio), _le(cpu_ratio, 0.1)),
        ("throughput ≥ 0.9× the ceiling loop's (default settings)", fmt(tp_ratio), _ge(tp_ratio, 0.9)),
        ("≤ 3.05 storage requests per keyed message, default settings (batchSize 16)",
         fmt(median(keyed_req)), _le(median(keyed_req), 3.05)),
        ("≤ 3.05 storage requests per keyed message, batchSize 32",
         fmt(median(keyed_tuned_req)), _le(median(keyed_tuned_req), 3.05)),
        ("≤ 1.05 without keys, default settings (batchSize 16)", fmt(median(keyless_req)),
         _le(median(keyless_req), 1.05)),
        ("≤ 1.05 without keys, batchSize 32", fmt(median(keyless_tuned_req)), _le(median(keyless_tuned_req), 1.05)),
        ("idle: ≤ 60 receive calls per hour per queue (default maxPollingInterval)", fmt(idle_h, 1),
         _le(idle_h, 60.5)),
        ("peak RSS ≤ 30 MiB with up to 32 (default) or 64 (tuned) jobs in flight",
         fmt(rss_max, 1) + " MiB" if rss_max else "n/a", _le(rss_max, 30)),
        ("replay ≥ 0.8× the raw put+delete loop (records/s ÷ messages/s)", fmt(replay_rate_ratio),
         _ge(replay_rate_ratio, 0.8)),
        ("in-process harness (a): CPU per message with RUST_BACKTRACE=1 within 10 % of unset (ratio ≤ 1.10)",
         fmt(backtrace_ratio), _le(backtrace_ratio, 1.10)),
        ("`aqw run` CPU per message, trace export OTLP on ≤ 1.15× off", fmt(traces_ratio), _le(traces_ratio, 1.15)),
    ]


# A key purge's fixed reads: the open records, then each of a function's 256
# key partitions (src/retention/mod.rs).
PURGE_SCAN_REQUESTS = 1 + 256


def purge_figures(run):
    """(i): requests and CPU per purged key, and the requests a naive purge
    (the same scans, then one DELETE per key) would make, as ratios."""
    deleted = run.get("deleted") or 0
    if not deleted:
        return None
    naive = PURGE_SCAN_REQUESTS + deleted
    return dict(requests_per_key=run["requests"] / deleted, naive_requests_per_key=naive / deleted,
                vs_naive=run["requests"] / naive, cpu_ms_per_key=run["cpu"] * 1000 / deleted,
                deletes_per_key=(run["requests"] - PURGE_SCAN_REQUESTS) / deleted)


def flow_figures(limits):
    """(l)'s flow limits pair, from {mode: [run or None per repetition]}: the
    medians per mode (CPU per message of the work loop and of the whole
    process, storage requests per message, throughput), the on ÷ off ratios
    of the medians, and the paired (per repetition) CPU ratios with their
    median. None without runs."""
    if not limits:
        return None
    runs = {m: limits.get(m) or [] for m in ("off", "on")}
    med = {key: {m: median([x[key] for x in xs if x]) for m, xs in runs.items()}
           for key in ("cpu_ms", "process_cpu_ms", "requests_per_message", "rps")}
    paired = paired_ratios(runs["on"], runs["off"])
    return dict(
        **med,
        cpu_ratio=ratio(med["cpu_ms"]["on"], med["cpu_ms"]["off"]),
        process_cpu_ratio=ratio(med["process_cpu_ms"]["on"], med["process_cpu_ms"]["off"]),
        requests_ratio=ratio(med["requests_per_message"]["on"], med["requests_per_message"]["off"]),
        paired_cpu=paired, paired_cpu_median=median(paired),
    )


def ops_figures(m):
    """(m): from {"deep": [run], "shallow": [run]} (None for a failed run):
    per depth the median records per second, that over the configured rate,
    and CPU per record; and the deep / shallow wall time per record (1.0: a
    record costs the same whatever the poison queue's depth). None without
    runs of both."""
    runs = {k: [x for x in (m or {}).get(k, []) if x] for k in ("deep", "shallow")}
    if not runs["deep"] or not runs["shallow"]:
        return None
    out = {}
    for k, xs in runs.items():
        rps = median([x["n"] / x["wall"] for x in xs])
        out[k] = dict(depth=xs[0]["depth"], n=xs[0]["n"], rate=xs[0]["rate"], rps=rps,
                      vs_rate=rps / xs[0]["rate"], cpu_ms_per_record=median([x["cpu"] * 1000 / x["n"] for x in xs]),
                      all_rps=[x["n"] / x["wall"] for x in xs])
    out["deep_vs_shallow"] = ratio(out["shallow"]["rps"], out["deep"]["rps"])
    return out


def claim_check_figures(x):
    """(n) one run: the worker's requests and CPU per job, the producer's
    requests per job."""
    if not x or not x.get("json"):
        return None
    n = x["n"]
    feed = (x.get("feed") or {}).get("requests") or {}
    return dict(requests=per_message(x["json"]["requests"], n),
                cpu_ms=x["json"]["cpu_s"] * 1000 / n,
                producer=per_message(feed, n) if feed else None)

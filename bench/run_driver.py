"""Drive one `aqw run` (or any command) to N completed jobs, as users run it:
an HTTP handler and an OTLP collector on loopback in this process, the
worker's own log lines read for its outcomes (nothing is scraped from the
worker, so the measurement adds no work to it), SIGTERM once N jobs have
completed. Prints one JSON line: the worker's exit code, its CPU (rusage of
the child: user + system, all threads), completions, handler calls, exports.

  python3 bench/run_driver.py --expect N --port P [--otlp] [--timeout S] -- CMD ARGS...

The handler is http://127.0.0.1:P/effects (the app's host.json names it, see
scripts/profile.sh); with --otlp, OTEL_EXPORTER_OTLP_ENDPOINT points at
http://127.0.0.1:P.
Stdlib only (the handler is the bench's own `scenarios.LocalHttp`).
"""
import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scenarios import LocalHttp  # noqa: E402 (the bench's own handler and collector)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--otlp", action="store_true")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    srv = LocalHttp(a.port)
    env = dict(os.environ)
    if a.otlp:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = srv.url
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    completed = 0
    other = []
    killer = threading.Timer(a.timeout, proc.kill)
    killer.start()
    started = time.monotonic()
    done_at = None
    for line in proc.stderr:
        if '"aqw.job.completed"' in line:
            completed += 1
            if completed == a.expect:
                done_at = time.monotonic()
                proc.send_signal(signal.SIGTERM)
        elif '"level":"WARN"' in line or '"level":"ERROR"' in line:
            other.append(line.strip()[:300])
    rc = proc.wait()
    killer.cancel()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = {"rc": rc, "completed": completed, "cpu": cpu, "user": after.ru_utime - before.ru_utime,
           "sys": after.ru_stime - before.ru_stime, "cpu_ms_per_job": cpu * 1000 / max(completed, 1),
           "seconds": (done_at or time.monotonic()) - started, "handler_calls": srv.counts.get("/effects", [0])[0],
           "exports": srv.counts.get("/v1/traces", [0])[0],
           # context switches: a wait for the network (voluntary) or a preemption
           "csw_per_job": ((after.ru_nvcsw - before.ru_nvcsw) + (after.ru_nivcsw - before.ru_nivcsw))
           / max(completed, 1), "warnings": other[:5]}
    print(json.dumps(out))
    return 0 if rc == 0 and completed == a.expect else 1


if __name__ == "__main__":
    sys.exit(main())

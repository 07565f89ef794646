"""The bench's machinery: one run's context, child processes with their
rusage, Azurite, app folders, the queue feeder, reading a worker's log lines
and /metrics scraping."""
import json
import os
import random
import re
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import urllib.request

CORES = len(os.sched_getaffinity(0))
DEFAULT_THRESHOLD = 8 * CORES  # aqw's default newBatchThreshold: batchSize/2 x cores
MAX_DEPTH = 900


def sizes(smoke):
    """Jobs (and seconds) per scenario: tiny for --smoke."""
    return dict(
        throughput=60 if smoke else 1000,
        keyless=30 if smoke else 500,
        duplicates=30 if smoke else 500,
        poisoned=2 if smoke else 20,
        idle_seconds=10 if smoke else 600,
        replay=20 if smoke else 500,
        latency_busy=20 if smoke else 300,
        latency_rate=20 if smoke else 100,
        latency_idle_samples=0 if smoke else 5,
        scale=40 if smoke else 2000,
        traces=40 if smoke else 500,
        users=40 if smoke else 800,
        breaker=40 if smoke else 500,
        purge=30 if smoke else 2000,
        dashboard_small=10 if smoke else 100,
        dashboard_large=200 if smoke else 10000,
        flow=40 if smoke else 1000,
        fleet_hours=1 if smoke else 24,
        # (m), full runs only: a durable discard of ops_selected records at
        # a poison queue ops_depth deep, at ops_rate records per second.
        ops_depth=10000,
        ops_selected=2000,
        ops_rate=50,
        # (n): jobs per mode of the claim-check comparison.
        claim_check=20 if smoke else 500,
    )


class Bench:
    """One bench run: where things are, its sizes, and the errors and
    commands it collects for the report."""

    def __init__(self, root, target, mode, reps, work=None):
        self.root = root
        self.target = target
        self.mode = mode
        self.reps = reps
        self.smoke = mode == "smoke"
        self.restarted_once = False
        self.state = os.path.join(root, ".bench")
        self.work = work or os.path.join(self.state, f"{mode}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.sizes = sizes(self.smoke)
        self.timeout = 120 if self.smoke else 900
        self.errors = []
        self.commands = {}
        self.aqw = os.path.join(target, "aqw")
        self.bench_worker = os.path.join(target, "examples", "bench_worker")
        self.ceiling_exe = os.path.join(target, "examples", "ceiling")
        self.seed_exe = os.path.join(target, "examples", "seed_poison")
        self.python = sys.executable
        self.py_worker = os.path.join(root, "bench", "python_worker.py")
        self.azurite_sh = os.path.join(root, "scripts", "azurite.sh")
        # The idle probes run all along on a second, otherwise unused Azurite,
        # so the restarts of the main one do not disturb them.
        self.probe_azurite = dict(PROBE_PORTS, AQW_AZURITE_STATE=os.path.join(self.state, "azurite-probes"))

    def fail(self, msg):
        self.errors.append(msg)
        log(f"ERROR: {msg}")

    def show(self, cmd, subs=None):
        """A command as the report prints it: repo-relative, run-specific names as placeholders."""
        out = []
        for c in cmd:
            for literal, placeholder in sorted((subs or {}).items(), key=lambda kv: -len(kv[0])):
                c = c.replace(literal, placeholder)
            c = c.replace(self.work, "$RUN_DIR")
            c = c.replace(self.target + "/", "target/" + os.path.basename(self.target) + "/").replace(self.root + "/", "")
            c = c.replace(self.python, ".bench/venv/bin/python")
            out.append(c if re.fullmatch(r"[\w./:=,+$-]+", c) else "'" + c + "'")
        return " ".join(out)

    def proc(self, cmd, name, timeout=None, env=None):
        return Proc(cmd, os.path.join(self.work, name), name, self.timeout if timeout is None else timeout, env)

    def run(self, cmd, name, ok_codes=(0,), timeout=None, env=None):
        p = self.proc(cmd, name, timeout, env)
        r = p.wait()
        if r["timed_out"] or r["rc"] not in ok_codes:
            self.fail(f"{name}: {self.show(cmd)} exited {r['rc']}{' (timed out)' if r['timed_out'] else ''}: {p.tail()}")
            return None
        return r

    def ceiling(self, *args, name, ok_codes=(0,)):
        return self.run([self.ceiling_exe, *args], name, ok_codes)

    def queue_count(self, queue, name):
        r = self.ceiling("count", "--queue", queue, name=name)
        return None if r is None or r["json"] is None else r["json"]["count"]

    def cleanup(self, queues=(), tables=()):
        args = []
        for q in queues:
            args += ["--queue", q]
        for t in tables:
            args += ["--table", t]
        self.proc([self.ceiling_exe, "cleanup", *args], rand("cleanup-", 6)).wait()

    def cleanup_run(self, r, *extra_queues):
        """Delete one run's queues (source, poison, any extra) and tables."""
        self.cleanup([r["queue"], r["queue"] + "-poison", *extra_queues], [r["keys"], r["poison"]])

    def azurite(self, cmd, env=None):
        run = lambda: subprocess.run(["bash", self.azurite_sh, cmd], env={**os.environ, **(env or {})},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        r = run()
        if r.returncode != 0 and cmd == "restart":
            # Under load the old process can outlive its stop; one more try.
            log(f"scripts/azurite.sh restart failed once; retrying: {r.stderr.strip()[-200:]}")
            r = run()
        if r.returncode != 0:
            self.fail(f"scripts/azurite.sh {cmd} failed: {r.stderr[-500:]}")

    def fresh(self, restart=True):
        """Fresh names for one run, on a freshly restarted Azurite: every run
        starts from the same empty emulator, and none inherits the garbage of the
        ones before (see scripts/azurite.sh: Azurite's queue GC is quadratic).
        A smoke run restarts and warms up once, on its first run: it proves
        the benchmark works at tiny sizes, where no garbage builds up."""
        if restart and not (self.smoke and self.restarted_once):
            self.restarted_once = True
            self.azurite("restart")
            # Warm the new Node.js process up (JIT) with the calls the runs make,
            # so no contender pays for Azurite's cold start.
            self.warm_up()
        tag = rand("", 8)
        return dict(queue=rand("bq"), keys=rand("k"), poison=rand("p"), tag=tag)

    def warm_up(self, attempts=2):
        """Warm the new Node.js process up (JIT) with the calls the runs make.
        The warm-up is not measured, so a failed one (a cold Azurite once timed
        the first enqueue out) restarts Azurite and tries again before it
        counts as an error."""
        for attempt in range(1, attempts + 1):
            wq, wt = rand("warm"), rand("warm")
            ok = all(self.proc([self.ceiling_exe, *args], f"{name}-{attempt}").wait()["rc"] == 0
                     for args, name in ((["enqueue", "--queue", wq, "--count", "500"], "warm-enqueue"),
                                        (["run", "--queue", wq, "--table", wt, "--expect", "500"], "warm-run")))
            self.cleanup([wq], [wt])
            if ok:
                return
            log(f"warm-up attempt {attempt} failed; restarting Azurite")
            self.azurite("restart")
        self.fail(f"Azurite warm-up failed {attempts} times (see {self.work}/warm-*)")

    def azurite_cpu(self):
        """Azurite's user+system CPU seconds so far (from /proc), or None."""
        try:
            state = os.environ.get("AQW_AZURITE_STATE") or os.path.join(self.root, ".azurite")
            pid = int(open(os.path.join(state, "azurite.pid")).read().split()[0])
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None


DEV_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")


def dev_connection(env=None):
    """The bench's connection: Azurite on the ports scripts/azurite.sh starts
    it on (AQW_AZURITE_*_PORT), so a bench on ports of its own never touches
    another Azurite; UseDevelopmentStorage=true when none is set."""
    env = os.environ if env is None else env
    ports = [env.get(f"AQW_AZURITE_{s}_PORT") for s in ("BLOB", "QUEUE", "TABLE")]
    if not any(ports):
        return "UseDevelopmentStorage=true"
    blob, queue, table = (p or d for p, d in zip(ports, ("10000", "10001", "10002")))
    return ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={DEV_KEY};BlobEndpoint=http://127.0.0.1:{blob}/devstoreaccount1;"
            f"QueueEndpoint=http://127.0.0.1:{queue}/devstoreaccount1;"
            f"TableEndpoint=http://127.0.0.1:{table}/devstoreaccount1;")


PROBE_PORTS = dict(AQW_AZURITE_BLOB_PORT="10010", AQW_AZURITE_QUEUE_PORT="10011",
                   AQW_AZURITE_TABLE_PORT="10012")

PROBE_ENV = {"AzureWebJobsStorage": (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "QueueEndpoint=http://127.0.0.1:10011/devstoreaccount1;"
    "TableEndpoint=http://127.0.0.1:10012/devstoreaccount1;")}


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def rand(prefix, n=10):
    return prefix + "".join(random.choices(string.ascii_lowercase + string.digits, k=n))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_json(text):
    """The last line of a process's stdout that is JSON, else the whole of it."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{") or line.startswith("["):
            try:
                return json.loads(line)
            except ValueError:
                pass
    if text.strip().startswith(("[", "{")):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return None


class Proc:
    """A child process whose rusage (CPU, peak RSS) is collected at exit; its
    stdout and stderr go to `<base>.out` and `<base>.err`."""

    def __init__(self, cmd, base, name, timeout, env=None):
        self.cmd = cmd
        self.name = name
        self.out_path = base + ".out"
        self.err_path = base + ".err"
        self.out = open(self.out_path, "w")
        self.err = open(self.err_path, "w")
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(cmd, stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL,
                                  env=None if env is None else {**os.environ, **env})
        self.timed_out = False
        self.timer = threading.Timer(timeout, self._kill)
        self.timer.daemon = True
        self.timer.start()
        self.result = None
        # Peak RSS: VmHWM polled from /proc. (rusage's ru_maxrss is no good here:
        # Linux carries the forking Python's RSS over the exec into it.)
        self.hwm_kb = 0
        self.done = threading.Event()
        self.poller = threading.Thread(target=self._poll_hwm, daemon=True)
        self.poller.start()

    def _poll_hwm(self):
        path = f"/proc/{self.p.pid}/status"
        while not self.done.is_set():
            try:
                with open(path) as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.hwm_kb = max(self.hwm_kb, int(line.split()[1]))
                            break
            except (OSError, ValueError):
                pass
            self.done.wait(0.02)

    def _kill(self):
        self.timed_out = True
        try:
            os.kill(self.p.pid, signal.SIGKILL)  # not Popen.kill: it may reap (see signal)
        except ProcessLookupError:
            pass

    def signal(self, sig):
        # os.kill, not Popen.send_signal: that one polls first and so may reap
        # an exited child, whose rusage wait() then could not collect.
        if self.result is None and not self.exited():
            try:
                os.kill(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def exited(self):
        # Check without reaping (Popen.poll would reap): wait() needs the
        # child's rusage from wait4.
        if self.result is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def wait(self):
        if self.result is not None:
            return self.result
        _, status, ru = os.wait4(self.p.pid, 0)
        wall = time.monotonic() - self.t0
        self.timer.cancel()
        self.done.set()
        self.poller.join()
        self.p.returncode = os.waitstatus_to_exitcode(status)
        self.out.close()
        self.err.close()
        with open(self.out_path) as f:
            data = last_json(f.read())
        self.result = dict(
            rc=self.p.returncode, wall=wall, cpu=ru.ru_utime + ru.ru_stime,
            rss_mb=self.hwm_kb / 1024.0, json=data, timed_out=self.timed_out,
        )
        return self.result

    def tail(self):
        try:
            return open(self.err_path).read()[-1500:]
        except OSError:
            return ""


class LogTail:
    """Counts the lines of a growing log file (a process's stderr, as Proc
    writes it) that contain `needle`, reading only what was appended since the
    last look. A line still being written is held back until its newline.
    Reading the file costs the process that writes it nothing."""

    def __init__(self, path, needle):
        self.path = path
        self.needle = needle.encode()
        self.count = 0
        self.offset = 0
        self.partial = b""

    def poll(self):
        """Read what was appended; the count so far."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return self.count
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        self.count += sum(1 for line in lines if self.needle in line)
        return self.count


def wait_log_count(proc, needle, n, seconds, every=0.02):
    """Until `n` lines of proc's stderr contain `needle` (read every `every`
    seconds): the monotonic time the n-th was seen, or None (the process
    exited, or `seconds` passed first)."""
    tail = LogTail(proc.err_path, needle)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        exited = proc.exited()
        if tail.poll() >= n:
            return time.monotonic()
        if exited:
            return None
        time.sleep(every)
    return None


def write_app(app_dir, queue, keys, poison, key="bench:{/id}", handler=None, queues=None, http_port=None,
              breaker=None, aqw_extra=None, limits=None):
    os.makedirs(app_dir, exist_ok=True)
    fn = {"queue": queue, "key": key}
    if handler is not None:
        fn["handler"] = handler
    if breaker is not None:
        fn["breaker"] = breaker
    if limits is not None:
        fn["limits"] = limits
    aqw = {"functions": {"Bench": fn}, "tables": {"keys": keys, "poison": poison}, **(aqw_extra or {})}
    if http_port is not None:
        aqw["http"] = {"port": http_port}
    host = {"version": "2.0", "extensions": {"queues": dict(messageEncoding="base64", **(queues or {}))}, "aqw": aqw}
    with open(os.path.join(app_dir, "host.json"), "w") as f:
        json.dump(host, f, indent=2)
    return host


class Feeder:
    """`ceiling enqueue` in the background: first wave on the queue, then top-ups."""

    def __init__(self, b, queue, count, tag, name, extra=None):
        self.b = b
        self.ready = os.path.join(b.work, f"{name}.ready")
        self.cmd = [b.ceiling_exe, "enqueue", "--queue", queue, "--count", str(count), "--tag", tag,
                    "--max-depth", str(MAX_DEPTH), "--ready-file", self.ready] + list(extra or [])
        self.result = None
        b.commands.setdefault("feed the queue in waves (keyed jobs {\"id\": \"$TAG-<i>\"})",
                              b.show(self.cmd, {queue: "$QUEUE", tag: "$TAG", self.ready: "$RUN_DIR/ready"}))
        self.p = b.proc(self.cmd, name)

    def wait_ready(self):
        while not os.path.exists(self.ready):
            if self.p.exited():
                break
            time.sleep(0.02)
        return os.path.exists(self.ready)

    def kill(self):
        if not self.p.exited():
            self.p.signal(signal.SIGKILL)
        self.p.wait()

    def finish(self):
        r = self.p.wait()
        self.result = r.get("json")
        if r["rc"] != 0 or r["timed_out"]:
            self.b.fail(f"{self.p.name}: enqueue failed: {self.p.tail()}")
            return False
        return True


def subs(r, app_dir=None, **extra):
    out = {r["queue"]: "$QUEUE", r["keys"]: "$KEYS", r["poison"]: "$POISON", r["tag"]: "$TAG"}
    if app_dir:
        out[app_dir] = "$APP"
    out.update({k: v for k, v in extra.items()})
    return out


# ---------------------------------------------------------------------------
# /metrics
# ---------------------------------------------------------------------------

def parse_metrics(text):
    """Prometheus text → {name: [(labels, value), ...]}."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)$", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(4))))
    return out


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return parse_metrics(resp.read().decode())


def metric_by(metrics, name, *keys):
    out = {}
    for labels, v in metrics.get(name, []):
        k = ":".join(labels.get(x, "") for x in keys)
        out[k] = out.get(k, 0) + int(v)
    return out


def wait_http(port, proc, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.exited():
            return False
        try:
            scrape(port)
            return True
        except OSError:
            time.sleep(0.1)
    return False

//! Hostile input (issue 39 item 7): no input makes aqw panic, a closed
//! stdout exits quietly, and every value a user can type ends in a defined
//! exit code. Every subcommand runs with hostile values (huge, negative,
//! empty, non-UTF-8, control characters, paths that are not what they
//! claim) in each of its arguments, options, environment settings and
//! standard input, and every number and timespan of host.json gets the same;
//! each run must end within 20 s with an exit code in 0..=3 and no panic on
//! stderr. All failures are collected and reported together, so one run
//! shows every problem.

use crate::common::*;
use aqw_core::handler::HandlerError;
use aqw_core::storage::Storage;
use serde_json::{json, Value};
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A run still going after this long is killed and reported as hung.
const TIMEOUT: Duration = Duration::from_secs(20);
/// Runs at once (most of a run is waiting on process start-up and Azurite).
const THREADS: usize = 8;
const DEADLINE: Duration = Duration::from_secs(60);
/// A run of the suite tries one hostile value in [`STRIDE`] per slot (the
/// product is ~9,600 process runs, 7 minutes of the suite's 10 on this
/// 2-core machine); which one rotates by day, so every value of every slot
/// runs within [`STRIDE`] days. `AQW_HOSTILE_ALL=1` runs the whole product,
/// `AQW_HOSTILE_ROTATION=<0..STRIDE>` one rotation (a failure prints its own).
const STRIDE: usize = 4;

/// The rotation of this run: AQW_HOSTILE_ROTATION, else the day number; None
/// for the whole product (AQW_HOSTILE_ALL=1).
fn rotation() -> Option<usize> {
    if std::env::var_os("AQW_HOSTILE_ALL").is_some_and(|v| v == "1") {
        return None;
    }
    let day = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as usize;
    Some(
        std::env::var("AQW_HOSTILE_ROTATION")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(day)
            % STRIDE,
    )
}

/// Of one template's cases, the first (the valid run, or its first slot)
/// and every [`STRIDE`]th of the rest at `rotation`.
fn sample(cases: Vec<Case>, rotation: Option<usize>) -> Vec<Case> {
    let Some(r) = rotation else { return cases };
    cases
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || i % STRIDE == r)
        .map(|(_, c)| c)
        .collect()
}

/// How to run this rotation again, or the whole product.
fn rotation_note(rotation: Option<usize>) -> String {
    match rotation {
        Some(r) => format!(
            "rotation {r} of {STRIDE} (again: AQW_HOSTILE_ROTATION={r}; everything: AQW_HOSTILE_ALL=1)"
        ),
        None => "the whole product (AQW_HOSTILE_ALL=1)".to_string(),
    }
}

fn non_utf8() -> OsString {
    OsString::from_vec(vec![0xff, 0xfe, b'x'])
}

/// Values for any argument, option or environment setting.
fn hostile_values(files: &Path) -> Vec<OsString> {
    let mut v: Vec<OsString> = [
        "",
        "   \t ",
        "-1",
        "0",
        "-0",
        "1",
        "65536",
        "4294967296",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999",
        "-99999999999999999999999",
        "1e309",
        "-1e309",
        "1e-300",
        "4.9e-324",
        "NaN",
        "inf",
        "-inf",
        "0x10",
        "1_000",
        "10000000.00:00:00",
        "213503982334601.00:00:00",
        "99999999999999999.00:00:00",
        "10675199.02:48:05.4775807",
        "-00:00:01",
        "00:00:-1",
        "25:61:61",
        "24:00:00",
        "00:00:00",
        "00:00:00.0000001",
        "9999-12-31T23:59:59-23:59",
        "-9999-01-01T00:00:00+23:59",
        "2024-02-30T00:00:00Z",
        "a\u{1b}[31m\nb",
        "\u{202E}evil",
        "\r\n\t\u{7}\u{8}\u{7f}",
        "../../etc/passwd",
        "/",
        "/dev/null",
        "/proc/self/mem",
        "Q_UPPER!@#$%^&*()",
        "q--poison",
        "-",
        "--help",
        "%s%n%x",
        "' or PartitionKey ne '",
        "(",
        "a{4294967295}",
        "(?:a{1000}){1000}",
        "{\"orderId\":1e309}",
        "{\"orderId\":18446744073709551616}",
        "{\"orderId\":\"\\ud800\"}",
        "{\"orderId\":null}",
        "http://[::1",
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    v.push("x".repeat(100_000).into());
    v.push("[".repeat(100_000).into());
    v.push("😀".repeat(2_000).into());
    v.push(format!("{{\"orderId\":\"{}\"}}", "é".repeat(40_000)).into());
    v.push(non_utf8());
    v.push(OsString::from_vec(b"job:\xc3\x28".to_vec()));
    for f in [
        "empty",
        "nonutf8.json",
        "big.json",
        "deep.json",
        "dir",
        "missing",
    ] {
        v.push(files.join(f).into());
    }
    v
}

/// Values for `--app` (and AQW_APP): folders that are not an app.
fn hostile_apps(files: &Path) -> Vec<OsString> {
    let mut v: Vec<OsString> = [
        "",
        ".",
        "/",
        "/dev/null",
        "/proc/self/mem",
        "../../etc/passwd",
        "a\u{1b}[31m\nb",
        "\u{202E}evil",
        "   \t ",
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    v.push("x".repeat(100_000).into());
    v.push(non_utf8());
    for f in [
        "empty",
        "dir",
        "missing",
        "app-nonutf8",
        "app-deep",
        "app-empty",
        "app-dir",
    ] {
        v.push(files.join(f).into());
    }
    v
}

/// Values for `--output` and `--log-format`.
fn hostile_enums() -> Vec<OsString> {
    let mut v: Vec<OsString> = ["", "yaml", "JSON", " json", "a\u{1b}[31m\nb"]
        .into_iter()
        .map(OsString::from)
        .collect();
    v.push("x".repeat(100_000).into());
    v.push(non_utf8());
    v
}

/// Standard input for `-`.
fn hostile_stdin() -> Vec<Vec<u8>> {
    vec![
        vec![],
        vec![0xff, 0xfe, b'x'],
        b"\x1b[31m\n\x07".to_vec(),
        b"\xef\xbb\xbf{\"orderId\":\"o-3\"}".to_vec(),
        b"{\"orderId\":1e309}".to_vec(),
        "[".repeat(100_000).into_bytes(),
        format!("{{\"orderId\":\"{}\"}}", "x".repeat(1_000_000)).into_bytes(),
    ]
}

/// Files the path values point at.
fn make_files(dir: &Path) {
    let w = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    w("empty", b"");
    w("nonutf8.json", &[0xff, 0xfe, b'{']);
    w(
        "big.json",
        format!("{{\"orderId\":\"{}\"}}", "x".repeat(1_000_000)).as_bytes(),
    );
    w("deep.json", "[".repeat(100_000).as_bytes());
    w("valid.json", b"{\"orderId\":\"o-4\"}");
    std::fs::create_dir(dir.join("dir")).unwrap();
    let app = |name: &str, host: &[u8]| {
        std::fs::create_dir(dir.join(name)).unwrap();
        std::fs::write(dir.join(name).join("host.json"), host).unwrap();
    };
    app("app-nonutf8", &[0xff, 0xfe, b'{']);
    app("app-deep", "[".repeat(100_000).as_bytes());
    app("app-empty", b"");
    std::fs::create_dir_all(dir.join("app-dir").join("host.json")).unwrap();
}

/// One run of the binary.
#[derive(Clone, Default)]
struct Case {
    argv: Vec<OsString>,
    env: Vec<(&'static str, OsString)>,
    stdin: Option<Vec<u8>>,
    /// Killed after this long and passed if it has not panicked by then
    /// (`aqw run` on a host.json it accepted); otherwise hung at [`TIMEOUT`].
    run_for: Option<Duration>,
    /// Its stdout a pipe whose reader has gone (closed before the first write).
    close_stdout: bool,
    /// Shown before the command line.
    note: String,
}

struct Outcome {
    code: Option<i32>,
    stderr: String,
    /// Still running at [`TIMEOUT`], and killed.
    hung: bool,
    /// Still running at its `run_for`, and stopped (not a failure).
    stopped: bool,
}

/// Run one case: an empty working folder (so `--app ""` finds no host.json),
/// a clean environment but for the storage connection and $USER.
fn execute(case: &Case, cwd: &Path) -> Outcome {
    let mut cmd = Command::new(aqw_bin());
    cmd.args(&case.argv)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AzureWebJobsStorage", CONN)
        .env("USER", "tester")
        .stdout(if case.close_stdout {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::piped())
        .stdin(if case.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    for (k, v) in &case.env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn aqw");
    drop(child.stdout.take());
    if let (Some(bytes), Some(mut stdin)) = (case.stdin.clone(), child.stdin.take()) {
        // The child may never read it: a write error is expected then.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
    }
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let limit = case.run_for.unwrap_or(TIMEOUT);
    let started = Instant::now();
    let mut nap = Duration::from_millis(1);
    let (code, hung, stopped) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status.code(), false, false);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break (None, case.run_for.is_none(), case.run_for.is_some());
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    };
    let stderr = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    Outcome {
        code,
        stderr,
        hung,
        stopped,
    }
}

/// An argument as a person would read it: quoted when needed, long values
/// shortened, the app and files folders named.
fn show(arg: &OsStr, names: &[(&OsStr, &str)]) -> String {
    for (path, name) in names {
        if let Some(rest) = arg.as_bytes().strip_prefix(path.as_bytes()) {
            return match rest.is_empty() {
                true => name.to_string(),
                false => format!("{name}{}", show(OsStr::from_bytes(rest), &[])),
            };
        }
        if let Some(rest) = arg.as_bytes().strip_prefix(b"--app=") {
            if rest.starts_with(path.as_bytes()) {
                return format!("--app={}", show(OsStr::from_bytes(rest), names));
            }
        }
    }
    let b = arg.as_bytes();
    let simple = !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_graphic() && !b"\"'\\$`".contains(c));
    match (b.len() > 60, simple) {
        (true, _) => format!("{:?}…({} bytes)", OsStr::from_bytes(&b[..24]), b.len()),
        (false, true) => arg.to_string_lossy().into_owned(),
        (false, false) => format!("{arg:?}"),
    }
}

fn label(case: &Case, names: &[(&OsStr, &str)]) -> String {
    let mut s = case.note.clone();
    for (k, v) in &case.env {
        s.push_str(&format!("{k}={} ", show(v, names)));
    }
    s.push_str("aqw");
    for a in &case.argv {
        s.push(' ');
        s.push_str(&show(a, names));
    }
    if let Some(stdin) = &case.stdin {
        s.push_str(&format!(" < {}", show(OsStr::from_bytes(stdin), &[])));
    }
    s
}

/// What is wrong with an outcome, if anything.
fn judge(o: &Outcome) -> Option<String> {
    let bad_code = !o.stopped && !matches!(o.code, Some(0..=3));
    let panicked = o.stderr.contains("panicked") || o.stderr.contains("RUST_BACKTRACE");
    if !(o.hung || bad_code || panicked) {
        return None;
    }
    let what = match (o.hung, o.code) {
        (true, _) => {
            "still running after 20 s, killed (hung, or a long-running command took the hostile value)"
                .to_string()
        }
        (false, Some(c)) => format!("exit {c}"),
        (false, None) if o.stopped => "stopped after its run".to_string(),
        (false, None) => "killed by a signal".to_string(),
    };
    let first = o
        .stderr
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let panic_line = o
        .stderr
        .lines()
        .skip_while(|l| !l.contains("panicked"))
        .take(2)
        .collect::<Vec<_>>()
        .join(" | ");
    let why = match (panic_line.is_empty(), first.contains("panicked")) {
        (true, _) => format!("{what}: {}", clip(first)),
        (false, true) => format!("{what}: {}", clip(&panic_line)),
        (false, false) => format!("{what}: {} … {}", clip(first), clip(&panic_line)),
    };
    Some(why)
}

fn clip(s: &str) -> String {
    match s.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Run every case on [`THREADS`] threads; the outcomes in case order.
fn run_all(cases: &[Case], cwd: &Path) -> Vec<(usize, Outcome)> {
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::with_capacity(cases.len()));
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let o = execute(case, cwd);
                done.lock().unwrap().push((i, o));
            });
        }
    });
    let mut done = done.into_inner().unwrap();
    done.sort_by_key(|(i, _)| *i);
    done
}

fn failures(
    cases: &[Case],
    outcomes: &[(usize, Outcome)],
    names: &[(&OsStr, &str)],
) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|(i, o)| {
            judge(o).map(|why| format!("{}\n      → {why}", label(&cases[*i], names)))
        })
        .collect()
}

/// One part of a command line.
#[derive(Clone)]
enum Part {
    /// `--name=value`, replaced by each hostile value in turn.
    Opt(&'static str, OsString),
    /// `--name=value`, kept valid.
    Keep(&'static str, OsString),
    Flag(&'static str),
    /// A positional, replaced by each hostile value in turn.
    Pos(OsString),
    /// A positional, kept valid.
    KeepPos(OsString),
}

fn opt(name: &'static str, value: impl Into<OsString>) -> Part {
    Part::Opt(name, value.into())
}
fn keep(name: &'static str, value: impl Into<OsString>) -> Part {
    Part::Keep(name, value.into())
}
fn pos(value: impl Into<OsString>) -> Part {
    Part::Pos(value.into())
}
fn keep_pos(value: impl Into<OsString>) -> Part {
    Part::KeepPos(value.into())
}

/// A command with valid values, each slot of which gets the hostile ones.
#[derive(Clone)]
struct Template {
    sub: Vec<&'static str>,
    parts: Vec<Part>,
    /// Valid environment settings.
    env: Vec<(&'static str, OsString)>,
    /// Environment settings that get the hostile values.
    env_slots: Vec<&'static str>,
    /// Valid standard input (which then gets the hostile ones too).
    stdin: Option<Vec<u8>>,
    /// `--app` from AQW_APP (an env slot) rather than the command line.
    app_from_env: bool,
    /// `aqw run`: never started with valid values (it would not stop).
    long_running: bool,
    /// Positionals as they are, not after `--` (hostile subcommand names).
    raw: bool,
}

fn cmd(sub: &[&'static str], parts: Vec<Part>) -> Template {
    Template {
        sub: sub.to_vec(),
        parts,
        env: vec![],
        env_slots: vec![],
        stdin: None,
        app_from_env: false,
        long_running: false,
        raw: false,
    }
}

impl Template {
    fn env(mut self, valid: &[(&'static str, &str)], slots: &[&'static str]) -> Self {
        self.env
            .extend(valid.iter().map(|(k, v)| (*k, OsString::from(*v))));
        self.env_slots.extend(slots);
        self
    }
    fn stdin(mut self, valid: &[u8]) -> Self {
        self.stdin = Some(valid.to_vec());
        self
    }
    fn long_running(mut self) -> Self {
        self.long_running = true;
        self
    }
    fn raw(mut self) -> Self {
        self.raw = true;
        self
    }
    fn app_from_env(mut self) -> Self {
        self.app_from_env = true;
        self
    }

    /// The command line: globals, subcommand, options, then positionals.
    fn argv(
        &self,
        app: Option<&OsStr>,
        globals: &[(&str, &OsStr)],
        parts: &[Part],
    ) -> Vec<OsString> {
        let flag = |name: &str, v: &OsStr| {
            let mut s = OsString::from(format!("{name}="));
            s.push(v);
            s
        };
        let mut argv: Vec<OsString> = app.map(|a| flag("--app", a)).into_iter().collect();
        argv.extend(globals.iter().map(|(n, v)| flag(n, v)));
        argv.extend(self.sub.iter().map(OsString::from));
        let mut positionals = vec![];
        for p in parts {
            match p {
                Part::Opt(n, v) | Part::Keep(n, v) => argv.push(flag(n, v)),
                Part::Flag(n) => argv.push(n.into()),
                Part::Pos(v) | Part::KeepPos(v) => positionals.push(v.clone()),
            }
        }
        if !positionals.is_empty() && !self.raw {
            argv.push("--".into());
        }
        argv.extend(positionals);
        argv
    }

    fn case(&self, app: Option<&OsStr>, globals: &[(&str, &OsStr)], parts: &[Part]) -> Case {
        Case {
            argv: self.argv(app, globals, parts),
            env: self.env.clone(),
            stdin: self.stdin.clone(),
            ..Case::default()
        }
    }

    /// The valid run (unless long-running) and one run per slot and hostile value.
    fn cases(&self, ctx: &Ctx) -> Vec<Case> {
        let app = (!self.app_from_env).then_some(ctx.app.as_os_str());
        let mut out = vec![];
        if !self.long_running {
            out.push(self.case(app, &[], &self.parts));
        }
        for (i, p) in self.parts.iter().enumerate() {
            for h in &ctx.values {
                let mut parts = self.parts.clone();
                parts[i] = match p {
                    Part::Opt(n, _) => Part::Opt(n, h.clone()),
                    Part::Pos(_) => Part::Pos(h.clone()),
                    _ => break,
                };
                out.push(self.case(app, &[], &parts));
            }
        }
        for name in &self.env_slots {
            let values = if *name == "AQW_APP" {
                &ctx.apps
            } else {
                &ctx.values
            };
            for h in values.iter().filter(|h| safe_env_value(name, h)) {
                let mut c = self.case(app, &[], &self.parts);
                c.env.retain(|(k, _)| k != name);
                c.env.push((name, h.clone()));
                out.push(c);
            }
        }
        if self.stdin.is_some() {
            for s in &ctx.stdin {
                let mut c = self.case(app, &[], &self.parts);
                c.stdin = Some(s.clone());
                out.push(c);
            }
        }
        if !self.app_from_env {
            for h in &ctx.apps {
                out.push(self.case(Some(h), &[], &self.parts));
            }
        }
        for global in ["--output", "--log-format"] {
            for h in &ctx.enums {
                out.push(self.case(app, &[(global, h)], &self.parts));
            }
        }
        out
    }
}

/// Leave out values that are valid and would make a run start for good
/// (or, for TOKIO_WORKER_THREADS, start that many threads on this machine).
fn safe_env_value(name: &str, v: &OsStr) -> bool {
    let text = v.to_string_lossy();
    match name {
        "TOKIO_WORKER_THREADS" => {
            !matches!(text.trim().parse::<usize>(), Ok(n) if (1..1 << 40).contains(&n))
        }
        "FUNCTIONS_CUSTOMHANDLER_PORT" => !matches!(text.trim().parse::<u16>(), Ok(p) if p != 0),
        _ => true,
    }
}

struct Ctx {
    app: PathBuf,
    values: Vec<OsString>,
    apps: Vec<OsString>,
    enums: Vec<OsString>,
    stdin: Vec<Vec<u8>>,
}

/// The function of every app here: keyed, an HTTP handler and lookup on a
/// closed port, so `run`, `serve` and `keys check` get past their checks.
fn job_function() -> Value {
    json!({
        "key": "job:{/orderId}",
        "handler": {
            "type": "http",
            "url": "http://127.0.0.1:9/job",
            "timeout": "00:00:02",
            "lookup": { "url": "http://127.0.0.1:9/lookup", "timeout": "00:00:02" }
        }
    })
}

/// Every subcommand and every value it takes (from `aqw --help`, each
/// `aqw <sub> --help` and `aqw <sub> <subsub> --help`).
fn templates(q: &str, id: &str, files: &Path, held_port: u16) -> Vec<Template> {
    let valid_file = files.join("valid.json");
    let payload = r#"{"orderId":"o-2"}"#;
    let port = held_port.to_string();
    let unreachable_listen = "192.0.2.1:1"; // TEST-NET-1: binding fails at once
    let token = "0123456789abcdef0123456789abcdef0123456789abcdef";
    vec![
        // The command tree itself: hostile subcommand names.
        cmd(&[], vec![pos("status")]).raw(),
        cmd(&["help"], vec![pos("poison"), pos("list")]).raw(),
        cmd(&["poison"], vec![pos("list"), keep_pos(q)]).raw(),
        cmd(&["keys"], vec![pos("purge"), Part::Flag("--dry-run")]).raw(),
        cmd(&["config"], vec![pos("show")]).raw(),
        // Long-running: only values that must be refused before they start.
        cmd(&["run"], vec![])
            .env(&[], &["TOKIO_WORKER_THREADS", "AzureWebJobsStorage"])
            .long_running(),
        // serve and dashboard stop at once on a port they cannot bind.
        cmd(&["serve"], vec![]).env(
            &[("FUNCTIONS_CUSTOMHANDLER_PORT", &port)],
            &["FUNCTIONS_CUSTOMHANDLER_PORT", "TOKIO_WORKER_THREADS"],
        ),
        cmd(
            &["dashboard"],
            vec![
                Part::Flag("--read-only"),
                opt("--listen", unreachable_listen),
            ],
        ),
        cmd(&["dashboard"], vec![Part::Flag("--read-only")]).env(
            &[("AQW_DASHBOARD_LISTEN", unreachable_listen)],
            &["AQW_DASHBOARD_LISTEN"],
        ),
        cmd(&["dashboard"], vec![keep("--listen", unreachable_listen)]).env(
            &[("AQW_DASHBOARD_TOKEN", token)],
            &[
                "AQW_DASHBOARD_TOKEN",
                "AQW_DASHBOARD_USER",
                "AQW_DASHBOARD_TRUSTED_PROXIES",
                "AQW_DASHBOARD_TRUST_PRINCIPAL",
                "AQW_DASHBOARD_PROXY_SECRET",
                "AQW_DASHBOARD_PUBLIC_URL",
            ],
        ),
        cmd(&["enqueue"], vec![pos(q), opt("--payload", payload)]),
        cmd(
            &["enqueue"],
            vec![pos(q), opt("--file", &valid_file), Part::Flag("--force")],
        ),
        cmd(&["enqueue"], vec![keep_pos(q), pos("-")]).stdin(payload.as_bytes()),
        cmd(
            &["enqueue"],
            vec![
                keep_pos(q),
                keep("--payload", payload),
                opt("--delay", "00:00:01"),
                opt("--ttl", "01:00:00"),
            ],
        ),
        cmd(
            &["enqueue"],
            vec![
                keep_pos(q),
                keep("--payload", payload),
                opt("--at", "2099-01-01T00:00:00Z"),
            ],
        ),
        cmd(&["status"], vec![]).env(
            &[],
            &[
                "AQW_LOG_FORMAT",
                "AQW_LOG",
                "RUST_LOG",
                "TOKIO_WORKER_THREADS",
                "AzureWebJobsStorage",
                "NO_COLOR",
            ],
        ),
        cmd(&["status"], vec![])
            .env(&[], &["AQW_APP"])
            .app_from_env(),
        cmd(&["status"], vec![]).env(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")],
            &[
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TIMEOUT",
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                "OTEL_EXPORTER_OTLP_HEADERS",
                "OTEL_EXPORTER_OTLP_COMPRESSION",
                "OTEL_TRACES_EXPORTER",
                "OTEL_SERVICE_NAME",
                "OTEL_RESOURCE_ATTRIBUTES",
                "OTEL_SDK_DISABLED",
                "AQW_TRACE_STORAGE",
                "APPLICATIONINSIGHTS_CONNECTION_STRING",
            ],
        ),
        cmd(
            &["pause"],
            vec![pos("Job"), opt("--reason", "r"), opt("--by", "t")],
        ),
        cmd(&["pause"], vec![keep_pos("Job")]).env(&[], &["USER"]),
        cmd(&["resume"], vec![pos("Job"), opt("--by", "t")]),
        cmd(
            &["poison", "list"],
            vec![
                pos(q),
                opt("--status", "all"),
                opt("--since", "01:00:00"),
                opt("--until", "2100-01-01T00:00:00Z"),
                opt("--function", "Job"),
                opt("--error", "HTTP"),
            ],
        ),
        cmd(
            &["poison", "show"],
            vec![pos(q), pos(id), Part::Flag("--pretty")],
        ),
        // Durable operations: dry runs only, so no value changes a record.
        cmd(
            &["ops", "fix"],
            vec![
                pos(q),
                opt("--patch", r#"[{"op":"add","path":"/c","value":1}]"#),
                opt("--error", ".*"),
                opt("--since", "01:00:00"),
                opt("--rate", "10"),
                opt("--halt-after", "3"),
                opt("--by", "t"),
                Part::Flag("--dry-run"),
            ],
        ),
        cmd(
            &["ops", "fix"],
            vec![
                keep_pos(q),
                opt("--patch-file", &valid_file),
                keep("--by", "t"),
                Part::Flag("--dry-run"),
            ],
        ),
        cmd(
            &["ops", "discard"],
            vec![
                keep_pos(q),
                opt("--reason", "r"),
                opt("--until", "2100-01-01T00:00:00Z"),
                opt("--function", "Job"),
                opt("--reviewed", "abc"),
                keep("--by", "t"),
                Part::Flag("--dry-run"),
            ],
        ),
        cmd(&["ops", "show"], vec![pos("no-such-op"), opt("--queue", q)]),
        cmd(
            &["ops", "cancel"],
            vec![pos("no-such-op"), opt("--by", "t"), keep("--queue", q)],
        ),
        cmd(
            &["ops", "resume"],
            vec![pos("no-such-op"), Part::Flag("--take-over")],
        ),
        cmd(&["ops", "list"], vec![opt("--queue", q)]),
        cmd(
            &["poison", "replay"],
            vec![
                pos(q),
                Part::Flag("--all"),
                Part::Flag("--dry-run"),
                Part::Flag("--past-provider-window"),
                opt("--error", ".*"),
                opt("--since", "01:00:00"),
                opt("--limit", "10"),
                opt("--rate", "100"),
                opt("--concurrency", "8"),
                opt("--by", "t"),
            ],
        ),
        cmd(
            &["poison", "replay"],
            vec![
                keep_pos(q),
                opt("--id", "no-such-record"),
                opt("--by", "t"),
                opt("--wait", "00:00:01"),
            ],
        ),
        cmd(
            &["poison", "replay"],
            vec![keep_pos(q), keep("--id", "no-such-record")],
        )
        .env(&[], &["USER"]),
        cmd(
            &["poison", "fix"],
            vec![
                pos(q),
                opt("--id", id),
                opt("--by", "t"),
                opt("--payload", r#"{"orderId":"o-9"}"#),
                Part::Flag("--dry-run"),
            ],
        ),
        cmd(
            &["poison", "fix"],
            vec![
                keep_pos(q),
                keep("--id", id),
                keep("--by", "t"),
                opt("--file", &valid_file),
                Part::Flag("--dry-run"),
            ],
        ),
        cmd(
            &["poison", "fix"],
            vec![
                keep_pos(q),
                pos("-"),
                keep("--id", id),
                keep("--by", "t"),
                Part::Flag("--dry-run"),
            ],
        )
        .stdin(br#"{"orderId":"o-9"}"#),
        cmd(
            &["poison", "fix"],
            vec![
                keep_pos(q),
                keep("--id", "no-such-record"),
                keep("--by", "t"),
                keep("--payload", r#"{"orderId":"o-9"}"#),
                opt("--wait", "00:00:01"),
            ],
        ),
        cmd(
            &["poison", "discard"],
            vec![
                pos(q),
                opt("--id", id),
                opt("--reason", "r"),
                opt("--by", "t"),
                Part::Flag("--close-key"),
                Part::Flag("--dry-run"),
            ],
        ),
        cmd(
            &["poison", "purge"],
            vec![
                pos(q),
                opt("--older-than", "90.00:00:00"),
                Part::Flag("--dry-run"),
            ],
        ),
        cmd(
            &["poison", "report"],
            vec![pos(q), opt("--since", "01:00:00")],
        ),
        cmd(&["keys", "show"], vec![pos("Job"), pos("job:o-1")]),
        cmd(
            &["keys", "list"],
            vec![
                pos("Job"),
                opt("--prefix", "job:"),
                opt("--status", "poisoned"),
                opt("--since", "01:00:00"),
                opt("--until", "2100-01-01T00:00:00Z"),
                opt("--limit", "10"),
            ],
        ),
        cmd(&["keys", "check"], vec![pos("Job"), pos("job:o-1")]),
        cmd(
            &["keys", "new-provider-key"],
            vec![
                pos("Job"),
                pos("job:o-1"),
                opt("--reason", "r"),
                opt("--by", "t"),
            ],
        ),
        cmd(
            &["keys", "purge"],
            vec![
                opt("--function", "Job"),
                opt("--older-than", "30.00:00:00"),
                Part::Flag("--dry-run"),
            ],
        ),
        cmd(&["config", "show"], vec![]),
        cmd(&["completions"], vec![pos("bash")]),
    ]
}

/// Two open poison records (a worker poisons two jobs its handler
/// refuses): their ids.
async fn two_poisoned(app: &TestApp) -> (String, String) {
    let a = app.enqueue(r#"{"orderId":"o-1"}"#).await;
    let b = app.enqueue(r#"{"orderId":"o-5"}"#).await;
    let w = app.start_worker(Scripted::new(|_, _| {
        Err(HandlerError::permanent("HTTP 404 Not Found: no such order"))
    }));
    eventually("two poison copies", DEADLINE, || async {
        (app.poison_messages().await.len() == 2).then_some(())
    })
    .await;
    w.stop().await;
    (a, b)
}

fn report(what: &str, total: usize, failures: &[String]) {
    println!(
        "hostile_input: {what}: {total} runs, {} failures",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{what}: {} of {total} runs failed (exit code outside 0..=3, a panic, or hung):\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_survives_hostile_values() {
    let app = TestApp::new(job_function(), json!({}), json!({}));
    let (id, other) = two_poisoned(&app).await;
    let files = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    make_files(files.path());
    // A port that is taken, so `aqw serve` stops at once once its checks pass.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ctx = Ctx {
        app: app.path().to_path_buf(),
        values: hostile_values(files.path()),
        apps: hostile_apps(files.path()),
        enums: hostile_enums(),
        stdin: hostile_stdin(),
    };
    let templates = templates(
        &app.queue,
        &id,
        files.path(),
        held.local_addr().unwrap().port(),
    );
    let rotation = rotation();
    let cases: Vec<Case> = templates
        .iter()
        .flat_map(|t| sample(t.cases(&ctx), rotation))
        .collect();
    // Last, as they change the records the runs above read: a --wait too
    // long for a clock, on a real replay and a real fix.
    let overflow = "--wait=213503982334601.00:00:00";
    let last: Vec<Case> = [
        vec!["poison", "replay", &app.queue, "--by=t", overflow],
        vec![
            "poison",
            "fix",
            &app.queue,
            "--by=t",
            r#"--payload={"orderId":"o-6"}"#,
            overflow,
        ],
    ]
    .into_iter()
    .zip([&id, &other])
    .map(|(line, id)| {
        let mut argv: Vec<OsString> = vec!["--app".into(), app.path().into()];
        argv.extend(line.into_iter().map(OsString::from));
        argv.push(format!("--id={id}").into());
        Case {
            argv,
            ..Case::default()
        }
    })
    .collect();
    let started = Instant::now();
    let (total, fails) = {
        let app_dir = app.path().to_path_buf();
        let files_dir = files.path().to_path_buf();
        let cwd_dir = cwd.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            let names = [
                (app_dir.as_os_str(), "$APP"),
                (files_dir.as_os_str(), "$FILES"),
            ];
            let mut fails = failures(&cases, &run_all(&cases, &cwd_dir), &names);
            fails.extend(failures(&last, &run_all(&last, &cwd_dir), &names));
            (cases.len() + last.len(), fails)
        })
        .await
        .unwrap()
    };
    println!("hostile_input: {total} runs in {:?}", started.elapsed());
    drop(held);
    app.cleanup().await;
    report(
        &format!("hostile command lines, {}", rotation_note(rotation)),
        total,
        &fails,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_exits_quietly() {
    let app = TestApp::new(job_function(), json!({}), json!({}));
    let id = poisoned_by_worker(&app, DEADLINE).await;
    let cwd = tempfile::tempdir().unwrap();
    let q = app.queue.as_str();
    let lines: Vec<Vec<&str>> = vec![
        vec!["config", "show"],
        vec!["config", "show", "--output", "json"],
        vec!["status"],
        vec!["status", "--output", "json"],
        vec!["poison", "list", q],
        vec!["poison", "list", q, "--output", "json"],
        vec!["poison", "show", q, &id],
        vec!["poison", "show", q, &id, "--output", "json"],
        vec!["poison", "replay", q, "--all", "--dry-run"],
        vec!["poison", "purge", q, "--dry-run"],
        vec!["poison", "report", q],
        vec!["poison", "report", q, "--output", "json"],
        vec!["keys", "list", "Job"],
        vec!["keys", "list", "Job", "--output", "json"],
        vec!["keys", "show", "Job", "job:o-1"],
        vec!["keys", "purge", "--dry-run"],
        vec!["completions", "bash"],
        vec!["completions", "zsh"],
        vec!["completions", "fish"],
        vec!["completions", "powershell"],
        vec!["completions", "elvish"],
        vec!["--help"],
        vec!["poison", "list", "--help"],
        vec!["help", "poison"],
        vec!["--version"],
    ];
    let cases: Vec<Case> = lines
        .iter()
        .map(|l| {
            let mut argv: Vec<OsString> = vec!["--app".into(), app.path().into()];
            argv.extend(l.iter().map(OsString::from));
            Case {
                argv,
                close_stdout: true,
                note: "(stdout closed) ".into(),
                ..Case::default()
            }
        })
        .collect();
    let app_dir = app.path().to_path_buf();
    let cwd_dir = cwd.path().to_path_buf();
    let (cases, fails) = tokio::task::spawn_blocking(move || {
        let names = [(app_dir.as_os_str(), "$APP")];
        let outcomes = run_all(&cases, &cwd_dir);
        let mut fails = failures(&cases, &outcomes, &names);
        // A pipe closed by its reader is not an error: exit 0, whatever the
        // command would have exited with.
        for (i, o) in &outcomes {
            if judge(o).is_none() && o.code != Some(0) {
                fails.push(format!(
                    "{}\n      → exit {:?}, not 0: {}",
                    label(&cases[*i], &names),
                    o.code,
                    clip(o.stderr.lines().next().unwrap_or(""))
                ));
            }
        }
        (cases, fails)
    })
    .await
    .unwrap();
    app.cleanup().await;
    report("closed stdout", cases.len(), &fails);
}

/// Every number and timespan of host.json (and the settings next to them),
/// with the parent object's other keys a valid setting needs.
fn host_fields() -> Vec<(&'static str, Value)> {
    let plain = [
        "/extensions/queues/maxDequeueCount",
        "/extensions/queues/visibilityTimeout",
        "/extensions/queues/batchSize",
        "/extensions/queues/newBatchThreshold",
        "/extensions/queues/maxPollingInterval",
        "/extensions/queues/messageEncoding",
        "/functionTimeout",
        "/aqw/lease",
        "/aqw/shutdownTimeout",
        "/aqw/maxDeferral",
        "/aqw/retry/initialDelay",
        "/aqw/retry/maxDelay",
        "/aqw/retry/strategy",
        "/aqw/retention/sourceMessageTtl",
        "/aqw/retention/keys",
        "/aqw/retention/closedRecords",
        "/aqw/retention/sweep/requestsPerSecond",
        "/aqw/retention/sweep/interval",
        "/aqw/retention/sweep/lease",
        "/aqw/poison/ttl",
        "/aqw/http/port",
        "/aqw/http/metricsInterval",
        "/aqw/breaker/failureRatio",
        "/aqw/breaker/minimumAttempts",
        "/aqw/breaker/window",
        "/aqw/breaker/coolDown",
        "/aqw/breaker/maxCoolDown",
        "/aqw/breaker/probes",
        "/aqw/functions/Job/providerKeyWindow",
        "/aqw/functions/Job/expiry",
        "/aqw/functions/Job/limits/callsPerSecond",
        "/aqw/functions/Job/limits/inFlight",
        "/aqw/functions/Job/handler/timeout",
        "/aqw/functions/Job/handler/lookup/timeout",
    ];
    let mut v: Vec<(&'static str, Value)> = plain.iter().map(|p| (*p, json!({}))).collect();
    v.push((
        "/aqw/alert/window",
        json!({"webhook": "http://127.0.0.1:9/alert"}),
    ));
    v.push((
        "/aqw/functions/Job/limits/perKey/inFlight",
        json!({"key": "{/orderId}"}),
    ));
    v
}

/// JSON values for a host.json field; `__RAW__x` is written as the bare
/// text x (numbers JSON allows but no f64 or i64 holds).
fn hostile_json() -> Vec<Value> {
    let mut v = vec![
        json!(-1),
        json!(0),
        json!(1),
        json!(0.5),
        json!(-0.5),
        json!(1e308),
        json!(-1e308),
        json!(5e-324),
        json!(u64::MAX),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(4294967296u64),
        json!(65536),
        json!(null),
        json!(true),
        json!([]),
        json!({}),
    ];
    for s in [
        "",
        "   ",
        "0",
        "-1",
        "NaN",
        "inf",
        "1e309",
        "10000000.00:00:00",
        "213503982334601.00:00:00",
        "10675199.02:48:05.4775807",
        "-00:00:01",
        "00:00:-1",
        "25:61:61",
        "24:00:00",
        "00:00:00",
        "00:00:00.0000001",
        "a\u{1b}[31m\nb",
        "\u{202E}evil",
    ] {
        v.push(json!(s));
    }
    v.push(json!("x".repeat(100_000)));
    for raw in [
        "1e309",
        "18446744073709551616",
        "-9223372036854775809",
        "1e-400",
    ] {
        v.push(json!(format!("__RAW__{raw}")));
    }
    v
}

/// `host` with `value` at `pointer` (objects on the way created, `siblings`
/// merged into its parent), as the text of a host.json.
fn host_with(host: &Value, pointer: &str, siblings: &Value, value: &Value) -> String {
    let mut host = host.clone();
    let keys: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    let (last, path) = keys.split_last().unwrap();
    let mut cur = &mut host;
    for k in path {
        if !cur.get(*k).is_some_and(Value::is_object) {
            cur[*k] = json!({});
        }
        cur = cur.get_mut(*k).unwrap();
    }
    for (k, v) in siblings.as_object().unwrap() {
        cur[k] = v.clone();
    }
    cur[*last] = value.clone();
    let text = serde_json::to_string_pretty(&host).unwrap();
    match value.as_str().and_then(|s| s.strip_prefix("__RAW__")) {
        Some(raw) => text.replace(&format!("\"__RAW__{raw}\""), raw),
        None => text,
    }
}

/// A host.json value as a note: its JSON text, bidi overrides escaped,
/// long ones shortened.
fn json_note(v: &Value) -> String {
    let text = v.to_string().replace('\u{202E}', "\\u202e");
    match text.char_indices().nth(40) {
        Some((i, _)) => format!("{}…({} bytes)", &text[..i], text.len()),
        None => text,
    }
}

/// One app folder per hostile host.json value, each function on its own
/// queue (so each `run` below has jobs of its own); `config show` on each.
fn host_json_cases(app: &TestApp, apps: &Path, rotation: Option<usize>) -> Vec<Case> {
    let host: Value =
        serde_json::from_str(&std::fs::read_to_string(app.path().join("host.json")).unwrap())
            .unwrap();
    let mut cases = vec![];
    let mut k = 0;
    for (pointer, siblings) in host_fields() {
        for value in hostile_json() {
            k += 1;
            if rotation.is_some_and(|r| k % STRIDE != r) {
                continue;
            }
            // Numbered in the sample: the test names queues by case index.
            let n = cases.len();
            let mut host = host.clone();
            host["aqw"]["functions"]["Job"]["queue"] = json!(format!("{}-{n}", app.queue));
            let dir = apps.join(n.to_string());
            std::fs::create_dir(&dir).unwrap();
            let text = host_with(&host, pointer, &siblings, &value);
            std::fs::write(dir.join("host.json"), text).unwrap();
            cases.push(Case {
                argv: vec!["--app".into(), dir.into(), "config".into(), "show".into()],
                note: format!("(host.json {pointer} = {}) ", json_note(&value)),
                ..Case::default()
            });
        }
    }
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_host_json_values_get_a_defined_exit() {
    let app = TestApp::new(job_function(), json!({}), json!({}));
    let apps = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let names = [(apps.path().as_os_str().to_owned(), "$APPS")];
    let rotation = rotation();
    let cases = host_json_cases(&app, apps.path(), rotation);
    let run = |cases: Vec<Case>| {
        let (cwd, names) = (cwd.path().to_path_buf(), names.clone());
        tokio::task::spawn_blocking(move || {
            let names: Vec<(&OsStr, &str)> =
                names.iter().map(|(p, n)| (p.as_os_str(), *n)).collect();
            let outcomes = run_all(&cases, &cwd);
            let fails = failures(&cases, &outcomes, &names);
            (cases, outcomes, fails)
        })
    };
    let (cases, outcomes, mut fails) = run(cases).await.unwrap();
    // What `config show` accepted, `status` reads and `run` works with for a
    // while, two jobs on its queue (stopped after 2 s unless it ended or
    // panicked first).
    let mut more = vec![];
    let mut queues = vec![];
    for (i, _) in outcomes.iter().filter(|(_, o)| o.code == Some(0)) {
        let queue = app.storage().queue(&format!("{}-{i}", app.queue));
        queue.create_if_missing().await.unwrap();
        for n in 0..2 {
            let text = aqw_core::message::encode(
                &format!(r#"{{"orderId":"h-{n}"}}"#),
                app.config.message_encoding,
            );
            queue
                .put(&text, Duration::ZERO, aqw_core::storage::Ttl::Default)
                .await
                .unwrap();
        }
        queues.push(format!("{}-{i}", app.queue));
        let mut status = cases[*i].clone();
        status.argv.truncate(2);
        status.argv.push("status".into());
        let mut run = status.clone();
        run.argv[2] = "run".into();
        run.run_for = Some(Duration::from_secs(2));
        more.extend([status, run]);
    }
    let (more, _, more_fails) = run(more).await.unwrap();
    fails.extend(more_fails);
    println!(
        "hostile_input: host.json: {} hostile settings accepted by config show",
        queues.len()
    );
    for q in &queues {
        let _ = app.storage().queue(q).delete_queue().await;
        let _ = app
            .storage()
            .queue(&format!("{q}-poison"))
            .delete_queue()
            .await;
    }
    app.cleanup().await;
    report(
        &format!("hostile host.json values, {}", rotation_note(rotation)),
        cases.len() + more.len(),
        &fails,
    );
}

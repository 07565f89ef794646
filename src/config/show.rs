//! `aqw config show`: the effective configuration, resolved, as name /
//! value / source rows. Secrets never appear: a connection is shown as its
//! account, endpoints and credential kind; URLs lose user info and query;
//! tokens are only said to be set.

use super::{AppConfig, HandlerSpec, KeySpec, RetryStrategy};
use aqw_azure::Credentials;
use aqw_core::config::StorageAccount;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// Where a setting's value came from.
/// Serialized as the text shows it (`host.json`, `local.settings.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Source {
    /// The process environment (wins over local.settings.json).
    #[serde(rename = "environment")]
    Environment,
    /// `Values` of local.settings.json in the app folder.
    #[serde(rename = "local.settings.json")]
    LocalSettings,
    /// host.json.
    #[serde(rename = "host.json")]
    HostJson,
    /// `<Function>/function.json`.
    #[serde(rename = "function.json")]
    FunctionJson,
    /// Not set anywhere: aqw's default.
    #[serde(rename = "default")]
    Default,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Environment => "environment",
            Source::LocalSettings => "local.settings.json",
            Source::HostJson => "host.json",
            Source::FunctionJson => "function.json",
            Source::Default => "default",
        }
    }
}

/// One effective setting.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Setting {
    pub name: String,
    pub value: String,
    pub source: Source,
}

/// Where settings are looked up, to name each one's source.
pub struct Lookup<'a> {
    /// The process environment.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// `Values` of local.settings.json.
    pub local: BTreeMap<String, String>,
    /// host.json as written.
    pub host: Value,
}

impl Lookup<'_> {
    /// The source of an app setting (environment first, as `load` reads it).
    fn setting(&self, name: &str) -> Option<Source> {
        if (self.env)(name).is_some_and(|v| !v.is_empty()) {
            Some(Source::Environment)
        } else if self.local.get(name).is_some_and(|v| !v.is_empty()) {
            Some(Source::LocalSettings)
        } else {
            None
        }
    }

    /// host.json if it has `pointer`, else the default.
    fn host(&self, pointer: &str) -> Source {
        if self.host.pointer(pointer).is_some() {
            Source::HostJson
        } else {
            Source::Default
        }
    }
}

/// The lookup of `app_dir` over the process environment.
pub fn lookup(app_dir: &std::path::Path) -> Result<Lookup<'static>, super::ConfigError> {
    let local = super::settings::read_local_settings(app_dir)?;
    let host = std::fs::read_to_string(app_dir.join("host.json"))
        .ok()
        .and_then(|t| serde_json::from_str(t.trim_start_matches('\u{feff}')).ok())
        .unwrap_or(Value::Null);
    Ok(Lookup {
        env: &|k| std::env::var(k).ok(),
        local,
        host,
    })
}

/// The effective configuration of `app`, every row safe to print.
pub fn effective(app: &AppConfig, look: &Lookup) -> Vec<Setting> {
    let mut out = Vec::new();
    let mut row = |name: &str, value: String, source: Source| {
        out.push(Setting {
            name: name.into(),
            value,
            source,
        })
    };
    let q = "/extensions/queues";
    row(
        "maxDequeueCount",
        app.max_dequeue_count.to_string(),
        look.host(&format!("{q}/maxDequeueCount")),
    );
    row(
        "batchSize",
        app.batch_size.to_string(),
        look.host(&format!("{q}/batchSize")),
    );
    row(
        "maxPollingInterval",
        secs(app.max_polling_interval),
        look.host(&format!("{q}/maxPollingInterval")),
    );
    row(
        "messageEncoding",
        app.message_encoding.as_str().into(),
        look.host(&format!("{q}/messageEncoding")),
    );
    row("retry", retry(&app.retry), look.host("/aqw/retry"));
    row("lease", secs(app.lease), look.host("/aqw/lease"));
    later_rows(app, look, &mut row);
    table_rows(app, look, &mut row);
    claim_check_row(app, look, &mut row);
    let port = app.http_port.map_or("off".into(), |p| p.to_string());
    row("http.port", port, look.host("/aqw/http/port"));
    delivery_rows(app, look, &mut row);
    environment_rows(look, &mut row);
    let dynamic = match app.dynamic_concurrency {
        true => "on: applied by the Functions host under aqw serve; not supported by aqw run, which keeps batchSize",
        false => "off",
    };
    row(
        "dynamicConcurrency",
        dynamic.into(),
        look.host("/concurrency/dynamicConcurrencyEnabled"),
    );
    for f in &app.functions {
        function_rows(f, look, &mut row);
        override_rows(app, f, look, &mut row);
    }
    schedule_rows(app, look, &mut row);
    out
}

/// How a provider's "later" is waited out: the deferral, the in-progress
/// timeout, the adaptive rate.
fn later_rows(app: &AppConfig, look: &Lookup, row: &mut impl FnMut(&str, String, Source)) {
    row(
        "maxDeferral",
        secs(app.max_deferral),
        look.host("/aqw/maxDeferral"),
    );
    row(
        "inProgressTimeout",
        secs(app.in_progress_timeout),
        look.host("/aqw/inProgressTimeout"),
    );
    let adaptive = if app.adaptive_rate {
        "on (learns each provider's limit from its 429s; limits.callsPerSecond is the ceiling; the rate learned now: aqw status, aqw_fleet_adaptive_rate)"
    } else {
        "off"
    };
    row(
        "adaptiveRate",
        adaptive.into(),
        look.host("/aqw/adaptiveRate"),
    );
}

/// Each schedule of `aqw.schedules`: when, which function, the catch-up.
fn schedule_rows(app: &AppConfig, look: &Lookup, row: &mut impl FnMut(&str, String, Source)) {
    for s in &app.schedules {
        let what = format!(
            "{} → {} (catch-up {})",
            s.when.describe(),
            s.function,
            s.catch_up.as_str()
        );
        let at = format!("/aqw/schedules/{}", s.name);
        row(&format!("schedules.{}", s.name), what, look.host(&at));
    }
}

/// A function's own queue settings (`aqw.functions.<Name>.maxDequeueCount`,
/// `.visibilityTimeout`, `.batchSize`, `.retry`), each shown only when set.
fn override_rows(
    app: &AppConfig,
    f: &super::FunctionConfig,
    look: &Lookup,
    row: &mut impl FnMut(&str, String, Source),
) {
    let o = &f.overrides;
    let host = |what: &str| look.host(&format!("/aqw/functions/{}/{what}", f.name));
    let at = |what: &str| format!("functions.{}.{what}", f.name);
    if let Some(n) = o.max_dequeue_count {
        let note = format!("{n} (app: {})", app.max_dequeue_count);
        row(&at("maxDequeueCount"), note, host("maxDequeueCount"));
    }
    if let Some(v) = o.visibility_timeout {
        row(&at("visibilityTimeout"), secs(v), host("visibilityTimeout"));
    }
    if let Some(b) = o.batch_size {
        let note = format!("{b} (aqw run; the host's batchSize under aqw serve)");
        row(&at("batchSize"), note, host("batchSize"));
    }
    if let Some(r) = &o.retry {
        let source = match host("retry") {
            Source::Default => host("visibilityTimeout"),
            s => s,
        };
        row(&at("retry"), retry(r), source);
    }
}

/// The tables aqw keeps its keys, records and heartbeats in.
/// `aqw.claimCheck`: when a job goes to a blob, and where.
fn claim_check_row(app: &AppConfig, look: &Lookup, row: &mut impl FnMut(&str, String, Source)) {
    let c = &app.claim_check;
    let value = match c.enabled {
        true => format!(
            "a payload over {} bytes goes to blob container {}",
            c.threshold, c.container
        ),
        false => "off (a payload that does not fit a message is refused)".into(),
    };
    row("claimCheck", value, look.host("/aqw/claimCheck"));
    row(
        "claimCheck.maxBytes",
        format!(
            "a reference may name a body of at most {} bytes",
            c.max_bytes
        ),
        look.host("/aqw/claimCheck/maxBytes"),
    );
}

fn table_rows(app: &AppConfig, look: &Lookup, row: &mut impl FnMut(&str, String, Source)) {
    for (name, table) in [
        ("keys", &app.keys_table),
        ("poison", &app.poison_table),
        ("heartbeats", &app.heartbeat_table),
    ] {
        row(
            &format!("tables.{name}"),
            table.clone(),
            look.host(&format!("/aqw/tables/{name}")),
        );
    }
}

/// The alert's delivery and the gauges' refresh; the signing secret only
/// as set or not.
fn delivery_rows(app: &AppConfig, look: &Lookup, row: &mut impl FnMut(&str, String, Source)) {
    let webhook = app
        .alert_webhook
        .as_ref()
        .map_or("off".into(), |u| safe_url(u.as_str()));
    row("alert.webhook", webhook, look.host("/aqw/alert/webhook"));
    let format = format!("{:?}", app.alert_format).to_lowercase();
    row("alert.format", format, look.host("/aqw/alert/format"));
    row(
        "alert.throttledFor",
        secs(app.alert_throttled_for),
        look.host("/aqw/alert/throttledFor"),
    );
    let dashboard = app
        .alert_dashboard_url
        .as_ref()
        .map_or("off".into(), |u| safe_url(u.as_str()));
    row(
        "alert.dashboardUrl",
        dashboard,
        look.host("/aqw/alert/dashboardUrl"),
    );
    let runbook = app
        .alert_runbook_url
        .as_ref()
        .map_or("aqw oncall (the runbook in this binary)".into(), |u| {
            safe_url(u.as_str())
        });
    row(
        "alert.runbookUrl",
        runbook,
        look.host("/aqw/alert/runbookUrl"),
    );
    let secret = match &app.alert_secret {
        Some(_) => "(set, not shown)".to_string(),
        None => "off".to_string(),
    };
    row("alert.secret", secret, look.host("/aqw/alert/secret"));
    let interval = secs(app.metrics_interval);
    row(
        "http.metricsInterval",
        interval,
        look.host("/aqw/http/metricsInterval"),
    );
}

/// The rows read from the environment: ports, the dashboard, exporters.
fn environment_rows(look: &Lookup, row: &mut impl FnMut(&str, String, Source)) {
    for name in ["FUNCTIONS_CUSTOMHANDLER_PORT", "AQW_DASHBOARD_LISTEN"] {
        if let Some(src) = look.setting(name) {
            row(name, setting_value(look, name, src), src);
        }
    }
    for name in [
        "AQW_DASHBOARD_TOKEN",
        "APPLICATIONINSIGHTS_CONNECTION_STRING",
    ] {
        if let Some(src) = look.setting(name) {
            row(name, "(set, not shown)".into(), src);
        }
    }
    let exporters = crate::traces::export::targets_from_env(|k| {
        let src = look.setting(k)?;
        Some(setting_value(look, k, src))
    });
    let exporters = match exporters {
        Ok(t) if t.is_empty() => "none".into(),
        Ok(t) => t
            .iter()
            .map(|t| t.describe())
            .collect::<Vec<_>>()
            .join("; "),
        Err(e) => format!("invalid: {e}"),
    };
    row("exporters", exporters, Source::Environment);
    if let Some(src) = look.setting("AQW_TRACE_STORAGE") {
        let value = setting_value(look, "AQW_TRACE_STORAGE", src);
        row("AQW_TRACE_STORAGE", value, src);
    }
}

/// The rows of one function: queue, connection, handler, key, cap.
fn function_rows(
    f: &super::FunctionConfig,
    look: &Lookup,
    row: &mut impl FnMut(&str, String, Source),
) {
    let at = |what: &str| format!("functions.{}.{what}", f.name);
    let h = format!("/aqw/functions/{}/handler", f.name);
    let queue_source = match look.host(&format!("/aqw/functions/{}/queue", f.name)) {
        Source::HostJson => Source::HostJson,
        _ => Source::FunctionJson,
    };
    row(&at("queue"), f.queue.clone(), queue_source);
    let conn_source = look
        .setting(&f.connection.setting)
        .or_else(|| look.setting(&format!("{}__accountName", f.connection.setting)))
        .unwrap_or(Source::Environment);
    row(&at("connection"), connection(&f.connection), conn_source);
    let (handler, source) = handler_row(&f.handler, look, &h);
    row(&at("handler"), handler, source);
    let key = match &f.key {
        KeySpec::Template(t) => format!("template {}", t.source()),
        KeySpec::PayloadField => "the payload's idempotencyKey field".into(),
        KeySpec::None => "none (naturally idempotent)".into(),
    };
    row(
        &at("key"),
        key,
        look.host(&format!("/aqw/functions/{}/key", f.name)),
    );
    if !f.limits.is_empty() {
        row(
            &at("limits"),
            limits(&f.limits),
            look.host(&format!("/aqw/functions/{}/limits", f.name)),
        );
    }
    if f.expiry == super::Expiry::Expected {
        row(
            &at("expiry"),
            "expected (held messages may expire: counted, not rescued)".into(),
            look.host(&format!("/aqw/functions/{}/expiry", f.name)),
        );
    }
    if !f.redact.is_empty() {
        row(
            &at("redact"),
            f.redact.pointers().join(", "),
            look.host(&format!("/aqw/functions/{}/redact", f.name)),
        );
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The function's handler in one line, and where it was set.
fn handler_row(handler: &HandlerSpec, look: &Lookup, at: &str) -> (String, Source) {
    match handler {
        HandlerSpec::Http {
            url,
            timeout,
            answers,
        } => (
            format!(
                "http POST {} (timeout {}, replay header {}, replay marker {}, refused {}, lookup {}, idempotent {}, saves failures {})",
                safe_url(url.as_str()),
                secs(*timeout),
                answers.replay_header.as_deref().unwrap_or("none"),
                answers
                    .replay_marker
                    .as_ref()
                    .map_or("none".into(), |m| format!("{} = {}", m.pointer, m.value)),
                refused(&answers.refused_statuses),
                answers
                    .lookup
                    .as_ref()
                    .map_or("none".into(), |l| format!("GET {}", safe_url(&l.url))),
                yes_no(answers.idempotent),
                yes_no(answers.saves_failures),
            ),
            look.host(at),
        ),
        HandlerSpec::Exec { command, .. } => (
            format!("exec {}", command.first().map(String::as_str).unwrap_or("")),
            look.host(at),
        ),
        HandlerSpec::Registered => ("registered in code".into(), Source::Default),
    }
}

/// A function's flow limits in one line.
fn limits(l: &aqw_core::flow::FlowLimits) -> String {
    let mut parts = Vec::new();
    if let Some(r) = l.calls_per_second {
        parts.push(format!("{r} calls/s"));
    }
    if let Some(n) = l.in_flight {
        parts.push(format!("{n} in flight"));
    }
    if let Some(k) = &l.per_key {
        parts.push(format!("{} in flight per {}", k.in_flight, k.key.source()));
    }
    format!("{} (fleet-wide)", parts.join(", "))
}

/// The value of a setting from its source (environment or local.settings.json).
fn setting_value(look: &Lookup, name: &str, source: Source) -> String {
    let v = match source {
        Source::Environment => (look.env)(name),
        _ => look.local.get(name).cloned(),
    };
    v.unwrap_or_default()
}

/// A connection without its secret: account, queue endpoint, credential kind.
fn connection(account: &StorageAccount) -> String {
    let Ok(c) = aqw_azure::connection_of(account) else {
        return account.setting.clone();
    };
    let kind = match &c.credentials {
        Credentials::SharedKey { .. } => "account key (not shown)".to_string(),
        Credentials::Sas { .. } => "SAS token (not shown)".to_string(),
        Credentials::Identity { client_id } => match client_id {
            Some(id) => format!("identity (client id {id})"),
            None => "identity".into(),
        },
    };
    format!(
        "{} ({}) via {}, {kind}",
        c.setting,
        c.account,
        safe_url(&c.queue_endpoint)
    )
}

/// A URL fit to print: no user info, no query (SAS tokens, codes).
pub fn safe_url(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        Err(_) => "(not a URL)".into(),
    }
}

fn refused(statuses: &[u16]) -> String {
    let mut all = vec![425, 429];
    all.extend_from_slice(statuses);
    all.sort_unstable();
    all.dedup();
    all.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
}

fn retry(r: &RetryStrategy) -> String {
    match r {
        RetryStrategy::Exponential {
            initial_delay,
            max_delay,
        } => format!(
            "exponential from {} to {}",
            secs(*initial_delay),
            secs(*max_delay)
        ),
        RetryStrategy::Fixed { delay } => format!("fixed {}", secs(*delay)),
    }
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

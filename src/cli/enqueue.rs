//! `aqw enqueue`: put a job on a queue, encoded per the app's
//! messageEncoding, with its delivery (`--delay`, `--at`, `--ttl`) checked first.

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{connect, load, read_payload};
use crate::cli::output::{print_json, Output};
use aqw_core::config::MessageEncoding;
use aqw_core::idempotency::fmt_time;
use aqw_core::ops::{self, Enqueued};
use clap::Args;
use std::path::{Path, PathBuf};
use tracing::Instrument;

/// Put a job on a queue, encoded per the app's messageEncoding.
#[derive(Args)]
#[command(
    after_help = "Examples:\n  aqw enqueue receipts --payload '{\"orderId\":\"o-1\"}'\n  jq -c . order.json | aqw enqueue receipts -\n  aqw enqueue receipts --file order.json --delay 00:30:00\n  aqw enqueue receipts --file order.json --at 2026-12-24T18:00:00Z --ttl never"
)]
pub struct EnqueueArgs {
    /// Target queue (a configured function's queue).
    pub queue: String,
    /// The payload as text (JSON for keyed functions).
    #[arg(long, conflicts_with = "file")]
    pub payload: Option<String>,
    /// Read the payload from a file.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// `-` reads the payload from standard input.
    #[arg(value_name = "-")]
    pub stdin: Option<String>,
    /// Enqueue even if the worker would poison it at once (no key derivable).
    #[arg(long)]
    pub force: bool,
    /// Deliver after this long ([d.]hh:mm:ss, under 7 days and shorter than --ttl).
    #[arg(long, value_name = "DURATION", conflicts_with = "at")]
    pub delay: Option<String>,
    /// Deliver at this time (RFC 3339, within 7 days).
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// The message's time-to-live from the put ([d.]hh:mm:ss, 1 s to 7
    /// days, or `never`); default: 7 days.
    #[arg(long, value_name = "DURATION|never")]
    pub ttl: Option<String>,
}

pub(super) async fn run(app_dir: &Path, a: EnqueueArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let payload = read_payload(a.payload, a.file, a.stdin.as_deref())?;
    // The producer span; its context goes into the payload where
    // aqw.tracing.parent says (joining TRACEPARENT from the environment).
    let span = aqw_core::traces::enqueue_span(&a.queue);
    let payload = ops::with_trace_context(&app, &payload, &span);
    let delivery = parse_delivery(a.delay.as_deref(), a.at.as_deref(), a.ttl.as_deref())?;
    let job = ops::prepare_enqueue(&app, &a.queue, &payload, a.force)?;
    let storage = connect(&job.connection)?;
    let done = ops::enqueue_with(job, delivery, storage.as_ref())
        .instrument(span)
        .await?;
    print_enqueued(&done, output);
    Ok(Exit::Ok)
}

/// `enqueue --delay/--at/--ttl` as a [`ops::Delivery`]: each value checked,
/// and the pair against the service's rules, before anything is sent.
fn parse_delivery(
    delay: Option<&str>,
    at: Option<&str>,
    ttl: Option<&str>,
) -> Result<ops::Delivery, Failure> {
    let ttl = match ttl {
        None => aqw_core::storage::Ttl::Default,
        Some("never") => aqw_core::storage::Ttl::Never,
        Some(t) => aqw_core::storage::Ttl::After(
            aqw_core::config::parse_timespan(t)
                .map_err(|e| Failure::usage(format!("--ttl: {e}")))?,
        ),
    };
    let delivery = match (delay, at) {
        (Some(d), _) => {
            let d = aqw_core::config::parse_timespan(d)
                .map_err(|e| Failure::usage(format!("--delay: {e}")))?;
            ops::Delivery::after(d, ttl)
        }
        (None, Some(t)) => {
            let when =
                time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                    .map_err(|_| {
                        Failure::usage(format!(
                            "--at: \"{t}\" is not an RFC 3339 time (2026-12-24T18:00:00Z)"
                        ))
                    })?;
            ops::Delivery::at(when, aqw_core::clock::now_utc(), ttl)
        }
        (None, None) => ops::Delivery::after(std::time::Duration::ZERO, ttl),
    };
    delivery.map_err(|e| Failure::usage(format!("--delay/--at/--ttl: {e}")))
}

/// `enqueue`: the message id, key and encoding.
fn print_enqueued(e: &Enqueued, output: Output) {
    let enc = match e.encoding {
        MessageEncoding::Base64 => "base64",
        MessageEncoding::None => "none",
    };
    if output == Output::Json {
        print_json(
            &serde_json::json!({"queue": e.queue, "messageId": e.message_id, "key": e.key.as_ref().map(|k| k.to_string()), "encoding": enc, "visibleAt": e.visible_at.map(fmt_time), "blob": e.blob}),
        );
    } else {
        let when = e
            .visible_at
            .map(|t| format!(", visible at {}", fmt_time(t)))
            .unwrap_or_default();
        let blob = e
            .blob
            .as_ref()
            .map(|b| format!(", body in blob {b}"))
            .unwrap_or_default();
        outln!(
            "enqueued {} to {} (key {}, encoding {enc}{when}{blob})",
            e.message_id,
            e.queue,
            e.key
                .as_ref()
                .map(|k| format!("{:?}", k.as_str()))
                .unwrap_or("none".into())
        );
    }
}

//! `aqw status`: depth and poison count per queue, each schedule's next
//! and last tick, and what holds a function (a pause, a breaker not closed).

use crate::cli::exit::{Exit, Failure};
use crate::cli::load::{load, queue_ops};
use crate::cli::output::{print_json, Output};
use aqw_core::ops::{self, QueueStatus};
use aqw_core::schedule::ScheduleStatus;
use aqw_core::scrub::one_line;
use clap::Args;
use std::path::Path;

/// Depth and poison count per queue; exit 1 while any poison record is
/// open, a function is paused, or a breaker is not closed.
#[derive(Args)]
#[command(
    after_help = "Exit codes: 0 nothing needs a person; 1 a poison record is open, a function is paused, or a breaker is open or half-open (its own or the fleet's); 2 bad arguments or configuration; 3 storage error.\n\nExamples:\n  aqw status\n  aqw status --output json"
)]
// No arguments but the global ones; `group(skip)`: no empty argument group.
#[group(skip)]
pub struct StatusArgs {}

pub(super) async fn run(app_dir: &Path, _: StatusArgs, output: Output) -> Result<Exit, Failure> {
    let app = load(app_dir)?;
    let mut lines = Vec::new();
    for f in &app.functions {
        lines.push(ops::status(&queue_ops(&app, &f.queue)?).await?);
    }
    let open: usize = lines.iter().map(|l| l.open_records).sum();
    let mut schedules = Vec::new();
    for s in &app.schedules {
        let f = app.function(&s.function).ok_or_else(|| {
            Failure::usage(format!(
                "schedule {}: no function named {}",
                s.name, s.function
            ))
        })?;
        let qo = queue_ops(&app, &f.queue)?;
        // One unreadable schedule (a bad row) is shown as such, not the
        // end of the whole status.
        let status = aqw_core::schedule::status(&app, s, qo.control.table().as_ref(), &qo.keys)
            .await
            .unwrap_or_else(|e| {
                let why = aqw_core::scrub::scrub(&e.to_string());
                aqw_core::schedule::ScheduleStatus::unread(s, why)
            });
        schedules.push(status);
    }
    print_status(&lines, &schedules, open, output);
    print_control(&lines, output);
    let held = lines.iter().any(|l| l.held());
    Ok(Exit::needs_a_person_if(open > 0 || held))
}

/// `status`: one line per queue.
fn print_status(lines: &[QueueStatus], schedules: &[ScheduleStatus], open: usize, output: Output) {
    if output == Output::Json {
        print_json(
            &serde_json::json!({"queues": lines, "schedules": schedules, "openPoisonRecords": open,
                "triage": lines.iter().filter(|l| l.open_records > 0)
                    .map(|l| aqw_core::alert::triage_command(&l.queue)).collect::<Vec<_>>()}),
        );
        return;
    }
    status_queues(lines);
    status_schedules(schedules);
}

/// `status`: one line per schedule (none when the app has none).
fn status_schedules(schedules: &[ScheduleStatus]) {
    if schedules.is_empty() {
        return;
    }
    outln!("");
    outln!(
        "{:<20} {:<20} {:<22}  {:<22}  LAST TICK",
        "SCHEDULE",
        "FUNCTION",
        "WHEN",
        "NEXT TICK"
    );
    for s in schedules {
        let last = match (&s.last_tick, &s.last_outcome) {
            _ if s.error.is_some() => format!(
                "cannot read: {}",
                one_line(s.error.as_deref().unwrap_or(""))
            ),
            (Some(t), Some(o)) => format!("{t} ({o})"),
            (Some(t), None) => t.clone(),
            (None, _) => "none yet".to_string(),
        };
        outln!(
            "{:<20} {:<20} {:<22}  {:<22}  {last}",
            one_line(&s.name),
            s.function,
            format!("{} (catch-up {})", s.when, s.catch_up),
            s.next.as_deref().unwrap_or("never")
        );
    }
}

fn status_queues(lines: &[QueueStatus]) {
    outln!(
        "{:<20} {:<24} {:>8} {:>8} {:>6}  {:<20}  LAST POLL",
        "FUNCTION",
        "QUEUE",
        "DEPTH",
        "POISON",
        "OPEN",
        "OLDEST OPEN"
    );
    for l in lines {
        let polled = match (&l.last_poll, l.polling_workers) {
            (None, _) => "never (no worker has polled)".to_string(),
            (Some(t), 0) => format!("{t} (NOT polling now)"),
            (Some(t), n) => format!("{t} ({n} worker(s) polling)"),
        };
        outln!(
            "{:<20} {:<24} {:>8} {:>8} {:>6}  {:<20}  {polled}",
            l.function,
            l.queue,
            l.depth.map(|d| d.to_string()).unwrap_or("-".into()),
            l.poison_depth.map(|d| d.to_string()).unwrap_or("-".into()),
            l.open_records,
            l.oldest_open.as_deref().unwrap_or("-")
        );
    }
}

/// Under the status table: each paused function and each breaker not
/// closed, with who, when and why, and each function's learned call rate
/// while its provider throttles it (in JSON they are on each queue's line).
fn print_control(lines: &[QueueStatus], output: Output) {
    if output == Output::Json {
        return;
    }
    for l in lines {
        if let Some(r) = &l.learned_rate {
            outln!("RATE     {} {}", l.function, r.describe());
        }
    }
    for l in lines {
        if let Some(p) = &l.control.pause {
            let why = if p.reason.is_empty() {
                "no reason given".to_string()
            } else {
                one_line(&p.reason)
            };
            outln!(
                "PAUSED   {} by {} at {}: {why}",
                l.function,
                one_line(&p.by),
                p.at
            );
        }
        if let Some(b) = l.control.breaker.as_ref().filter(|b| b.state != "closed") {
            outln!(
                "BREAKER  {} {} since {} (worker {}): {}",
                l.function,
                b.state,
                b.at,
                b.worker,
                one_line(&b.reason)
            );
        }
    }
    for l in lines.iter().filter(|l| l.open_records > 0) {
        outln!(
            "TRIAGE   {} open record(s) on {}: start with `{}` (grouped by cause, with the next commands)",
            l.open_records,
            l.queue,
            aqw_core::alert::triage_command(&l.queue)
        );
    }
}

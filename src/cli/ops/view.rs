//! An operation as the CLI prints it (a fix's patch as a person may see
//! it), and the exit code its state means.

use crate::cli::exit::Exit;
use crate::cli::output::{print_json, Output};
use aqw_core::config::AppConfig;
use aqw_core::ops::operation::{self as operation, OpKind, OpState, Operation};

/// 1 when it stopped short (halted, cancelled, failed), left records
/// unhandled, or (a fix) left records open the patch did not apply to.
pub(super) fn exit_of(op: &Operation) -> Exit {
    let short = matches!(
        op.state,
        OpState::Halted | OpState::Cancelled | OpState::Failed
    );
    let left_open = matches!(op.kind, OpKind::Fix { .. }) && op.skipped > 0;
    Exit::needs_a_person_if(short || op.failed > 0 || left_open)
}

/// `op` as a person may see it: a fix's patch through
/// [`aqw_core::redact::patch_for_display`] with the redaction of the function of
/// its queue, values shown (whoever runs the CLI holds the account's keys
/// and may act), except where they write a redacted field; every value
/// masked when this app has no function for its queue, whose rules are
/// then unknown.
fn shown(app: &AppConfig, op: &Operation) -> Operation {
    let mut op = op.clone();
    if let OpKind::Fix { patch, .. } = &mut op.kind {
        let function = app.function_for_queue(&op.queue);
        let none = aqw_core::redact::Redaction::default();
        let redact = function.map_or(&none, |f| &f.redact);
        *patch = aqw_core::redact::patch_for_display(patch, redact, function.is_some());
    }
    op
}

pub(super) fn render_list(app: &AppConfig, ops: &[Operation], output: Output) {
    if output == Output::Json {
        print_json(&ops.iter().map(|o| shown(app, o)).collect::<Vec<_>>());
        return;
    }
    if ops.is_empty() {
        outln!("no operations");
        return;
    }
    outln!(
        "{:<26} {:<9} {:<7} {:<16} {:>14} BY",
        "ID",
        "STATE",
        "KIND",
        "QUEUE",
        "DONE/SELECTED"
    );
    for op in ops {
        let progress = format!("{}/{}", op.done, op.selected);
        // Why a halted or failed one stopped: what someone must look at.
        let why = match (op.state, &op.stop_reason) {
            (OpState::Halted | OpState::Failed, Some(r)) => {
                format!(" ({})", r.chars().take(100).collect::<String>())
            }
            _ => String::new(),
        };
        outln!(
            "{:<26} {:<9} {:<7} {:<16} {:>14} {}{why}",
            op.id,
            op.state.as_str(),
            op.kind.name(),
            op.queue,
            progress,
            op.by
        );
    }
}

/// What only an operation of its kind has: a discard's reason, a fix's
/// patch (as [`shown`] left it), an unknown kind's name.
fn render_kind(kind: &OpKind) {
    match kind {
        OpKind::Discard { reason, close_key } => outln!(
            "  reason: {reason}{}",
            if *close_key { " (keys closed)" } else { "" }
        ),
        OpKind::Fix { patch, .. } => outln!("  patch: {}", aqw_core::scrub::one_line(patch)),
        OpKind::Unknown { name } => {
            outln!("  kind {name:?} is not known to this aqw: a newer one carries it out")
        }
        OpKind::Replay { .. } => {}
    }
}

pub(super) fn render_one(app: &AppConfig, op: &Operation, output: Output) {
    let op = &shown(app, op);
    if output == Output::Json {
        print_json(op);
        return;
    }
    outln!(
        "operation {}: {} {} on {}",
        op.id,
        op.state.as_str(),
        op.kind.name(),
        op.queue
    );
    outln!(
        "  by {} at {}; {}",
        op.by,
        op.created_at,
        op.selection.describe()
    );
    render_kind(&op.kind);
    outln!(
        "  selected {} (fingerprint {}), rate {}/s",
        op.selected,
        op.fingerprint,
        op.rate
    );
    outln!(
        "  done {}, skipped {}, failed {}, replayed jobs back in poison {}",
        op.done,
        op.skipped,
        op.failed,
        op.returned_poisoned
    );
    if let Some(r) = &op.stop_reason {
        outln!("  stopped: {r}");
    }
    if op.takeovers > 0 {
        outln!(
            "  taken over from a dead executor {} time(s) since its last checkpoint (halted past {})",
            op.takeovers,
            operation::MAX_TAKEOVERS
        );
    }
    if let Some(e) = &op.last_error {
        outln!("  last error: {e}");
    }
    if let (Some(o), Some(u), false) = (&op.lease_owner, &op.lease_until, op.state.is_final()) {
        outln!("  lease: {o} until {u}");
    }
}

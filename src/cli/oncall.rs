//! `aqw oncall [KIND]`: the on-call runbook of this very binary
//! (`docs/oncall.md`, embedded at build time), whole or one incident kind's
//! page. A kind's page is the `## KIND: …` section; the kinds are the
//! causes `aqw triage` names.

use super::exit::{Exit, Failure};
use super::output::print_json;
use super::output::Output;
use aqw_core::ops::triage::Cause;
use clap::Args;

/// The runbook, as this version of aqw was built with it.
pub const RUNBOOK: &str = include_str!("../../docs/oncall.md");

/// Print the on-call runbook embedded in this binary, whole or one incident kind's page.
#[derive(Args)]
#[command(
    after_help = "Exit codes: 0 printed; 2 an unknown kind (the kinds are listed).\n\nExamples:\n  aqw oncall\n  aqw oncall outage"
)]
pub struct OncallArgs {
    /// One incident kind's page (outage, bad-producer, uncertain,
    /// saved-failure, refusal, claim-check, closed); all when omitted.
    pub kind: Option<String>,
}

/// Every kind, in the order `aqw triage` ranks them.
pub fn kinds() -> Vec<&'static str> {
    Cause::ALL.iter().map(|c| c.slug()).collect()
}

/// The section of `kind` (its `## KIND:` heading to the next `## `).
pub fn section(kind: &str) -> Option<&'static str> {
    let heading = format!("## {kind}:");
    let start = RUNBOOK
        .match_indices(&heading)
        .map(|(i, _)| i)
        .find(|&i| i == 0 || RUNBOOK.as_bytes()[i - 1] == b'\n')?;
    let rest = &RUNBOOK[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    Some(rest[..end].trim_end())
}

pub(super) fn run(a: OncallArgs, output: Output) -> Result<Exit, Failure> {
    let version = env!("CARGO_PKG_VERSION");
    let text = match a.kind.as_deref() {
        None => RUNBOOK.trim_end(),
        Some(k) => section(k).ok_or_else(|| {
            Failure::usage(format!(
                "no runbook page for kind \"{}\"; the kinds are: {}",
                aqw_core::scrub::one_line(k),
                kinds().join(", ")
            ))
        })?,
    };
    match output {
        Output::Json => print_json(&serde_json::json!({
            "version": version,
            "kind": a.kind,
            "kinds": kinds(),
            "runbook": text,
        })),
        Output::Text => {
            outln!("aqw {version} on-call runbook (embedded in this binary; `aqw oncall KIND` for one page)");
            outln!("");
            outln!("{text}");
        }
    }
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind `aqw triage` names has its page, at most one screen
    /// (~40 lines), and the runbook starts from `aqw triage`.
    #[test]
    fn every_kind_has_a_page_of_one_screen() {
        for k in kinds() {
            let s = section(k).unwrap_or_else(|| panic!("no ## {k}: section"));
            let lines = s.lines().count();
            assert!(lines <= 42, "{k}: {lines} lines");
            assert!(!s[3..].contains("\n## "), "{k}: one section only");
        }
        assert!(section("nonsense").is_none());
        let start = RUNBOOK.find("aqw triage").unwrap();
        assert!(
            start < RUNBOOK.find("\n## ").unwrap(),
            "starts from aqw triage"
        );
    }
}

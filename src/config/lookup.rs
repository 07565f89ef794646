//! `handler.replayMarker` and `handler.lookup` of an `http` function: how
//! the provider says an answer is a replay, and how to ask it whether a
//! provider key took effect. Each value is checked where it is written.

use super::raw::{RawLookup, RawReplayMarker};
use super::timespan::opt_timespan;
use super::ConfigError;
use aqw_core::handler::{Lookup, ReplayMarker};
use std::time::Duration;

/// `handler.replayMarker`: a JSON pointer and the value that means "replayed".
pub(super) fn replay_marker(
    raw: &RawReplayMarker,
    host_file: &str,
    path: &str,
) -> Result<ReplayMarker, ConfigError> {
    if !raw.pointer.starts_with('/') {
        return Err(ConfigError::new(
            host_file,
            format!("{path}.handler.replayMarker.pointer"),
            format!("{:?} is not a JSON pointer (it starts with /)", raw.pointer),
        ));
    }
    Ok(ReplayMarker {
        pointer: raw.pointer.clone(),
        value: raw.value.clone(),
    })
}

/// `handler.lookup`: an http(s) URL (with `{providerKey}` where the key
/// goes, or the key in `Idempotency-Key` alone) and a timeout of 1 s to
/// 5 min (default 10 s).
pub(super) fn lookup(raw: &RawLookup, host_file: &str, path: &str) -> Result<Lookup, ConfigError> {
    let field = format!("{path}.handler.lookup");
    let sample = raw
        .url
        .replace("{providerKey}", "00000000-0000-4000-8000-000000000000");
    super::validate::parse_http_url(&sample)
        .map_err(|m| ConfigError::new(host_file, format!("{field}.url"), m))?;
    let timeout = opt_timespan(host_file, &format!("{field}.timeout"), &raw.timeout)?
        .unwrap_or(Duration::from_secs(10));
    if !(Duration::from_secs(1)..=Duration::from_secs(300)).contains(&timeout) {
        return Err(ConfigError::new(
            host_file,
            format!("{field}.timeout"),
            "must be between 00:00:01 and 00:05:00",
        ));
    }
    Ok(Lookup {
        url: raw.url.clone(),
        timeout,
    })
}

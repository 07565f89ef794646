//! `aqw.schedules`: each schedule checked where it is written, so an error
//! names `aqw.schedules.<Name>.<field>`. A schedule must name a function of
//! the app whose key carries the schedule and the tick (two ticks, or two
//! schedules' ticks at one instant, derive two keys), or a tick would be
//! settled as a duplicate and never run.

use super::raw::RawSchedule;
use super::ConfigError;
use aqw_core::config::FunctionConfig;
use aqw_core::idempotency::derive_key;
use aqw_core::schedule::{CatchUp, Schedule, When};
use std::collections::BTreeMap;

/// The schedules of `aqw.schedules`, checked against `functions`.
pub(super) fn schedules(
    host_file: &str,
    raw: &BTreeMap<String, RawSchedule>,
    functions: &[FunctionConfig],
) -> Result<Vec<Schedule>, ConfigError> {
    raw.iter()
        .map(|(name, r)| match name_refused(name) {
            Some(why) => Err(ConfigError::new(
                host_file,
                // Escaped: the name itself may hold a control character.
                format!("aqw.schedules.{}", aqw_core::scrub::one_line(name)),
                why,
            )),
            None => schedule(host_file, name, r, functions),
        })
        .collect()
}

/// The longest schedule name: its row's RowKey in the control table, and
/// part of every tick's key.
pub const MAX_SCHEDULE_NAME: usize = 100;

/// Why `name` cannot name a schedule, if it cannot: the name is its row's
/// RowKey in the control table, where `/`, `\`, `#`, `?` and control
/// characters are not allowed (issue 48: a schedule named `a/b` made `aqw
/// status` fail as a whole), and it is shown on pages and terminals.
fn name_refused(name: &str) -> Option<String> {
    if name.trim().is_empty() {
        return Some("a schedule needs a name".into());
    }
    if name.chars().count() > MAX_SCHEDULE_NAME {
        return Some(format!(
            "the name is longer than {MAX_SCHEDULE_NAME} characters"
        ));
    }
    let bad = name.chars().find(|c| {
        matches!(c, '/' | '\\' | '#' | '?')
            || c.is_control()
            || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
    })?;
    Some(format!(
        "the name must not contain {:?}: a schedule's name is a table key, where /, \\, #, ? and control or direction characters are not allowed",
        bad
    ))
}

fn schedule(
    host_file: &str,
    name: &str,
    raw: &RawSchedule,
    functions: &[FunctionConfig],
) -> Result<Schedule, ConfigError> {
    let path = format!("aqw.schedules.{name}");
    let err = |field: &str, msg: String| {
        let at = if field.is_empty() {
            path.clone()
        } else {
            format!("{path}.{field}")
        };
        ConfigError::new(host_file, at, msg)
    };
    let bad = |field: &str, e: &dyn std::fmt::Display| err(field, e.to_string());
    let when = match (&raw.cron, &raw.every) {
        (Some(c), None) => When::cron(c, raw.time_zone.as_deref()).map_err(|m| bad("cron", &m))?,
        (None, Some(e)) => {
            if raw.time_zone.is_some() {
                return Err(err(
                    "timeZone",
                    "applies to cron only (an interval has no wall clock)".into(),
                ));
            }
            let d = aqw_core::config::parse_timespan(e).map_err(|m| bad("every", &m))?;
            When::every(d).map_err(|m| bad("every", &m))?
        }
        _ => return Err(err("", "give exactly one of cron or every".into())),
    };
    let catch_up = match &raw.catch_up {
        None => CatchUp::default(),
        Some(c) => CatchUp::parse(c).map_err(|m| bad("catchUp", &m))?,
    };
    let payload = match &raw.payload {
        None => serde_json::Map::new(),
        Some(serde_json::Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(err(
                "payload",
                "must be a JSON object (its fields join each tick's job)".into(),
            ))
        }
    };
    if payload.contains_key("schedule") || payload.contains_key("tick") {
        return Err(err(
            "payload",
            "must not set schedule or tick: aqw writes them".into(),
        ));
    }
    let s = Schedule {
        name: name.to_string(),
        function: raw.function.clone(),
        when,
        payload,
        catch_up,
    };
    check_key_carries_the_tick(&s, functions).map_err(|m| err("function", m))?;
    Ok(s)
}

/// The function exists and two ticks derive two keys.
fn check_key_carries_the_tick(s: &Schedule, functions: &[FunctionConfig]) -> Result<(), String> {
    let f = functions
        .iter()
        .find(|f| f.name == s.function)
        .ok_or_else(|| {
            let known: Vec<&str> = functions.iter().map(|f| f.name.as_str()).collect();
            format!(
                "\"{}\" is not a function of this app (known: {})",
                s.function,
                known.join(", ")
            )
        })?;
    let now = time::OffsetDateTime::now_utc();
    let (a, b) = (s.when.latest_at(now), s.when.next_after(now));
    let (Some(a), Some(b)) = (a, b) else {
        return Err("the schedule never ticks".into());
    };
    let key = |t| derive_key(&f.key, &s.tick_payload(t));
    // Another schedule on the same function ticking at the same instant
    // must not share its keys either.
    let mut other = s.clone();
    other.name.push_str("~other");
    let other_key = derive_key(&f.key, &other.tick_payload(a));
    match (key(a), key(b), other_key) {
        (Ok(Some(ka)), Ok(Some(kb)), Ok(Some(ko))) if ka != kb && ka != ko => Ok(()),
        _ => Err(format!(
            "the key of function \"{}\" must carry the schedule and the tick, or a tick is settled as a duplicate of another: \
             give it \"key\": \"{{/schedule}}:{{/tick}}\"",
            f.name
        )),
    }
}

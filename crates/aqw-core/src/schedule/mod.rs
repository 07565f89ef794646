//! Schedules (`aqw.schedules`): each tick is a normal keyed job on a
//! function's queue, `{"schedule": <name>, "tick": <RFC 3339 time>, …}`,
//! whose key carries the tick (`{/schedule}:{/tick}`), so a tick runs once
//! however many replicas see it, and a failed tick is retried, poisoned,
//! alerted and replayed like any job.
//!
//! A tick is an instant the schedule names: a cron pattern in a time zone
//! (croner: 5 fields, or 6 with seconds first as the Functions timer's
//! NCRONTAB writes them), or a fixed interval counted from the Unix epoch,
//! so every replica computes the same ticks without asking anyone.
//!
//! Who enqueues it: [`run`] (one task per schedule in every worker) wakes at
//! each tick, reads the schedule's row in the control table and claims the
//! due ticks with one `If-Match` write; the winner puts them and clears its
//! claim. A claim left by a crashed replica is put again after
//! `run::STALE_CLAIM` by whoever sees it: a second copy of a tick is
//! settled by its key, never run twice. Ticks missed while every worker was
//! down follow the schedule's [`CatchUp`].

mod run;

pub use run::{run, spawn, status, ScheduleStatus, PARTITION};

use serde_json::{Map, Value};
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The most missed ticks one round of [`CatchUp::All`] puts (the rest
/// follow in the next rounds, oldest first).
const MAX_TICKS_PER_ROUND: usize = 100;

/// A tick this much late still runs under [`CatchUp::None`] (a replica's
/// wake-up jitter and a slow read are not "missed").
const ON_TIME: Duration = Duration::from_secs(60);

/// What happens to ticks missed while no worker ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// Run the latest missed tick once (the default): a report that was
    /// due while the fleet was down is made once, not once per missed tick.
    #[default]
    Latest,
    /// Run every missed tick, oldest first.
    All,
    /// Run none: only ticks still on time (`ON_TIME`).
    None,
}

impl CatchUp {
    /// The host.json spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Latest => "latest",
            CatchUp::All => "all",
            CatchUp::None => "none",
        }
    }

    /// From the host.json spelling.
    pub fn parse(s: &str) -> Result<Self, ScheduleError> {
        match s {
            "latest" => Ok(CatchUp::Latest),
            "all" => Ok(CatchUp::All),
            "none" => Ok(CatchUp::None),
            other => Err(ScheduleError::UnknownCatchUp {
                value: other.to_string(),
            }),
        }
    }
}

/// Why a schedule's timing cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// A catch-up policy other than latest, all or none.
    #[error("\"{value}\" is not a catch-up policy (latest, all or none)")]
    UnknownCatchUp {
        /// The policy as given.
        value: String,
    },
    /// A pattern the cron parser refuses.
    #[error("\"{pattern}\" is not a cron pattern: {reason}")]
    BadCron {
        /// The pattern as given.
        pattern: String,
        /// The parser's reason.
        reason: String,
    },
    /// A zone that is not an IANA name.
    #[error("\"{zone}\" is not an IANA time zone (e.g. Europe/Amsterdam)")]
    UnknownTimeZone {
        /// The zone as given.
        zone: String,
    },
    /// An interval under one second.
    #[error("the interval must be at least 1 second")]
    IntervalUnderASecond,
}

/// When a schedule ticks.
#[derive(Debug, Clone)]
pub enum When {
    /// A cron pattern in a time zone.
    Cron {
        /// The pattern as written.
        pattern: String,
        /// The parsed pattern (boxed: it is large beside an interval).
        cron: Box<croner::Cron>,
        /// The zone its wall-clock times are in.
        zone: chrono_tz::Tz,
    },
    /// Every so long, counted from the Unix epoch.
    Every(Duration),
}

impl When {
    /// A cron pattern in `zone` (IANA name; UTC when absent).
    pub fn cron(pattern: &str, zone: Option<&str>) -> Result<Self, ScheduleError> {
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(pattern)
            .map_err(|e| ScheduleError::BadCron {
                pattern: pattern.to_string(),
                reason: e.to_string(),
            })?;
        let zone = match zone {
            None => chrono_tz::UTC,
            Some(z) => z
                .parse::<chrono_tz::Tz>()
                .map_err(|_| ScheduleError::UnknownTimeZone {
                    zone: z.to_string(),
                })?,
        };
        Ok(When::Cron {
            pattern: pattern.to_string(),
            cron: Box::new(cron),
            zone,
        })
    }

    /// Every `interval` (at least a second; no upper bound: a tick is a
    /// job put at its time, not a message held invisible until then).
    pub fn every(interval: Duration) -> Result<Self, ScheduleError> {
        if interval < Duration::from_secs(1) {
            return Err(ScheduleError::IntervalUnderASecond);
        }
        Ok(When::Every(interval))
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: OffsetDateTime) -> Option<OffsetDateTime> {
        match self {
            When::Every(interval) => {
                let step = interval.as_nanos() as i128;
                let at = t.unix_timestamp_nanos();
                let next = (at.div_euclid(step) + 1) * step;
                OffsetDateTime::from_unix_timestamp_nanos(next).ok()
            }
            When::Cron { cron, zone, .. } => {
                let local = to_chrono(t)?.with_timezone(zone);
                let next = cron.find_next_occurrence(&local, false).ok()?;
                from_chrono(next.timestamp(), next.timestamp_subsec_nanos())
            }
        }
    }

    /// The last tick at or before `t`.
    pub fn latest_at(&self, t: OffsetDateTime) -> Option<OffsetDateTime> {
        match self {
            When::Every(interval) => {
                let step = interval.as_nanos() as i128;
                let at = t.unix_timestamp_nanos();
                OffsetDateTime::from_unix_timestamp_nanos(at.div_euclid(step) * step).ok()
            }
            When::Cron { cron, zone, .. } => {
                let local = to_chrono(t)?.with_timezone(zone);
                let prev = cron.find_previous_occurrence(&local, true).ok()?;
                from_chrono(prev.timestamp(), prev.timestamp_subsec_nanos())
            }
        }
    }

    /// How the schedule reads in `config show` and `status`.
    pub fn describe(&self) -> String {
        match self {
            When::Every(d) => format!("every {}", crate::span::fmt_span(*d)),
            When::Cron { pattern, zone, .. } => format!("cron \"{pattern}\" ({zone})"),
        }
    }
}

fn to_chrono(t: OffsetDateTime) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(t.unix_timestamp(), t.nanosecond())
}

fn from_chrono(secs: i64, nanos: u32) -> Option<OffsetDateTime> {
    let t = OffsetDateTime::from_unix_timestamp(secs).ok()?;
    t.replace_nanosecond(nanos).ok()
}

/// One schedule of `aqw.schedules`.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Its name (the `{/schedule}` of each tick's job, and its row).
    pub name: String,
    /// The function whose queue gets the ticks.
    pub function: String,
    /// When it ticks.
    pub when: When,
    /// More fields of each tick's job.
    pub payload: Map<String, Value>,
    /// What happens to missed ticks.
    pub catch_up: CatchUp,
}

impl Schedule {
    /// The job of tick `tick`: `payload`'s fields plus `schedule` and `tick`.
    pub fn tick_payload(&self, tick: OffsetDateTime) -> String {
        let mut job = self.payload.clone();
        job.insert("schedule".into(), Value::String(self.name.clone()));
        job.insert("tick".into(), Value::String(tick_text(tick)));
        Value::Object(job).to_string()
    }

    /// The ticks to put now, given the last tick already claimed: per
    /// [`CatchUp`], oldest first, and the tick the row moves to.
    pub(crate) fn due(
        &self,
        last: OffsetDateTime,
        now: OffsetDateTime,
    ) -> (Vec<OffsetDateTime>, OffsetDateTime) {
        let Some(latest) = self.when.latest_at(now).filter(|t| *t > last) else {
            return (vec![], last);
        };
        match self.catch_up {
            CatchUp::Latest => (vec![latest], latest),
            CatchUp::None if now - latest <= ON_TIME => (vec![latest], latest),
            CatchUp::None => (vec![], latest),
            CatchUp::All => {
                let mut ticks = vec![];
                let mut at = last;
                while ticks.len() < MAX_TICKS_PER_ROUND {
                    match self.when.next_after(at).filter(|t| *t <= latest) {
                        Some(t) => {
                            ticks.push(t);
                            at = t;
                        }
                        None => break,
                    }
                }
                let moved_to = ticks.last().copied().unwrap_or(last);
                (ticks, moved_to)
            }
        }
    }
}

/// A tick as its job and its key write it: RFC 3339 in UTC.
pub fn tick_text(tick: OffsetDateTime) -> String {
    tick.to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn every(secs: u64, catch_up: CatchUp) -> Schedule {
        Schedule {
            name: "s".into(),
            function: "F".into(),
            when: When::every(Duration::from_secs(secs)).unwrap(),
            payload: Map::new(),
            catch_up,
        }
    }

    #[test]
    fn intervals_tick_on_multiples_of_the_epoch() {
        let w = When::every(Duration::from_secs(300)).unwrap();
        let t = datetime!(2026-12-06 20:03:10 UTC);
        assert_eq!(w.next_after(t), Some(datetime!(2026-12-06 20:05:00 UTC)));
        assert_eq!(w.latest_at(t), Some(datetime!(2026-12-06 20:00:00 UTC)));
        let on = datetime!(2026-12-06 20:05:00 UTC);
        assert_eq!(w.latest_at(on), Some(on), "a tick is at its own instant");
        assert_eq!(w.next_after(on), Some(datetime!(2026-12-06 20:10:00 UTC)));
    }

    #[test]
    fn cron_ticks_in_its_time_zone() {
        // 02:00 in Amsterdam is 01:00 UTC in winter.
        let w = When::cron("0 0 2 * * *", Some("Europe/Amsterdam")).unwrap();
        let t = datetime!(2026-12-06 20:00:00 UTC);
        assert_eq!(w.next_after(t), Some(datetime!(2026-12-07 01:00:00 UTC)));
        assert_eq!(w.latest_at(t), Some(datetime!(2026-12-06 01:00:00 UTC)));
        // Five fields: minutes first.
        let w = When::cron("*/15 * * * *", None).unwrap();
        assert_eq!(w.next_after(t), Some(datetime!(2026-12-06 20:15:00 UTC)));
        assert!(matches!(
            When::cron("not a cron", None),
            Err(ScheduleError::BadCron { pattern, .. }) if pattern == "not a cron"
        ));
        assert!(matches!(
            When::cron("* * * * *", Some("Mars/Olympus")),
            Err(ScheduleError::UnknownTimeZone { zone }) if zone == "Mars/Olympus"
        ));
        assert!(matches!(
            When::every(Duration::from_millis(10)),
            Err(ScheduleError::IntervalUnderASecond)
        ));
        assert_eq!(
            CatchUp::parse("some"),
            Err(ScheduleError::UnknownCatchUp {
                value: "some".into()
            })
        );
    }

    #[test]
    fn missed_ticks_follow_the_catch_up_policy() {
        let last = datetime!(2026-12-06 20:00:00 UTC);
        let now = datetime!(2026-12-06 20:05:30 UTC); // 5 ticks missed
        let (ticks, to) = every(60, CatchUp::Latest).due(last, now);
        assert_eq!(ticks, [datetime!(2026-12-06 20:05:00 UTC)]);
        assert_eq!(to, datetime!(2026-12-06 20:05:00 UTC));
        let (ticks, _) = every(60, CatchUp::All).due(last, now);
        assert_eq!(ticks.len(), 5);
        assert_eq!(ticks[0], datetime!(2026-12-06 20:01:00 UTC));
        // 30 s late is on time; 5 minutes late is missed.
        let (ticks, _) = every(60, CatchUp::None).due(last, now);
        assert_eq!(ticks.len(), 1);
        let (ticks, to) = every(3600, CatchUp::None).due(
            datetime!(2026-12-06 18:00:00 UTC),
            datetime!(2026-12-06 19:05:00 UTC),
        );
        assert!(ticks.is_empty());
        assert_eq!(to, datetime!(2026-12-06 19:00:00 UTC), "moved past it");
        // Nothing due: the row stays.
        let (ticks, to) = every(60, CatchUp::Latest).due(now, now);
        assert!(ticks.is_empty());
        assert_eq!(to, now);
    }

    #[test]
    fn all_catches_up_in_bounded_rounds() {
        let s = every(1, CatchUp::All);
        let last = datetime!(2026-12-06 20:00:00 UTC);
        let now = datetime!(2026-12-06 20:10:00 UTC);
        let (ticks, to) = s.due(last, now);
        assert_eq!(ticks.len(), MAX_TICKS_PER_ROUND);
        let (rest, _) = s.due(to, now);
        assert_eq!(
            rest[0],
            to + Duration::from_secs(1),
            "the next round goes on"
        );
    }

    #[test]
    fn a_tick_job_carries_the_schedule_and_the_tick() {
        let mut s = every(60, CatchUp::Latest);
        s.payload
            .insert("report".into(), Value::String("daily".into()));
        let job: Value =
            serde_json::from_str(&s.tick_payload(datetime!(2026-12-06 20:05:00 UTC))).unwrap();
        assert_eq!(job["schedule"], "s");
        assert_eq!(job["tick"], "2026-12-06T20:05:00Z");
        assert_eq!(job["report"], "daily");
    }
}

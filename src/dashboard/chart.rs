//! The poison list's chart: poisons per hour over the last 24 hours, one
//! stacked colour per function and error cause, drawn on the server as SVG
//! (no script; the CSP forbids it). Each bar segment carries a `<title>`, so
//! hovering shows its hour, series and count (the series, free text, as
//! [`Text`]).

use super::text::Text;
use aqw_core::poison::PoisonRecord;
use maud::{html, Markup};
use std::collections::BTreeMap;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Hourly bins shown: one day, the span an on-call shift looks back over.
const HOURS: usize = 24;
/// Series drawn in their own colour; the rest are one "other" series.
const SERIES: usize = 5;
const PALETTE: [&str; SERIES + 1] = [
    "#d62728", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#7f7f7f",
];
const WIDTH: usize = 720;
const PLOT_HEIGHT: usize = 140;

/// Counts per series ("function · cause") and hour bin (0 = the oldest).
fn bins(
    records: &[PoisonRecord],
    now: OffsetDateTime,
    cause_of: &dyn Fn(&PoisonRecord) -> String,
) -> Vec<(String, [u32; HOURS])> {
    let mut by_series: BTreeMap<String, [u32; HOURS]> = BTreeMap::new();
    for r in records {
        let Ok(at) = OffsetDateTime::parse(&r.poisoned_at, &Rfc3339) else {
            continue;
        };
        let hours_ago = (now - at).whole_hours();
        if !(0..HOURS as i64).contains(&hours_ago) {
            continue;
        }
        let series = format!("{} · {}", r.function, cause_of(r));
        by_series.entry(series).or_insert([0; HOURS])[HOURS - 1 - hours_ago as usize] += 1;
    }
    let mut series: Vec<(String, [u32; HOURS])> = by_series.into_iter().collect();
    series.sort_by_key(|(_, b)| std::cmp::Reverse(b.iter().sum::<u32>()));
    if series.len() > SERIES {
        let mut other = [0; HOURS];
        for (_, b) in series.drain(SERIES..) {
            for (o, n) in other.iter_mut().zip(b) {
                *o += n;
            }
        }
        series.push(("other causes".into(), other));
    }
    series
}

/// The bars' stacked segments: (x, y, height, colour, hover text).
fn segments(
    series: &[(String, [u32; HOURS])],
    max: usize,
) -> Vec<(usize, usize, usize, &'static str, String)> {
    let bar = WIDTH / HOURS;
    let mut out = Vec::new();
    for h in 0..HOURS {
        let mut top = PLOT_HEIGHT;
        for (i, (name, b)) in series.iter().enumerate().filter(|(_, (_, b))| b[h] > 0) {
            let height = (b[h] as usize * PLOT_HEIGHT).div_ceil(max).min(top);
            top -= height;
            let tip = format!(
                "{} h ago → {} h ago · {name}: {}",
                HOURS - h,
                HOURS - h - 1,
                b[h]
            );
            out.push((h * bar + 2, top, height, PALETTE[i], tip));
        }
    }
    out
}

/// The chart of `records` (all those the filter matched, not one page).
pub fn poisons_chart(
    records: &[PoisonRecord],
    now: OffsetDateTime,
    cause_of: &dyn Fn(&PoisonRecord) -> String,
) -> Markup {
    let series = bins(records, now, cause_of);
    let totals: Vec<u32> = (0..HOURS)
        .map(|h| series.iter().map(|(_, b)| b[h]).sum())
        .collect();
    let max = totals.iter().copied().max().unwrap_or(0).max(1) as usize;
    let bar = WIDTH / HOURS;
    let label = format!(
        "Poisons per hour over the last 24 hours: {} in all",
        totals.iter().sum::<u32>()
    );
    html! {
        svg #poison-chart viewBox={ "0 0 " (WIDTH) " " (PLOT_HEIGHT + 20) } role="img" aria-label=(label) {
            title { (label) }
            @for (x, y, height, colour, tip) in segments(&series, max) {
                rect x=(x) y=(y) width=(bar - 4) height=(height) fill=(colour) { title { (Text(&tip)) } }
            }
            line x1="0" y1=(PLOT_HEIGHT) x2=(WIDTH) y2=(PLOT_HEIGHT) stroke="#999" {}
            text x="0" y=(PLOT_HEIGHT + 15) font-size="11" { "24 h ago" }
            text x=(WIDTH) y=(PLOT_HEIGHT + 15) font-size="11" text-anchor="end" { "now" }
        }
        ul.legend {
            @for (i, (name, b)) in series.iter().enumerate() {
                li { svg width="10" height="10" { rect width="10" height="10" fill=(PALETTE[i]) {} }
                    " " (Text(name)) " (" (b.iter().sum::<u32>()) ")" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aqw_core::message::{ErrorInfo, ErrorKind};

    fn record(function: &str, error: &str, poisoned_at: &str) -> PoisonRecord {
        let mut r = aqw_core::poison::PoisonRecord::from_entity(&Default::default());
        r.function = function.into();
        r.error = ErrorInfo {
            kind: ErrorKind::Retryable,
            message: error.into(),
        };
        r.poisoned_at = poisoned_at.into();
        r
    }

    #[test]
    fn records_are_binned_by_hour_series_capped_and_old_ones_left_out() {
        let now = OffsetDateTime::parse("2026-12-04T12:30:00Z", &Rfc3339).unwrap();
        let mut records = vec![
            record("Grant", "HTTP 503", "2026-12-04T12:10:00Z"),
            record("Grant", "HTTP 503", "2026-12-04T12:20:00Z"),
            record("Grant", "HTTP 503", "2026-12-04T09:00:00Z"),
            record("Grant", "HTTP 503", "2026-12-02T12:00:00Z"),
            record("Receipt", "<b>bold</b>", "2026-12-04T12:00:00Z"),
            record("Receipt", "<b>bold</b>", "2026-12-04T10:00:00Z"),
        ];
        for i in 0..6 {
            records.push(record(
                "Other",
                &format!("cause {}", "x".repeat(i + 1)),
                "2026-12-04T11:00:00Z",
            ));
        }
        let cause = |r: &PoisonRecord| r.error.message.clone();
        let series = bins(&records, now, &cause);
        assert_eq!(series.len(), SERIES + 1);
        assert_eq!(series[0].0, "Grant · HTTP 503");
        assert_eq!(series[0].1[HOURS - 1], 2, "two within the last hour");
        assert_eq!(series[0].1[HOURS - 4], 1);
        assert_eq!(
            series[0].1.iter().sum::<u32>(),
            3,
            "two days ago is left out"
        );
        let html = poisons_chart(&records, now, &cause).into_string();
        assert!(
            html.contains("&lt;b&gt;bold&lt;/b&gt;") && !html.contains("<b>"),
            "escaped"
        );
        assert!(html.contains("Poisons per hour over the last 24 hours: 11 in all"));
        assert!(!html.contains("<script"));
    }
}

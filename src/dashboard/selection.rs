//! Which records a list page shows and a group action touches: the filter
//! form's fields, the search, and the alert's grouping. Both go through
//! [`select`], so a group action covers exactly the records its page listed.

use super::error::DashboardError;
use super::forms::Filters;
use super::views::Group;
use crate::telemetry::alert_body;
use aqw_core::alert::{error_group, PoisonAlert};
use aqw_core::ops::{self, Filter, OpsError, QueueOps};
use aqw_core::poison::{PoisonRecord, RecordStatus};
use aqw_core::redact::Redaction;

/// The records a page's query selects.
pub(super) struct Selection {
    /// Matching the filter and the search (what the groups and the chart count).
    pub matching: Vec<PoisonRecord>,
    /// The error group the page is narrowed to, if any.
    group: Option<String>,
}

impl Selection {
    /// The records of the chosen group (all of them without `group`).
    pub fn chosen(&self) -> Vec<&PoisonRecord> {
        self.matching
            .iter()
            .filter(|r| self.group.as_ref().is_none_or(|g| &group_id(r) == g))
            .collect()
    }

    /// [`Selection::chosen`], owned.
    pub fn into_chosen(self) -> Vec<PoisonRecord> {
        let group = self.group;
        self.matching
            .into_iter()
            .filter(|r| group.as_ref().is_none_or(|g| &group_id(r) == g))
            .collect()
    }
}

/// Why a query selects nothing it could show.
pub(super) enum SelectError {
    /// The filter itself is wrong (a 400, with the reason).
    BadFilter(String),
    Ops(OpsError),
}

impl From<SelectError> for DashboardError {
    fn from(e: SelectError) -> Self {
        match e {
            SelectError::BadFilter(m) => DashboardError::bad_input("Bad filter", m),
            SelectError::Ops(e) => e.into(),
        }
    }
}

/// The records `params` selects, newest first. Without a search no payload
/// is read (the list shows none, and must stay fast at 10,000 records); a
/// search reads the payloads of the records the filter leaves, since it
/// looks inside them.
pub(super) async fn select(ops: &QueueOps, params: &Filters) -> Result<Selection, SelectError> {
    let filter = list_filter(params).map_err(SelectError::BadFilter)?;
    let text = params.search.get();
    let records = match text {
        Some(_) => ops::list(ops, &filter).await,
        None => ops::list_summaries(ops, &filter).await,
    }
    .map_err(SelectError::Ops)?;
    let none = Redaction::default();
    let redact = ops.function.as_ref().map_or(&none, |f| &f.redact);
    Ok(Selection {
        matching: search(records, text, redact),
        group: params.group.get().map(str::to_string),
    })
}

/// The key of the digests a review form carries to the real action (the
/// ids a dry run or review showed, the patch a preview applied): HMAC-SHA256
/// under a secret drawn at random when the dashboard starts, so a client
/// cannot compute one and skip the review. A review must therefore be
/// done by the same process as its action: a restart invalidates pending
/// reviews (the action is refused with 409 and asks for a new review).
pub(super) struct ReviewKey([u8; 32]);

impl ReviewKey {
    /// A fresh random key.
    pub fn new() -> Self {
        let mut key = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut key);
        ReviewKey(key)
    }

    /// The MAC of `what` on `queue` over `parts` (each length-prefixed,
    /// so no two lists of parts read alike).
    fn mac(&self, what: &str, queue: &str, parts: &[&str]) -> hmac::Hmac<sha2::Sha256> {
        use hmac::Mac;
        let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0).expect("any key length");
        for p in [what, queue].iter().chain(parts) {
            m.update(&(p.len() as u64).to_be_bytes());
            m.update(p.as_bytes());
        }
        m
    }

    fn sign(&self, what: &str, queue: &str, parts: &[&str]) -> String {
        use hmac::Mac;
        hex::encode(self.mac(what, queue, parts).finalize().into_bytes())
    }

    /// Whether `presented` is the digest of `what` (constant-time).
    fn verify(&self, what: &str, queue: &str, parts: &[&str], presented: Option<&str>) -> bool {
        use hmac::Mac;
        let Some(Ok(bytes)) = presented.map(hex::decode) else {
            return false;
        };
        self.mac(what, queue, parts).verify_slice(&bytes).is_ok()
    }

    /// The digest of a review of `ids` (order does not matter) on `queue`:
    /// a group action's dry run carries it, and the real action refuses when
    /// the same query now selects other records.
    pub fn ids(&self, queue: &str, ids: &[String]) -> String {
        self.sign("reviewed", queue, &sorted(ids))
    }

    /// Whether `presented` is [`Self::ids`] of `ids` on `queue`.
    pub fn ids_ok(&self, queue: &str, ids: &[String], presented: Option<&str>) -> bool {
        self.verify("reviewed", queue, &sorted(ids), presented)
    }

    /// The digest of a previewed `patch` on `queue`: the real fix runs only
    /// the patch its preview applied.
    pub fn patch(&self, queue: &str, patch: &str) -> String {
        self.sign("patch", queue, &[patch])
    }

    /// Whether `presented` is [`Self::patch`] of `patch` on `queue`.
    pub fn patch_ok(&self, queue: &str, patch: &str, presented: Option<&str>) -> bool {
        self.verify("patch", queue, &[patch], presented)
    }
}

fn sorted(ids: &[String]) -> Vec<&str> {
    let mut sorted: Vec<&str> = ids.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted
}

/// The list filter from the query string (status open by default).
fn list_filter(p: &Filters) -> Result<Filter, String> {
    let status = match p.status.get().unwrap_or("open") {
        "all" => None,
        s => Some(RecordStatus::parse(s).ok_or_else(|| format!("unknown status {s:?}"))?),
    };
    let time = |k: &str, v: &super::forms::One| {
        v.get()
            .map(|s| ops::parse_time(s).map_err(|e| format!("{k}: {e}")))
            .transpose()
    };
    let error = (p.error.get())
        .map(|e| {
            regex::RegexBuilder::new(&regex::escape(e))
                .case_insensitive(true)
                .build()
                .map_err(|e| format!("error: {e}"))
        })
        .transpose()?;
    Ok(Filter {
        status,
        since: time("since", &p.since)?,
        until: time("until", &p.until)?,
        function: p.function.get().map(str::to_string),
        error,
        ids: vec![],
    })
}

/// The alert's grouping of a record: kind and masked first line.
pub(super) fn cause(r: &PoisonRecord) -> (String, String) {
    (
        r.error.kind.as_str().to_string(),
        error_group(&r.error.message).1,
    )
}

fn group_id(r: &PoisonRecord) -> String {
    let (k, t) = cause(r);
    format!("{k}|{t}")
}

/// The groups of `records`, exactly as the alert webhook would report them.
pub(super) fn groups(queue: &str, records: &[PoisonRecord]) -> Vec<Group> {
    let alerts: Vec<PoisonAlert> = records
        .iter()
        .map(|r| PoisonAlert {
            queue: r.queue.clone(),
            poison_queue: aqw_core::poison::poison_queue_name(&r.queue),
            function: r.function.clone(),
            message_id: r.message_id.clone(),
            key: r.key.as_deref().map(str::to_string),
            error_kind: r.error.kind.as_str().to_string(),
            error: r.error.message.clone(),
            poisoned_at: time::OffsetDateTime::UNIX_EPOCH,
            uncertain: r.uncertain_attempts > 0,
        })
        .collect();
    let body = alert_body(queue, &alerts);
    let s = |g: &serde_json::Value, k: &str| g[k].as_str().unwrap_or_default().to_string();
    body["groups"]
        .as_array()
        .map(|gs| {
            gs.iter()
                .map(|g| Group {
                    id: format!("{}|{}", s(g, "errorKind"), s(g, "errorGroup")),
                    kind: s(g, "errorKind"),
                    text: s(g, "errorGroup"),
                    count: g["count"].as_u64().unwrap_or(0) as usize,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The filter form's fields as asked (status open by default).
pub(super) fn filter_form(params: &Filters) -> Vec<(&'static str, String)> {
    let set = params.pairs();
    let keep = [
        "status", "since", "until", "function", "error", "search", "group",
    ];
    let default = |k: &str| if k == "status" { "open" } else { "" };
    let value = |k: &str| set.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    keep.iter()
        .map(|k| (*k, value(k).unwrap_or(default(k)).to_string()))
        .collect()
}

/// The records whose id is `text`, or whose key or decoded payload contains
/// it (case-insensitively): how an operator finds the record behind a
/// customer's complaint, by order number or account.
/// The payload text is searched as a person would see it: with the
/// function's `redact` fields masked, so a search cannot probe for them.
fn search(records: Vec<PoisonRecord>, text: Option<&str>, redact: &Redaction) -> Vec<PoisonRecord> {
    let Some(needle) = text.map(|t| t.trim().to_lowercase()) else {
        return records;
    };
    let contains = |hay: &str| hay.to_lowercase().contains(&needle);
    records
        .into_iter()
        .filter(|r| {
            r.message_id.eq_ignore_ascii_case(&needle)
                || r.key.as_deref().is_some_and(contains)
                || match aqw_core::message::decode(&r.message, r.encoding) {
                    Ok(p) => contains(redact.mask(&p).text()),
                    Err(_) => redact.is_empty() && contains(&r.message),
                }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, key: Option<&str>, payload: &str) -> PoisonRecord {
        let mut r = PoisonRecord::from_entity(&Default::default());
        r.message_id = id.into();
        r.key = key.map(|k| aqw_core::idempotency::IdempotencyKey::new(k).unwrap());
        r.encoding = aqw_core::message::MessageEncoding::Base64;
        r.message = aqw_core::message::encode(payload, r.encoding);
        r
    }

    #[test]
    fn search_finds_a_record_by_id_key_or_payload_text() {
        let records = || {
            vec![
                record("6f1c-aa", Some("receipt:o-1001"), r#"{"orderId":"o-1001"}"#),
                record("9b2e-bb", None, r#"{"customer":"Ada Lovelace"}"#),
            ]
        };
        let ids = |found: Vec<PoisonRecord>| -> Vec<String> {
            found.into_iter().map(|r| r.message_id).collect()
        };
        let none = Redaction::default();
        assert_eq!(ids(search(records(), Some("6F1C-AA"), &none)), ["6f1c-aa"]);
        assert_eq!(ids(search(records(), Some("o-1001"), &none)), ["6f1c-aa"]);
        assert_eq!(ids(search(records(), Some("lovelace"), &none)), ["9b2e-bb"]);
        assert!(search(records(), Some("nobody"), &none).is_empty());
        assert_eq!(search(records(), None, &none).len(), 2);
        // A redacted field cannot be probed by search; the rest still can.
        let names = Redaction::parse(&["/customer".into()]).unwrap();
        assert!(search(records(), Some("lovelace"), &names).is_empty());
        assert_eq!(ids(search(records(), Some("o-1001"), &names)), ["6f1c-aa"]);
    }

    #[test]
    fn a_review_digest_ignores_order_tells_sets_apart_and_is_keyed() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let key = ReviewKey::new();
        let ab = key.ids("q", &ids(&["a", "b"]));
        assert_eq!(ab, key.ids("q", &ids(&["b", "a"])));
        assert!(key.ids_ok("q", &ids(&["b", "a"]), Some(&ab)));
        assert!(!key.ids_ok("q", &ids(&["a"]), Some(&ab)));
        assert!(!key.ids_ok("other", &ids(&["a", "b"]), Some(&ab)));
        assert_ne!(key.ids("q", &ids(&["ab"])), ab);
        assert_ne!(key.ids("q", &ids(&["a", "b"])), key.patch("q", "a"));
        // Another process (another key) cannot make or check one.
        assert!(!ReviewKey::new().ids_ok("q", &ids(&["a", "b"]), Some(&ab)));
        // The unkeyed fingerprint of before, or no digest, is refused.
        let unkeyed = aqw_core::ops::operation::fingerprint(&ids(&["a", "b"]));
        assert!(!key.ids_ok("q", &ids(&["a", "b"]), Some(&unkeyed)));
        assert!(!key.ids_ok("q", &ids(&["a", "b"]), None));
        assert!(!key.ids_ok("q", &ids(&["a", "b"]), Some("not hex")));
        let p = key.patch("q", "[]");
        assert!(key.patch_ok("q", "[]", Some(&p)) && !key.patch_ok("q", "[ ]", Some(&p)));
    }
}

//! What each route reads from a form or a query string: serde structs, read
//! by axum-extra's `Form` and `Query` (a repeated field, `id=a&id=b`, is a
//! list) and checked after extraction against their bounds. A text field is
//! a [`One`]: absent when blank, as an empty box is sent; sent twice, the
//! form or query is refused (400) rather than one value silently chosen.

use super::error::DashboardError;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// The most characters a reason, filter field, rate, id or digest may have
/// (a payload and a patch are bounded by the body and the patch bounds).
pub const MAX_FIELD_CHARS: usize = 1000;

/// One text field's value: `None` when missing or blank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct One(Option<String>);

impl One {
    pub fn get(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// Sent and not blank (a checked checkbox).
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// The value, or `""`.
    pub fn or_empty(&self) -> &str {
        self.get().unwrap_or("")
    }
}

impl<'de> Deserialize<'de> for One {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct OneText;
        impl<'de> Visitor<'de> for OneText {
            type Value = One;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("one text value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<One, E> {
                Ok(One(Some(v.to_string()).filter(|v| !v.trim().is_empty())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<One, A::Error> {
                Err(de::Error::custom("sent more than once, one value expected"))
            }
        }
        d.deserialize_any(OneText)
    }
}

/// Refuse the first of `fields` longer than [`MAX_FIELD_CHARS`].
pub fn bounded(fields: &[(&str, &One)]) -> Result<(), DashboardError> {
    for (name, value) in fields {
        let n = value.or_empty().chars().count();
        if n > MAX_FIELD_CHARS {
            return Err(DashboardError::bad_input(
                "Too long",
                format!(
                    "{name}: at most {MAX_FIELD_CHARS} characters, not {n}. Nothing was changed."
                ),
            ));
        }
    }
    Ok(())
}

/// Which step of an action a form asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Show what would happen (a replay's dry run, a group's review).
    DryRun,
    /// Apply a group fix's patch to each record, changing nothing.
    Preview,
    /// Carry it out.
    Real,
}

/// The list page's query: which records it shows and a group action touches.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Filters {
    pub status: One,
    pub since: One,
    pub until: One,
    pub function: One,
    pub error: One,
    pub search: One,
    pub group: One,
}

impl Filters {
    /// Every field, in the order of the filter form.
    fn fields(&self) -> [(&'static str, &One); 7] {
        [
            ("status", &self.status),
            ("since", &self.since),
            ("until", &self.until),
            ("function", &self.function),
            ("error", &self.error),
            ("search", &self.search),
            ("group", &self.group),
        ]
    }

    /// The fields that are set, as name and value.
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        (self.fields().into_iter())
            .filter_map(|(k, v)| v.get().map(|v| (k, v)))
            .collect()
    }

    pub fn check(&self) -> Result<(), DashboardError> {
        bounded(&self.fields())
    }
}

/// `GET /q/{queue}`: the page of the list its [`Filters`] select (read
/// from the same query string; serde's `flatten` would lose the name of a
/// field in its error).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PageQuery {
    /// Out of range or not a number: the nearest page.
    pub page: One,
}

/// `GET /q/{queue}/record`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RecordQuery {
    pub id: One,
}

/// `GET /q/{queue}/progress`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProgressQuery {
    #[serde(rename = "id")]
    pub ids: Vec<String>,
    /// When the action was (seconds); an old link without it starts now.
    pub since: One,
}

/// A form of an action: it carries its sender's CSRF token, and has bounds.
pub trait ActionForm: serde::de::DeserializeOwned + Send {
    fn csrf(&self) -> &str;
    /// Refuse a field past its bound (after the CSRF check).
    fn check(&self) -> Result<(), DashboardError> {
        Ok(())
    }
}

/// Sign-out, resume and cancel: the CSRF token only.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CsrfForm {
    pub csrf: One,
}

impl ActionForm for CsrfForm {
    fn csrf(&self) -> &str {
        self.csrf.or_empty()
    }
}

/// `POST /login`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct LoginForm {
    pub csrf: One,
    pub token: One,
}

/// `POST /q/{queue}/pause`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PauseForm {
    pub csrf: One,
    pub reason: One,
}

impl ActionForm for PauseForm {
    fn csrf(&self) -> &str {
        self.csrf.or_empty()
    }
    fn check(&self) -> Result<(), DashboardError> {
        bounded(&[("reason", &self.reason)])
    }
}

/// `POST /q/{queue}/replay`: the selected records, a dry run unless `real`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ReplayForm {
    pub csrf: One,
    #[serde(rename = "id")]
    pub ids: Vec<String>,
    pub mode: Option<Mode>,
    pub past_provider_window: One,
}

impl ActionForm for ReplayForm {
    fn csrf(&self) -> &str {
        self.csrf.or_empty()
    }
}

/// `POST /q/{queue}/discard`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DiscardForm {
    pub csrf: One,
    pub id: One,
    pub reason: One,
    pub close_key: One,
}

impl ActionForm for DiscardForm {
    fn csrf(&self) -> &str {
        self.csrf.or_empty()
    }
    fn check(&self) -> Result<(), DashboardError> {
        bounded(&[("reason", &self.reason)])
    }
}

/// `POST /q/{queue}/fix`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct FixForm {
    pub csrf: One,
    pub id: One,
    pub payload: One,
    pub past_provider_window: One,
}

impl ActionForm for FixForm {
    fn csrf(&self) -> &str {
        self.csrf.or_empty()
    }
}

/// `POST /q/{queue}/group/{replay,discard,fix}`: the list page's query,
/// and what its review carries to the real action.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct GroupForm {
    pub csrf: One,
    pub mode: Option<Mode>,
    /// The keyed digest of the ids the review showed.
    pub reviewed: One,
    /// The keyed digest of the patch the preview applied.
    pub patch_reviewed: One,
    /// The id of the operation the real action creates (once).
    pub op: One,
    pub rate: One,
    pub reason: One,
    pub close_key: One,
    pub past_provider_window: One,
    pub patch: One,
    // The list page's query (its status is always open).
    pub since: One,
    pub until: One,
    pub function: One,
    pub error: One,
    pub search: One,
    pub group: One,
}

impl GroupForm {
    pub fn real(&self) -> bool {
        self.mode == Some(Mode::Real)
    }

    /// The query this form carries, forced to open records.
    pub fn filters(&self) -> Filters {
        Filters {
            status: One(Some("open".into())),
            since: self.since.clone(),
            until: self.until.clone(),
            function: self.function.clone(),
            error: self.error.clone(),
            search: self.search.clone(),
            group: self.group.clone(),
        }
    }
}

impl ActionForm for GroupForm {
    fn csrf(&self) -> &str {
        self.csrf.or_empty()
    }
    fn check(&self) -> Result<(), DashboardError> {
        self.filters().check()?;
        bounded(&[
            ("reviewed", &self.reviewed),
            ("patch_reviewed", &self.patch_reviewed),
            ("op", &self.op),
            ("rate", &self.rate),
            ("reason", &self.reason),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `s` read as axum-extra's `Form` reads a POST body.
    fn form<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, String> {
        use axum::extract::FromRequest as _;
        let req = axum::http::Request::post("/")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(axum::body::Body::from(s.to_string()))
            .unwrap();
        let read = axum_extra::extract::Form::<T>::from_request(req, &());
        futures::executor::block_on(read)
            .map(|f| f.0)
            .map_err(|e| e.body_text())
    }

    #[test]
    fn blank_is_absent_repeats_are_lists_or_refused() {
        let f: ReplayForm = form("id=a&id=b&mode=real&past_provider_window=").unwrap();
        assert_eq!(
            (f.ids, f.mode),
            (vec!["a".into(), "b".into()], Some(Mode::Real))
        );
        assert!(!f.past_provider_window.is_set());
        let one: ReplayForm = form("id=a&csrf=x").unwrap();
        assert_eq!(
            (one.csrf(), one.ids.as_slice()),
            ("x", &["a".to_string()][..])
        );
        let e = form::<DiscardForm>("id=a&id=b").unwrap_err();
        assert!(e.contains("id") && e.contains("more than once"), "{e}");
        let e = form::<GroupForm>("mode=sideways").unwrap_err();
        assert!(e.contains("mode") && e.contains("unknown variant"), "{e}");
        let g: GroupForm = form("mode=dry-run&search=o-1&group=a%7Cb&status=all").unwrap();
        assert_eq!(
            g.filters().pairs(),
            [("status", "open"), ("search", "o-1"), ("group", "a|b")]
        );
        let e = form::<GroupForm>("search=a&search=b").unwrap_err();
        assert!(e.contains("search: sent more than once"), "{e}");
        let q: Filters = form("status=all&page=2").unwrap();
        assert_eq!(q.pairs(), [("status", "all")]);
    }

    #[test]
    fn fields_past_their_bound_are_refused_by_name() {
        let long = "r".repeat(MAX_FIELD_CHARS + 1);
        let f: DiscardForm = form(&format!("id=a&reason={long}")).unwrap();
        let e = f.check().unwrap_err();
        assert!(matches!(e, DashboardError::BadInput { .. }), "{e:?}");
        assert!(e.to_string().contains("reason: at most 1000"), "{e}");
        let ok: DiscardForm = form("id=a&reason=fine").unwrap();
        assert!(ok.check().is_ok());
    }
}

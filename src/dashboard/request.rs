//! What every route shares: the state extractor, form and query pairs, the
//! page wrapper, redirects, and `tri!` (a refusal returned as the response).

use super::views::{self, Viewer};
use super::Dashboard;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::Markup;
use std::sync::Arc;

pub(super) type S = State<Arc<Dashboard>>;
pub(super) type Pairs = Vec<(String, String)>;
/// A response instead of what was asked (boxed: responses are large).
pub(super) type Refused = Box<Response>;

pub(super) fn pairs(s: &[u8]) -> Pairs {
    url::form_urlencoded::parse(s).into_owned().collect()
}

pub(super) fn get<'a>(p: &'a Pairs, k: &str) -> Option<&'a str> {
    p.iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.trim().is_empty())
}

pub(super) fn all(p: &Pairs, k: &str) -> Vec<String> {
    p.iter()
        .filter(|(n, v)| n == k && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect()
}

pub(super) fn page(
    status: StatusCode,
    title: &str,
    v: &Viewer,
    refresh: Option<u32>,
    body: Markup,
) -> Response {
    let html = views::layout(title, v, refresh, body).into_string();
    (status, Html(html)).into_response()
}

pub(super) fn see_other(to: &str) -> Response {
    Redirect::to(to).into_response()
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return *r,
        }
    };
}
pub(super) use tri;

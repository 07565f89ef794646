//! The one error type of the dashboard's routes, [`DashboardError`], and
//! the extractors whose rejections become it (axum's pattern: handlers
//! return `Result<_, DashboardError>` and use `?`).
//!
//! A refusal is a page that says why, with the navigation of whoever asked
//! ([`render`], the innermost layer but the body reader's: an error's
//! `IntoResponse` has no state, so it leaves its title and message in the
//! response's extensions and the layer draws the page). A form, query or
//! path that cannot be read is a 400 page naming the field, never axum's
//! plain-text rejection; nothing is changed by a refused request.

use super::auth::Principal;
use super::views::{self, enc};
use super::Dashboard;
use aqw_core::ops::OpsError;
use aqw_core::scrub::scrub;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// What a rejected extractor's detail (a field name and serde's reason) may
/// add to a page: a value echoed back (an unknown `mode`) is cut here.
const MAX_DETAIL_CHARS: usize = 300;

/// Why a dashboard request was not carried out. Each variant is one status
/// code and one kind of page; nothing was changed by the request.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// What the request carries is wrong: a form, query or path that cannot
    /// be read, a missing reason or payload, a bad filter, rate or patch,
    /// a value over its bound (400).
    #[error("{title}: {message}")]
    BadInput {
        title: &'static str,
        message: String,
    },
    /// No such queue, record or operation (404).
    #[error("{title}: {message}")]
    NotFound {
        title: &'static str,
        message: String,
    },
    /// Refused as things stand: a record no longer open, a selection that
    /// changed since its review, a patch not the previewed one (409).
    #[error("{title}: {message}")]
    Conflict {
        title: &'static str,
        message: String,
    },
    /// Storage failed or did not answer (503), its error scrubbed.
    #[error("storage unavailable: {0}")]
    StorageUnavailable(String),
    /// Nobody is asking: no credentials, a wrong one, or a session that
    /// ended (401, `WWW-Authenticate: Bearer`).
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// Someone is asking, but may not do this: a read-only dashboard, a
    /// form whose CSRF token is not theirs (403).
    #[error("{0}")]
    Forbidden(&'static str),
    /// One group action runs at a time on a dashboard (429).
    #[error("{0}")]
    Busy(&'static str),
    /// The request could not be read at all: a body too large (413, the
    /// connection closed after it), too slow (408), or not a form (415).
    #[error("{message}")]
    Unreadable { status: StatusCode, message: String },
    /// A page that needs signing in, asked without credentials on a
    /// dashboard with a token: 303 to `/login`.
    #[error("sign in first")]
    SignInFirst,
    /// A reviewed form submitted again: 303 to the page of the operation
    /// its first submission created.
    #[error("submitted before as operation {0}")]
    SubmittedBefore(String),
}

/// A refusal's page, left in a response's extensions for [`render`].
#[derive(Debug, Clone)]
struct Refusal {
    title: String,
    message: String,
    /// Drawn with the navigation of nobody (an authentication refusal).
    anonymous: bool,
}

impl DashboardError {
    /// A 400 page with `title` and `message`.
    pub fn bad_input(title: &'static str, message: impl Into<String>) -> Self {
        DashboardError::BadInput {
            title,
            message: message.into(),
        }
    }

    /// A 404 page with `title` and `message`.
    pub fn not_found(title: &'static str, message: impl Into<String>) -> Self {
        DashboardError::NotFound {
            title,
            message: message.into(),
        }
    }

    /// A 409 page with `title` and `message`.
    pub fn conflict(title: &'static str, message: impl Into<String>) -> Self {
        DashboardError::Conflict {
            title,
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            DashboardError::BadInput { .. } => StatusCode::BAD_REQUEST,
            DashboardError::NotFound { .. } => StatusCode::NOT_FOUND,
            DashboardError::Conflict { .. } => StatusCode::CONFLICT,
            DashboardError::StorageUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            DashboardError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            DashboardError::Forbidden(_) => StatusCode::FORBIDDEN,
            DashboardError::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
            DashboardError::Unreadable { status, .. } => *status,
            DashboardError::SignInFirst | DashboardError::SubmittedBefore(_) => {
                StatusCode::SEE_OTHER
            }
        }
    }

    /// The page this error is, or `None` for a redirect.
    fn refusal(self) -> Option<Refusal> {
        let status = self.status();
        let (title, message, anonymous) = match self {
            DashboardError::BadInput { title, message }
            | DashboardError::NotFound { title, message }
            | DashboardError::Conflict { title, message } => (title.to_string(), message, false),
            DashboardError::StorageUnavailable(message) => ("Not done".into(), message, false),
            DashboardError::Unauthenticated(m) | DashboardError::Forbidden(m) => {
                (status.to_string(), m.to_string(), true)
            }
            DashboardError::Busy(m) => ("Busy".into(), m.to_string(), false),
            DashboardError::Unreadable { message, .. } => (status.to_string(), message, false),
            DashboardError::SignInFirst | DashboardError::SubmittedBefore(_) => return None,
        };
        Some(Refusal {
            title,
            message,
            anonymous,
        })
    }
}

impl IntoResponse for DashboardError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            DashboardError::SignInFirst => return Redirect::to("/login").into_response(),
            DashboardError::SubmittedBefore(id) => {
                return Redirect::to(&format!("/ops/{}", enc(id))).into_response()
            }
            _ => {}
        }
        let Some(refusal) = self.refusal() else {
            return status.into_response();
        };
        // Plain text until `render` draws the page.
        let mut r = (status, refusal.message.clone()).into_response();
        let h = r.headers_mut();
        if status == StatusCode::UNAUTHORIZED {
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r.extensions_mut().insert(refusal);
        r
    }
}

impl From<OpsError> for DashboardError {
    fn from(e: OpsError) -> Self {
        let storage = matches!(e, OpsError::Storage(_));
        let message = scrub(&format!("{:#}", anyhow::Error::from(e)));
        if storage {
            DashboardError::StorageUnavailable(message)
        } else {
            DashboardError::conflict("Not done", message)
        }
    }
}

impl From<aqw_core::storage::StorageError> for DashboardError {
    fn from(e: aqw_core::storage::StorageError) -> Self {
        OpsError::from(e).into()
    }
}

/// A rejection's reason after axum's fixed prefix ("Failed to deserialize
/// form body: mode: unknown variant …"), cut to [`MAX_DETAIL_CHARS`].
fn detail(body_text: &str) -> String {
    let reason = body_text.split_once(": ").map_or(body_text, |(_, r)| r);
    let mut d: String = reason.chars().take(MAX_DETAIL_CHARS).collect();
    if d.len() < reason.len() {
        d.push('…');
    }
    d
}

/// The 400 of a form, query or path that was read but does not fit.
fn unreadable(what: &str, status: StatusCode, body_text: &str) -> DashboardError {
    let message = format!(
        "The {what} could not be read ({}): each field may be sent once, with a value of its kind. Nothing was changed.",
        detail(body_text)
    );
    if status.is_client_error() && status != StatusCode::UNSUPPORTED_MEDIA_TYPE {
        DashboardError::bad_input("Bad request", message)
    } else {
        DashboardError::Unreadable { status, message }
    }
}

impl From<axum_extra::extract::FormRejection> for DashboardError {
    fn from(r: axum_extra::extract::FormRejection) -> Self {
        use axum_extra::extract::FormRejection as R;
        match r {
            // Not a form (415) or a body that failed to arrive.
            R::RawFormRejection(raw) => DashboardError::Unreadable {
                status: raw.status(),
                message: format!("{} Nothing was changed.", raw.body_text()),
            },
            // Read, but not this form: 400 (axum-extra says 422 for a body).
            other => unreadable("form", StatusCode::BAD_REQUEST, &other.body_text()),
        }
    }
}

/// axum-extra's `Form` (a repeated field is a list), rejected as a
/// [`DashboardError`] page.
pub struct Form<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Form<T> {
    type Rejection = DashboardError;

    async fn from_request(req: Request, state: &S) -> Result<Self, DashboardError> {
        let axum_extra::extract::Form(t) = axum_extra::extract::Form::from_request(req, state)
            .await
            .map_err(DashboardError::from)?;
        Ok(Form(t))
    }
}

/// axum-extra's `Query` (a repeated field is a list), rejected as a
/// [`DashboardError`] page.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = DashboardError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, DashboardError> {
        match axum_extra::extract::Query::from_request_parts(parts, state).await {
            Ok(axum_extra::extract::Query(t)) => Ok(Query(t)),
            Err(r) => Err(unreadable("query", r.status(), &r.body_text())),
        }
    }
}

/// axum's `Path`, rejected as a [`DashboardError`] page (a segment that
/// is not UTF-8 once decoded is a 400 page).
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = DashboardError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, DashboardError> {
        match axum::extract::Path::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(t)) => Ok(Path(t)),
            Err(r) => Err(unreadable("path", r.status(), &r.body_text())),
        }
    }
}

impl Dashboard {
    /// `r` with the page of the refusal it carries, if any, drawn with the
    /// navigation of `who` (nobody for an authentication refusal).
    pub(super) fn draw_refusal(&self, mut r: Response, who: Option<&Principal>) -> Response {
        let Some(refusal) = r.extensions_mut().remove::<Refusal>() else {
            return r;
        };
        let v = self.viewer(who.filter(|_| !refusal.anonymous));
        let body = views::layout(&refusal.title, &v, None, views::message(&refusal.message));
        let (mut parts, _) = r.into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        let html = HeaderValue::from_static("text/html; charset=utf-8");
        parts.headers.insert(header::CONTENT_TYPE, html);
        Response::from_parts(parts, body.into_string().into())
    }

    /// `e`'s response, its page drawn for nobody (a layer outside
    /// [`render`]: the throttle).
    pub(super) fn refusal_page(&self, e: DashboardError) -> Response {
        self.draw_refusal(e.into_response(), None)
    }
}

/// Draw the page of every refusal a route answers, with the asker's
/// navigation (who is signed in, the queues, the read-only badge).
pub(super) async fn render(
    State(d): State<Arc<Dashboard>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = req.headers().clone();
    let r = next.run(req).await;
    if r.extensions().get::<Refusal>().is_none() {
        return r;
    }
    let who = d.auth.identify(&headers);
    d.draw_refusal(r, who.as_ref())
}

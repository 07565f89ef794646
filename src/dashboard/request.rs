//! What every route shares: the state, the two extractors that open a
//! route ([`Reader`] for a view, [`Act`] for an action: who asks, and for an
//! action its form and CSRF token), the page wrapper and redirects.

use super::auth::Principal;
use super::error::{DashboardError, Form};
use super::forms::ActionForm;
use super::views::{self, Viewer};
use super::Dashboard;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::Markup;
use std::sync::Arc;

pub(super) type S = State<Arc<Dashboard>>;
/// What a route answers: a page or redirect, or why not.
pub(super) type Answer = Result<Response, DashboardError>;

/// Who reads a view: anyone when no authentication is configured, else an
/// authenticated principal (`Dashboard::gate`).
pub(super) struct Reader(pub Viewer);

impl FromRequestParts<Arc<Dashboard>> for Reader {
    type Rejection = DashboardError;

    async fn from_request_parts(
        parts: &mut Parts,
        d: &Arc<Dashboard>,
    ) -> Result<Self, DashboardError> {
        d.gate(&parts.headers).map(Reader)
    }
}

/// An action's asker and form, checked in this order: a dashboard that is
/// not read-only (403), an authenticated principal (401), a form that can be
/// read (400), the principal's own CSRF token in it (403), the form's
/// bounds (400). Nothing is read from the form before the principal is known.
pub(super) struct Act<T> {
    pub v: Viewer,
    pub p: Principal,
    pub form: T,
}

impl<T: ActionForm> FromRequest<Arc<Dashboard>> for Act<T> {
    type Rejection = DashboardError;

    async fn from_request(req: Request, d: &Arc<Dashboard>) -> Result<Self, DashboardError> {
        let p = d.acting(req.headers())?;
        let Form(form) = Form::<T>::from_request(req, d).await?;
        let v = d.csrf_checked(&p, form.csrf())?;
        form.check()?;
        Ok(Act { v, p, form })
    }
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

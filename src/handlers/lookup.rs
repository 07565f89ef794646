//! Asking the provider whether a provider key took effect
//! (`handler.lookup`, issue 38): one HTTP GET to the configured URL with
//! `{providerKey}` replaced (percent-encoded) and `Idempotency-Key` set.
//! 2xx: applied; 404 or 410: not applied; any other status, a timeout, no
//! connection or an unreadable answer: unknown, with the reason. Never an
//! error and never a panic: an operator reads the answer beside the key.

use aqw_core::handler::{HandlerSpec, Lookup};
use serde::Serialize;

/// What the provider said of one provider key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum LookupAnswer {
    /// The provider applied it (its answer's status and a body excerpt).
    Applied { status: u16, body: String },
    /// The provider has no effect under this key.
    NotApplied { status: u16 },
    /// The provider could not tell, or could not be asked: why.
    Unknown { reason: String },
    /// The function has no `handler.lookup`: the provider was not asked.
    NotAsked,
}

impl LookupAnswer {
    /// One line for the operator.
    pub fn line(&self) -> String {
        match self {
            LookupAnswer::Applied { status, body } if body.is_empty() => {
                format!("applied (the provider answered HTTP {status})")
            }
            LookupAnswer::Applied { status, body } => {
                format!("applied (the provider answered HTTP {status}: {body})")
            }
            LookupAnswer::NotApplied { status } => {
                format!("not applied (the provider answered HTTP {status})")
            }
            LookupAnswer::Unknown { reason } => format!("unknown ({reason})"),
            LookupAnswer::NotAsked => {
                "not asked (the function has no handler.lookup: check the provider by hand)".into()
            }
        }
    }
}

/// The lookup of a function's handler, if it has one.
pub fn of(spec: &HandlerSpec) -> Option<&Lookup> {
    match spec {
        HandlerSpec::Http { answers, .. } => answers.lookup.as_ref(),
        _ => None,
    }
}

/// Ask `lookup` (or say it was not asked) about `provider_key`.
pub async fn ask(lookup: Option<&Lookup>, provider_key: &str) -> LookupAnswer {
    let Some(lookup) = lookup else {
        return LookupAnswer::NotAsked;
    };
    let encoded: String = url::form_urlencoded::byte_serialize(provider_key.as_bytes()).collect();
    let url = lookup.url.replace("{providerKey}", &encoded);
    let client = match aqw_azure::tls::client_builder()
        .timeout(lookup.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => return unknown(format!("cannot build an HTTP client: {e}")),
    };
    let answer = client
        .get(&url)
        .header("idempotency-key", provider_key)
        .send()
        .await;
    let resp = match answer {
        Ok(r) => r,
        Err(e) if e.is_timeout() => {
            return unknown(format!("timed out after {:?}", lookup.timeout))
        }
        Err(e) if e.is_connect() => return unknown("cannot connect to the lookup URL".into()),
        Err(_) => return unknown("the lookup request failed".into()),
    };
    let status = resp.status().as_u16();
    let body = match resp.text().await {
        Ok(b) => super::http::body_excerpt(&b),
        Err(e) if e.is_timeout() => {
            return unknown(format!(
                "timed out after {:?} reading the answer",
                lookup.timeout
            ))
        }
        Err(_) => return unknown(format!("HTTP {status} with an unreadable body")),
    };
    match status {
        200..=299 => LookupAnswer::Applied { status, body },
        404 | 410 => LookupAnswer::NotApplied { status },
        _ if body.is_empty() => unknown(format!("the provider answered HTTP {status}")),
        _ => unknown(format!("the provider answered HTTP {status}: {body}")),
    }
}

fn unknown(reason: String) -> LookupAnswer {
    LookupAnswer::Unknown { reason }
}

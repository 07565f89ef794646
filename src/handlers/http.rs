//! The built-in `http` handler: POST the payload to a URL.
//!
//! Headers: `Idempotency-Key: <ProviderKey>` (the same on every attempt and
//! every replay), `Aqw-Key` (the business key, percent-encoded), `Aqw-Message-Id`,
//! `Aqw-Dequeue-Count`, `Aqw-Previously-Pending`. 2xx success; 408, 425, 429,
//! 5xx, connect errors and timeouts retryable (honouring `Retry-After`); other
//! 4xx permanent.
//!
//! Uncertainty, stated once: an attempt "may have taken effect" only when its
//! outcome is unknown — a timeout or a connection lost after the request was
//! sent, 408, 500, 502, 504 and any other 5xx. An explicit refusal (425, 429,
//! 503, and the function's `refusedStatuses`) did not apply the request.
//! The answer (status, a short scrubbed body excerpt, the provider's replay
//! header) goes into the key's attempt history.

use super::{Handler, HandlerError, Job, ProviderAnswer, Success};
use async_trait::async_trait;
use std::time::Duration;

pub struct HttpHandler {
    url: url::Url,
    client: reqwest::Client,
    answers: ProviderAnswers,
}

/// How a function reads its provider's answers
/// (`aqw.functions.<Name>.handler.replayHeader` / `.refusedStatuses`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAnswers {
    /// The response header whose `true` means the provider
    /// answered from its idempotency store: the effect happened once, earlier.
    pub replay_header: Option<String>,
    /// Statuses that mean "refused, not applied", besides 425, 429 and 503.
    pub refused_statuses: Vec<u16>,
}

/// The longest body excerpt kept from a provider's answer, in bytes.
pub const BODY_EXCERPT_MAX: usize = 200;

/// A body excerpt fit for the history: scrubbed, one line, cut.
pub fn body_excerpt(body: &str) -> String {
    let one_line: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
    let s = crate::telemetry::scrub(&one_line);
    let mut end = s.len().min(BODY_EXCERPT_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

impl HttpHandler {
    pub fn new(url: url::Url, timeout: Duration) -> Result<Self, String> {
        let client = crate::tls::client_builder()
            .connect_timeout(Duration::from_secs(5).min(timeout))
            .timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot build HTTP client: {e}"))?;
        Ok(Self {
            url,
            client,
            answers: ProviderAnswers::default(),
        })
    }

    /// The same handler reading answers as the function's config says.
    pub fn reading_answers(mut self, answers: ProviderAnswers) -> Self {
        self.answers = answers;
        self
    }
}

/// Percent-encode a business key so any text fits a header value.
pub fn header_safe(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// `Retry-After`: delay-seconds or an HTTP date.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when =
        time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc2822).ok()?;
    let delta = when - time::OffsetDateTime::now_utc();
    Some(Duration::try_from(delta).unwrap_or(Duration::ZERO))
}

/// Classify a status code: None = success.
pub fn classify(
    status: u16,
    retry_after: Option<Duration>,
    body_tail: &str,
) -> Option<HandlerError> {
    classify_with(status, retry_after, body_tail, &[])
}

/// [`classify`] with the function's own refusal statuses (`refusedStatuses`).
pub fn classify_with(
    status: u16,
    retry_after: Option<Duration>,
    body_tail: &str,
    refused: &[u16],
) -> Option<HandlerError> {
    let message = if body_tail.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {body_tail}")
    };
    match status {
        200..=299 => None,
        // Refused before processing: 425, 429, 503 (the provider is not
        // taking work), and what the function declares. 408 and other 5xx
        // (500, 502, 504): the provider may have acted before answering.
        s if is_refusal(s, refused) => Some(HandlerError::Retryable {
            message,
            retry_after,
            may_have_taken_effect: false,
        }),
        408 | 500..=599 => Some(HandlerError::Retryable {
            message,
            retry_after,
            may_have_taken_effect: true,
        }),
        _ => Some(HandlerError::Permanent { message }),
    }
}

/// An explicit "not applied": 425, 429, 503 or one of `refused`.
pub fn is_refusal(status: u16, refused: &[u16]) -> bool {
    matches!(status, 425 | 429 | 503) || refused.contains(&status)
}

/// Whether the answer carries the replay signal (`true`, any case).
fn replay_signalled(headers: &reqwest::header::HeaderMap, name: Option<&str>) -> bool {
    name.and_then(|n| headers.get(n))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

#[async_trait]
impl Handler for HttpHandler {
    async fn handle(&self, job: &Job) -> Result<Success, HandlerError> {
        let resp = self
            .request(job)
            .send()
            .await
            .map_err(|e| self.send_error(&e))?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let replayed = replay_signalled(resp.headers(), self.answers.replay_header.as_deref());
        let body = resp.text().await.unwrap_or_default();
        let tail: String = body.chars().take(512).collect();
        match classify_with(
            status,
            retry_after,
            tail.trim(),
            &self.answers.refused_statuses,
        ) {
            None => Ok(Success::answered(ProviderAnswer {
                status,
                body: body_excerpt(&body),
                replayed,
            })),
            Some(e) => Err(e),
        }
    }
}

impl HttpHandler {
    /// The POST of one attempt, with aqw's headers.
    fn request(&self, job: &Job) -> reqwest::RequestBuilder {
        let mut req = self
            .client
            .post(self.url.clone())
            .header("content-type", "application/json")
            .header("aqw-message-id", &job.message_id)
            .header("aqw-dequeue-count", job.dequeue_count.to_string())
            .header(
                "aqw-previously-pending",
                if job.previously_pending {
                    "true"
                } else {
                    "false"
                },
            )
            .body(job.payload.clone());
        if let Some(pk) = &job.provider_key {
            req = req.header("idempotency-key", pk);
        }
        if let Some(k) = &job.key {
            req = req.header("aqw-key", header_safe(k));
        }
        if let Some(t) = &job.trace {
            req = req.header("traceparent", t.traceparent());
            if let Some(state) = &t.tracestate {
                req = req.header("tracestate", state);
            }
        }
        req
    }

    /// A request that got no answer: uncertain unless it never connected.
    fn send_error(&self, e: &reqwest::Error) -> HandlerError {
        let (what, sent) = if e.is_timeout() {
            ("timed out", true)
        } else if e.is_connect() {
            ("cannot connect", false)
        } else {
            ("request failed", true)
        };
        // The URL is the operator's own config: keep host and path, drop the query.
        let mut shown = self.url.clone();
        shown.set_query(None);
        let message = format!("POST {shown}: {what}");
        // Not connected: the provider never saw it. Otherwise it may have.
        if sent {
            HandlerError::uncertain(message)
        } else {
            HandlerError::retryable(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classification() {
        assert!(classify(200, None, "").is_none());
        assert!(classify(204, None, "").is_none());
        for s in [408, 425, 429, 500, 502, 503] {
            assert!(
                matches!(classify(s, None, ""), Some(HandlerError::Retryable { .. })),
                "{s}"
            );
        }
        for s in [400, 401, 403, 404, 409, 422] {
            assert!(
                matches!(classify(s, None, ""), Some(HandlerError::Permanent { .. })),
                "{s}"
            );
        }
        let e = classify(429, Some(Duration::from_secs(7)), "slow down").unwrap();
        assert_eq!(
            e,
            HandlerError::Retryable {
                message: "HTTP 429: slow down".into(),
                retry_after: Some(Duration::from_secs(7)),
                may_have_taken_effect: false,
            }
        );
        // A 5xx or a 408 came after the provider had the body: it may have acted.
        for s in [408, 500, 502, 504] {
            assert!(
                matches!(
                    classify(s, None, ""),
                    Some(HandlerError::Retryable {
                        may_have_taken_effect: true,
                        ..
                    })
                ),
                "{s}"
            );
        }
    }

    #[test]
    fn refusals_did_not_apply_and_can_be_declared() {
        let uncertain = |s, refused: &[u16]| {
            matches!(
                classify_with(s, None, "", refused),
                Some(HandlerError::Retryable {
                    may_have_taken_effect: true,
                    ..
                })
            )
        };
        for s in [425, 429, 503] {
            assert!(!uncertain(s, &[]), "{s} is a refusal");
        }
        assert!(uncertain(500, &[]), "500 is unknown unless declared");
        assert!(!uncertain(500, &[500]), "declared refused");
        let long = format!("https://a.example/?sv=1&sig=abc {} end", "x ".repeat(400));
        let e = body_excerpt(&long);
        assert!(e.len() <= BODY_EXCERPT_MAX && !e.contains("abc"), "{e}");
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("120"), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn keys_become_header_safe() {
        let h = header_safe("receipt:42/é #?\"😀");
        assert!(h.bytes().all(|b| b.is_ascii_graphic()), "{h}");
    }
}

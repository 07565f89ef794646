//! The built-in `http` handler: POST the payload to a URL.
//!
//! Headers: `Idempotency-Key: <ProviderKey>` (the same on every attempt and
//! every replay), `Aqw-Key` (the business key, percent-encoded), `Aqw-Message-Id`,
//! `Aqw-Dequeue-Count`, `Aqw-Previously-Pending`. 2xx success; 429
//! throttled, a "later" that spends no attempt, with the delay of
//! `Retry-After` or the RateLimit fields ([`super::rate_headers`]), or
//! aqw's backoff; 408, 409, 425, 5xx, connect errors and timeouts
//! retryable (a refusal or a 503 with a delay is a "later" too); other 4xx
//! permanent.
//!
//! Uncertainty, stated once: an attempt "may have taken effect" when its
//! outcome is unknown — a timeout or a connection lost after the request was
//! sent, 408 and any 5xx, 503 included (Envoy, the ingress of Container Apps
//! and Istio, answers 503 for an upstream connection reset after the request
//! was sent: envoyproxy/envoy#5876, istio/istio#9906) — and on 409, which
//! the IETF Idempotency-Key draft and Stripe (`idempotency_key_in_use`) use
//! for "a request with this key is still being processed": retried later,
//! since that first request may yet complete. An explicit refusal rests on
//! evidence a proxy cannot fake for the provider: 425, 429, and the
//! function's `refusedStatuses`. 422 (the key reused with other parameters)
//! is permanent, as every other 4xx.
//! The answer (status, a short scrubbed body excerpt, the provider's replay
//! header) goes into the key's attempt history.
//!
//! The POST goes out on the transport storage requests use
//! (`aqw_azure::transport`: hyper's pooled client, reqwest behind a
//! proxy), with this handler's own limits. A redirect is not followed: it
//! is the provider's answer (a 3xx, permanent), because re-sending a job to
//! a URL nobody configured (and, for 301-303, as a GET without its body) is
//! not something to do behind the operator's back.

use super::{Handler, HandlerError, Job, ProviderAnswer, Success};
use aqw_azure::transport::{Limits, Outgoing, SendError, Transport};
use async_trait::async_trait;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;

pub struct HttpHandler {
    url: url::Url,
    transport: Transport,
    answers: ProviderAnswers,
}

use aqw_core::handler::ProviderAnswers;

/// The longest body excerpt kept from a provider's answer, in bytes.
pub const BODY_EXCERPT_MAX: usize = 200;

/// A body excerpt fit for the history: scrubbed, one line, cut.
pub fn body_excerpt(body: &str) -> String {
    let one_line: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
    let s = aqw_core::scrub::scrub(&one_line);
    let mut end = s.len().min(BODY_EXCERPT_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

impl HttpHandler {
    pub fn new(url: url::Url, timeout: Duration) -> Result<Self, String> {
        let transport = Transport::from_env(Limits {
            connect: Duration::from_secs(5).min(timeout),
            request: timeout,
            pool_idle: Duration::from_secs(60),
        })
        .map_err(|e| format!("cannot build HTTP client: {e}"))?;
        Ok(Self {
            url,
            transport,
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

/// `Retry-After`: delay-seconds or an HTTP date (see
/// [`super::rate_headers`], which also reads the RateLimit fields).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    super::rate_headers::parse_retry_after_at(value, time::OffsetDateTime::now_utc())
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
        // Throttled: refused for now, not applied, whatever the headers
        // say (RFC 6585 §4): it spends no attempt and slows the adaptive
        // rate, and trips no breaker (the provider is up and answering).
        429 => Some(HandlerError::Throttled {
            message,
            retry_after,
        }),
        // Refused before processing: 425 and what the function declares.
        // 408 and every 5xx (a proxy's 503 included): the provider may
        // have acted before answering. A 503 with `Retry-After` is the
        // provider's own "come back later" (RFC 9110 §10.2.3, §15.6.4),
        // not a proxy's reset: a "later" too, and a throttle for the
        // adaptive rate, but it counts toward the breaker (a provider in
        // maintenance answers it to every call).
        s if is_refusal(s, refused) || (s == 503 && retry_after.is_some()) => {
            Some(HandlerError::Retryable {
                message,
                retry_after,
                may_have_taken_effect: false,
            })
        }
        // In progress: the first request with this key is still running;
        // it may complete, so this attempt may have taken effect.
        409 => Some(HandlerError::InProgress {
            message: format!("{message} (in progress: the provider is still processing this key)"),
            retry_after,
        }),
        408 | 500..=599 => Some(HandlerError::Retryable {
            message,
            retry_after,
            may_have_taken_effect: true,
        }),
        _ => Some(HandlerError::Permanent { message }),
    }
}

/// An explicit "not applied": 425, 429 or one of `refused`.
pub fn is_refusal(status: u16, refused: &[u16]) -> bool {
    matches!(status, 425 | 429) || refused.contains(&status)
}

/// Whether the answer carries the replay signal (`true`, any case).
fn replay_signalled(headers: &HeaderMap, name: Option<&str>) -> bool {
    name.and_then(|n| headers.get(n))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

#[async_trait]
impl Handler for HttpHandler {
    async fn handle(&self, job: &Job) -> Result<Success, HandlerError> {
        let resp = self
            .transport
            .send(Outgoing {
                method: http::Method::POST,
                url: self.url.as_str(),
                headers: self.headers(job)?,
                body: bytes::Bytes::from(job.payload.clone()),
            })
            .await
            .map_err(|e| self.send_error(e))?;
        let status = resp.status;
        let retry_after =
            super::rate_headers::provider_delay(&resp.headers, time::OffsetDateTime::now_utc());
        let body = String::from_utf8_lossy(&resp.body);
        let replayed = replay_signalled(&resp.headers, self.answers.replay_header.as_deref())
            || (self.answers.replay_marker.as_ref()).is_some_and(|m| m.found_in(&body));
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
            // A failure the provider says it replays: its saved answer to
            // an earlier attempt, which no retry with this key can change.
            Some(e) if replayed => Err(HandlerError::ReplayedFailure {
                message: format!("{e} (replayed: the provider answered this Idempotency-Key with the failure it saved from an earlier attempt)"),
            }),
            Some(e) => Err(e),
        }
    }
}

impl HttpHandler {
    /// aqw's headers on one attempt's POST. A value that is not valid HTTP
    /// fails the attempt for good (it would on every try), except
    /// `tracestate`, which comes from the payload and, invalid, is dropped
    /// as W3C Trace Context says.
    fn headers(&self, job: &Job) -> Result<HeaderMap, HandlerError> {
        let mut headers = HeaderMap::with_capacity(12);
        let mut put = |name: &'static str, value: &str| -> Result<(), HandlerError> {
            let value = HeaderValue::from_str(value)
                .map_err(|_| HandlerError::permanent(format!("header {name} is not valid HTTP")))?;
            headers.insert(HeaderName::from_static(name), value);
            Ok(())
        };
        put("content-type", "application/json")?;
        put("accept", "*/*")?;
        put("aqw-message-id", &job.message_id)?;
        put("aqw-dequeue-count", &job.dequeue_count.to_string())?;
        let previously = if job.previously_pending {
            "true"
        } else {
            "false"
        };
        put("aqw-previously-pending", previously)?;
        if let Some(pk) = &job.provider_key {
            put("idempotency-key", pk)?;
        }
        if let Some(k) = &job.key {
            put("aqw-key", &header_safe(k))?;
        }
        if let Some(t) = &job.trace {
            put("traceparent", &t.traceparent())?;
            if let Some(state) = &t.tracestate {
                let _ = put("tracestate", state);
            }
        }
        Ok(headers)
    }

    /// A request that got no answer: uncertain unless it never left.
    fn send_error(&self, e: SendError) -> HandlerError {
        // The URL is the operator's own config: keep host and path, drop the query.
        let mut shown = self.url.clone();
        shown.set_query(None);
        match e {
            // Not connected: the provider never saw it.
            SendError::Connect(_) => {
                HandlerError::retryable(format!("POST {shown}: cannot connect"))
            }
            SendError::TimedOut(_) => HandlerError::uncertain(format!("POST {shown}: timed out")),
            // The connection broke after the request went out: it may have acted.
            SendError::Io(_) => HandlerError::uncertain(format!("POST {shown}: request failed")),
            SendError::Invalid(text) => HandlerError::permanent(format!("POST {shown}: {text}")),
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
        for s in [408, 425, 500, 502, 503] {
            assert!(
                matches!(classify(s, None, ""), Some(HandlerError::Retryable { .. })),
                "{s}"
            );
        }
        for s in [400, 401, 403, 404, 422] {
            assert!(
                matches!(classify(s, None, ""), Some(HandlerError::Permanent { .. })),
                "{s}"
            );
        }
        let e = classify(429, Some(Duration::from_secs(7)), "slow down").unwrap();
        assert_eq!(
            e,
            HandlerError::throttled("HTTP 429: slow down", Some(Duration::from_secs(7)))
        );
        assert_eq!(
            classify(429, None, "").unwrap(),
            HandlerError::throttled("HTTP 429", None),
            "a bare 429 is throttled too: refused for now, not applied"
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
        assert!(!uncertain(425, &[]), "425 is a refusal");
        // A proxy answers 503 after an upstream reset: unknown unless the
        // provider's own refusal is declared; 409 is "in progress".
        assert!(uncertain(503, &[]), "503 is unknown unless declared");
        assert!(!uncertain(503, &[503]), "declared refused");
        assert!(
            matches!(
                classify_with(409, None, "", &[]),
                Some(HandlerError::InProgress { .. })
            ),
            "409: in progress, the first request may complete"
        );
        assert!(
            matches!(
                classify_with(503, Some(Duration::from_secs(2)), "", &[]),
                Some(HandlerError::Retryable {
                    may_have_taken_effect: false,
                    ..
                })
            ),
            "a 503 with Retry-After is the provider's own later"
        );
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

    fn job(tracestate: Option<&str>) -> Job {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        Job {
            function: "Grant".into(),
            message_id: "m-1".into(),
            dequeue_count: 2,
            payload: r#"{"orderId":"o-1"}"#.into(),
            key: None,
            provider_key: Some("pk-1".into()),
            previously_pending: true,
            key_partition: None,
            trace: aqw_core::traces::TraceContext::parse(tp, None).map(|mut t| {
                t.tracestate = tracestate.map(str::to_string);
                t
            }),
        }
    }

    /// A local provider answering every POST with `status`, `headers` and
    /// the request's headers and body echoed as its own body.
    async fn provider(status: u16, headers: &'static [(&'static str, &'static str)]) -> url::Url {
        let app = axum::Router::new().route(
            "/effects",
            axum::routing::post(move |h: axum::http::HeaderMap, body: String| async move {
                // Values only, in this order: the excerpt kept is 200 bytes.
                let seen: Vec<&str> = [
                    "aqw-message-id",
                    "aqw-dequeue-count",
                    "aqw-previously-pending",
                    "idempotency-key",
                    "content-type",
                    "traceparent",
                    "tracestate",
                ]
                .iter()
                .map(|n| h.get(*n).and_then(|v| v.to_str().ok()).unwrap_or("-"))
                .collect();
                let status = axum::http::StatusCode::from_u16(status).unwrap();
                let mut rsp = axum::http::HeaderMap::new();
                for (k, v) in headers {
                    rsp.insert(*k, axum::http::HeaderValue::from_static(v));
                }
                (status, rsp, format!("{}|{body}", seen.join("|")))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        url::Url::parse(&format!("http://{addr}/effects")).unwrap()
    }

    #[tokio::test]
    async fn a_post_carries_aqws_headers_and_the_payload() {
        let url = provider(200, &[("idempotent-replayed", "true")]).await;
        let answers = ProviderAnswers {
            replay_header: Some("Idempotent-Replayed".into()),
            ..Default::default()
        };
        let h = HttpHandler::new(url, Duration::from_secs(5))
            .unwrap()
            .reading_answers(answers);
        let answer = h
            .handle(&job(Some("vendor=a1")))
            .await
            .unwrap()
            .provider
            .unwrap();
        assert_eq!(answer.status, 200);
        assert!(
            answer.replayed,
            "the replay header is read by name, any case"
        );
        let headers = "m-1|2|true|pk-1|application/json|\
            00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01|vendor=a1|";
        assert_eq!(answer.body, format!("{headers}{}", job(None).payload));
    }

    #[tokio::test]
    async fn an_invalid_tracestate_is_dropped_not_the_job() {
        let url = provider(200, &[]).await;
        let h = HttpHandler::new(url, Duration::from_secs(5)).unwrap();
        let answer = h
            .handle(&job(Some("a=1\nb=2")))
            .await
            .unwrap()
            .provider
            .unwrap();
        assert!(
            answer.body.ends_with(r#"-01|-|{"orderId":"o-1"}"#),
            "{}",
            answer.body
        );
    }

    /// Issue 38: a replay is recognised without configuration (Stripe's
    /// header, read by default), and switched off with `""` in the config.
    #[tokio::test]
    async fn the_replay_header_is_read_by_default() {
        let url = provider(200, &[("Idempotent-Replayed", "true")]).await;
        let h = HttpHandler::new(url, Duration::from_secs(5)).unwrap();
        let answer = h.handle(&job(None)).await.unwrap().provider.unwrap();
        assert!(answer.replayed, "read without configuration");
        let url = provider(200, &[("Idempotent-Replayed", "true")]).await;
        let off = HttpHandler::new(url, Duration::from_secs(5))
            .unwrap()
            .reading_answers(ProviderAnswers {
                replay_header: None,
                ..Default::default()
            });
        let answer = off.handle(&job(None)).await.unwrap().provider.unwrap();
        assert!(!answer.replayed, "switched off");
    }

    /// Issue 38: 409 from an idempotent provider is "in progress": retried
    /// (not poisoned at once, its own kind, the engine marks it uncertain:
    /// the first request may still complete); a proxy's 503 is uncertain
    /// too; 422 stays permanent.
    #[tokio::test]
    async fn in_progress_is_retried_and_a_proxys_503_is_uncertain() {
        let url = provider(409, &[]).await;
        let h = HttpHandler::new(url, Duration::from_secs(5)).unwrap();
        assert!(matches!(
            h.handle(&job(None)).await,
            Err(HandlerError::InProgress { .. })
        ));
        let url = provider(503, &[]).await;
        let h = HttpHandler::new(url, Duration::from_secs(5)).unwrap();
        assert!(
            matches!(
                h.handle(&job(None)).await,
                Err(HandlerError::Retryable {
                    may_have_taken_effect: true,
                    ..
                })
            ),
            "a bare 503 may have taken effect"
        );
        let url = provider(429, &[]).await;
        let h = HttpHandler::new(url, Duration::from_secs(5)).unwrap();
        assert!(matches!(
            h.handle(&job(None)).await,
            Err(HandlerError::Throttled {
                retry_after: None,
                ..
            })
        ));
        let url = provider(
            429,
            &[
                ("ratelimit", "\"default\";r=0;t=9"),
                ("ratelimit-policy", "\"default\";q=7;w=1"),
            ],
        )
        .await;
        let h = HttpHandler::new(url, Duration::from_secs(5)).unwrap();
        let nine = Some(Duration::from_secs(9));
        assert!(
            matches!(
                h.handle(&job(None)).await,
                Err(HandlerError::Throttled { retry_after, .. }) if retry_after == nine
            ),
            "the RateLimit field's reset is the delay"
        );
        let url = provider(422, &[]).await;
        let h = HttpHandler::new(url, Duration::from_secs(5)).unwrap();
        assert!(matches!(
            h.handle(&job(None)).await,
            Err(HandlerError::Permanent { .. })
        ));
    }

    #[tokio::test]
    async fn a_redirect_is_the_providers_answer_not_followed() {
        let url = provider(307, &[("location", "http://127.0.0.1:9/elsewhere")]).await;
        let h = HttpHandler::new(url, Duration::from_secs(5)).unwrap();
        match h.handle(&job(None)).await {
            Err(HandlerError::Permanent { message }) => {
                assert!(message.starts_with("HTTP 307"), "{message}")
            }
            other => panic!("expected a permanent failure, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn no_connection_did_not_apply_and_silence_may_have() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = url::Url::parse(&format!("http://127.0.0.1:{port}/effects?code=s3cret")).unwrap();
        let refused = HttpHandler::new(url, Duration::from_secs(5))
            .unwrap()
            .handle(&job(None))
            .await;
        let Err(HandlerError::Retryable {
            message,
            may_have_taken_effect: false,
            ..
        }) = refused
        else {
            panic!("expected a retryable failure that did not apply, got {refused:?}");
        };
        assert!(
            message.contains("cannot connect") && !message.contains("s3cret"),
            "{message}"
        );

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let (_sock, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
        });
        let url = url::Url::parse(&format!("http://{addr}/effects")).unwrap();
        let silent = HttpHandler::new(url, Duration::from_millis(300))
            .unwrap()
            .handle(&job(None))
            .await;
        let Err(HandlerError::Retryable {
            message,
            may_have_taken_effect: true,
            ..
        }) = silent
        else {
            panic!("expected an uncertain failure, got {silent:?}");
        };
        assert!(message.ends_with("timed out"), "{message}");
        hold.abort();
    }
}

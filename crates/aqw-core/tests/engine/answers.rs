//! What a provider's answer means to the engine (issue 38): a 409 "in
//! progress" is retried without counting toward the breaker and poisoned
//! as `in_progress` if it lasts to the cap; a provider that replays its
//! saved failure (the same HTTP 500 and body to every attempt under one
//! `Idempotency-Key`, with `providerKeyWindow` declared) stops costing
//! attempts and is poisoned as `replayed_failure`.

use crate::common::*;
use aqw_core::message::ErrorKind;
use std::sync::Arc;
use std::time::Duration;

/// 30 jobs, every call answered 409: each waits out
/// `aqw.inProgressTimeout` (here 20 s), then is retried to the cap and
/// poisoned as `in_progress`, and the breaker never opens (in progress is
/// no sign of an outage).
#[tokio::test(start_paused = true)]
async fn in_progress_to_the_cap_is_its_own_kind_and_trips_no_breaker() {
    let env = Env::new(|_, _| Behave::InProgress);
    let mut keys = Vec::new();
    for n in 0..30 {
        let job = env.job(&format!("ip{n}"));
        env.enqueue(&job).await;
        keys.push(job.key);
    }
    let worker = env
        .builder()
        .configure(|app| app.in_progress_timeout = Duration::from_secs(20))
        .build()
        .expect("valid settings");
    let running = start(worker);
    env.wait_until("every job poisoned", minutes(10), || async {
        env.records().await.len() == 30
    })
    .await;
    running.stop().await;
    for r in env.records().await {
        assert_eq!(r.error.kind, ErrorKind::InProgress, "{:?}", r.error);
        assert!(r.uncertain_attempts > 0, "the first request may complete");
    }
    let spent = env
        .provider
        .calls()
        .iter()
        .filter(|c| c.dequeue_count > 1)
        .count();
    assert_eq!(spent, 30 * 4, "every attempt was spent after the timeout");
    assert!(
        !env.alerts()
            .iter()
            .any(|a| matches!(a, aqw_core::alert::AlertEvent::Breaker(_))),
        "no breaker transition"
    );
}

const SAVED_FAILURE: &str =
    r#"HTTP 500: {"error":{"type":"api_error","request_log_url":"https://p.example/req_7Hx"}}"#;

/// A provider that saved its first failure (Stripe keeps 500s too) answers
/// every retry with it. With `providerKeyWindow` declared, the third
/// identical answer poisons the job as `replayed_failure`, two attempts
/// sooner, and the record says why in plain words.
#[tokio::test(start_paused = true)]
async fn a_replayed_saved_failure_stops_costing_attempts() {
    let env = Env::new(|_, _| Behave::Retry(SAVED_FAILURE.into()));
    let job = env.job("saved");
    env.enqueue(&job).await;
    let worker = env
        .builder_on(Arc::new(env.storage.clone()), |f| {
            f.provider_key_window = Some(Duration::from_secs(24 * 3600))
        })
        .build()
        .expect("valid settings");
    let running = start(worker);
    env.wait_until("poisoned", minutes(10), || async {
        env.records().await.len() == 1
    })
    .await;
    running.stop().await;
    let rec = &env.records().await[0];
    assert_eq!(rec.error.kind, ErrorKind::ReplayedFailure);
    assert!(
        rec.error
            .message
            .contains("the provider replays the failure it saved")
            && rec.error.message.contains("24h"),
        "{}",
        rec.error.message
    );
    assert_eq!(env.provider.calls_for(&job.key).len(), 3);
}

/// The same answers without `providerKeyWindow`: nothing says the provider
/// keeps its answers, so they are five ordinary failures.
#[tokio::test(start_paused = true)]
async fn the_same_failure_without_a_key_window_is_an_ordinary_one() {
    let env = Env::new(|_, _| Behave::Retry(SAVED_FAILURE.into()));
    let job = env.job("plain");
    env.enqueue(&job).await;
    let running = start(env.worker());
    env.wait_until("poisoned", minutes(10), || async {
        env.records().await.len() == 1
    })
    .await;
    running.stop().await;
    assert_eq!(env.records().await[0].error.kind, ErrorKind::Retryable);
    assert_eq!(env.provider.calls_for(&job.key).len(), 5);
}

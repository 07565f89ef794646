//! The producer API and delayed jobs (issue 42 items 2 and 3): a typed job
//! put by [`Producer`] runs once under the key the worker derives; a delayed
//! job is not run before its time and runs once after it; the delivery
//! rules refuse what the service would refuse or what would expire before
//! it is delivered; a job the worker could not key is never sent.

use crate::common::*;
use aqw_core::idempotency::KeyStatus;
use aqw_core::ops::{Delivery, DeliveryError};
use aqw_core::producer::Producer;
use aqw_core::storage::Ttl;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn producer(env: &Env) -> Producer {
    Producer::new(env.app(), Arc::new(env.storage.clone()))
}

#[tokio::test(start_paused = true)]
async fn a_typed_job_runs_once_under_the_key_the_worker_derives() {
    let env = Env::new(|_, _| Behave::Succeed);
    let id = format!("{}-typed", env.id);
    let put = producer(&env)
        .enqueue(&env.queue, &json!({ "id": id }), Delivery::default())
        .await
        .expect("enqueued");
    let key = put.key.expect("a keyed function").to_string();
    assert_eq!(key, format!("job:{id}"));
    assert!(put.visible_at.is_none(), "visible at once");

    let w = start(env.worker());
    env.drained(Duration::from_secs(60)).await;
    w.stop().await;
    env.provider.assert_applied_once(std::slice::from_ref(&key));
    assert_eq!(
        env.key(&key).await.expect("key record").status,
        KeyStatus::Done
    );
}

#[tokio::test(start_paused = true)]
async fn a_delayed_job_waits_for_its_time_then_runs_once() {
    let env = Env::new(|_, _| Behave::Succeed);
    let id = format!("{}-later", env.id);
    let delivery = Delivery::after(2 * HOUR, Ttl::Default).expect("a valid delay");
    let put = producer(&env)
        .enqueue(&env.queue, &json!({ "id": id }), delivery)
        .await
        .expect("enqueued");
    assert!(put.visible_at.is_some());
    let w = start(env.worker());
    // Polling all along: nothing runs for the first two hours.
    tokio::time::sleep(2 * HOUR - Duration::from_secs(60)).await;
    assert!(env.provider.calls().is_empty(), "ran before its time");
    assert_eq!(env.source_depth().await, 1, "still waiting on the queue");
    env.drained(Duration::from_secs(300)).await;
    w.stop().await;
    env.provider.assert_applied_once(&[format!("job:{id}")]);
}

#[test]
fn delivery_rules_refuse_what_the_service_would_or_what_would_expire_first() {
    // Beyond 7 days invisible: the service's limit, whatever the ttl.
    let e = Delivery::after(7 * DAY + Duration::from_secs(1), Ttl::Never).unwrap_err();
    assert!(matches!(e, DeliveryError::DelayOverSevenDays { .. }));
    let e = e.to_string();
    assert!(e.contains("7 days"), "{e}");
    // Not shorter than the time-to-live: it would expire undelivered.
    let e = Delivery::after(7 * DAY, Ttl::Default)
        .unwrap_err()
        .to_string();
    assert!(e.contains("expire before it is delivered"), "{e}");
    let e = Delivery::after(HOUR, Ttl::After(HOUR)).unwrap_err();
    assert_eq!(
        e,
        DeliveryError::ExpiresFirst {
            delay: HOUR,
            lifetime: HOUR
        }
    );
    let e = e.to_string();
    assert!(e.contains("expire before it is delivered"), "{e}");
    // A time-to-live of no time is refused; never is fine.
    assert!(Delivery::after(Duration::ZERO, Ttl::After(Duration::ZERO)).is_err());
    assert!(Delivery::after(7 * DAY, Ttl::Never).is_ok());
    assert!(Delivery::after(HOUR, Ttl::After(2 * HOUR)).is_ok());
    // Over 7 days the adapters would cut it short: refused, never is the way.
    let e = Delivery::after(6 * DAY, Ttl::After(30 * DAY))
        .unwrap_err()
        .to_string();
    assert!(e.contains("give never"), "{e}");
    // Compared in the whole seconds the service takes: 1.5 s delay vs 2 s.
    assert!(Delivery::after(
        Duration::from_millis(1500),
        Ttl::After(Duration::from_secs(2))
    )
    .is_err());
    // --at: the future only.
    let now = time::OffsetDateTime::now_utc();
    assert!(Delivery::at(now - time::Duration::minutes(1), now, Ttl::Default).is_err());
    assert!(Delivery::at(now, now, Ttl::Default).is_err());
    let at = Delivery::at(now + time::Duration::hours(3), now, Ttl::Default).unwrap();
    assert_eq!(at.delay(), 3 * HOUR);
    assert!(Delivery::at(now + time::Duration::days(8), now, Ttl::Never).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_job_the_worker_could_not_key_is_never_sent() {
    let env = Env::new(|_, _| Behave::Succeed);
    let p = producer(&env);
    let e = p
        .enqueue(&env.queue, &json!({ "notTheId": 1 }), Delivery::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("poison"), "{e}");
    let e = p
        .enqueue(
            "not-a-queue-of-this-app",
            &json!({ "id": "x" }),
            Delivery::default(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not consumed"), "{e}");
    // Too large for a message, with claim-check turned off (on, it goes to
    // a blob: engine/claim_check.rs).
    let mut app = (*env.app()).clone();
    app.claim_check.enabled = false;
    let p = Producer::new(Arc::new(app), Arc::new(env.storage.clone()));
    let big = json!({ "id": format!("{}-big", env.id), "pad": "x".repeat(70_000) });
    let e = p
        .enqueue(&env.queue, &big, Delivery::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("49152"), "{e}");
    assert_eq!(env.source_depth().await, 0, "nothing was put");
}

//! The producer API: a Rust service puts jobs exactly as `aqw enqueue` does.
//! The same checks run before anything is sent: the queue must be consumed
//! by a function of the app, the job must derive that function's key (a job
//! the worker could only poison is refused), a job over
//! `aqw.claimCheck.threshold` goes to a blob with a reference on the queue
//! ([`crate::claim`]; else the encoded text must fit in a message), and the
//! delay and time-to-live follow [`Delivery`]'s rules.
//!
//! ```
//! use aqw_core::builder::{handler_fn, WorkerBuilder};
//! use aqw_core::handler::Success;
//! use aqw_core::idempotency::{KeySpec, KeyTemplate};
//! use aqw_core::ops::Delivery;
//! use aqw_core::producer::Producer;
//! use aqw_core::storage::{memory::MemoryStorage, Ttl};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! #[derive(serde::Serialize)]
//! struct Receipt<'a> {
//!     #[serde(rename = "orderId")]
//!     order_id: &'a str,
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let storage = Arc::new(MemoryStorage::new());
//! let worker = WorkerBuilder::new(storage.clone())
//!     .function("SendReceipt", "receipts", handler_fn(|_job| async { Ok(Success::default()) }))
//!     .key(KeySpec::Template(KeyTemplate::parse("receipt:{/orderId}").unwrap()))
//!     .build()
//!     .unwrap();
//! let producer = Producer::new(worker.config().clone(), storage);
//!
//! // Now, and in an hour: the key is the one the worker will claim.
//! let now = producer.enqueue("receipts", &Receipt { order_id: "o-1" }, Delivery::default()).await.unwrap();
//! assert_eq!(now.key.unwrap().as_str(), "receipt:o-1");
//! let later = Delivery::after(Duration::from_secs(3600), Ttl::Default).unwrap();
//! let queued = producer.enqueue("receipts", &Receipt { order_id: "o-2" }, later).await.unwrap();
//! assert!(queued.visible_at.is_some());
//!
//! // A job the worker could not key is refused before anything is sent.
//! let keyless = serde_json::json!({ "order": "o-3" });
//! assert!(producer.enqueue("receipts", &keyless, Delivery::default()).await.is_err());
//! # }
//! ```

use crate::config::AppConfig;
use crate::ops::{enqueue_with, prepare_enqueue, Delivery, Enqueued, OpsError, OpsResult};
use crate::storage::Storage;
use serde::Serialize;
use std::sync::Arc;

/// Puts jobs on the queues of one app, over the storage of its functions'
/// account (the Azure adapter in production, the memory store in tests).
#[derive(Clone)]
pub struct Producer {
    app: Arc<AppConfig>,
    storage: Arc<dyn Storage>,
}

impl Producer {
    /// A producer for `app` (an app folder's config, or
    /// [`crate::builder::Worker::config`]) over `storage`.
    pub fn new(app: Arc<AppConfig>, storage: Arc<dyn Storage>) -> Self {
        Self { app, storage }
    }

    /// Serialize `job` to JSON and put it on `queue` per `delivery`.
    pub async fn enqueue<T: Serialize + ?Sized>(
        &self,
        queue: &str,
        job: &T,
        delivery: Delivery,
    ) -> OpsResult<Enqueued> {
        let payload = serde_json::to_string(job)
            .map_err(|e| OpsError::Usage(format!("the job does not serialize to JSON: {e}")))?;
        self.enqueue_text(queue, &payload, delivery).await
    }

    /// Put `payload` (the exact text the handler will get) on `queue` per
    /// `delivery`.
    pub async fn enqueue_text(
        &self,
        queue: &str,
        payload: &str,
        delivery: Delivery,
    ) -> OpsResult<Enqueued> {
        let job = prepare_enqueue(&self.app, queue, payload, false)?;
        enqueue_with(job, delivery, self.storage.as_ref()).await
    }
}

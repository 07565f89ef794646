//! Flow control across the fleet (issue 37): per function, at most
//! `callsPerSecond` handler calls and at most `inFlight` calls at once,
//! counted over every replica; per key template (`perKey`), at most
//! `inFlight` calls at once for each value (one tenant cannot take every
//! slot). The counts live in the control table's `limits` partition, one
//! row per limit, written under ETags (`rate`: a GCRA row; [`slots`]: a
//! lease-based counting semaphore).
//!
//! Work over a function-wide limit is not received at all: the poll loop
//! asks `Flow::before_receive` first and waits, so the messages stay on
//! the queue without spending a dequeue. Work over a per-key limit is known
//! only once received (the key is in the payload): it is parked as a fresh
//! copy, which spends no attempt either.
//!
//! Costs, only for a function with limits: a receive adds one row read and
//! one write per limit (two when it reserves rate and slots), and a job
//! under `perKey` two reads and two writes (take and give back); a replica
//! holding slots renews its entry every `slots::RENEW_EVERY`. An error
//! reading a limit's row holds the receive (fail closed, logged); an error
//! handing slots back leaves them counted until [`slots::HOLD_TTL`].

pub mod adaptive;
pub(crate) mod rate;
mod rows;
pub mod slots;

pub use rows::PARTITION;

use crate::idempotency::KeyTemplate;
use crate::storage::{StorageResult, TableStore};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;

/// A function's fleet-wide flow limits (`aqw.functions.<Name>.limits`);
/// the default sets none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlowLimits {
    /// At most this many handler calls per second, fleet-wide.
    pub calls_per_second: Option<f64>,
    /// At most this many handler calls in flight, fleet-wide.
    pub in_flight: Option<u32>,
    /// At most this many calls in flight per value of a key template.
    pub per_key: Option<PerKeyLimit>,
}

impl FlowLimits {
    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        self.calls_per_second.is_none() && self.in_flight.is_none() && self.per_key.is_none()
    }
}

/// `perKey`: calls in flight per value of `key` (`{/accountId}`).
#[derive(Debug, Clone, PartialEq)]
pub struct PerKeyLimit {
    /// The template whose value groups the jobs.
    pub key: KeyTemplate,
    /// At most this many in flight per value.
    pub in_flight: u32,
}

/// How long a poll loop waits after a limit's row could not be read.
const ERROR_WAIT: Duration = Duration::from_secs(1);

/// How long a poll loop waits when every in-flight slot is taken.
const SLOTS_WAIT: Duration = Duration::from_millis(200);

/// The longest one receive reserves calls for: a replica never holds
/// messages for much more than this (plus [`rate::HORIZON`]) before its
/// slots come.
const MAX_RESERVE: Duration = Duration::from_secs(1);

/// One function's limits on one replica.
pub(crate) struct Flow {
    function: String,
    worker_id: String,
    table: Arc<dyn TableStore>,
    limits: FlowLimits,
    /// How many slots this replica holds, per row.
    held: Mutex<BTreeMap<String, u32>>,
    /// One writer per row in this replica.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Rows with a release waiting to be written.
    to_sync: Mutex<std::collections::HashSet<String>>,
}

/// How long a released slot waits for others to be written with it.
const RELEASE_DELAY: Duration = Duration::from_millis(100);

/// What the limits allow one receive.
#[derive(Debug)]
pub(crate) struct Grant {
    /// Receive at most this many.
    pub(crate) receive: u32,
    slots: u32,
    rate: Option<rate::Reserved>,
}

/// A job's place under the limits: when it may start, and the slots it
/// holds until dropped.
pub(crate) struct Ticket {
    /// Start the handler no earlier than this.
    pub start: Option<Instant>,
    _slot: Option<Permit>,
}

/// Slots held on one row; handed back (asynchronously) when dropped.
pub(crate) struct Permit {
    flow: Arc<Flow>,
    row: String,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.flow.give_back_one(&self.row);
    }
}

/// What the per-key limit says of one job.
pub(crate) enum KeyAdmission {
    /// Run; the permit (if any) is held until dropped.
    Run(Option<Permit>),
    /// The key's value is at its limit: park for this long.
    Park(Duration),
}

impl Flow {
    /// The limits of `function` on this replica, over the control `table`;
    /// `None` when it has none.
    pub(crate) fn new(
        function: &str,
        worker_id: &str,
        table: Arc<dyn TableStore>,
        limits: &FlowLimits,
    ) -> Option<Arc<Self>> {
        (!limits.is_empty()).then(|| {
            Arc::new(Self {
                function: function.to_string(),
                worker_id: worker_id.to_string(),
                table,
                limits: limits.clone(),
                held: Mutex::default(),
                locks: Mutex::default(),
                to_sync: Mutex::default(),
            })
        })
    }

    fn rate_row(&self) -> String {
        format!("{}.rate", self.function)
    }
    fn slots_row(&self) -> String {
        format!("{}.inflight", self.function)
    }

    /// Before a receive of up to `want`: how many the limits allow now, or
    /// how long to wait. Slots are taken first (cheap to hand back), then
    /// calls reserved for as many.
    pub(crate) async fn before_receive(&self, want: u32) -> Result<Grant, Duration> {
        let mut n = want;
        if let Some(r) = self.limits.calls_per_second {
            n = n.min(((r * MAX_RESERVE.as_secs_f64()) as u32).max(1));
        }
        let mut slots = 0;
        if let Some(limit) = self.limits.in_flight {
            slots = match self.take(&self.slots_row(), limit, n).await {
                Ok(0) => return Err(self.waited("inFlight", SLOTS_WAIT)),
                Ok(g) => g,
                Err(e) => return Err(self.failed(e)),
            };
            n = slots;
        }
        let mut reserved = None;
        if let Some(r) = self.limits.calls_per_second {
            let wait = match rate::take(self.table.as_ref(), &self.rate_row(), n, r).await {
                Ok(Ok(res)) => {
                    reserved = Some(res);
                    None
                }
                Ok(Err(wait)) => Some(self.waited("callsPerSecond", wait)),
                Err(e) => Some(self.failed(e)),
            };
            if let Some(wait) = wait {
                self.release(&self.slots_row(), slots).await;
                return Err(wait);
            }
        }
        Ok(Grant {
            receive: n,
            slots,
            rate: reserved,
        })
    }

    /// After the receive: hand back what `got` messages did not use, and
    /// one ticket per message (its start time and its slot).
    pub(crate) async fn after_receive(self: &Arc<Self>, grant: Grant, got: u32) -> Vec<Ticket> {
        let unused = grant.receive.saturating_sub(got);
        if unused > 0 {
            self.release(&self.slots_row(), grant.slots.min(unused))
                .await;
            if let Some(r) = &grant.rate {
                let row = self.rate_row();
                let back = rate::give_back(self.table.as_ref(), &row, r, unused);
                if let Err(e) = back.await {
                    warn!(function = %self.function, error = %e, "could not hand back unused calls of the rate limit");
                }
            }
        }
        let now = Instant::now();
        (0..got)
            .map(|i| Ticket {
                start: grant
                    .rate
                    .map(|r| now + Duration::from_secs_f64(r.first_in + f64::from(i) * r.spacing)),
                _slot: (grant.slots > i).then(|| Permit {
                    flow: self.clone(),
                    row: self.slots_row(),
                }),
            })
            .collect()
    }

    /// The per-key limit for one job's payload. A payload without the
    /// template's fields is not limited by it.
    pub(crate) async fn admit_key(self: &Arc<Self>, payload: &str) -> KeyAdmission {
        let Some(per_key) = &self.limits.per_key else {
            return KeyAdmission::Run(None);
        };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(payload) else {
            return KeyAdmission::Run(None);
        };
        let Ok(value) = per_key.key.render(&json) else {
            return KeyAdmission::Run(None);
        };
        let row = format!("{}.key.{}", self.function, &value.row_key()[..32]);
        match self.take(&row, per_key.in_flight, 1).await {
            Ok(0) => KeyAdmission::Park(self.waited("perKey", KEY_PARK)),
            Ok(_) => KeyAdmission::Run(Some(Permit {
                flow: self.clone(),
                row,
            })),
            Err(e) => KeyAdmission::Park(self.failed(e)),
        }
    }

    /// Renew this replica's entries while it holds slots, until `shutdown`.
    pub(crate) async fn renew(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                biased;
                _ = tokio::time::sleep(slots::RENEW_EVERY) => {}
                _ = shutdown.cancelled() => return,
            }
            let rows: Vec<String> = self.held.lock().unwrap().keys().cloned().collect();
            for row in rows {
                self.sync(&row).await;
            }
        }
    }

    async fn take(&self, row: &str, limit: u32, want: u32) -> StorageResult<u32> {
        let lock = self.lock(row);
        let _guard = lock.lock().await;
        let mine = self.held(row);
        let got = slots::take(self.table.as_ref(), row, &self.worker_id, mine, limit, want).await?;
        *self
            .held
            .lock()
            .unwrap()
            .entry(row.to_string())
            .or_default() += got;
        Ok(got)
    }

    async fn release(&self, row: &str, n: u32) {
        if n == 0 {
            return;
        }
        self.count_down(row, n);
        self.sync(row).await;
    }

    /// A job's slot ends: counted down at once, written after
    /// [`RELEASE_DELAY`] with whatever else ended meanwhile (one read and at
    /// most one write for a burst of jobs ending, not two per job). A take
    /// in between writes the count anyway.
    fn give_back_one(self: &Arc<Self>, row: &str) {
        self.count_down(row, 1);
        if !self.to_sync.lock().unwrap().insert(row.to_string()) {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (flow, row) = (self.clone(), row.to_string());
            rt.spawn(crate::clock::carry(async move {
                tokio::time::sleep(RELEASE_DELAY).await;
                flow.to_sync.lock().unwrap().remove(&row);
                flow.sync(&row).await;
            }));
        }
    }

    fn count_down(&self, row: &str, n: u32) {
        if let Some(c) = self.held.lock().unwrap().get_mut(row) {
            *c = c.saturating_sub(n);
        }
    }

    /// Write this replica's entry of `row` as the count it holds now.
    async fn sync(&self, row: &str) {
        let lock = self.lock(row);
        let _guard = lock.lock().await;
        let mine = self.held(row);
        if let Err(e) = slots::set(self.table.as_ref(), row, &self.worker_id, mine).await {
            warn!(function = %self.function, error = %e, "could not update this replica's slots; they count until their entry expires");
            return;
        }
        if mine == 0 {
            let mut held = self.held.lock().unwrap();
            if held.get(row) == Some(&0) {
                held.remove(row);
                self.locks.lock().unwrap().remove(row);
            }
        }
    }

    fn held(&self, row: &str) -> u32 {
        self.held.lock().unwrap().get(row).copied().unwrap_or(0)
    }

    fn lock(&self, row: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .unwrap()
            .entry(row.to_string())
            .or_default()
            .clone()
    }

    fn waited(&self, limit: &'static str, wait: Duration) -> Duration {
        metrics::counter!("aqw_flow_waits_total", "function" => self.function.clone(), "limit" => limit)
            .increment(1);
        wait
    }

    fn failed(&self, e: crate::storage::StorageError) -> Duration {
        warn!(function = %self.function, error = %e, "cannot read a flow limit's row; holding the receive");
        ERROR_WAIT
    }
}

/// How long a job over its key's limit is parked: a slot of a busy key
/// frees when one of its calls ends, which this waits out at a cost of one
/// put and one delete per look.
const KEY_PARK: Duration = Duration::from_secs(5);

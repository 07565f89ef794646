//! The queues of the memory store: the queue state (messages by visibility
//! and by expiry) and [`QueueStore`] on it, as the module documentation of
//! [`super`] describes.

use super::{http, whole_secs, wire, Scope, Shared, StaleReceipt, State};
use crate::storage::{
    PeekedMessage, PutReceipt, QueueStore, ReceivedMessage, StorageError, StorageResult, Ttl,
};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;
use time::macros::datetime;
use time::OffsetDateTime;

/// Queue Storage's limit on message text, in bytes of UTF-8.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// The service's default message time-to-live.
const DEFAULT_TTL_SECS: u64 = 7 * 24 * 3600;
/// The expiration time the service reports for `messagettl=-1`.
const NEVER_EXPIRES: OffsetDateTime = datetime!(9999-12-31 23:59:59.999 UTC);
/// Messages per receive or peek, at most.
const MAX_MESSAGES_PER_RECEIVE: u8 = 32;

/// Azure's queue naming rules, with Azurite's error codes.
fn check_queue_name(name: &str) -> StorageResult<()> {
    if name.is_empty() {
        return Err(http(400, "InvalidResourceName"));
    }
    if !(3..=63).contains(&name.len()) {
        return Err(http(400, "OutOfRangeInput"));
    }
    let valid_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !valid_chars || name.split('-').any(str::is_empty) {
        return Err(http(400, "InvalidResourceName"));
    }
    Ok(())
}

struct Message {
    seq: u64,
    text: String,
    inserted: OffsetDateTime,
    expires: OffsetDateTime,
    visible_at: OffsetDateTime,
    dequeue_count: u32,
    pop_receipt: String,
}

#[derive(Default)]
pub(super) struct Queue {
    messages: BTreeMap<String, Message>,
    /// (visible from, insertion order) → id: the receive order.
    by_visible: BTreeMap<(OffsetDateTime, u64), String>,
    /// (expires at, insertion order) → id.
    by_expiry: BTreeMap<(OffsetDateTime, u64), String>,
}

impl Queue {
    /// Drop the messages whose time-to-live has passed (at `expires`, as
    /// Azurite compares).
    fn sweep(&mut self, now: OffsetDateTime) {
        while let Some(entry) = self.by_expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let id = entry.remove();
            if let Some(m) = self.messages.remove(&id) {
                self.by_visible.remove(&(m.visible_at, m.seq));
            }
        }
    }

    /// Up to `max` visible messages, in receive order.
    fn visible(&self, now: OffsetDateTime, max: usize) -> Vec<String> {
        self.by_visible
            .range(..=(now, u64::MAX))
            .take(max)
            .map(|(_, id)| id.clone())
            .collect()
    }

    fn set_visible_at(&mut self, id: &str, at: OffsetDateTime) {
        if let Some(m) = self.messages.get_mut(id) {
            self.by_visible.remove(&(m.visible_at, m.seq));
            m.visible_at = at;
            self.by_visible.insert((at, m.seq), id.to_string());
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(m) = self.messages.remove(id) {
            self.by_visible.remove(&(m.visible_at, m.seq));
            self.by_expiry.remove(&(m.expires, m.seq));
        }
    }

    /// The message `id` if `pop_receipt` is its current receipt.
    fn leased(&self, id: &str, pop_receipt: &str, stale: StaleReceipt) -> StorageResult<()> {
        let m = self.messages.get(id).ok_or(StorageError::NotFound)?;
        if m.pop_receipt != pop_receipt {
            return Err(match stale {
                StaleReceipt::NotFound => StorageError::NotFound,
                StaleReceipt::PopReceiptMismatch => http(400, "PopReceiptMismatch"),
            });
        }
        Ok(())
    }
}

/// A handle on one queue of the shared account.
pub(super) struct MemoryQueue {
    pub(super) shared: Arc<Shared>,
    pub(super) name: String,
}

impl MemoryQueue {
    /// Count the request, then check the name: the queue state and the time.
    async fn begin(
        &self,
        op: &'static str,
    ) -> StorageResult<(MutexGuard<'_, State>, OffsetDateTime)> {
        self.shared.delay().await;
        let (st, now) = self.shared.begin(op, Scope::Queue(&self.name))?;
        check_queue_name(&self.name)?;
        Ok((st, now))
    }
}

/// The queue `name` of `st`, swept at `now`; `NotFound` when missing.
fn queue_of<'a>(
    st: &'a mut State,
    name: &str,
    now: OffsetDateTime,
) -> StorageResult<&'a mut Queue> {
    let q = st.queues.get_mut(name).ok_or(StorageError::NotFound)?;
    q.sweep(now);
    Ok(q)
}

#[async_trait]
impl QueueStore for MemoryQueue {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_if_missing(&self) -> StorageResult<()> {
        let (mut st, _) = self.begin("queue.create").await?;
        st.queues.entry(self.name.clone()).or_default();
        Ok(())
    }

    async fn receive(&self, max: u8, visibility: Duration) -> StorageResult<Vec<ReceivedMessage>> {
        let (mut st, now) = self.begin("queue.receive").await?;
        let secs = whole_secs(visibility);
        if secs == 0 {
            return Err(http(400, "OutOfRangeQueryParameterValue"));
        }
        let next_visible = now + Duration::from_secs(secs);
        let receipts: Vec<String> = (0..usize::from(max.clamp(1, MAX_MESSAGES_PER_RECEIVE)))
            .map(|_| crate::entropy::uuid().to_string())
            .collect();
        let q = queue_of(&mut st, &self.name, now)?;
        let ids = q.visible(now, receipts.len());
        let mut out = Vec::with_capacity(ids.len());
        for (id, receipt) in ids.into_iter().zip(receipts) {
            q.set_visible_at(&id, next_visible);
            let Some(m) = q.messages.get_mut(&id) else {
                continue;
            };
            m.dequeue_count = m.dequeue_count.saturating_add(1);
            m.pop_receipt = receipt;
            out.push(ReceivedMessage {
                pop_receipt: m.pop_receipt.clone(),
                dequeue_count: m.dequeue_count,
                insertion_time: wire(m.inserted),
                expiration_time: wire(m.expires),
                next_visible: wire(m.visible_at),
                text: m.text.clone(),
                id,
            });
        }
        let more = out.len().saturating_sub(1) as u64;
        st.load.charge(Scope::Queue(&self.name), more);
        Ok(out)
    }

    async fn peek(&self, max: u8) -> StorageResult<Vec<PeekedMessage>> {
        let (mut st, now) = self.begin("queue.peek").await?;
        let q = queue_of(&mut st, &self.name, now)?;
        let max = usize::from(max.clamp(1, MAX_MESSAGES_PER_RECEIVE));
        Ok(q.visible(now, max)
            .into_iter()
            .filter_map(|id| {
                let m = q.messages.get(&id)?;
                Some(PeekedMessage {
                    dequeue_count: m.dequeue_count,
                    insertion_time: wire(m.inserted),
                    expiration_time: wire(m.expires),
                    text: m.text.clone(),
                    id,
                })
            })
            .collect())
    }

    async fn put(&self, text: &str, visibility: Duration, ttl: Ttl) -> StorageResult<PutReceipt> {
        let (mut st, now) = self.begin("queue.put").await?;
        if text.len() > MAX_MESSAGE_BYTES {
            return Err(http(413, "RequestBodyTooLarge"));
        }
        // The adapter leaves a zero visibility out of the request.
        let visibility = (!visibility.is_zero()).then(|| whole_secs(visibility));
        let expires = match ttl {
            Ttl::Default => now + Duration::from_secs(DEFAULT_TTL_SECS),
            Ttl::Never => NEVER_EXPIRES,
            Ttl::After(d) => {
                let secs = whole_secs(d);
                if secs < 1 || visibility.is_some_and(|v| v >= secs) {
                    return Err(http(400, "InvalidQueryParameterValue"));
                }
                now + Duration::from_secs(secs)
            }
        };
        let seq = st.next_seq();
        let q = queue_of(&mut st, &self.name, now)?;
        let id = crate::entropy::uuid().to_string();
        let pop_receipt = crate::entropy::uuid().to_string();
        let visible_at = now + Duration::from_secs(visibility.unwrap_or(0));
        q.by_visible.insert((visible_at, seq), id.clone());
        q.by_expiry.insert((expires, seq), id.clone());
        q.messages.insert(
            id.clone(),
            Message {
                seq,
                text: text.to_string(),
                inserted: now,
                expires,
                visible_at,
                dequeue_count: 0,
                pop_receipt: pop_receipt.clone(),
            },
        );
        Ok(PutReceipt {
            id,
            pop_receipt,
            insertion_time: wire(now),
        })
    }

    async fn update_visibility(
        &self,
        id: &str,
        pop_receipt: &str,
        _text: &str,
        visibility: Duration,
    ) -> StorageResult<String> {
        let (mut st, now) = self.begin("queue.update").await?;
        let stale = st.stale_receipt;
        let q = queue_of(&mut st, &self.name, now)?;
        q.leased(id, pop_receipt, stale)?;
        let receipt = crate::entropy::uuid().to_string();
        q.set_visible_at(id, now + Duration::from_secs(whole_secs(visibility)));
        if let Some(m) = q.messages.get_mut(id) {
            m.pop_receipt = receipt.clone();
        }
        Ok(receipt)
    }

    async fn delete(&self, id: &str, pop_receipt: &str) -> StorageResult<()> {
        let (mut st, now) = self.begin("queue.delete").await?;
        let stale = st.stale_receipt;
        let q = queue_of(&mut st, &self.name, now)?;
        q.leased(id, pop_receipt, stale)?;
        q.remove(id);
        Ok(())
    }

    async fn approximate_count(&self) -> StorageResult<u64> {
        let (mut st, now) = self.begin("queue.metadata").await?;
        Ok(queue_of(&mut st, &self.name, now)?.messages.len() as u64)
    }

    async fn delete_queue(&self) -> StorageResult<()> {
        let (mut st, _) = self.begin("queue.delete_queue").await?;
        st.queues.remove(&self.name);
        Ok(())
    }
}

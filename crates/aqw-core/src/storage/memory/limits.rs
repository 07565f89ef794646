//! Azure's scalability targets in the memory store (off by default):
//! what one queue, one table partition and the whole account serve in a
//! second, a 503 ServerBusy beyond, and the service's whole-second clock.
//!
//! The targets, as Azure documents them for a standard account
//! (<https://learn.microsoft.com/azure/storage/queues/scalability-targets>,
//! <https://learn.microsoft.com/azure/storage/tables/scalability-targets>):
//! a single queue "up to 2,000 messages per second" (1 KiB messages), a
//! single table partition "up to 2,000 entities per second" (1 KiB
//! entities), and "20,000 messages per second" / "20,000 transactions per
//! second" per account; past what a partition can handle "Azure Storage
//! begins to return error code 503 (Server Busy) or error code 500
//! (Operation Timeout)".
//!
//! The store counts each second of its clock apart (a fixed window, as the
//! targets are stated per second): every request one against the account;
//! a queue request the messages it handles (a receive the messages it
//! returns, at least one) against its queue; a table request the entities
//! it handles (a batch its operations, a partition query the rows it
//! returns, at least one) against its partition. A request that would take
//! a count past its target is refused with `Http { 503, "ServerBusy" }`
//! and changes nothing; a receive or query whose answer runs past a target
//! is served (the service cannot know the count before), and the requests
//! after it in that second are refused. The highest count each queue,
//! partition and the account reached in one second is kept
//! ([`MemoryStorage::load_peaks`](super::MemoryStorage::load_peaks)).

use std::collections::BTreeMap;

/// What the store enforces when [`MemoryStorage::set_azure_limits`] is on
/// (the defaults are Azure's documented targets).
///
/// [`MemoryStorage::set_azure_limits`]: super::MemoryStorage::set_azure_limits
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AzureLimits {
    /// Messages one queue serves a second (Azure: 2,000).
    pub queue_messages_per_sec: u64,
    /// Entities one table partition serves a second (Azure: 2,000).
    pub partition_entities_per_sec: u64,
    /// Requests the account serves a second (Azure: 20,000).
    pub account_requests_per_sec: u64,
    /// The service keeps times in whole seconds: a message's visibility,
    /// insertion and expiry times and entities' `Timestamp`s are the
    /// request's second, truncated (a visibility of 1 s set at .9 s ends
    /// 0.1 s later).
    pub whole_seconds: bool,
}

impl Default for AzureLimits {
    fn default() -> Self {
        Self {
            queue_messages_per_sec: 2_000,
            partition_entities_per_sec: 2_000,
            account_requests_per_sec: 20_000,
            whole_seconds: true,
        }
    }
}

/// What a request is counted against, besides the account.
#[derive(Debug, Clone, Copy)]
pub(super) enum Scope<'a> {
    /// Only the account (blobs, admin requests, cross-partition queries).
    Account,
    Queue(&'a str),
    /// A table (lowercase name) and a partition key.
    Partition(&'a str, &'a str),
}

impl Scope<'_> {
    /// The load's name: `queue <name>`, `partition <table>/<pk>`.
    fn name(&self) -> Option<String> {
        match self {
            Scope::Account => None,
            Scope::Queue(q) => Some(format!("queue {q}")),
            Scope::Partition(t, pk) => Some(format!("partition {t}/{pk}")),
        }
    }
}

/// The account's load in the current second and the peaks so far.
#[derive(Debug, Default)]
pub(super) struct Load {
    pub(super) limits: Option<AzureLimits>,
    /// The second (unix time) the counts are for.
    second: i64,
    requests: u64,
    by_scope: BTreeMap<String, u64>,
    /// The highest count of each scope (and `account`) in one second.
    pub(super) peaks: BTreeMap<String, u64>,
    /// Requests refused as ServerBusy, by scope (`account` for the account).
    pub(super) refused: BTreeMap<String, u64>,
}

/// The name the account's own count goes by in peaks and refusals.
pub(super) const ACCOUNT: &str = "account";

impl Load {
    fn roll(&mut self, second: i64) {
        if self.second != second {
            self.second = second;
            self.requests = 0;
            self.by_scope.clear();
        }
    }

    fn peak(&mut self, name: &str, n: u64) {
        match self.peaks.get_mut(name) {
            Some(p) => *p = (*p).max(n),
            None => {
                self.peaks.insert(name.to_string(), n);
            }
        }
    }

    fn refuse(&mut self, name: &str) -> bool {
        *self.refused.entry(name.to_string()).or_default() += 1;
        false
    }

    /// Admit one request against `scope` in `second`: false (ServerBusy)
    /// when the account or the scope is at its target already. Without
    /// limits every request is admitted and nothing is counted.
    pub(super) fn admit(&mut self, second: i64, scope: Scope<'_>) -> bool {
        let Some(limits) = self.limits else {
            return true;
        };
        self.roll(second);
        if self.requests >= limits.account_requests_per_sec {
            return self.refuse(ACCOUNT);
        }
        let target = match scope {
            Scope::Account => u64::MAX,
            Scope::Queue(_) => limits.queue_messages_per_sec,
            Scope::Partition(..) => limits.partition_entities_per_sec,
        };
        let name = scope.name();
        if let Some(name) = &name {
            if self.by_scope.get(name).copied().unwrap_or(0) >= target {
                return self.refuse(name);
            }
        }
        self.requests += 1;
        let requests = self.requests;
        self.peak(ACCOUNT, requests);
        if let Some(name) = name {
            self.charge_named(name, 1);
        }
        true
    }

    /// Count `n` more messages or entities against `scope` for a request
    /// admitted this second (a receive's or a query's answer past its
    /// first, a batch's operations past its first).
    pub(super) fn charge(&mut self, scope: Scope<'_>, n: u64) {
        if self.limits.is_none() || n == 0 {
            return;
        }
        if let Some(name) = scope.name() {
            self.charge_named(name, n);
        }
    }

    fn charge_named(&mut self, name: String, n: u64) {
        let count = self.by_scope.entry(name.clone()).or_default();
        *count += n;
        let count = *count;
        self.peak(&name, count);
    }
}

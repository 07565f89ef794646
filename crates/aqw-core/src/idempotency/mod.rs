//! Idempotency: keys derived from business facts (`key`), the key record
//! and its attempt history (`record`), the claim protocol over Table
//! Storage (`store`), and what retention may read of it (`purge`).
//!
//! One record per key, RowKey = hex SHA-256 of the key (any key text is safe),
//! created *pending* before the handler runs (key first), marked *done* before
//! the message is deleted. A claim is one atomic insert (409 = exists) or a
//! take-over of an expired lease with `If-Match` (412 = another worker won),
//! so exactly one worker holds a key at a time.

pub(crate) mod key;
pub(crate) mod operator;
pub(crate) mod purge;
pub(crate) mod record;
pub(crate) mod store;

pub use key::{derive_key, IdempotencyKey, KeyError, KeySpec, KeyTemplate};
pub(crate) use operator::PROVIDER_KEY_REPLACED;
pub use operator::{KeyQuery, KeyRefusal};
pub use purge::PurgeCandidate;
pub use record::*;
pub use store::*;

//! The poison path: the one exit for every message that cannot succeed, and
//! the records an operator reads, replays and discards.
//!
//! Write order (each step idempotent, so a crash anywhere is repaired by
//! running the path again; the source message is still there until the end):
//! 1. insert the poison record (PK = source queue, RK = source message id),
//!    status `open` (409: it exists, reuse it);
//! 2. unless the record already names its poison-queue copy, put the envelope
//!    on `<queue>-poison` (created on first use);
//! 3. write the copy's id into the record;
//! 4. (caller) delete the source message.
//!
//! A crash between 2 and 3 can leave a stray copy whose id the record does
//! not name; `aqw poison list/replay` recognise and remove such strays, so
//! operators only ever see one copy per message.

pub mod record;
pub mod sink;

pub use record::{PoisonRecord, RecordStatus};
pub use sink::{put_creating, PoisonSink};

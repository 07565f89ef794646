//! The poison path: the one exit for every message that cannot succeed, and
//! the records an operator reads, replays and discards.
//!
//! Write order (each step idempotent, so a crash anywhere is repaired by
//! running the path again; the source message is still there until the end):
//! 1. insert the poison record (PK = source queue, RK = source message id),
//!    status `open` (409: it exists, reuse it);
//! 2. unless the record already names its poison-queue copy, put the copy
//!    on `<queue>-poison` (created on first use): the envelope, or with
//!    `aqw.poison.format: raw` the source message text exactly as received;
//! 3. write the copy's id into the record;
//! 4. (caller) delete the source message.
//!
//! `PoisonStore::write` is steps 1–3, the only code that writes them;
//! [`PoisonSink`] is the worker's entry to it.
//!
//! A crash between 2 and 3 can leave a stray copy whose id the record does
//! not name; `aqw poison list/replay` recognise and remove such strays (a
//! [`PoisonStore::scan`]), so operators only ever see one copy per message.
//! A raw copy carries nothing that says it is aqw's: the record (written in
//! step 1 with `CopyFormat` raw and the message text) is what makes it so.
//! The scan takes a non-envelope copy as aqw's own when a record names its
//! id or an aqw raw record holds exactly its text, names it on a record that
//! names none, and imports only a copy no record accounts for as a
//! Functions-host record.
//!
//! Files: `envelope` (the poison-queue message and the naming of poison
//! queues and host-copy records), `record` (the row format: columns,
//! status, the merges that change a record), `store` and `copies`
//! (`PoisonStore`: every read and write of records and copies), `purge`
//! (what retention may read: open records' keys, closed records), `sink`.

pub(crate) mod copies;
pub(crate) mod envelope;
pub(crate) mod purge;
pub(crate) mod record;
pub(crate) mod sink;
pub(crate) mod store;

pub(crate) use copies::put_creating_after;
pub use copies::{put_creating, Held};
pub(crate) use envelope::{host_record_id, POISON_SUFFIX};
pub use envelope::{poison_queue_name, PoisonEnvelope, PoisonFormat, RecordRef};
pub(crate) use purge::open_record_keys;
pub use record::{PoisonRecord, RecordStatus, Replayed};
pub(crate) use record::{Replacement, WindowOverride};
pub use sink::PoisonSink;
pub(crate) use store::Closing;
pub use store::PoisonStore;

//! The blob checks of the contract suite: put (replacing), get, touch,
//! conditional delete, listing by prefix, and a missing container.

use super::{ensure, fails, not_found, ok, CheckResult};
use crate::storage::{BlobRead, BlobStore, Etag, Storage, StorageError};

/// A read with no bound that matters: the whole blob's bytes, if any.
async fn whole(c: &dyn BlobStore, name: &str) -> Result<Option<Vec<u8>>, String> {
    match ok("get", c.get(name, u64::MAX >> 1).await)? {
        None => Ok(None),
        Some(BlobRead::Whole(b)) => Ok(Some(b)),
        Some(other) => Err(format!("get {name} without a bound: {other:?}")),
    }
}

/// A random container name: `aqwc-` and 32 hex digits (valid: 3-63 of
/// lowercase letters, digits and single hyphens).
pub fn random_container_name() -> String {
    format!("aqwc-{}", uuid::Uuid::new_v4().simple())
}

/// Put and get bytes back exactly (a 1 MiB body, a name with `/`), a read
/// bounded at the blob's size whole and one byte below it refused without
/// the bytes, a put
/// replacing a blob, touch changing the ETag (never the bytes) and not
/// moving the last write back, a delete guarded by a stale ETag refused,
/// a current one accepted, a missing blob deleted without error, and a
/// listing by prefix with lengths.
pub async fn blob_put_get_delete(storage: &dyn Storage) -> CheckResult {
    let c = storage.blobs(&random_container_name());
    ok("create_if_missing", c.create_if_missing().await)?;
    ok("create_if_missing again", c.create_if_missing().await)?;
    let result = put_get_delete(&*c).await;
    let cleanup = c.delete_container().await;
    result?;
    ok("delete_container (cleanup)", cleanup)
}

async fn put_get_delete(c: &dyn BlobStore) -> CheckResult {
    let big: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let e1 = ok("put", c.put("q1/aa", &big).await)?;
    ensure!(
        whole(c, "q1/aa").await?.as_deref() == Some(&big[..]),
        "get must return the exact bytes put"
    );
    bounded_reads(c, &big).await?;
    ensure!(
        ok("get missing", c.get("q1/zz", 10).await)?.is_none(),
        "a missing blob is None"
    );
    let e2 = ok("put again", c.put("q1/aa", b"second").await)?;
    ensure!(e1 != e2, "a put must change the ETag");
    ensure!(
        whole(c, "q1/aa").await?.as_deref() == Some(&b"second"[..]),
        "a put replaces the blob"
    );
    let e3 = ok("touch", c.touch("q1/aa").await)?;
    ensure!(e3 != e2, "a touch must change the ETag");
    ensure!(
        whole(c, "q1/aa").await?.as_deref() == Some(&b"second"[..]),
        "a touch keeps the bytes"
    );
    fails(
        "touch missing",
        c.touch("q1/zz").await,
        "NotFound",
        not_found,
    )?;
    listed_and_deleted(c, &e2, &e3).await
}

/// `q1/aa` holding `big`: a read bounded at its size is whole, one bounded
/// below it is [`BlobRead::TooLarge`] (and carries no bytes); an empty blob
/// reads whole under a bound of 0.
async fn bounded_reads(c: &dyn BlobStore, big: &[u8]) -> CheckResult {
    let size = big.len() as u64;
    ensure!(
        ok("get at the bound", c.get("q1/aa", size).await)? == Some(BlobRead::Whole(big.to_vec())),
        "a blob of exactly the bound is read whole"
    );
    for bound in [size - 1, 1000, 0] {
        let got = ok("get over the bound", c.get("q1/aa", bound).await)?;
        ensure!(
            matches!(got, Some(BlobRead::TooLarge(n)) if n.is_none_or(|n| n == size)),
            "a blob over a bound of {bound} is TooLarge: {got:?}"
        );
    }
    ok("put empty", c.put("q1/empty", b"").await)?;
    let got = ok("get empty", c.get("q1/empty", 0).await)?;
    ensure!(
        got == Some(BlobRead::Whole(Vec::new())),
        "an empty blob under a bound of 0: {got:?}"
    );
    ok("delete empty", c.delete("q1/empty", None).await)
}

/// With `q1/aa` at `current` (after `stale`): a listing by prefix, a
/// delete guarded by the stale ETag refused and by the current one done.
async fn listed_and_deleted(c: &dyn BlobStore, stale: &Etag, current: &Etag) -> CheckResult {
    ok("put other", c.put("q2/bb", b"x").await)?;
    let listed = ok("list", c.list("q1/").await)?;
    ensure!(
        listed.len() == 1 && listed[0].name == "q1/aa" && listed[0].length == 6,
        "list by prefix: {listed:?}"
    );
    ensure!(
        &listed[0].etag == current,
        "the listing's ETag is the last write's: {listed:?}"
    );
    ensure!(
        ok("list all", c.list("").await)?.len() == 2,
        "list without a prefix"
    );
    fails(
        "delete with a stale ETag",
        c.delete("q1/aa", Some(stale)).await,
        "PreconditionFailed",
        |e| matches!(e, StorageError::PreconditionFailed),
    )?;
    ok(
        "delete with the current ETag",
        c.delete("q1/aa", Some(current)).await,
    )?;
    ensure!(whole(c, "q1/aa").await?.is_none(), "deleted");
    ok("delete missing", c.delete("q1/aa", None).await)?;
    ok("delete unconditionally", c.delete("q2/bb", None).await)?;
    ensure!(
        ok("list empty", c.list("").await)?.is_empty(),
        "all deleted"
    );
    Ok(())
}

/// A container that does not exist: get is `None`, list is empty, delete
/// and delete_container are `Ok`, put and touch are `NotFound`.
pub async fn blob_missing(storage: &dyn Storage) -> CheckResult {
    let c = storage.blobs(&random_container_name());
    ensure!(
        ok("get", c.get("a", 10).await)?.is_none(),
        "get in a missing container"
    );
    ensure!(
        ok("list", c.list("").await)?.is_empty(),
        "list of a missing container"
    );
    ok("delete", c.delete("a", None).await)?;
    fails("put", c.put("a", b"x").await, "NotFound", not_found)?;
    fails("touch", c.touch("a").await, "NotFound", not_found)?;
    ok("delete_container", c.delete_container().await)
}

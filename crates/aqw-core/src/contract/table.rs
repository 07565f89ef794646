//! The table checks of the contract suite: entities and their ETags, a
//! missing table, and entity-group transactions.

use super::{ensure, entity, fails, not_found, ok, random_table_name, status, CheckResult};
use crate::storage::{Etag, Storage, StorageError, TableOp, TableStore, MAX_BATCH_OPERATIONS};
use serde_json::{json, Value};

/// The body's result, after removing the table; a failed removal fails a
/// check that passed.
pub(super) async fn with_table_removed(t: &dyn TableStore, result: CheckResult) -> CheckResult {
    let cleanup = t.delete_table().await;
    result?;
    ok("delete_table (cleanup)", cleanup)
}

/// A new, created table.
pub(super) async fn new_table(
    storage: &dyn Storage,
) -> Result<std::sync::Arc<dyn TableStore>, String> {
    let t = storage.table(&random_table_name());
    ok("create_if_missing", t.create_if_missing().await)?;
    ok("create_if_missing again", t.create_if_missing().await)?;
    Ok(t)
}

/// Insert (a conflict on an existing row), get (missing: `None`), merge
/// with If-Match (stale: `PreconditionFailed`; missing row: `NotFound`),
/// delete (twice is fine), and the entity rules the service enforces (keys
/// without `/`, string properties up to 32 K characters).
pub async fn table_entities(storage: &dyn Storage) -> CheckResult {
    let t = new_table(storage).await?;
    let result = entities(&*t).await;
    with_table_removed(&*t, result).await
}

async fn entities(t: &dyn TableStore) -> CheckResult {
    let pk = "p";
    let rk = "r'1 é";
    let e1 = insert_and_get(t, pk, rk).await?;
    let (e2, e3) = merges_are_guarded(t, pk, rk, &e1).await?;
    entity_rules(t, pk).await?;

    ok("delete", t.delete(pk, rk).await)?;
    ok("delete again", t.delete(pk, rk).await)?;
    ensure!(ok("get deleted", t.get(pk, rk).await)?.is_none(), "deleted");
    let e4 = ok("insert again", t.insert(pk, rk, &entity(json!({}))).await)?;
    ensure!(
        ![&e1, &e2, &e3].contains(&&e4),
        "a re-inserted row has a new ETag"
    );
    Ok(())
}

/// Insert `pk`/`rk` (a second insert conflicts) and get it back without
/// keys, metadata or nulls; a missing row is `None`. The insert's ETag.
async fn insert_and_get(t: &dyn TableStore, pk: &str, rk: &str) -> Result<Etag, String> {
    let e1 = ok(
        "insert",
        t.insert(
            pk,
            rk,
            &entity(json!({"Status": "pending", "Attempts": 1, "Gone": null})),
        )
        .await,
    )?;
    fails(
        "insert existing",
        t.insert(pk, rk, &entity(json!({}))).await,
        "Conflict",
        |e| matches!(e, StorageError::Conflict),
    )?;
    let (got, etag) = ok("get", t.get(pk, rk).await)?.ok_or("get: row missing")?;
    ensure!(
        etag == e1,
        "get returns the insert's ETag: {etag:?} vs {e1:?}"
    );
    ensure!(
        got == entity(json!({"Status": "pending", "Attempts": 1})),
        "entity without keys, metadata or nulls: {got:?}"
    );
    ensure!(
        ok("get missing", t.get(pk, "missing").await)?.is_none(),
        "a missing row is None"
    );
    Ok(e1)
}

/// Merges of `pk`/`rk`, inserted with ETag `e1`: a stale ETag is
/// `PreconditionFailed` and changes nothing, a merge keeps the other
/// properties, a missing row is `NotFound` and not inserted. The ETags of
/// the two merges that land.
async fn merges_are_guarded(
    t: &dyn TableStore,
    pk: &str,
    rk: &str,
    e1: &Etag,
) -> Result<(Etag, Etag), String> {
    let e2 = ok(
        "merge",
        t.merge(pk, rk, &entity(json!({"Status": "done"})), Some(e1))
            .await,
    )?;
    ensure!(e2 != *e1, "a merge gives a new ETag");
    fails(
        "merge with a stale ETag",
        t.merge(pk, rk, &entity(json!({"Status": "stale"})), Some(e1))
            .await,
        "PreconditionFailed",
        |e| matches!(e, StorageError::PreconditionFailed),
    )?;
    let (got, etag) = ok("get", t.get(pk, rk).await)?.ok_or("get: row missing")?;
    ensure!(etag == e2, "the failed merge changed nothing");
    ensure!(
        got == entity(json!({"Status": "done", "Attempts": 1})),
        "merge keeps the rest: {got:?}"
    );
    let e3 = ok(
        "merge without ETag",
        t.merge(pk, rk, &entity(json!({"Attempts": 2})), None).await,
    )?;
    ensure!(e3 != e2, "a new ETag");
    for if_match in [None, Some(&e3)] {
        fails(
            "merge a missing row",
            t.merge(pk, "ghost", &entity(json!({"A": 1})), if_match)
                .await,
            "NotFound",
            not_found,
        )?;
    }
    ensure!(
        ok("get ghost", t.get(pk, "ghost").await)?.is_none(),
        "merge does not insert"
    );
    Ok((e2, e3))
}

/// The entity rules the service enforces: no `/` in a key, string
/// properties up to 32 K characters, kept whole.
async fn entity_rules(t: &dyn TableStore, pk: &str) -> CheckResult {
    fails(
        "insert a key with '/'",
        t.insert(pk, "a/b", &entity(json!({}))).await,
        "Http 400",
        status(400),
    )?;
    let long = "x".repeat(32 * 1024);
    ok(
        "insert a 32 K string",
        t.insert(pk, "long", &entity(json!({ "S": long }))).await,
    )?;
    fails(
        "insert a 32 K + 1 string",
        t.insert(pk, "longer", &entity(json!({ "S": format!("{long}x") })))
            .await,
        "Http 400",
        status(400),
    )?;
    let (got, _) = ok("get long", t.get(pk, "long").await)?.ok_or("get long: row missing")?;
    ensure!(
        got.get("S").and_then(Value::as_str) == Some(long.as_str()),
        "32 K kept whole"
    );
    Ok(())
}

/// On a table that does not exist: get is `None`, delete is fine, insert,
/// merge, query and a transaction are `NotFound`.
pub async fn table_missing(storage: &dyn Storage) -> CheckResult {
    let t = storage.table(&random_table_name());
    let result = missing_table(&*t).await;
    with_table_removed(&*t, result).await
}

async fn missing_table(t: &dyn TableStore) -> CheckResult {
    ensure!(
        ok("get", t.get("p", "r").await)?.is_none(),
        "get on a missing table is None"
    );
    ok("delete", t.delete("p", "r").await)?;
    fails(
        "insert",
        t.insert("p", "r", &entity(json!({"A": 1}))).await,
        "NotFound",
        not_found,
    )?;
    fails(
        "merge",
        t.merge("p", "r", &entity(json!({"A": 1})), None).await,
        "NotFound",
        not_found,
    )?;
    fails("query", t.query_rows(None).await, "NotFound", not_found)?;
    let insert = vec![TableOp::Insert {
        row_key: "r".into(),
        entity: entity(json!({"A": 1})),
    }];
    fails(
        "transaction",
        t.transaction("p", insert).await,
        "NotFound",
        not_found,
    )?;
    ok("delete_table of a missing table", t.delete_table().await)?;
    Ok(())
}

/// Entity-group transactions: one failing operation (conflict, stale ETag,
/// missing row, the same row twice) leaves nothing applied; more than 100
/// operations are refused (400) and exactly 100 land; a mixed batch of
/// insert, merge and delete lands whole.
pub async fn table_transactions(storage: &dyn Storage) -> CheckResult {
    let t = new_table(storage).await?;
    let result = transactions(&*t).await;
    with_table_removed(&*t, result).await
}

/// A batch that must fail: what it is, its operations, the error wanted
/// (described, and as a test).
type Case = (
    &'static str,
    Vec<TableOp>,
    &'static str,
    Box<dyn Fn(&StorageError) -> bool + Send + Sync>,
);

async fn transactions(t: &dyn TableStore) -> CheckResult {
    let pk = "p";
    let stale = ok(
        "insert keep",
        t.insert(pk, "keep", &entity(json!({"S": "a"}))).await,
    )?;
    let keep = ok(
        "merge keep",
        t.merge(pk, "keep", &entity(json!({"S": "b"})), Some(&stale))
            .await,
    )?;
    let cases = conflicting_batches(&stale)
        .into_iter()
        .chain(invalid_batches());
    for (what, ops, wanted, expected) in cases {
        fails(what, t.transaction(pk, ops).await, wanted, expected)?;
        ensure!(
            ok("get new", t.get(pk, "new").await)?.is_none(),
            "{what}: the insert was applied"
        );
        let (got, etag) = ok("get keep", t.get(pk, "keep").await)?.ok_or("keep missing")?;
        ensure!(
            etag == keep && got == entity(json!({"S": "b"})),
            "{what}: keep changed: {got:?}"
        );
    }
    batches_hold_100_operations(t).await?;
    a_mixed_batch_lands_whole(t, pk, &keep).await
}

/// The insert of `new` that every failing batch starts with.
fn new_row() -> TableOp {
    TableOp::Insert {
        row_key: "new".into(),
        entity: entity(json!({"N": 1})),
    }
}

/// Batches that fail on the row `keep`, whose ETag is no longer `stale`.
fn conflicting_batches(stale: &Etag) -> Vec<Case> {
    let conflict = |e: &StorageError| matches!(e, StorageError::Conflict);
    let precondition = |e: &StorageError| matches!(e, StorageError::PreconditionFailed);
    vec![
        (
            "insert an existing row",
            vec![
                new_row(),
                TableOp::Insert {
                    row_key: "keep".into(),
                    entity: entity(json!({})),
                },
            ],
            "Conflict",
            Box::new(conflict),
        ),
        (
            "merge with a stale ETag",
            vec![
                new_row(),
                TableOp::Merge {
                    row_key: "keep".into(),
                    entity: entity(json!({"S": "x"})),
                    if_match: Some(stale.clone()),
                },
            ],
            "PreconditionFailed",
            Box::new(precondition),
        ),
        (
            "delete with a stale ETag",
            vec![
                new_row(),
                TableOp::Delete {
                    row_key: "keep".into(),
                    if_match: stale.clone(),
                },
            ],
            "PreconditionFailed",
            Box::new(precondition),
        ),
    ]
}

/// Batches that fail on a missing row or the same row twice.
fn invalid_batches() -> Vec<Case> {
    vec![
        (
            "merge a missing row",
            vec![
                new_row(),
                TableOp::Merge {
                    row_key: "ghost".into(),
                    entity: entity(json!({"S": "x"})),
                    if_match: None,
                },
            ],
            "NotFound",
            Box::new(not_found),
        ),
        (
            "the same row twice",
            vec![new_row(), new_row()],
            "Http 400",
            Box::new(status(400)),
        ),
    ]
}

/// More than 100 operations are refused (400) with nothing applied;
/// exactly 100 land.
async fn batches_hold_100_operations(t: &dyn TableStore) -> CheckResult {
    let inserts = |n: usize| -> Vec<TableOp> {
        (0..n)
            .map(|i| TableOp::Insert {
                row_key: format!("r{i:03}"),
                entity: entity(json!({ "N": i })),
            })
            .collect()
    };
    fails(
        "more than 100 operations",
        t.transaction("full", inserts(MAX_BATCH_OPERATIONS + 1))
            .await,
        "Http 400",
        status(400),
    )?;
    ensure!(
        ok("query", t.query_rows(Some("full")).await)?.is_empty(),
        "the refused batch applied"
    );
    ok(
        "100 operations",
        t.transaction("full", inserts(MAX_BATCH_OPERATIONS)).await,
    )?;
    let full = ok("query", t.query_rows(Some("full")).await)?;
    ensure!(
        full.len() == MAX_BATCH_OPERATIONS,
        "100 rows: {}",
        full.len()
    );
    Ok(())
}

/// Insert, merge (at `keep`, the ETag of the row `keep`) and delete in one
/// batch on `pk`: all of them land.
async fn a_mixed_batch_lands_whole(t: &dyn TableStore, pk: &str, keep: &Etag) -> CheckResult {
    ok(
        "insert gone",
        t.insert(pk, "gone", &entity(json!({}))).await,
    )?;
    let (_, gone) = ok("get gone", t.get(pk, "gone").await)?.ok_or("gone missing")?;
    let mixed = vec![
        new_row(),
        TableOp::Merge {
            row_key: "keep".into(),
            entity: entity(json!({"T": 1})),
            if_match: Some(keep.clone()),
        },
        TableOp::Delete {
            row_key: "gone".into(),
            if_match: gone,
        },
    ];
    ok("a mixed batch", t.transaction(pk, mixed).await)?;
    let rows = ok("query", t.query_rows(Some(pk)).await)?;
    let keys: Vec<&str> = rows.iter().map(|r| r.row_key.as_str()).collect();
    ensure!(keys == ["keep", "new"], "after the batch: {keys:?}");
    ensure!(
        rows[0].entity == entity(json!({"S": "b", "T": 1})),
        "merged in the batch: {:?}",
        rows[0]
    );
    ensure!(
        rows[0].etag.as_ref().is_some_and(|e| e != keep),
        "the batch gave keep a new ETag"
    );
    ensure!(
        rows[1].entity == entity(json!({"N": 1})),
        "inserted in the batch: {:?}",
        rows[1]
    );
    Ok(())
}

//! The table semantics of the memory store.

use super::*;
use crate::storage::{Etag, Filter, Row, TableQuery};

/// A batch that must fail, and how.
type Case = (Vec<TableOp>, fn(&StorageError) -> bool);

#[tokio::test(start_paused = true)]
async fn etags_guard_every_write() {
    let s = MemoryStorage::new();
    let t = table(&s).await;
    let e1 = t
        .insert(
            "p",
            "r",
            &entity(json!({"Status": "pending", "Attempts": 1})),
        )
        .await
        .unwrap();
    let again = t.insert("p", "r", &entity(json!({}))).await;
    assert!(matches!(again, Err(StorageError::Conflict)), "{again:?}");
    let (got, etag) = t.get("p", "r").await.unwrap().unwrap();
    assert_eq!(
        (got, etag.clone()),
        (
            entity(json!({"Status": "pending", "Attempts": 1})),
            e1.clone()
        )
    );
    assert!(t.get("p", "other").await.unwrap().is_none());

    let [e2, e3, e4] = merges_are_guarded(&*t, &e1).await;
    t.delete("p", "r").await.unwrap();
    t.delete("p", "r").await.unwrap();
    let e5 = t.insert("p", "r", &entity(json!({}))).await.unwrap();
    assert!(
        ![&e1, &e2, &e3, &e4].contains(&&e5),
        "ETags are never reused"
    );
}

/// Merges of the row `p`/`r`, written with ETag `e1`: a stale ETag is
/// refused, none or `*` matches any version, a missing row is `NotFound`.
/// The ETags of the three merges that land.
async fn merges_are_guarded(t: &dyn TableStore, e1: &Etag) -> [Etag; 3] {
    let e2 = t
        .merge("p", "r", &entity(json!({"Status": "done"})), Some(e1))
        .await
        .unwrap();
    assert_ne!(&e2, e1);
    let stale = t
        .merge("p", "r", &entity(json!({"Status": "x"})), Some(e1))
        .await;
    assert!(
        matches!(stale, Err(StorageError::PreconditionFailed)),
        "{stale:?}"
    );
    let (got, etag) = t.get("p", "r").await.unwrap().unwrap();
    assert_eq!(got, entity(json!({"Status": "done", "Attempts": 1})));
    assert_eq!(etag, e2);
    // Without an ETag (If-Match: *) the row must exist.
    let e3 = t
        .merge("p", "r", &entity(json!({"Attempts": 2})), None)
        .await
        .unwrap();
    let e4 = t
        .merge("p", "r", &entity(json!({})), Some(&Etag("*".into())))
        .await
        .unwrap();
    assert!(e3 != e2 && e4 != e3);
    for if_match in [None, Some(&e4)] {
        let missing = t.merge("p", "ghost", &entity(json!({})), if_match).await;
        assert!(
            matches!(missing, Err(StorageError::NotFound)),
            "{missing:?}"
        );
    }
    [e2, e3, e4]
}

#[tokio::test(start_paused = true)]
async fn every_write_stamps_the_clock_time() {
    let s = MemoryStorage::starting_at(datetime!(2030-01-01 00:00:00.5 UTC));
    let t = table(&s).await;
    t.insert("p", "old", &entity(json!({}))).await.unwrap();
    advance(Duration::from_secs(3600)).await;
    t.insert("p", "new", &entity(json!({}))).await.unwrap();
    let before = |at: OffsetDateTime| TableQuery {
        filter: Some(Filter::ChangedBefore(at)),
        ..Default::default()
    };
    let keys = |rows: Vec<Row>| rows.into_iter().map(|r| r.row_key).collect::<Vec<_>>();
    let q = before(datetime!(2030-01-01 00:30 UTC));
    assert_eq!(keys(t.query_where(&q).await.unwrap()), ["old"]);
    // Whole seconds: a row written at 00:00:00.5 did not change before
    // 00:00:00.9 (rounded down to 00:00:00).
    let q = before(datetime!(2030-01-01 00:00:00.9 UTC));
    assert!(t.query_where(&q).await.unwrap().is_empty());
    advance(Duration::from_secs(3600)).await;
    t.merge("p", "old", &entity(json!({"A": 1})), None)
        .await
        .unwrap();
    let q = before(datetime!(2030-01-01 01:30 UTC));
    assert_eq!(keys(t.query_where(&q).await.unwrap()), ["new"]);
}

#[tokio::test(start_paused = true)]
async fn a_batch_lands_whole_or_not_at_all() {
    let s = MemoryStorage::new();
    let t = table(&s).await;
    let keep = t
        .insert("p", "keep", &entity(json!({"S": "a"})))
        .await
        .unwrap();
    let stale = keep.clone();
    let keep = t
        .merge("p", "keep", &entity(json!({"S": "b"})), Some(&keep))
        .await
        .unwrap();
    let cases = conflicting_batches(&stale)
        .into_iter()
        .chain(invalid_batches());
    for (i, (ops, expected)) in cases.enumerate() {
        let r = t.transaction("p", ops).await;
        assert!(r.as_ref().is_err_and(expected), "case {i}: {r:?}");
        assert!(
            t.get("p", "new").await.unwrap().is_none(),
            "case {i}: applied"
        );
        assert_eq!(
            t.get("p", "keep").await.unwrap().unwrap().1,
            keep,
            "case {i}"
        );
    }

    batches_hold_100_operations(&*t).await;
    a_mixed_batch_lands_whole(&*t, &keep).await;

    let missing = s.table("nothere").transaction("p", vec![new_row()]).await;
    assert!(
        matches!(missing, Err(StorageError::NotFound)),
        "{missing:?}"
    );
}

/// The insert of `p`/`new` that every failing batch starts with.
fn new_row() -> TableOp {
    TableOp::Insert {
        row_key: "new".into(),
        entity: entity(json!({"N": 1})),
    }
}

/// Batches that fail on the row `p`/`keep`, whose ETag is no longer `stale`.
fn conflicting_batches(stale: &Etag) -> Vec<Case> {
    vec![
        (
            vec![
                new_row(),
                TableOp::Insert {
                    row_key: "keep".into(),
                    entity: Entity::new(),
                },
            ],
            |e| matches!(e, StorageError::Conflict),
        ),
        (
            vec![
                new_row(),
                TableOp::Merge {
                    row_key: "keep".into(),
                    entity: Entity::new(),
                    if_match: Some(stale.clone()),
                },
            ],
            |e| matches!(e, StorageError::PreconditionFailed),
        ),
        (
            vec![
                new_row(),
                TableOp::Delete {
                    row_key: "keep".into(),
                    if_match: stale.clone(),
                },
            ],
            |e| matches!(e, StorageError::PreconditionFailed),
        ),
    ]
}

/// Batches that fail on a missing row, the same row twice or an entity rule.
fn invalid_batches() -> Vec<Case> {
    vec![
        (
            vec![
                new_row(),
                TableOp::Merge {
                    row_key: "ghost".into(),
                    entity: Entity::new(),
                    if_match: None,
                },
            ],
            |e| matches!(e, StorageError::NotFound),
        ),
        (
            vec![
                new_row(),
                TableOp::Delete {
                    row_key: "ghost".into(),
                    if_match: Etag("*".into()),
                },
            ],
            |e| matches!(e, StorageError::NotFound),
        ),
        (vec![new_row(), new_row()], |e| {
            is_http(e, 400, "BatchOperationFailed")
        }),
        (
            vec![
                new_row(),
                TableOp::Insert {
                    row_key: "a/b".into(),
                    entity: Entity::new(),
                },
            ],
            |e| is_http(e, 400, "BatchOperationFailed"),
        ),
        (
            vec![
                new_row(),
                TableOp::Insert {
                    row_key: "x".into(),
                    entity: entity(json!({"A": [1]})),
                },
            ],
            |e| is_http(e, 400, "BatchOperationFailed"),
        ),
    ]
}

/// More than 100 operations are refused whole; 100 land; none is `Ok`.
async fn batches_hold_100_operations(t: &dyn TableStore) {
    let ops = |n: usize, prefix: &str| -> Vec<TableOp> {
        (0..n)
            .map(|i| TableOp::Insert {
                row_key: format!("{prefix}{i:03}"),
                entity: Entity::new(),
            })
            .collect()
    };
    let e = t.transaction("big", ops(101, "r")).await.unwrap_err();
    assert!(is_http(&e, 400, "BatchOperationFailed"), "{e:?}");
    assert!(t.query_rows(Some("big")).await.unwrap().is_empty());
    t.transaction("big", ops(100, "r")).await.unwrap();
    assert_eq!(t.query_rows(Some("big")).await.unwrap().len(), 100);
    t.transaction("big", Vec::new()).await.unwrap();
}

/// Insert, merge (at `keep`, the ETag of `p`/`keep`) and delete in one
/// batch: all of them land.
async fn a_mixed_batch_lands_whole(t: &dyn TableStore, keep: &Etag) {
    t.insert("p", "gone", &entity(json!({}))).await.unwrap();
    let (_, gone) = t.get("p", "gone").await.unwrap().unwrap();
    t.transaction(
        "p",
        vec![
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
        ],
    )
    .await
    .unwrap();
    let rows = t.query_rows(Some("p")).await.unwrap();
    let keys: Vec<&str> = rows.iter().map(|r| r.row_key.as_str()).collect();
    assert_eq!(keys, ["keep", "new"]);
    assert_eq!(rows[0].entity, entity(json!({"S": "b", "T": 1})));
    assert_ne!(rows[0].etag.as_ref(), Some(keep));
}

#[tokio::test(start_paused = true)]
async fn queries_filter_select_and_order_by_keys() {
    let s = MemoryStorage::new();
    let t = table(&s).await;
    for (pk, rk, status) in [
        ("p2", "b", "done"),
        ("p1", "c", "pending"),
        ("p1", "a", "done"),
        ("p2", "a", "failed"),
        ("p1", "b", "failed"),
        ("p10", "a", "done"),
    ] {
        t.insert(
            pk,
            rk,
            &entity(json!({"Status": status, "Kind": "job", "N": 1})),
        )
        .await
        .unwrap();
    }
    let all = t.query_rows(None).await.unwrap();
    assert_eq!(
        row_keys(&all),
        ["p1/a", "p1/b", "p1/c", "p10/a", "p2/a", "p2/b"]
    );
    assert!(all.iter().all(|r| r.etag.is_some()));
    let p1 = t.query(Some("p1")).await.unwrap();
    assert_eq!(p1.len(), 3);

    filters_and_select(&*t).await;
    let missing = s.table("nothere").query_rows(None).await;
    assert!(
        matches!(missing, Err(StorageError::NotFound)),
        "{missing:?}"
    );
}

/// The keys of `rows`, as `PartitionKey/RowKey`.
fn row_keys(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .map(|r| format!("{}/{}", r.partition_key, r.row_key))
        .collect()
}

/// Filters and `select` on the rows of
/// `queries_filter_select_and_order_by_keys`.
async fn filters_and_select(t: &dyn TableStore) {
    let q = TableQuery {
        partition: Some("p1"),
        filter: Some(Filter::one_of("Status", &["done", "failed"]).and(Filter::eq("Kind", "job"))),
        select: &["Status"],
    };
    let rows = t.query_where(&q).await.unwrap();
    assert_eq!(row_keys(&rows), ["p1/a", "p1/b"]);
    assert_eq!(rows[0].entity, entity(json!({"Status": "done"})));
    let (_, etag) = t.get("p1", "a").await.unwrap().unwrap();
    assert_eq!(rows[0].etag, Some(etag));
    let q = TableQuery {
        filter: Some(Filter::eq("Status", "done")),
        ..Default::default()
    };
    assert_eq!(
        row_keys(&t.query_where(&q).await.unwrap()),
        ["p1/a", "p10/a", "p2/b"]
    );
    let q = TableQuery {
        filter: Some(Filter::one_of("Status", &[])),
        ..Default::default()
    };
    assert!(t.query_where(&q).await.unwrap().is_empty());
    let q = TableQuery {
        select: &["Missing"],
        ..Default::default()
    };
    assert!(t
        .query_where(&q)
        .await
        .unwrap()
        .iter()
        .all(|r| r.entity.is_empty()));
}

#[tokio::test(start_paused = true)]
async fn entities_follow_the_service_rules() {
    let s = MemoryStorage::new();
    let t = table(&s).await;
    metadata_and_nulls_are_not_stored(&*t).await;

    let long = "x".repeat(32 * 1024);
    t.insert("p", "long", &entity(json!({ "S": long })))
        .await
        .unwrap();
    let many: Entity = (0..252)
        .map(|i| (format!("P{i}"), Value::from(i)))
        .collect();
    t.insert("p", "many", &many).await.unwrap();
    let cases = [
        ("a/b", entity(json!({})), "InvalidInput"),
        ("a#b", entity(json!({})), "InvalidInput"),
        ("a\u{7}b", entity(json!({})), "InvalidInput"),
        (&*"k".repeat(513), entity(json!({})), "InvalidInput"),
        ("obj", entity(json!({"O": {"a": 1}})), "InvalidInput"),
        ("arr", entity(json!({"A": [1]})), "InvalidInput"),
        (
            "big",
            entity(json!({ "S": format!("{long}x") })),
            "PropertyValueTooLarge",
        ),
        (
            "many",
            (0..253)
                .map(|i| (format!("P{i}"), Value::from(i)))
                .collect(),
            "TooManyProperties",
        ),
        (
            "huge",
            (0..17)
                .map(|i| (format!("S{i}"), Value::from(long.clone())))
                .collect(),
            "EntityTooLarge",
        ),
    ];
    for (rk, e, code) in cases {
        let err = t.insert("p", rk, &e).await.unwrap_err();
        assert!(is_http(&err, 400, code), "{rk}: {err:?}");
    }
    // A merge is checked on what it would store.
    let more: Entity = (0..17)
        .map(|i| (format!("S{i}"), Value::from(long.clone())))
        .collect();
    let err = t.merge("p", "long", &more, None).await.unwrap_err();
    assert!(is_http(&err, 400, "EntityTooLarge"), "{err:?}");
    t.insert("p", &"k".repeat(512), &entity(json!({})))
        .await
        .unwrap();
}

/// Keys, `Timestamp`, `odata` metadata and `null`s are not stored; merging
/// a `null` removes the property.
async fn metadata_and_nulls_are_not_stored(t: &dyn TableStore) {
    let written = entity(json!({
        "PartitionKey": "ignored", "RowKey": "ignored", "Timestamp": "ignored",
        "odata.etag": "ignored", "N@odata.type": "Edm.Int64", "N": "5",
        "Gone": null, "Kept": "yes"
    }));
    t.insert("p", "r", &written).await.unwrap();
    let (got, _) = t.get("p", "r").await.unwrap().unwrap();
    assert_eq!(got, entity(json!({"N": "5", "Kept": "yes"})));
    t.merge("p", "r", &entity(json!({"Kept": null, "New": true})), None)
        .await
        .unwrap();
    let (got, _) = t.get("p", "r").await.unwrap().unwrap();
    assert_eq!(got, entity(json!({"N": "5", "New": true})));
}

#[tokio::test(start_paused = true)]
async fn missing_tables_and_names() {
    let s = MemoryStorage::new();
    let t = s.table("nothere");
    assert!(t.get("p", "r").await.unwrap().is_none());
    t.delete("p", "r").await.unwrap();
    t.delete_table().await.unwrap();
    let e = t.insert("p", "r", &entity(json!({}))).await;
    assert!(matches!(e, Err(StorageError::NotFound)), "{e:?}");
    let e = t.merge("p", "r", &entity(json!({})), None).await;
    assert!(matches!(e, Err(StorageError::NotFound)), "{e:?}");
    // Names are case-insensitive.
    s.table("MixedCase").create_if_missing().await.unwrap();
    s.table("mixedcase")
        .insert("p", "r", &entity(json!({})))
        .await
        .unwrap();
    assert!(s.table("MIXEDCASE").get("p", "r").await.unwrap().is_some());
    assert_eq!(s.table_names(), ["mixedcase"]);
    for (name, code) in [
        ("ab", "OutOfRangeInput"),
        ("1abc", "InvalidResourceName"),
        ("ab-c", "InvalidResourceName"),
        ("Tables", "InvalidResourceName"),
    ] {
        let e = s.table(name).create_if_missing().await.unwrap_err();
        assert!(is_http(&e, 400, code), "{name}: {e:?}");
    }
}

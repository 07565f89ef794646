//! The table query checks of the contract suite: filters, `select`, key
//! order, and results past a page.

use super::table::{new_table, with_table_removed};
use super::{ensure, entity, ok, CheckResult};
use crate::storage::{Filter, Row, Storage, TableOp, TableQuery, TableStore, MAX_BATCH_OPERATIONS};
use serde_json::{json, Value};
use time::OffsetDateTime;

/// Typed queries: a partition, `Eq`, `OneOf`, `And`, `ChangedBefore`,
/// `ChangedSince`, `StartsWith`, and
/// `select` (only the named columns; keys and ETag always), rows ordered by
/// (PartitionKey, RowKey).
pub async fn table_queries(storage: &dyn Storage) -> CheckResult {
    let t = new_table(storage).await?;
    let result = queries(&*t).await;
    with_table_removed(&*t, result).await
}

fn row_keys(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .map(|r| format!("{}/{}", r.partition_key, r.row_key))
        .collect()
}

async fn queries(t: &dyn TableStore) -> CheckResult {
    insert_and_query_all(t).await?;
    for (query, want) in filter_cases() {
        let got = ok("query_where", t.query_where(&query).await)?;
        ensure!(
            row_keys(&got) == want,
            "{:?}: got {:?}, want {want:?}",
            query.filter,
            row_keys(&got)
        );
    }
    select_columns(t).await
}

/// Seven rows over three partitions, inserted out of order: a query of
/// all of them comes back in key order, with ETags and without metadata.
async fn insert_and_query_all(t: &dyn TableStore) -> CheckResult {
    let rows = [
        ("p2", "b", "done", "job"),
        ("p1", "c", "pending", "job"),
        ("p1", "a", "done", "job"),
        ("p2", "a", "failed", "job"),
        ("p1", "b", "failed", "job"),
        ("p1", "d", "done", "other"),
        ("p10", "a", "done", "job"),
    ];
    for (pk, rk, status, kind) in rows {
        let e = entity(json!({"Status": status, "Kind": kind, "N": 7}));
        ok("insert", t.insert(pk, rk, &e).await)?;
    }
    let all = ok("query all", t.query_rows(None).await)?;
    ensure!(
        row_keys(&all) == ["p1/a", "p1/b", "p1/c", "p1/d", "p10/a", "p2/a", "p2/b"],
        "ordered by keys: {:?}",
        row_keys(&all)
    );
    ensure!(
        all.iter().all(|r| r.etag.is_some()),
        "every row has an ETag"
    );
    let (_, etag) = ok("get", t.get("p1", "a").await)?.ok_or("p1/a missing")?;
    ensure!(
        all[0].etag.as_ref() == Some(&etag),
        "the query's ETag is get's: {:?}",
        all[0].etag
    );
    ensure!(
        all[0].entity == entity(json!({"Status": "done", "Kind": "job", "N": 7})),
        "no metadata in a queried entity: {:?}",
        all[0].entity
    );
    Ok(())
}

/// Filtered queries and the rows (`PartitionKey/RowKey`) each must return.
fn filter_cases() -> Vec<(TableQuery<'static>, Vec<&'static str>)> {
    let mut cases = value_cases();
    cases.extend(time_and_prefix_cases());
    cases.extend(since_and_prefix_cases());
    cases
}

/// The cases on column values: `Eq`, `OneOf`, `And`, with and without a partition.
fn value_cases() -> Vec<(TableQuery<'static>, Vec<&'static str>)> {
    let q = |partition, filter| TableQuery {
        partition,
        filter: Some(filter),
        select: &[],
    };
    vec![
        (
            q(Some("p1"), Filter::eq("Status", "done")),
            vec!["p1/a", "p1/d"],
        ),
        (
            q(None, Filter::eq("Status", "done")),
            vec!["p1/a", "p1/d", "p10/a", "p2/b"],
        ),
        (
            q(Some("p2"), Filter::one_of("Status", &["failed", "pending"])),
            vec!["p2/a"],
        ),
        (
            q(None, Filter::one_of("Status", &["failed", "pending"])),
            vec!["p1/b", "p1/c", "p2/a"],
        ),
        (
            q(
                Some("p1"),
                Filter::eq("Status", "done").and(Filter::eq("Kind", "job")),
            ),
            vec!["p1/a"],
        ),
        (
            q(
                None,
                Filter::one_of("Status", &["done", "failed"]).and(Filter::eq("Kind", "job")),
            ),
            vec!["p1/a", "p1/b", "p10/a", "p2/a", "p2/b"],
        ),
        (q(None, Filter::eq("Status", "nothing")), vec![]),
        (q(Some("p3"), Filter::eq("Status", "done")), vec![]),
    ]
}

/// The cases on `ChangedBefore` (the service's `Timestamp`).
fn time_and_prefix_cases() -> Vec<(TableQuery<'static>, Vec<&'static str>)> {
    let q = |partition, filter| TableQuery {
        partition,
        filter: Some(filter),
        select: &[],
    };
    vec![
        (
            q(
                Some("p2"),
                Filter::ChangedBefore(OffsetDateTime::now_utc() + time::Duration::days(30)),
            ),
            vec!["p2/a", "p2/b"],
        ),
        (
            q(
                Some("p2"),
                Filter::ChangedBefore(OffsetDateTime::now_utc() - time::Duration::days(30)),
            ),
            vec![],
        ),
        // The row's own key as a column: the key purge's one range query
        // per function (`p1` takes `p10` too; the caller keeps its own).
        (
            q(
                None,
                Filter::StartsWith {
                    column: "PartitionKey",
                    prefix: "p1".into(),
                },
            ),
            vec!["p1/a", "p1/b", "p1/c", "p1/d", "p10/a"],
        ),
    ]
}

/// The cases on `ChangedSince` and on string prefixes.
fn since_and_prefix_cases() -> Vec<(TableQuery<'static>, Vec<&'static str>)> {
    let q = |partition, filter| TableQuery {
        partition,
        filter: Some(filter),
        select: &[],
    };
    vec![
        (
            q(
                Some("p2"),
                Filter::ChangedSince(OffsetDateTime::now_utc() - time::Duration::days(30)),
            ),
            vec!["p2/a", "p2/b"],
        ),
        (
            q(
                None,
                Filter::ChangedSince(OffsetDateTime::now_utc() + time::Duration::days(30)),
            ),
            vec![],
        ),
        (
            q(
                None,
                Filter::StartsWith {
                    column: "Kind",
                    prefix: "ot".into(),
                },
            ),
            vec!["p1/d"],
        ),
        (
            q(
                Some("p1"),
                Filter::StartsWith {
                    column: "Status",
                    prefix: "d".into(),
                },
            ),
            vec!["p1/a", "p1/d"],
        ),
        (
            q(
                None,
                Filter::StartsWith {
                    column: "Status",
                    prefix: "donez".into(),
                },
            ),
            vec![],
        ),
    ]
}

/// `select`: only the named columns, keys and ETags always.
async fn select_columns(t: &dyn TableStore) -> CheckResult {
    let select = TableQuery {
        partition: Some("p1"),
        filter: Some(Filter::one_of("Status", &["done", "failed"])),
        select: &["Status", "N"],
    };
    let got = ok("query with select", t.query_where(&select).await)?;
    ensure!(
        row_keys(&got) == ["p1/a", "p1/b", "p1/d"],
        "select: {:?}",
        row_keys(&got)
    );
    ensure!(
        got[1].entity == entity(json!({"Status": "failed", "N": 7})),
        "selected columns only: {:?}",
        got[1]
    );
    ensure!(
        got.iter().all(|r| r.etag.is_some()),
        "select keeps the ETags"
    );
    Ok(())
}

/// More than 1,000 rows in a partition (Azure pages at 1,000) come back
/// whole and in order from a plain query and from a filtered query with
/// `select`.
pub async fn table_continuation(storage: &dyn Storage) -> CheckResult {
    let t = new_table(storage).await?;
    let result = continuation(&*t).await;
    with_table_removed(&*t, result).await
}

async fn continuation(t: &dyn TableStore) -> CheckResult {
    const BATCHES: usize = 11;
    for b in 0..BATCHES {
        let ops = (0..MAX_BATCH_OPERATIONS)
            .map(|i| {
                let n = b * MAX_BATCH_OPERATIONS + i;
                TableOp::Insert {
                    row_key: format!("r{n:05}"),
                    entity: entity(
                        json!({ "N": n, "Kind": if n.is_multiple_of(2) { "even" } else { "odd" } }),
                    ),
                }
            })
            .collect();
        ok("batch insert", t.transaction("big", ops).await)?;
    }
    for rk in ["a", "b"] {
        ok(
            "insert other",
            t.insert("other", rk, &entity(json!({"Kind": "odd"}))).await,
        )?;
    }
    let total = BATCHES * MAX_BATCH_OPERATIONS;
    let big = ok("query big", t.query_rows(Some("big")).await)?;
    ensure!(big.len() == total, "{} of {total} rows", big.len());
    let in_order = big.iter().enumerate().all(|(n, r)| {
        r.row_key == format!("r{n:05}") && r.partition_key == "big" && r.etag.is_some()
    });
    ensure!(in_order, "rows in key order, with ETags");
    let all = ok("query all", t.query(None).await)?;
    ensure!(all.len() == total + 2, "{} rows in the table", all.len());

    let odd = TableQuery {
        partition: Some("big"),
        filter: Some(Filter::one_of("Kind", &["odd", "none"]).and(Filter::eq("Kind", "odd"))),
        select: &["N"],
    };
    let got = ok("filtered query", t.query_where(&odd).await)?;
    ensure!(got.len() == total / 2, "{} odd rows", got.len());
    let selected = got.iter().all(|r| {
        r.entity.len() == 1
            && r.entity
                .get("N")
                .and_then(Value::as_u64)
                .is_some_and(|n| n % 2 == 1)
    });
    ensure!(selected, "only N, odd");
    let every = TableQuery {
        partition: Some("big"),
        filter: Some(Filter::one_of("Kind", &["odd", "even"])),
        select: &["Kind"],
    };
    let got = ok("filtered query past a page", t.query_where(&every).await)?;
    ensure!(
        got.len() == total,
        "{} of {total} rows through the filter",
        got.len()
    );
    Ok(())
}

//! Connection strings on the 1.x storage stack, against Azurite: an account
//! key with explicit endpoints (SharedKey signing, queues and tables) and an
//! account SAS, each through every queue and table operation aqw uses
//! (including a query long enough to need continuation and a `$batch`).
//! A wrong key or SAS fails with 403 and never shows the secret. Claim-check
//! blobs (`azure_storage_blob` on aqw's signing policies) keep the storage
//! contract's blob checks with both.

use crate::common;

use aqw_azure::connect;
use aqw_azure::parse_connection_string;
use aqw_azure::{DEV_ACCOUNT, DEV_KEY};
use aqw_core::storage::{Storage, StorageError, TableOp, Ttl};
use serde_json::{json, Map, Value};
use std::time::Duration;

fn key_conn(key: &str) -> String {
    format!(
        "DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={key};\
         QueueEndpoint=http://127.0.0.1:10001/{DEV_ACCOUNT};\
         TableEndpoint=http://127.0.0.1:10002/{DEV_ACCOUNT};\
         BlobEndpoint=http://127.0.0.1:10000/{DEV_ACCOUNT};"
    )
}

/// An account SAS (service version 2019-02-02 string-to-sign: account,
/// sp, ss, srt, st, se, sip, spr, sv, each followed by a newline).
fn account_sas(key_b64: &str) -> String {
    use base64::Engine;
    use hmac::{Hmac, Mac};
    let se = (time::OffsetDateTime::now_utc() + time::Duration::hours(1))
        .format(&time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second]Z"
        ))
        .unwrap();
    let (sp, ss, srt, spr, sv) = ("rwdlacup", "bqt", "sco", "https,http", "2019-02-02");
    let to_sign = format!("{DEV_ACCOUNT}\n{sp}\n{ss}\n{srt}\n\n{se}\n\n{spr}\n{sv}\n");
    let key = base64::engine::general_purpose::STANDARD
        .decode(key_b64)
        .unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(to_sign.as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    format!(
        "sv={sv}&ss={ss}&srt={srt}&sp={sp}&se={}&spr={}&sig={}",
        enc(&se),
        enc(spr),
        enc(&sig)
    )
}

fn sas_conn(sas: &str) -> String {
    format!(
        "QueueEndpoint=http://127.0.0.1:10001/{DEV_ACCOUNT};\
         TableEndpoint=http://127.0.0.1:10002/{DEV_ACCOUNT};\
         BlobEndpoint=http://127.0.0.1:10000/{DEV_ACCOUNT};\
         SharedAccessSignature={sas}"
    )
}

fn entity(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

/// Every queue and table operation aqw calls, with the outcomes aqw relies on.
async fn exercise(storage: &dyn Storage) {
    // Queues.
    let q = storage.queue(&common::random_name("conn"));
    q.create_if_missing().await.unwrap();
    q.create_if_missing().await.unwrap();
    let put = q
        .put("hello wörld <&>", Duration::ZERO, Ttl::Never)
        .await
        .unwrap();
    q.put(
        "second",
        Duration::ZERO,
        Ttl::After(Duration::from_secs(600)),
    )
    .await
    .unwrap();
    assert!(!put.id.is_empty());
    assert_eq!(q.approximate_count().await.unwrap(), 2);
    let peeked = q.peek(32).await.unwrap();
    assert_eq!(peeked.len(), 2);
    let got = q.receive(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].text, "hello wörld <&>");
    assert_eq!(got[0].dequeue_count, 1);
    let receipt = q
        .update_visibility(
            &got[0].id,
            &got[0].pop_receipt,
            &got[0].text,
            Duration::ZERO,
        )
        .await
        .unwrap();
    // The stale receipt no longer deletes (the service answers 400
    // PopReceiptMismatch); the new one does.
    let stale = q.delete(&got[0].id, &got[0].pop_receipt).await;
    assert!(
        matches!(&stale, Err(StorageError::Http { status: 400, code }) if code == "PopReceiptMismatch"),
        "{stale:?}"
    );
    q.delete(&got[0].id, &receipt).await.unwrap();
    let rest = q.receive(32, Duration::from_secs(30)).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].text, "second");
    q.delete_queue().await.unwrap();
    q.delete_queue().await.unwrap();

    // Tables.
    let t = storage.table(&common::random_name("conn"));
    t.create_if_missing().await.unwrap();
    t.create_if_missing().await.unwrap();
    let e1 = t
        .insert(
            "p",
            "r'1",
            &entity(json!({"Status": "pending", "Attempts": 1})),
        )
        .await
        .unwrap();
    assert!(matches!(
        t.insert("p", "r'1", &entity(json!({}))).await,
        Err(StorageError::Conflict)
    ));
    let (got, etag) = t.get("p", "r'1").await.unwrap().unwrap();
    assert_eq!(etag, e1);
    assert_eq!(got["Status"], "pending");
    let e2 = t
        .merge(
            "p",
            "r'1",
            &entity(json!({"Status": "done", "Attempts": 2})),
            Some(&e1),
        )
        .await
        .unwrap();
    assert!(matches!(
        t.merge("p", "r'1", &entity(json!({})), Some(&e1)).await,
        Err(StorageError::PreconditionFailed)
    ));
    let e3 = t
        .merge("p", "r'1", &entity(json!({"LastError": "x"})), Some(&e2))
        .await
        .unwrap();
    assert!(matches!(
        t.merge("p", "r'1", &entity(json!({})), Some(&e2)).await,
        Err(StorageError::PreconditionFailed)
    ));
    let (merged, _) = t.get("p", "r'1").await.unwrap().unwrap();
    assert_eq!(merged["Status"], "done");
    assert_eq!(merged["LastError"], "x");
    assert_eq!(merged["Attempts"], 2);
    assert!(t.get("p", "missing").await.unwrap().is_none());

    // Entity-group transactions: 11 × 100 inserts; then one that fails as a whole.
    for b in 0..11 {
        let ops = (0..100)
            .map(|i| TableOp::Insert {
                row_key: format!("b{b:02}-{i:03}"),
                entity: entity(json!({ "N": b * 100 + i })),
            })
            .collect();
        t.transaction("big", ops).await.unwrap();
    }
    let failed = t
        .transaction(
            "p",
            vec![
                TableOp::Insert {
                    row_key: "new".into(),
                    entity: entity(json!({})),
                },
                TableOp::Merge {
                    row_key: "r'1".into(),
                    entity: entity(json!({"Status": "poisoned"})),
                    if_match: Some(e1.clone()),
                },
            ],
        )
        .await;
    assert!(
        matches!(failed, Err(StorageError::PreconditionFailed)),
        "{failed:?}"
    );
    assert!(t.get("p", "new").await.unwrap().is_none(), "all or nothing");
    t.transaction(
        "p",
        vec![
            TableOp::Insert {
                row_key: "new".into(),
                entity: entity(json!({"A": 1})),
            },
            TableOp::Merge {
                row_key: "r'1".into(),
                entity: entity(json!({"Status": "poisoned"})),
                if_match: Some(e3.clone()),
            },
        ],
    )
    .await
    .unwrap();

    // A partition query past the 1000-entity page (continuation), with ETags.
    let rows = t.query_rows(Some("big")).await.unwrap();
    assert_eq!(rows.len(), 1100);
    assert!(rows
        .iter()
        .all(|r| r.partition_key == "big" && r.etag.is_some()));
    let p = t.query(Some("p")).await.unwrap();
    assert_eq!(p.len(), 2);
    let poisoned = p.iter().find(|(_, rk, _)| rk == "r'1").unwrap();
    assert_eq!(poisoned.2["Status"], "poisoned");
    assert_eq!(
        poisoned.2["LastError"], "x",
        "a merge keeps the other properties"
    );
    assert!(!poisoned.2.keys().any(|k| k.contains("odata")));
    assert_eq!(t.query(None).await.unwrap().len(), 1102);

    t.delete("p", "new").await.unwrap();
    t.delete("p", "new").await.unwrap();
    assert!(t.get("p", "new").await.unwrap().is_none());
    t.delete_table().await.unwrap();
    t.delete_table().await.unwrap();
}

#[tokio::test]
async fn account_key_connection_string_signs_queues_and_tables() {
    common::azurite();
    let conn = parse_connection_string("AzureWebJobsStorage", &key_conn(DEV_KEY)).unwrap();
    let storage = connect(&conn).unwrap();
    exercise(&storage).await;
}

#[tokio::test]
async fn sas_connection_string_works_for_queues_and_tables() {
    common::azurite();
    let sas = account_sas(DEV_KEY);
    let conn = parse_connection_string("AzureWebJobsStorage", &sas_conn(&sas)).unwrap();
    let storage = connect(&conn).unwrap();
    exercise(&storage).await;
}

#[tokio::test]
async fn blobs_keep_the_contract_with_an_account_key_and_with_a_sas() {
    common::azurite();
    for (how, text) in [
        ("account key", key_conn(DEV_KEY)),
        ("SAS", sas_conn(&account_sas(DEV_KEY))),
    ] {
        let conn = parse_connection_string("AzureWebJobsStorage", &text).unwrap();
        let storage = connect(&conn).unwrap();
        let checked = aqw_core::contract::blob_put_get_delete(&storage).await;
        assert_eq!(checked, Ok(()), "{how}");
    }
}

#[tokio::test]
async fn wrong_key_or_sas_is_refused_and_never_shown() {
    common::azurite();
    use base64::Engine;
    let wrong_key = base64::engine::general_purpose::STANDARD.encode([7u8; 64]);
    let conn = parse_connection_string("AzureWebJobsStorage", &key_conn(&wrong_key)).unwrap();
    let storage = connect(&conn).unwrap();
    let q = storage.queue(&common::random_name("conn"));
    let err = q.create_if_missing().await.unwrap_err();
    assert!(
        matches!(err, StorageError::Http { status: 403, .. }),
        "{err:?}"
    );
    let t = storage.table(&common::random_name("conn"));
    let err_t = t.create_if_missing().await.unwrap_err();
    assert!(
        matches!(err_t, StorageError::Http { status: 403, .. }),
        "{err_t:?}"
    );
    for e in [format!("{err} {err:?}"), format!("{err_t} {err_t:?}")] {
        assert!(!e.contains(&wrong_key), "{e}");
    }

    let wrong_sas = account_sas(&wrong_key);
    let sig = wrong_sas.split("sig=").nth(1).unwrap().to_string();
    let conn = parse_connection_string("AzureWebJobsStorage", &sas_conn(&wrong_sas)).unwrap();
    let storage = connect(&conn).unwrap();
    let err = storage
        .queue(&common::random_name("conn"))
        .receive(1, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StorageError::Http { status: 403, .. }),
        "{err:?}"
    );
    let err_t = storage
        .table(&common::random_name("conn"))
        .get("a", "b")
        .await
        .unwrap_err();
    assert!(
        matches!(err_t, StorageError::Http { status: 403, .. }),
        "{err_t:?}"
    );
    for e in [format!("{err} {err:?}"), format!("{err_t} {err_t:?}")] {
        assert!(!e.contains(&sig) && !e.contains("sig="), "{e}");
    }
}

//! The storage port's contract on Azurite: the same checks
//! (`aqw_core::contract`) that aqw-core runs on its in-memory store, here
//! on the Azure adapter against the emulator, so the fake cannot drift from
//! what the engine meets in production.

use crate::common::azurite;
use aqw_azure::parse_connection_string;
use aqw_core::contract;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_azure_adapter_keeps_the_storage_contract() {
    azurite();
    let conn =
        parse_connection_string("AzureWebJobsStorage", "UseDevelopmentStorage=true").unwrap();
    let storage = aqw_azure::connect(&conn).unwrap();
    let mut failures = Vec::new();
    for (name, result) in contract::report(&storage).await {
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "contract broken on Azurite:\n{}",
        failures.join("\n")
    );
}

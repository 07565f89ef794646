//! The Flex Consumption template (`deploy/flex/aqw-flex.json`) is a Flex app
//! that runs `aqw serve`: an FC1 plan, `functionAppConfig.runtime` custom
//! 1.0, a deployment container and the storage reached by one user-assigned
//! identity holding the data roles aqw and the host need. Every app setting
//! it sets is one that aqw reads (found in aqw's own source), none is one
//! Flex refuses, and with those settings the example app folder loads as an
//! identity-based aqw app. The docs never give `FUNCTIONS_WORKER_RUNTIME`
//! without saying it is not for Flex.
//!
//! No storage, no network: plain file parsing (ARM JSON, so serde reads it
//! without a Bicep compiler).

use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const TEMPLATE: &str = "deploy/flex/aqw-flex.json";
const APP_FOLDER: &str = "examples/functions-app";

/// App settings the Flex Consumption plan refuses or ignores: the runtime
/// moved to `functionAppConfig.runtime`, content and scale to
/// `functionAppConfig` (learn.microsoft.com, "App settings reference for
/// Azure Functions", section "Flex Consumption plan deprecations").
const FLEX_REFUSES: [&str; 16] = [
    "FUNCTIONS_EXTENSION_VERSION",
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_WORKER_RUNTIME_VERSION",
    "FUNCTIONS_MAX_HTTP_CONCURRENCY",
    "FUNCTIONS_WORKER_PROCESS_COUNT",
    "FUNCTIONS_WORKER_DYNAMIC_CONCURRENCY_ENABLED",
    "SCALE_CONTROLLER_SCALE_DOWN_DELAY",
    "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    "WEBSITE_CONTENTOVERVNET",
    "WEBSITE_CONTENTSHARE",
    "WEBSITE_DNS_SERVER",
    "WEBSITE_MAX_DYNAMIC_APPLICATION_SCALE_OUT",
    "WEBSITE_NODE_DEFAULT_VERSION",
    "WEBSITE_RUN_FROM_PACKAGE",
    "WEBSITE_SKIP_CONTENTSHARE_VALIDATION",
    "WEBSITE_VNET_ROUTE_ALL",
];

/// Built-in role definition ids (Azure RBAC "Azure built-in roles").
const BLOB_DATA_OWNER: &str = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b";
const QUEUE_DATA_CONTRIBUTOR: &str = "974c5e8b-45b9-4653-ba55-5f855dd0fb88";
const TABLE_DATA_CONTRIBUTOR: &str = "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3";

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    let path = repo_file(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn template() -> Json {
    serde_json::from_str(&read(TEMPLATE)).unwrap_or_else(|e| panic!("{TEMPLATE}: not JSON: {e}"))
}

/// The one resource of `kind` in the template.
fn resource<'a>(t: &'a Json, kind: &str) -> &'a Json {
    let found: Vec<&Json> = resources(t, kind);
    assert_eq!(found.len(), 1, "{TEMPLATE}: expected exactly one {kind}");
    found[0]
}

fn resources<'a>(t: &'a Json, kind: &str) -> Vec<&'a Json> {
    t["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter(|r| r["type"].as_str() == Some(kind))
        .collect()
}

/// The site's app settings, name → value (ARM expressions left as they are).
fn app_settings(site: &Json) -> BTreeMap<String, String> {
    site["properties"]["siteConfig"]["appSettings"]
        .as_array()
        .expect("siteConfig.appSettings")
        .iter()
        .map(|s| {
            let name = s["name"].as_str().expect("setting name").to_string();
            let value = s["value"].as_str().expect("setting value").to_string();
            (name, value)
        })
        .collect()
}

/// Every Rust source text of aqw (both crates).
fn aqw_source() -> String {
    let mut text = String::new();
    for dir in ["src", "crates/aqw-core/src", "crates/aqw-azure/src"] {
        collect_rs(&repo_file(dir), &mut text);
    }
    text
}

fn collect_rs(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).expect("read source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).expect("read source"));
        }
    }
}

/// Whether aqw's source reads setting `name`: the name as a string literal,
/// or `<connection>__<suffix>` where the connection resolver reads
/// `{name}__<suffix>` (crates/aqw-azure/src/connection.rs).
fn aqw_reads(name: &str, connection: &str, source: &str) -> bool {
    if source.contains(&format!("\"{name}\"")) {
        return true;
    }
    match name.strip_prefix(&format!("{connection}__")) {
        Some(suffix) => source.contains(&format!("{{name}}__{suffix}")),
        None => false,
    }
}

#[test]
fn flex_plan_and_runtime_are_custom_on_fc1() {
    let t = template();
    let plan = resource(&t, "Microsoft.Web/serverfarms");
    assert_eq!(plan["sku"]["name"], "FC1");
    assert_eq!(plan["sku"]["tier"], "FlexConsumption");
    assert_eq!(plan["properties"]["reserved"], true, "Flex is Linux");

    let site = resource(&t, "Microsoft.Web/sites");
    assert_eq!(site["kind"], "functionapp,linux");
    let config = &site["properties"]["functionAppConfig"];
    assert_eq!(config["runtime"]["name"], "custom");
    assert_eq!(config["runtime"]["version"], "1.0");
    let scale = &config["scaleAndConcurrency"];
    assert!(
        scale["maximumInstanceCount"]
            .as_str()
            .is_some_and(|v| v.contains("maximumInstanceCount")),
        "the instance cap is a parameter"
    );
    let memory = t["parameters"]["instanceMemoryMB"]["allowedValues"]
        .as_array()
        .expect("instanceMemoryMB.allowedValues");
    assert!(memory
        .iter()
        .all(|m| [512, 2048, 4096].contains(&m.as_u64().unwrap_or(0))));
    assert_eq!(site["properties"]["httpsOnly"], true);
    // The deployment container is `app-package-<appName>`: a container
    // name has at most 63 characters.
    let longest = t["parameters"]["appName"]["maxLength"]
        .as_u64()
        .expect("appName.maxLength");
    assert!(
        longest as usize + "app-package-".len() <= 63,
        "appName up to {longest}"
    );
}

#[test]
fn flex_deployment_storage_and_connection_use_the_one_identity() {
    let t = template();
    let site = resource(&t, "Microsoft.Web/sites");
    let identities = site["identity"]["userAssignedIdentities"]
        .as_object()
        .expect("a user-assigned identity");
    assert_eq!(identities.len(), 1);
    let identity_ref = identities.keys().next().expect("identity");
    assert!(identity_ref.contains("userAssignedIdentities"));

    let storage = &site["properties"]["functionAppConfig"]["deployment"]["storage"];
    assert_eq!(storage["type"], "blobContainer");
    assert_eq!(storage["authentication"]["type"], "UserAssignedIdentity");
    assert_eq!(
        storage["authentication"]["userAssignedIdentityResourceId"].as_str(),
        Some(identity_ref.as_str()),
        "the package is read with the app's own identity"
    );
    assert_eq!(
        resources(
            &t,
            "Microsoft.Storage/storageAccounts/blobServices/containers"
        )
        .len(),
        1
    );

    // No shared key anywhere: the account refuses it, so a connection
    // string would not work even if one were set.
    let account = resource(&t, "Microsoft.Storage/storageAccounts");
    assert_eq!(account["properties"]["allowSharedKeyAccess"], false);
    assert!(
        !read(TEMPLATE).contains("listKeys"),
        "no account key is read"
    );

    let settings = app_settings(site);
    assert_eq!(
        settings["AzureWebJobsStorage__credential"],
        "managedidentity"
    );
    assert!(settings["AzureWebJobsStorage__clientId"].contains(".clientId"));
    assert!(
        !settings.contains_key("AzureWebJobsStorage"),
        "identity, not a connection string"
    );
}

#[test]
fn flex_identity_holds_the_data_roles_aqw_and_the_host_need() {
    let t = template();
    let roles: Vec<String> = resources(&t, "Microsoft.Authorization/roleAssignments")
        .iter()
        .map(|r| {
            let props = &r["properties"];
            assert_eq!(props["principalType"], "ServicePrincipal");
            assert!(props["principalId"]
                .as_str()
                .is_some_and(|p| p.contains("userAssignedIdentities")));
            props["roleDefinitionId"]
                .as_str()
                .expect("roleDefinitionId")
                .to_string()
        })
        .collect();
    let variables = &t["variables"]["roles"];
    for (id, why) in [
        (
            BLOB_DATA_OWNER,
            "the host's blobs and the deployment package",
        ),
        (
            QUEUE_DATA_CONTRIBUTOR,
            "the trigger, the poison queue and parked copies",
        ),
        (
            TABLE_DATA_CONTRIBUTOR,
            "aqw's key, record and control tables",
        ),
    ] {
        let name = variables
            .as_object()
            .expect("variables.roles")
            .iter()
            .find(|(_, v)| v.as_str() == Some(id))
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| panic!("role {id} ({why}) is not in variables.roles"));
        assert!(
            roles
                .iter()
                .any(|r| r.contains(&format!("variables('roles').{name}"))),
            "role {name} ({why}) is not assigned"
        );
    }
    // The app waits for its roles: a cold start before they exist fails its
    // first storage calls.
    let site = resource(&t, "Microsoft.Web/sites");
    let depends = site["dependsOn"].as_array().expect("dependsOn");
    assert_eq!(
        depends
            .iter()
            .filter(|d| d.as_str().is_some_and(|d| d.contains("roleAssignments")))
            .count(),
        3
    );
}

#[test]
fn flex_sets_only_settings_aqw_reads_and_none_flex_refuses() {
    let t = template();
    let settings = app_settings(resource(&t, "Microsoft.Web/sites"));
    let source = aqw_source();
    for name in settings.keys() {
        assert!(
            !FLEX_REFUSES.contains(&name.as_str()),
            "{TEMPLATE} sets {name}, which Flex Consumption refuses"
        );
        assert!(
            aqw_reads(name, "AzureWebJobsStorage", &source),
            "{TEMPLATE} sets {name}, which aqw does not read"
        );
    }
    // The guard is not vacuous: a setting aqw does not read is caught.
    assert!(!aqw_reads(
        "AQW_NOT_A_SETTING",
        "AzureWebJobsStorage",
        &source
    ));
    assert!(!aqw_reads(
        "AzureWebJobsStorage__notASuffix",
        "AzureWebJobsStorage",
        &source
    ));
}

/// The app folder as `func azure functionapp publish` uploads it: without
/// `local.settings.json` (Core Tools never publishes it), so the settings
/// the app sees are the template's alone.
fn published_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_tree(&repo_file(APP_FOLDER), dir.path());
    assert!(!dir.path().join("local.settings.json").exists());
    dir
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read app folder") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().expect("file name");
        if path.is_dir() {
            std::fs::create_dir_all(to.join(name)).expect("mkdir");
            copy_tree(&path, &to.join(name));
        } else if path.extension().is_some_and(|e| e == "json") && name != "local.settings.json" {
            std::fs::copy(&path, to.join(name)).expect("copy");
        }
    }
}

#[test]
fn flex_settings_load_the_example_app_with_an_identity_connection() {
    let t = template();
    let settings = app_settings(resource(&t, "Microsoft.Web/sites"));
    // ARM expressions stand for values known at deploy time.
    let env: BTreeMap<String, String> = settings
        .into_iter()
        .map(|(k, v)| {
            let value = match k.as_str() {
                "AzureWebJobsStorage__accountName" => "aqwflexacct".to_string(),
                "AzureWebJobsStorage__clientId" => {
                    "00000000-0000-0000-0000-000000000001".to_string()
                }
                _ if v.starts_with('[') => {
                    "InstrumentationKey=00000000-0000-0000-0000-000000000000".to_string()
                }
                _ => v,
            };
            (k, value)
        })
        .collect();
    let deployed = published_copy();
    let app = aqw::config::load_with_env(deployed.path(), &env)
        .unwrap_or_else(|e| panic!("{APP_FOLDER} with the Flex settings: {e:#}"));
    let connection = aqw_azure::connection_of(&app.functions[0].connection).unwrap();
    assert_eq!(connection.account, "aqwflexacct");
    match &connection.credentials {
        aqw_azure::Credentials::Identity { client_id } => {
            assert_eq!(
                client_id.as_deref(),
                Some("00000000-0000-0000-0000-000000000001")
            )
        }
        _ => panic!("the Flex settings should give an identity-based connection"),
    }
}

#[test]
fn docs_give_functions_worker_runtime_only_for_plans_other_than_flex() {
    for doc in [
        "README.md",
        "docs/operations.md",
        "examples/functions-app/README.md",
    ] {
        for (i, line) in read(doc).lines().enumerate() {
            if line.contains("FUNCTIONS_WORKER_RUNTIME") {
                assert!(
                    line.contains("Flex"),
                    "{doc}:{}: FUNCTIONS_WORKER_RUNTIME without saying Flex refuses it: {line}",
                    i + 1
                );
            }
        }
    }
}

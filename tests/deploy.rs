//! The deployment manifests under `deploy/` agree with the app they carry and
//! with each other: the grace period covers `aqw.shutdownTimeout`, the probes
//! hit `/healthz` and `/readyz` on `aqw.http.port`, the pod is non-root with a
//! read-only root filesystem, and the autoscalers watch the function's queue
//! (never its `-poison` twin) with one batch per replica. The embedded
//! host.json files are loaded with aqw's own config loader.
//!
//! No storage, no network: plain file parsing.

use serde::Deserialize;
use serde_json::Value as Json;
use serde_yaml::Value as Yaml;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const KUBE_DEPLOYMENT: &str = "deploy/kubernetes/deployment.yaml";
const KUBE_KEDA: &str = "deploy/kubernetes/keda-scaledobject.yaml";
const CONTAINER_APP: &str = "deploy/containerapps/aqw.yaml";

/// Time to release unfinished messages after shutdownTimeout, before SIGKILL.
const RELEASE_SLACK: Duration = Duration::from_secs(5);

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    let path = repo_file(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every non-empty YAML document of a (multi-document) file.
fn documents(rel: &str) -> Vec<Yaml> {
    let text = read(rel);
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value =
            Yaml::deserialize(doc).unwrap_or_else(|e| panic!("{rel}: YAML document {i}: {e}"));
        if !matches!(value, Yaml::Null) {
            docs.push(value);
        }
    }
    docs
}

/// The one document of `kind` in `docs`.
fn one<'a>(docs: &'a [Yaml], kind: &str, rel: &str) -> &'a Yaml {
    let found: Vec<&Yaml> = docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "{rel}: expected exactly one {kind}");
    found[0]
}

fn yaml_str<'a>(v: &'a Yaml, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, found {v:?}"))
}

/// The settings a manifest has to agree with, read from a host.json text.
struct HostFacts {
    queue: String,
    port: u64,
    shutdown: Duration,
    batch_size: u64,
}

fn host_facts(text: &str, origin: &str) -> HostFacts {
    let json: Json = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{origin}: embedded host.json is not JSON: {e}"));
    let functions = json["aqw"]["functions"]
        .as_object()
        .unwrap_or_else(|| panic!("{origin}: host.json has no aqw.functions"));
    assert_eq!(
        functions.len(),
        1,
        "{origin}: expected one function in host.json"
    );
    let function = functions.values().next().expect("one function");
    let queue = function["queue"]
        .as_str()
        .unwrap_or_else(|| panic!("{origin}: host.json function has no queue"))
        .to_string();
    let port = json["aqw"]["http"]["port"]
        .as_u64()
        .unwrap_or_else(|| panic!("{origin}: host.json has no aqw.http.port (probes need it)"));
    let shutdown = match json["aqw"]["shutdownTimeout"].as_str() {
        Some(s) => aqw_core::config::parse_timespan(s)
            .unwrap_or_else(|e| panic!("{origin}: aqw.shutdownTimeout: {e}")),
        None => Duration::from_secs(25),
    };
    let batch_size = json["extensions"]["queues"]["batchSize"]
        .as_u64()
        .unwrap_or(16);
    HostFacts {
        queue,
        port,
        shutdown,
        batch_size,
    }
}

/// Load a host.json text with aqw's config loader, as `aqw run` would.
fn load_app(
    host_json: &str,
    env: &BTreeMap<String, String>,
    origin: &str,
) -> aqw_core::config::AppConfig {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("host.json"), host_json).expect("write host.json");
    aqw::config::load_with_env(dir.path(), env)
        .unwrap_or_else(|e| panic!("{origin}: embedded host.json is not a valid aqw app: {e}"))
}

fn account_env() -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert(
        "AzureWebJobsStorage__accountName".to_string(),
        "acct".to_string(),
    );
    env
}

/// The literal `value`s of a container's `env` list.
fn env_values(container: &Yaml) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(list) = container["env"].as_sequence() {
        for e in list {
            if let (Some(name), Some(value)) = (e["name"].as_str(), e["value"].as_str()) {
                out.insert(name.to_string(), value.to_string());
            }
        }
    }
    out
}

/// A probe's port as a number, resolving a named port through `ports`.
fn probe_port(container: &Yaml, port: &Yaml) -> Option<u64> {
    if let Some(n) = port.as_u64() {
        return Some(n);
    }
    let name = port.as_str()?;
    container["ports"]
        .as_sequence()?
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_u64())
}

/// The checks both platforms share: the app loads, and its settings agree
/// with what the manifest promises.
fn check_app(host_json: &str, origin: &str, facts: &HostFacts) {
    let app = load_app(host_json, &account_env(), origin);
    assert_eq!(app.functions.len(), 1, "{origin}");
    assert_eq!(app.functions[0].queue, facts.queue, "{origin}");
    assert_eq!(app.http_port, Some(facts.port as u16), "{origin}");
    assert_eq!(app.shutdown_timeout, facts.shutdown, "{origin}");
    assert_eq!(u64::from(app.batch_size), facts.batch_size, "{origin}");
    if let aqw_core::config::HandlerSpec::Http { timeout, .. } = &app.functions[0].handler {
        assert!(
            *timeout <= app.shutdown_timeout,
            "{origin}: handler timeout {timeout:?} exceeds shutdownTimeout {:?}: \
             a job running at SIGTERM could not finish while draining",
            app.shutdown_timeout
        );
    }
}

fn check_grace(grace: u64, facts: &HostFacts, origin: &str) {
    assert!(
        Duration::from_secs(grace) >= facts.shutdown + RELEASE_SLACK,
        "{origin}: terminationGracePeriodSeconds {grace} must exceed shutdownTimeout {:?} \
         plus {RELEASE_SLACK:?} to release unfinished messages",
        facts.shutdown
    );
}

fn check_scale_metadata(
    metadata: &Yaml,
    facts: &HostFacts,
    env: &BTreeMap<String, String>,
    origin: &str,
) {
    let queue = yaml_str(&metadata["queueName"], "queueName");
    assert_eq!(
        queue, facts.queue,
        "{origin}: scaler watches the wrong queue"
    );
    assert!(
        !queue.ends_with("-poison"),
        "{origin}: poison queues must not scale workers"
    );
    let length: u64 = yaml_str(&metadata["queueLength"], "queueLength")
        .parse()
        .unwrap_or_else(|e| panic!("{origin}: queueLength: {e}"));
    assert_eq!(
        length, facts.batch_size,
        "{origin}: queueLength should be one batch (host.json batchSize)"
    );
    assert_eq!(
        metadata["accountName"].as_str(),
        env.get("AzureWebJobsStorage__accountName")
            .map(String::as_str),
        "{origin}: the scaler and the worker must read the same storage account"
    );
}

// ---------------------------------------------------------------------------
// Kubernetes
// ---------------------------------------------------------------------------

struct Kube {
    docs: Vec<Yaml>,
    host_json: String,
    facts: HostFacts,
}

impl Kube {
    fn load() -> Self {
        let docs = documents(KUBE_DEPLOYMENT);
        let host_json = yaml_str(
            &one(&docs, "ConfigMap", KUBE_DEPLOYMENT)["data"]["host.json"],
            "ConfigMap data host.json",
        )
        .to_string();
        let facts = host_facts(&host_json, KUBE_DEPLOYMENT);
        Kube {
            docs,
            host_json,
            facts,
        }
    }

    fn deployment(&self) -> &Yaml {
        one(&self.docs, "Deployment", KUBE_DEPLOYMENT)
    }

    fn pod(&self) -> &Yaml {
        &self.deployment()["spec"]["template"]["spec"]
    }

    fn container(&self) -> &Yaml {
        let containers = self.pod()["containers"]
            .as_sequence()
            .expect("Deployment has containers");
        assert_eq!(containers.len(), 1, "one aqw container");
        &containers[0]
    }
}

#[test]
fn kubernetes_host_json_is_a_valid_aqw_app() {
    let k = Kube::load();
    check_app(&k.host_json, KUBE_DEPLOYMENT, &k.facts);

    // The Deployment's own environment is a valid identity-based connection.
    let env = env_values(k.container());
    assert_eq!(
        env.get("AzureWebJobsStorage__credential")
            .map(String::as_str),
        Some("managedidentity")
    );
    let app = load_app(&k.host_json, &env, KUBE_DEPLOYMENT);
    assert!(
        matches!(
            aqw_azure::connection_of(&app.functions[0].connection)
                .unwrap()
                .credentials,
            aqw_azure::Credentials::Identity { .. }
        ),
        "the Deployment's env should give an identity-based connection"
    );
}

#[test]
fn kubernetes_grace_period_covers_shutdown_timeout() {
    let k = Kube::load();
    let grace = k.pod()["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds is set explicitly");
    check_grace(grace, &k.facts, KUBE_DEPLOYMENT);
}

#[test]
fn kubernetes_probes_hit_the_ops_port() {
    let k = Kube::load();
    let c = k.container();
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe} path");
        assert_eq!(
            probe_port(c, &get["port"]),
            Some(k.facts.port),
            "{probe} port must be host.json aqw.http.port"
        );
    }
    let ports: Vec<u64> = c["ports"]
        .as_sequence()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p["containerPort"].as_u64())
                .collect::<Vec<u64>>()
        })
        .unwrap_or_default();
    assert!(ports.contains(&k.facts.port), "containerPort {ports:?}");
}

#[test]
fn kubernetes_pod_is_locked_down() {
    let k = Kube::load();
    let pod_sc = &k.pod()["securityContext"];
    let sc = &k.container()["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(
        sc["runAsNonRoot"]
            .as_bool()
            .or(pod_sc["runAsNonRoot"].as_bool()),
        Some(true)
    );
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    let dropped: Vec<&str> = sc["capabilities"]["drop"]
        .as_sequence()
        .map(|d| d.iter().filter_map(Yaml::as_str).collect::<Vec<&str>>())
        .unwrap_or_default();
    assert!(dropped.contains(&"ALL"), "capabilities.drop: {dropped:?}");
    if let Some(uid) = sc["runAsUser"].as_u64().or(pod_sc["runAsUser"].as_u64()) {
        assert_ne!(uid, 0, "runAsUser");
    }
    let limits = &k.container()["resources"]["limits"];
    assert!(limits["cpu"].as_str().is_some() && limits["memory"].as_str().is_some());
}

#[test]
fn kubernetes_app_folder_is_the_configmap() {
    let k = Kube::load();
    let cm_name = yaml_str(
        &one(&k.docs, "ConfigMap", KUBE_DEPLOYMENT)["metadata"]["name"],
        "ConfigMap name",
    );
    let c = k.container();
    let mount = c["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["mountPath"].as_str() == Some("/app"))
        .expect("a volume mounted at /app");
    let volume_name = yaml_str(&mount["name"], "volumeMount name");
    let volume = k.pod()["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["name"].as_str() == Some(volume_name))
        .expect("the /app volume is declared");
    assert_eq!(volume["configMap"]["name"].as_str(), Some(cm_name));
    // If the command is spelled out, it must point at the mount.
    if let Some(args) = c["args"].as_sequence() {
        let args: Vec<&str> = args.iter().filter_map(Yaml::as_str).collect();
        assert_eq!(args.first(), Some(&"run"), "args: {args:?}");
        let at = args.iter().position(|a| *a == "--app").expect("--app");
        assert_eq!(args.get(at + 1), Some(&"/app"), "args: {args:?}");
    }
}

#[test]
fn kubernetes_workload_identity_is_consistent() {
    let k = Kube::load();
    let sa = one(&k.docs, "ServiceAccount", KUBE_DEPLOYMENT);
    assert_eq!(
        k.pod()["serviceAccountName"].as_str(),
        sa["metadata"]["name"].as_str()
    );
    assert_eq!(
        k.deployment()["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"]
            .as_str(),
        Some("true"),
        "the label value must be the string \"true\""
    );
    let client_id = yaml_str(
        &sa["metadata"]["annotations"]["azure.workload.identity/client-id"],
        "ServiceAccount client-id annotation",
    );
    let env = env_values(k.container());
    assert_eq!(
        env.get("AzureWebJobsStorage__clientId").map(String::as_str),
        Some(client_id),
        "AzureWebJobsStorage__clientId should name the ServiceAccount's identity"
    );
}

#[test]
fn keda_scales_the_deployment_on_the_source_queue() {
    let k = Kube::load();
    let docs = documents(KUBE_KEDA);
    let so = one(&docs, "ScaledObject", KUBE_KEDA);
    let target = &so["spec"]["scaleTargetRef"];
    assert_eq!(
        target["name"].as_str(),
        k.deployment()["metadata"]["name"].as_str(),
        "scaleTargetRef must name the Deployment"
    );
    if let Some(kind) = target["kind"].as_str() {
        assert_eq!(kind, "Deployment");
    }
    assert_eq!(so["spec"]["minReplicaCount"].as_u64(), Some(0));
    assert_eq!(so["spec"]["maxReplicaCount"].as_u64(), Some(10));

    let triggers = so["spec"]["triggers"].as_sequence().expect("triggers");
    assert_eq!(triggers.len(), 1, "one trigger: the source queue only");
    let trigger = &triggers[0];
    assert_eq!(trigger["type"].as_str(), Some("azure-queue"));
    let env = env_values(k.container());
    check_scale_metadata(&trigger["metadata"], &k.facts, &env, KUBE_KEDA);

    let auth = one(&docs, "TriggerAuthentication", KUBE_KEDA);
    assert_eq!(
        trigger["authenticationRef"]["name"].as_str(),
        auth["metadata"]["name"].as_str()
    );
    assert_eq!(
        auth["spec"]["podIdentity"]["provider"].as_str(),
        Some("azure-workload")
    );
}

// ---------------------------------------------------------------------------
// Azure Container Apps
// ---------------------------------------------------------------------------

#[test]
fn container_app_matches_its_host_json() {
    let docs = documents(CONTAINER_APP);
    assert_eq!(docs.len(), 1, "{CONTAINER_APP}: one document");
    let app = &docs[0];
    let props = &app["properties"];
    let template = &props["template"];

    // The host.json mounted at /app comes from a secret volume.
    let volume = template["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["storageType"].as_str() == Some("Secret"))
        .expect("a Secret volume holding host.json");
    let item = volume["secrets"]
        .as_sequence()
        .expect("volume secrets")
        .iter()
        .find(|s| s["path"].as_str() == Some("host.json"))
        .expect("a secret projected as host.json");
    let secret_name = yaml_str(&item["secretRef"], "secretRef");
    let secret = props["configuration"]["secrets"]
        .as_sequence()
        .expect("configuration.secrets")
        .iter()
        .find(|s| s["name"].as_str() == Some(secret_name))
        .expect("the host.json secret is declared");
    let host_json = yaml_str(&secret["value"], "host.json secret value");
    let facts = host_facts(host_json, CONTAINER_APP);
    check_app(host_json, CONTAINER_APP, &facts);

    // Same function, same queue as the Kubernetes manifests.
    assert_eq!(facts.queue, Kube::load().facts.queue);

    let containers = template["containers"].as_sequence().expect("containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let volume_name = yaml_str(&volume["name"], "volume name");
    assert!(
        c["volumeMounts"]
            .as_sequence()
            .expect("volumeMounts")
            .iter()
            .any(|m| m["volumeName"].as_str() == Some(volume_name)
                && m["mountPath"].as_str() == Some("/app")),
        "the host.json volume is mounted at /app"
    );

    let grace = template["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds is set");
    check_grace(grace, &facts, CONTAINER_APP);

    let probes = c["probes"].as_sequence().expect("probes");
    for (kind, path) in [("Liveness", "/healthz"), ("Readiness", "/readyz")] {
        let probe = probes
            .iter()
            .find(|p| p["type"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("a {kind} probe"));
        assert_eq!(probe["httpGet"]["path"].as_str(), Some(path), "{kind}");
        assert_eq!(
            probe["httpGet"]["port"].as_u64(),
            Some(facts.port),
            "{kind}"
        );
    }

    let env = env_values(c);
    assert_eq!(
        env.get("AzureWebJobsStorage__credential")
            .map(String::as_str),
        Some("managedidentity")
    );
    let loaded = load_app(host_json, &env, CONTAINER_APP);
    assert!(matches!(
        aqw_azure::connection_of(&loaded.functions[0].connection)
            .unwrap()
            .credentials,
        aqw_azure::Credentials::Identity { .. }
    ));

    let scale = &template["scale"];
    assert_eq!(scale["minReplicas"].as_u64(), Some(0));
    assert_eq!(scale["maxReplicas"].as_u64(), Some(10));
    let rules = scale["rules"].as_sequence().expect("scale rules");
    assert_eq!(rules.len(), 1, "one rule: the source queue only");
    let custom = &rules[0]["custom"];
    assert_eq!(custom["type"].as_str(), Some("azure-queue"));
    check_scale_metadata(&custom["metadata"], &facts, &env, CONTAINER_APP);
    let identity = yaml_str(&custom["identity"], "scale rule identity");
    assert!(
        identity == "system"
            || !matches!(
                app["identity"]["userAssignedIdentities"][identity],
                Yaml::Null
            ),
        "the scale rule's identity must be `system` or one of the app's user-assigned identities"
    );
}

#[test]
fn dockerfile_matches_the_manifests() {
    let dockerfile = read("Dockerfile");
    let k = Kube::load();
    assert!(dockerfile.contains("FROM gcr.io/distroless/cc-debian12:nonroot"));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/usr/local/bin/aqw"]"#));
    assert!(dockerfile.contains(r#"CMD ["run", "--app", "/app"]"#));
    assert!(
        dockerfile.contains(&format!("EXPOSE {}", k.facts.port)),
        "the image should EXPOSE the ops port {}",
        k.facts.port
    );
    // A numeric USER, so Kubernetes runAsNonRoot can verify it.
    let user = dockerfile
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("USER "))
        .expect("a USER line");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("USER {user} should be numeric"));
    assert_ne!(uid, 0);
    assert!(dockerfile.contains("cargo build --release --locked"));
}

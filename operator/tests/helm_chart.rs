//! The Helm chart in `helm/nextmini`: its copies of the CRDs and dashboards are current,
//! `helm lint --strict` passes, and what `helm template` renders with the default values, CI's
//! values and an external database is checked object by object: names and labels, the
//! operator's environment (the contract of `nextmini-operator`), its security context,
//! least-privilege RBAC, the Services, PostgreSQL, the dashboards. Bad values must make helm
//! fail with a message naming the value. (A server-side dry run against a real API server is
//! part of the Kubernetes end-to-end suite.)
//!
//! helm comes from `HELM`, else `/var/cache/nextmini/k8s/bin/helm`, which `make cluster-build`
//! (`e2e/cluster/build.sh`) builds. Without helm these tests fail: they do not skip.

use serde::Deserialize;
use serde_norway::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const RELEASE: &str = "nextmini";
const NAMESPACE: &str = "nextmini";
const DEFAULT_HELM: &str = "/var/cache/nextmini/k8s/bin/helm";
/// The Kubernetes version `helm template` renders for: that of the test cluster. (helm built with
/// `go install` has no version stamped in and would assume v1.20, below the chart's kubeVersion.)
const KUBE_VERSION: &str = "1.30.14";
const EXTERNAL_URL: &str = "postgres://nm:s3cret@db.example.internal:5432/nextmini";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the operator crate sits in the repository")
        .to_path_buf()
}

fn chart() -> PathBuf {
    repo().join("helm/nextmini")
}

/// The helm binary; panics (the test fails) when there is none.
fn helm() -> PathBuf {
    let path = std::env::var_os("HELM")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_HELM));
    let works = Command::new(&path)
        .arg("version")
        .arg("--short")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        works,
        "no working helm at {} (set HELM to override): run `make cluster-build` \
         (e2e/cluster/build.sh), which builds helm into {DEFAULT_HELM}",
        path.display()
    );
    path
}

/// Runs helm with a private, empty configuration so that a user's repositories and plugins
/// play no part.
fn run_helm(args: &[&str]) -> Output {
    let home = std::env::temp_dir().join(format!("nextmini-helm-test-{}", std::process::id()));
    Command::new(helm())
        .args(args)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("HELM_KUBECONTEXT")
        .env_remove("HELM_NAMESPACE")
        .output()
        .expect("running helm")
}

fn template_args<'a>(release: &'a str, chart: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "template",
        release,
        chart,
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
    ];
    args.extend_from_slice(extra);
    args
}

/// `helm template` with `extra` arguments; panics with helm's message when it fails.
fn render_release(release: &str, extra: &[&str]) -> Vec<Value> {
    let chart = chart();
    let chart = chart.to_str().expect("UTF-8 path");
    let out = run_helm(&template_args(release, chart, extra));
    assert!(
        out.status.success(),
        "helm template {extra:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8 output");
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let value = Value::deserialize(doc)
            .unwrap_or_else(|e| panic!("helm template {extra:?} rendered bad YAML: {e}"));
        if !value.is_null() {
            docs.push(value);
        }
    }
    assert!(!docs.is_empty(), "helm template {extra:?} rendered nothing");
    check_common(&docs, extra);
    docs
}

fn render(extra: &[&str]) -> Vec<Value> {
    render_release(RELEASE, extra)
}

/// `helm template` that must fail; returns helm's error output.
fn render_error(extra: &[&str]) -> String {
    let chart = chart();
    let chart = chart.to_str().expect("UTF-8 path");
    let out = run_helm(&template_args(RELEASE, chart, extra));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "helm template {extra:?} should have failed but rendered:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

fn ci_values() -> String {
    chart()
        .join("ci/ci-values.yaml")
        .to_str()
        .expect("UTF-8 path")
        .to_string()
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
}

fn seq<'a>(v: &'a Value, what: &str) -> &'a [Value] {
    v.as_sequence()
        .map(|s| s.as_slice())
        .unwrap_or_else(|| panic!("{what} is not a list: {v:?}"))
}

fn kind_name(v: &Value) -> String {
    format!(
        "{}/{}",
        v["kind"].as_str().unwrap_or("?"),
        v["metadata"]["name"].as_str().unwrap_or("?")
    )
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| {
            let all: Vec<String> = docs.iter().map(kind_name).collect();
            panic!("no {kind}/{name} among {all:?}")
        })
}

fn all_of<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        str_of(k, "label key").to_string(),
                        str_of(v, "label value").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Checks every rendered object: apiVersion, kind and a valid name; namespaced objects in the
/// release namespace; chart labels; nothing privileged, on the host, or with NET_ADMIN.
fn check_common(docs: &[Value], extra: &[&str]) {
    let cluster_scoped = [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
    ];
    let mut seen = BTreeSet::new();
    for d in docs {
        let what = format!("{} (values {extra:?})", kind_name(d));
        let api = d["apiVersion"].as_str().unwrap_or_default();
        let kind = d["kind"].as_str().unwrap_or_default();
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        assert!(
            !api.is_empty() && !kind.is_empty() && !name.is_empty(),
            "{what}: apiVersion, kind and metadata.name are required"
        );
        assert!(
            name.len() <= 63 || kind == "CustomResourceDefinition",
            "{what}: name longer than 63 characters"
        );
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                && !name.starts_with('-')
                && !name.ends_with('-'),
            "{what}: {name:?} is not a valid object name"
        );
        assert!(
            seen.insert((api.to_string(), kind.to_string(), name.to_string())),
            "{what}: rendered twice"
        );
        if kind == "CustomResourceDefinition" {
            continue;
        }
        let namespace = d["metadata"]["namespace"].as_str();
        if cluster_scoped.contains(&kind) {
            assert_eq!(
                namespace, None,
                "{what}: cluster-scoped, yet has a namespace"
            );
        } else {
            assert!(
                namespace.is_some(),
                "{what}: namespaced objects name their namespace"
            );
        }
        let l = labels(&d["metadata"]["labels"]);
        assert_eq!(
            l.get("app.kubernetes.io/managed-by").map(String::as_str),
            Some("Helm"),
            "{what}: labels {l:?}"
        );
        assert_eq!(
            l.get("app.kubernetes.io/instance").map(String::as_str),
            Some(release_of(docs)),
            "{what}: labels {l:?}"
        );
        if let Some(pod) = pod_spec(d) {
            check_pod_is_unprivileged(pod, &what);
        }
    }
}

/// The release name, read from the operator Deployment's instance label.
fn release_of(docs: &[Value]) -> &str {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))
        .and_then(|d| d["metadata"]["labels"]["app.kubernetes.io/instance"].as_str())
        .expect("an operator Deployment with an instance label")
}

fn pod_spec(d: &Value) -> Option<&Value> {
    match d["kind"].as_str() {
        Some("Deployment" | "StatefulSet" | "DaemonSet" | "Job" | "ReplicaSet") => {
            Some(&d["spec"]["template"]["spec"])
        }
        Some("Pod") => Some(&d["spec"]),
        _ => None,
    }
}

fn check_pod_is_unprivileged(pod: &Value, what: &str) {
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(pod[host].as_bool(), Some(true), "{what}: {host}");
    }
    for v in pod["volumes"].as_sequence().into_iter().flatten() {
        assert!(v["hostPath"].is_null(), "{what}: hostPath volume {v:?}");
    }
    let containers = seq(&pod["containers"], "containers")
        .iter()
        .chain(pod["initContainers"].as_sequence().into_iter().flatten());
    for c in containers {
        let sc = &c["securityContext"];
        assert_ne!(sc["privileged"].as_bool(), Some(true), "{what}: privileged");
        assert_eq!(
            sc["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{what}: allowPrivilegeEscalation must be false"
        );
        let added: Vec<&str> = sc["capabilities"]["add"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert!(added.is_empty(), "{what}: adds capabilities {added:?}");
        let dropped: Vec<&str> = sc["capabilities"]["drop"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            dropped.contains(&"ALL"),
            "{what}: must drop ALL capabilities"
        );
    }
}

fn operator_deployment(docs: &[Value]) -> &Value {
    let deployments = all_of(docs, "Deployment");
    assert_eq!(deployments.len(), 1, "exactly one Deployment, the operator");
    deployments[0]
}

fn operator_container(docs: &[Value]) -> &Value {
    let containers = seq(
        &operator_deployment(docs)["spec"]["template"]["spec"]["containers"],
        "operator containers",
    );
    assert_eq!(containers.len(), 1, "the operator pod has one container");
    &containers[0]
}

/// The operator's environment, in order: (name, the EnvVar object).
fn env_vars(container: &Value) -> Vec<(String, Value)> {
    seq(&container["env"], "env")
        .iter()
        .map(|e| (str_of(&e["name"], "env name").to_string(), e.clone()))
        .collect()
}

fn env_value(env: &[(String, Value)], name: &str) -> String {
    let (_, e) = env
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("the operator has no {name}"));
    str_of(&e["value"], name).to_string()
}

fn env_secret_ref(env: &[(String, Value)], name: &str) -> (String, String) {
    let (_, e) = env
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("the operator has no {name}"));
    let r = &e["valueFrom"]["secretKeyRef"];
    (
        str_of(&r["name"], "secretKeyRef.name").to_string(),
        str_of(&r["key"], "secretKeyRef.key").to_string(),
    )
}

fn app_version() -> String {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).expect("Chart.yaml");
    let chart: Value = serde_norway::from_str(&text).expect("Chart.yaml is YAML");
    str_of(&chart["appVersion"], "appVersion").to_string()
}

/// Checks the operator Deployment against the contract of `nextmini-operator`.
fn check_operator(docs: &[Value], release: &str, pull_policy: &str, tag: &str) {
    let deployment = operator_deployment(docs);
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"].as_i64(), Some(1), "a single operator");
    assert_eq!(spec["strategy"]["type"].as_str(), Some("Recreate"));
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_ne!(pod["securityContext"]["runAsUser"].as_i64(), Some(0));
    let selector = labels(&spec["selector"]["matchLabels"]);
    let pod_labels = labels(&spec["template"]["metadata"]["labels"]);
    assert!(
        selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "selector {selector:?} does not match the pod's labels {pod_labels:?}"
    );

    let c = operator_container(docs);
    assert_eq!(
        seq(&c["command"], "command"),
        &[Value::from("nextmini-operator")]
    );
    assert_eq!(
        c["image"].as_str(),
        Some(format!("docker.io/nextmini/nextmini:{tag}").as_str())
    );
    assert_eq!(c["imagePullPolicy"].as_str(), Some(pull_policy));
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(sc["privileged"].as_bool(), Some(false));
    assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true));

    let env = env_vars(c);
    for name in [
        "DATABASE_URL",
        "NEXTMINI_HUB_LISTEN",
        "NEXTMINI_HUB_ADDRESS",
        "NEXTMINI_AGENT_IMAGE",
        "NEXTMINI_AGENT_IMAGE_PULL_POLICY",
        "NEXTMINI_METRICS_LISTEN",
        "NEXTMINI_AGENT_LOG",
        "RUST_LOG",
        "POD_NAME",
    ] {
        assert_eq!(
            env.iter().filter(|(n, _)| n == name).count(),
            1,
            "the operator needs {name} exactly once; it has {:?}",
            env.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
    }
    assert_eq!(env_value(&env, "NEXTMINI_HUB_LISTEN"), "0.0.0.0:50051");
    assert_eq!(
        env_value(&env, "NEXTMINI_HUB_ADDRESS"),
        format!("https://{release}-hub.{NAMESPACE}.svc:50051")
    );
    assert_eq!(
        env_value(&env, "NEXTMINI_AGENT_IMAGE"),
        format!("docker.io/nextmini/nextmini:{tag}")
    );
    assert_eq!(
        env_value(&env, "NEXTMINI_AGENT_IMAGE_PULL_POLICY"),
        pull_policy
    );
    assert_eq!(env_value(&env, "NEXTMINI_METRICS_LISTEN"), "0.0.0.0:9464");
    assert!(!env_value(&env, "RUST_LOG").is_empty());

    // Ports and probes: /healthz and /readyz on the metrics port.
    let ports: BTreeMap<String, i64> = seq(&c["ports"], "ports")
        .iter()
        .map(|p| {
            (
                str_of(&p["name"], "port name").to_string(),
                p["containerPort"].as_i64().expect("containerPort"),
            )
        })
        .collect();
    assert_eq!(ports.get("grpc"), Some(&50051), "ports {ports:?}");
    assert_eq!(ports.get("metrics"), Some(&9464), "ports {ports:?}");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(get["port"].as_str(), Some("metrics"), "{probe}");
    }

    // The ServiceAccount it runs as is the one the ClusterRoleBinding names.
    let sa = str_of(&pod["serviceAccountName"], "serviceAccountName");
    find(docs, "ServiceAccount", sa);
    let binding = all_of(docs, "ClusterRoleBinding");
    assert_eq!(binding.len(), 1);
    let subjects = seq(&binding[0]["subjects"], "subjects");
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0]["kind"].as_str(), Some("ServiceAccount"));
    assert_eq!(subjects[0]["name"].as_str(), Some(sa));
    assert_eq!(subjects[0]["namespace"].as_str(), Some(NAMESPACE));
    let role = str_of(&binding[0]["roleRef"]["name"], "roleRef.name");
    assert_eq!(binding[0]["roleRef"]["kind"].as_str(), Some("ClusterRole"));
    find(docs, "ClusterRole", role);
    check_rbac(docs);

    // The Services select the operator's pod.
    for (service, port_name, port) in [("hub", "grpc", 50051), ("metrics", "metrics", 9464)] {
        let svc = find(docs, "Service", &format!("{release}-{service}"));
        assert_eq!(svc["spec"]["type"].as_str(), Some("ClusterIP"));
        let sel = labels(&svc["spec"]["selector"]);
        assert!(
            !sel.is_empty() && sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "Service {service} selects {sel:?}, not the operator pod {pod_labels:?}"
        );
        let ports = seq(&svc["spec"]["ports"], "service ports");
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0]["name"].as_str(), Some(port_name));
        assert_eq!(ports[0]["port"].as_i64(), Some(port));
        assert_eq!(ports[0]["targetPort"].as_str(), Some(port_name));
    }
}

/// The ClusterRole grants exactly the contract's permissions: no wildcard, nothing more, and
/// nothing the operator needs is missing.
fn check_rbac(docs: &[Value]) {
    let mut expected: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    let mut grant =
        |groups: &[&'static str], resources: &[&'static str], verbs: &[&'static str]| {
            for g in groups {
                for r in resources {
                    expected.entry((g, r)).or_default().extend(verbs);
                }
            }
        };
    grant(
        &["nextmini.io"],
        &["topologies", "links", "flows"],
        &["get", "list", "watch", "patch", "update"],
    );
    grant(
        &["nextmini.io"],
        &["topologies/status", "links/status", "flows/status"],
        &["get", "patch", "update"],
    );
    // MemberClusters: read, and their probe's status written.
    grant(
        &["nextmini.io"],
        &["memberclusters"],
        &["get", "list", "watch"],
    );
    grant(
        &["nextmini.io"],
        &["memberclusters/status"],
        &["get", "patch", "update"],
    );
    grant(
        &["nextmini.io"],
        &[
            "topologies/finalizers",
            "links/finalizers",
            "flows/finalizers",
        ],
        &["update"],
    );
    grant(
        &[""],
        &["pods", "services", "secrets", "configmaps"],
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
    );
    grant(&["", "events.k8s.io"], &["events"], &["create", "patch"]);
    grant(
        &["coordination.k8s.io"],
        &["leases"],
        &["get", "create", "update"],
    );

    let roles = all_of(docs, "ClusterRole");
    assert_eq!(roles.len(), 1, "one ClusterRole");
    assert!(all_of(docs, "Role").is_empty(), "no namespaced Roles");
    let mut granted: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for rule in seq(&roles[0]["rules"], "rules") {
        assert!(
            rule["nonResourceURLs"].is_null(),
            "no non-resource URLs: {rule:?}"
        );
        assert!(
            rule["resourceNames"].is_null(),
            "unexpected resourceNames: {rule:?}"
        );
        let strings = |key: &str| -> Vec<String> {
            seq(&rule[key], key)
                .iter()
                .map(|v| str_of(v, key).to_string())
                .collect()
        };
        let (groups, resources, verbs) =
            (strings("apiGroups"), strings("resources"), strings("verbs"));
        for list in [&groups, &resources, &verbs] {
            assert!(
                !list.iter().any(|s| s.contains('*')),
                "wildcard in ClusterRole rule {rule:?}"
            );
        }
        for g in &groups {
            for r in &resources {
                granted
                    .entry((g.clone(), r.clone()))
                    .or_default()
                    .extend(verbs.iter().cloned());
            }
        }
    }
    for ((g, r), verbs) in &granted {
        let allowed = expected.get(&(g.as_str(), r.as_str())).unwrap_or_else(|| {
            panic!(
                "the ClusterRole grants {verbs:?} on {g:?}/{r}, which the operator does not need"
            )
        });
        let extra: Vec<&String> = verbs
            .iter()
            .filter(|v| !allowed.contains(v.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "the ClusterRole grants {extra:?} on {g:?}/{r} beyond {allowed:?}"
        );
    }
    for ((g, r), verbs) in &expected {
        let have = granted
            .get(&(g.to_string(), r.to_string()))
            .cloned()
            .unwrap_or_default();
        let missing: Vec<&&str> = verbs.iter().filter(|v| !have.contains(**v)).collect();
        assert!(
            missing.is_empty(),
            "the ClusterRole lacks {missing:?} on {g:?}/{r}"
        );
    }
}

/// In-release PostgreSQL: StatefulSet, its Services and Secret, and the operator's
/// DATABASE_URL pointing at it.
fn check_postgresql(docs: &[Value], image: &str, persistent: bool) {
    let sts = find(docs, "StatefulSet", "nextmini-postgresql");
    let spec = &sts["spec"];
    assert_eq!(spec["replicas"].as_i64(), Some(1));
    let headless = find(docs, "Service", str_of(&spec["serviceName"], "serviceName"));
    assert_eq!(headless["spec"]["clusterIP"].as_str(), Some("None"));
    let svc = find(docs, "Service", "nextmini-postgresql");
    assert_eq!(svc["spec"]["ports"][0]["port"].as_i64(), Some(5432));
    let pod_labels = labels(&spec["template"]["metadata"]["labels"]);
    for s in [headless, svc] {
        let sel = labels(&s["spec"]["selector"]);
        assert!(
            !sel.is_empty() && sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "{} does not select the PostgreSQL pod",
            kind_name(s)
        );
    }
    let pod = &spec["template"]["spec"];
    for key in ["runAsUser", "runAsGroup", "fsGroup"] {
        assert_eq!(
            pod["securityContext"][key].as_i64(),
            Some(999),
            "PostgreSQL runs as uid/gid 999 ({key})"
        );
    }
    let c = &seq(&pod["containers"], "containers")[0];
    assert_eq!(c["image"].as_str(), Some(image));
    let env = env_vars(c);
    for name in ["POSTGRES_USER", "POSTGRES_DB", "PGDATA"] {
        assert!(!env_value(&env, name).is_empty(), "{name}");
    }
    let (secret, key) = env_secret_ref(&env, "POSTGRES_PASSWORD");
    let s = find(docs, "Secret", &secret);
    assert!(
        s["data"][key.as_str()]
            .as_str()
            .is_some_and(|p| !p.is_empty()),
        "Secret {secret} lacks {key}"
    );
    assert!(
        c["readinessProbe"]["tcpSocket"].is_mapping(),
        "default readiness probe is tcpSocket"
    );
    let claims = spec["volumeClaimTemplates"].as_sequence();
    let data_volume = pod["volumes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|v| v["name"].as_str() == Some("data"));
    if persistent {
        let claims = claims.expect("volumeClaimTemplates with persistence");
        assert_eq!(claims[0]["metadata"]["name"].as_str(), Some("data"));
        assert_eq!(
            claims[0]["spec"]["resources"]["requests"]["storage"].as_str(),
            Some("1Gi")
        );
        assert!(data_volume.is_none());
    } else {
        assert!(claims.is_none(), "no claims without persistence");
        assert!(
            data_volume.is_some_and(|v| v["emptyDir"].is_mapping()),
            "an emptyDir holds the data without persistence"
        );
    }

    // The operator builds its URL from the same user, database and Secret.
    let op = env_vars(operator_container(docs));
    let (op_secret, op_key) = env_secret_ref(&op, "NEXTMINI_DATABASE_PASSWORD");
    assert_eq!((op_secret, op_key), (secret, key));
    let password_at = op
        .iter()
        .position(|(n, _)| n == "NEXTMINI_DATABASE_PASSWORD")
        .expect("password variable");
    let url_at = op
        .iter()
        .position(|(n, _)| n == "DATABASE_URL")
        .expect("DATABASE_URL");
    assert!(
        password_at < url_at,
        "$(NEXTMINI_DATABASE_PASSWORD) expands only when defined before DATABASE_URL"
    );
    assert_eq!(
        env_value(&op, "DATABASE_URL"),
        format!(
            "postgres://{}:$(NEXTMINI_DATABASE_PASSWORD)@nextmini-postgresql.{NAMESPACE}.svc:5432/{}",
            env_value(&env, "POSTGRES_USER"),
            env_value(&env, "POSTGRES_DB")
        )
    );
}

#[test]
fn chart_crds_are_a_copy_of_the_generated_ones() {
    let generated = std::fs::read(repo().join("crds/nextmini.yaml")).expect("crds/nextmini.yaml");
    let copy = std::fs::read(chart().join("crds/nextmini.yaml"))
        .expect("helm/nextmini/crds/nextmini.yaml");
    assert!(
        generated == copy,
        "helm/nextmini/crds/nextmini.yaml differs from crds/nextmini.yaml: run `make crds` \
         (or cp crds/nextmini.yaml helm/nextmini/crds/)"
    );
    let extra: Vec<PathBuf> = std::fs::read_dir(chart().join("crds"))
        .expect("chart crds/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n != "nextmini.yaml"))
        .collect();
    assert!(
        extra.is_empty(),
        "unexpected files in the chart's crds/: {extra:?}"
    );
}

#[test]
fn chart_dashboards_are_a_copy_of_grafana_dashboards() {
    let read = |dir: &Path| -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .map(|p| {
                (
                    p.file_name()
                        .expect("file name")
                        .to_string_lossy()
                        .into_owned(),
                    std::fs::read(&p).expect("readable dashboard"),
                )
            })
            .collect()
    };
    let source = read(&repo().join("grafana/dashboards"));
    let copy = read(&chart().join("dashboards"));
    assert!(!source.is_empty(), "no dashboards in grafana/dashboards");
    let fix = "cp grafana/dashboards/*.json helm/nextmini/dashboards/ (and delete removed ones)";
    assert_eq!(
        source.keys().collect::<Vec<_>>(),
        copy.keys().collect::<Vec<_>>(),
        "helm/nextmini/dashboards/ must hold exactly grafana/dashboards/*.json: {fix}"
    );
    for (name, bytes) in &source {
        assert!(
            copy.get(name) == Some(bytes),
            "helm/nextmini/dashboards/{name} differs from grafana/dashboards/{name}: {fix}"
        );
    }
}

/// Every value the schema describes (all but the contents of free-form objects such as
/// `resources`) has a comment right above it in values.yaml, and every key in values.yaml is in
/// the schema.
#[test]
fn every_value_is_documented_and_in_the_schema() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(chart().join("values.schema.json")).expect("values.schema.json"),
    )
    .expect("values.schema.json is JSON");
    let text = std::fs::read_to_string(chart().join("values.yaml")).expect("values.yaml");
    let lines: Vec<&str> = text.lines().collect();
    let node = |path: &[String]| -> Option<&serde_json::Value> {
        path.iter()
            .try_fold(&schema, |n, key| n.get("properties")?.get(key.as_str()))
    };
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut undocumented = Vec::new();
    let mut unknown = Vec::new();
    let mut checked = 0;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('-') {
            continue;
        }
        let Some((key, _)) = trimmed.split_once(':') else {
            continue;
        };
        if key.is_empty() || key.contains(char::is_whitespace) || key.contains('"') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let parent: Vec<String> = stack.iter().map(|(_, k)| k.clone()).collect();
        stack.push((indent, key.to_string()));
        // Only keys of objects the schema spells out; free-form objects hold examples.
        let Some(parent_node) = node(&parent) else {
            continue;
        };
        let Some(properties) = parent_node.get("properties") else {
            continue;
        };
        let path = [parent, vec![key.to_string()]].concat().join(".");
        if properties.get(key).is_none() {
            unknown.push(path.clone());
        }
        let above = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim_start());
        if !above.is_some_and(|l| l.starts_with('#')) {
            undocumented.push(path);
        }
        checked += 1;
    }
    assert!(checked > 50, "only {checked} values found in values.yaml");
    assert!(
        undocumented.is_empty(),
        "values without a comment above them in values.yaml: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "values.yaml keys missing from values.schema.json: {unknown:?}"
    );
}

#[test]
fn chart_lints_strictly() {
    let chart = chart();
    let chart = chart.to_str().expect("UTF-8 path");
    let ci = ci_values();
    let external = chart.to_string() + "/ci/external-db-values.yaml";
    for extra in [
        vec![],
        vec!["-f", ci.as_str()],
        vec!["-f", external.as_str()],
    ] {
        let mut args = vec!["lint", "--strict", chart];
        args.extend(extra.iter().copied());
        let out = run_helm(&args);
        assert!(
            out.status.success(),
            "helm {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn default_values_render_the_operator_rbac_postgresql_and_dashboards() {
    let docs = render(&["--include-crds"]);
    check_operator(&docs, RELEASE, "IfNotPresent", &app_version());
    // Every default image is one the images step builds, at the appVersion.
    check_postgresql(
        &docs,
        &format!("docker.io/nextmini/postgres:{}", app_version()),
        true,
    );
    let op = env_vars(operator_container(&docs));
    assert!(
        !op.iter().any(|(n, _)| n == "NEXTMINI_WATCH_NAMESPACE"),
        "no NEXTMINI_WATCH_NAMESPACE by default: the operator watches all namespaces \
         (an empty value would name the namespace \"\")"
    );
    assert_eq!(env_value(&op, "RUST_LOG"), "info");
    assert_eq!(env_value(&op, "NEXTMINI_AGENT_LOG"), "info");

    // The CRDs come from the chart's crds/ folder.
    let crds: BTreeSet<&str> = all_of(&docs, "CustomResourceDefinition")
        .iter()
        .map(|d| d["metadata"]["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        crds,
        BTreeSet::from([
            "flows.nextmini.io",
            "links.nextmini.io",
            "memberclusters.nextmini.io",
            "topologies.nextmini.io"
        ])
    );

    // No ServiceMonitor by default.
    assert!(all_of(&docs, "ServiceMonitor").is_empty());

    // One ConfigMap per dashboard, for Grafana's sidecar, holding the dashboard verbatim.
    let dashboards: Vec<&Value> = all_of(&docs, "ConfigMap")
        .into_iter()
        .filter(|d| d["metadata"]["labels"]["grafana_dashboard"].as_str() == Some("1"))
        .collect();
    let dir = repo().join("grafana/dashboards");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("grafana/dashboards")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(dashboards.len(), files.len(), "one ConfigMap per dashboard");
    for file in &files {
        let name = file.file_name().expect("name").to_string_lossy();
        let cm = dashboards
            .iter()
            .find(|d| !d["data"][name.as_ref()].is_null())
            .unwrap_or_else(|| panic!("no ConfigMap carries {name}"));
        let rendered: serde_json::Value =
            serde_json::from_str(str_of(&cm["data"][name.as_ref()], "dashboard"))
                .expect("the ConfigMap holds JSON");
        let source: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file).expect("dashboard"))
                .expect("dashboard JSON");
        assert_eq!(
            rendered, source,
            "{name} changed on its way into the ConfigMap"
        );
    }

    // The same with dashboards disabled: no ConfigMaps at all.
    let docs = render(&["--set", "grafana.dashboards.enabled=false"]);
    assert!(all_of(&docs, "ConfigMap").is_empty());
}

#[test]
fn ci_values_render_local_images_and_ephemeral_postgresql() {
    let ci = ci_values();
    let docs = render(&["-f", &ci]);
    check_operator(&docs, RELEASE, "Never", "dev");
    check_postgresql(&docs, "docker.io/nextmini/postgres:dev", false);
    let sts = find(&docs, "StatefulSet", "nextmini-postgresql");
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["imagePullPolicy"].as_str(), Some("Never"));
}

#[test]
fn external_database_url_replaces_postgresql() {
    let url = format!("externalDatabase.url={EXTERNAL_URL}");
    let docs = render(&["--set", "postgresql.enabled=false", "--set", &url]);
    check_operator(&docs, RELEASE, "IfNotPresent", &app_version());
    assert!(all_of(&docs, "StatefulSet").is_empty(), "no StatefulSet");
    for d in &docs {
        let name = d["metadata"]["name"].as_str().unwrap_or_default();
        assert!(
            !name.contains("postgresql"),
            "{} rendered without postgresql.enabled",
            kind_name(d)
        );
    }
    let op = env_vars(operator_container(&docs));
    assert!(
        !op.iter().any(|(n, _)| n == "NEXTMINI_DATABASE_PASSWORD"),
        "no password variable with an external URL"
    );
    let (secret, key) = env_secret_ref(&op, "DATABASE_URL");
    let s = find(&docs, "Secret", &secret);
    assert_eq!(
        s["stringData"][key.as_str()].as_str(),
        Some(EXTERNAL_URL),
        "DATABASE_URL comes from externalDatabase.url"
    );

    // An existing Secret instead: referenced as is, and the chart makes no Secret of its own.
    let docs = render(&[
        "--set",
        "postgresql.enabled=false",
        "--set",
        "externalDatabase.existingSecret=my-db",
        "--set",
        "externalDatabase.existingSecretKey=dsn",
    ]);
    let op = env_vars(operator_container(&docs));
    assert_eq!(
        env_secret_ref(&op, "DATABASE_URL"),
        ("my-db".to_string(), "dsn".to_string())
    );
    assert!(all_of(&docs, "Secret").is_empty(), "no chart Secret");
    assert!(all_of(&docs, "StatefulSet").is_empty(), "no StatefulSet");

    // The CI file for this case renders too, with a ServiceMonitor.
    let file = chart().join("ci/external-db-values.yaml");
    let docs = render(&["-f", file.to_str().expect("UTF-8 path")]);
    assert!(all_of(&docs, "StatefulSet").is_empty());
    let monitors = all_of(&docs, "ServiceMonitor");
    assert_eq!(monitors.len(), 1);
    assert_eq!(
        monitors[0]["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
}

#[test]
fn options_render_as_documented() {
    // Another release name: every name and the hub address follow it.
    let docs = render_release("lab", &["--set", "operator.watchNamespace=experiments"]);
    check_operator(&docs, "lab", "IfNotPresent", &app_version());
    let op = env_vars(operator_container(&docs));
    assert_eq!(env_value(&op, "NEXTMINI_WATCH_NAMESPACE"), "experiments");
    find(&docs, "StatefulSet", "lab-postgresql");

    // A separate agent image and pull policy.
    let docs = render(&[
        "--set",
        "agent.image.repository=registry.example/agent",
        "--set",
        "agent.image.tag=v9",
        "--set",
        "agent.image.pullPolicy=Always",
        "--set",
        "operator.logLevel=debug",
        "--set",
        "agent.logLevel=trace",
    ]);
    let op = env_vars(operator_container(&docs));
    assert_eq!(
        env_value(&op, "NEXTMINI_AGENT_IMAGE"),
        "registry.example/agent:v9"
    );
    assert_eq!(env_value(&op, "NEXTMINI_AGENT_IMAGE_PULL_POLICY"), "Always");
    assert_eq!(env_value(&op, "RUST_LOG"), "debug");
    assert_eq!(env_value(&op, "NEXTMINI_AGENT_LOG"), "trace");

    // pg_isready probe, a storage class, an existing password Secret.
    let docs = render(&[
        "--set",
        "postgresql.readinessProbe.type=pgIsReady",
        "--set",
        "postgresql.persistence.storageClass=fast",
        "--set",
        "postgresql.auth.existingSecret=pg-auth",
    ]);
    let sts = find(&docs, "StatefulSet", "nextmini-postgresql");
    let c = &sts["spec"]["template"]["spec"]["containers"][0];
    let command = seq(&c["readinessProbe"]["exec"]["command"], "probe command");
    assert!(
        command
            .iter()
            .any(|a| a.as_str().is_some_and(|a| a.contains("pg_isready"))),
        "pgIsReady runs pg_isready: {command:?}"
    );
    assert_eq!(
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"].as_str(),
        Some("fast")
    );
    assert!(
        all_of(&docs, "Secret").is_empty(),
        "existingSecret: no Secret"
    );
    let pg_env = env_vars(c);
    assert_eq!(
        env_secret_ref(&pg_env, "POSTGRES_PASSWORD").0,
        "pg-auth".to_string()
    );
    let op = env_vars(operator_container(&docs));
    assert_eq!(
        env_secret_ref(&op, "NEXTMINI_DATABASE_PASSWORD").0,
        "pg-auth".to_string()
    );

    // ServiceMonitor with interval and labels, selecting the metrics Service.
    let docs = render(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.interval=5s",
        "--set",
        "metrics.serviceMonitor.labels.release=prom",
    ]);
    let sm = find(&docs, "ServiceMonitor", "nextmini-metrics");
    assert_eq!(sm["metadata"]["labels"]["release"].as_str(), Some("prom"));
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"].as_str(), Some("metrics"));
    assert_eq!(endpoint["interval"].as_str(), Some("5s"));
    let svc = find(&docs, "Service", "nextmini-metrics");
    let svc_labels = labels(&svc["metadata"]["labels"]);
    let sel = labels(&sm["spec"]["selector"]["matchLabels"]);
    assert!(
        sel.iter().all(|(k, v)| svc_labels.get(k) == Some(v)),
        "the ServiceMonitor selects {sel:?}, the metrics Service has {svc_labels:?}"
    );
    let hub = find(&docs, "Service", "nextmini-hub");
    let hub_labels = labels(&hub["metadata"]["labels"]);
    assert!(
        !sel.iter().all(|(k, v)| hub_labels.get(k) == Some(v)),
        "the ServiceMonitor must not scrape the gRPC hub Service"
    );
}

/// The chart's one NetworkPolicy, the one in front of PostgreSQL.
fn postgresql_policy(docs: &[Value]) -> &Value {
    let policies = all_of(docs, "NetworkPolicy");
    assert_eq!(policies.len(), 1, "one NetworkPolicy: {policies:?}");
    find(docs, "NetworkPolicy", "nextmini-postgresql")
}

#[test]
fn network_policy_admits_only_the_operator_to_postgresql() {
    // On by default (issue 9, point 5: PostgreSQL is never reachable from agents).
    let docs = render(&[]);
    let policy = postgresql_policy(&docs);
    let spec = &policy["spec"];
    let sts = find(&docs, "StatefulSet", "nextmini-postgresql");
    let db_pod = labels(&sts["spec"]["template"]["metadata"]["labels"]);
    let selected = labels(&spec["podSelector"]["matchLabels"]);
    assert!(
        !selected.is_empty() && selected.iter().all(|(k, v)| db_pod.get(k) == Some(v)),
        "the policy selects the PostgreSQL pod: {selected:?} vs {db_pod:?}"
    );
    let types: Vec<&str> = seq(&spec["policyTypes"], "policyTypes")
        .iter()
        .map(|t| t.as_str().expect("a policy type"))
        .collect();
    assert_eq!(types, ["Ingress"], "ingress is restricted");
    let rules = seq(&spec["ingress"], "ingress");
    assert_eq!(rules.len(), 1, "one ingress rule: {rules:?}");
    let from = seq(&rules[0]["from"], "from");
    assert_eq!(from.len(), 1, "one peer, the operator: {from:?}");
    assert!(
        from[0].get("namespaceSelector").is_none() && from[0].get("ipBlock").is_none(),
        "pods of the release namespace only: {from:?}"
    );
    let peer = labels(&from[0]["podSelector"]["matchLabels"]);
    let operator = labels(&operator_deployment(&docs)["spec"]["template"]["metadata"]["labels"]);
    assert!(
        !peer.is_empty() && peer.iter().all(|(k, v)| operator.get(k) == Some(v)),
        "the peer selects the operator pod: {peer:?} vs {operator:?}"
    );
    assert_eq!(
        peer.get("app.kubernetes.io/component").map(String::as_str),
        Some("operator"),
        "the peer names the operator component, not every pod of the release"
    );
    // Agent pods (controller/build.rs) are `app.kubernetes.io/name: nextmini-agent`; the
    // PostgreSQL pod itself is no operator either.
    assert_ne!(
        peer.get("app.kubernetes.io/name").map(String::as_str),
        Some("nextmini-agent")
    );
    assert!(!peer.iter().all(|(k, v)| db_pod.get(k) == Some(v)));
    let ports = seq(&rules[0]["ports"], "ports");
    assert_eq!(ports.len(), 1);
    let db_port = &sts["spec"]["template"]["spec"]["containers"][0]["ports"][0];
    assert_eq!(
        ports[0]["port"].as_str(),
        db_port["name"].as_str(),
        "the database port only"
    );
    assert_eq!(ports[0]["protocol"].as_str(), Some("TCP"));

    // More peers when asked for (Grafana's PostgreSQL data source).
    let docs = render(&[
        "--set",
        "networkPolicy.extraIngressFrom[0].podSelector.matchLabels.app=grafana",
    ]);
    let from = seq(
        &postgresql_policy(&docs)["spec"]["ingress"][0]["from"],
        "from",
    );
    assert_eq!(from.len(), 2);
    assert_eq!(
        from[1]["podSelector"]["matchLabels"]["app"].as_str(),
        Some("grafana")
    );

    // Off, or nothing to protect with an external database.
    let docs = render(&["--set", "networkPolicy.enabled=false"]);
    assert!(all_of(&docs, "NetworkPolicy").is_empty());
    let url = format!("externalDatabase.url={EXTERNAL_URL}");
    let docs = render(&["--set", "postgresql.enabled=false", "--set", &url]);
    assert!(all_of(&docs, "NetworkPolicy").is_empty());
}

#[test]
fn bad_values_fail_naming_the_value() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--set", "image.pullPolicy=Sometimes"], &["pullPolicy"]),
        (
            &["--set", "postgresql.image.pullPolicy=Sometimes"],
            &["postgresql", "pullPolicy"],
        ),
        (
            &["--set", "postgresql.enabled=false"],
            &["externalDatabase.url", "externalDatabase.existingSecret"],
        ),
        (
            &[
                "--set",
                "postgresql.enabled=false",
                "--set",
                "externalDatabase.url=mysql://db/x",
            ],
            &["url"],
        ),
        (
            &["--set", "postgresql.persistance.enabled=false"],
            &["persistance"],
        ),
        (
            &["--set", "postgresql.readinessProbe.type=exec"],
            &["readinessProbe"],
        ),
        (&["--set", "hub.port=70000"], &["port"]),
        (
            &["--set", "operator.watchNamespace=Not_A_Namespace"],
            &["watchNamespace"],
        ),
        (
            &["--set", "postgresql.auth.username=bad-user"],
            &["username"],
        ),
        (&["--set-string", "postgresql.enabled=yes"], &["enabled"]),
        (
            &["--set", "serviceAccount.create=false"],
            &["serviceAccount.name"],
        ),
        (
            &["--set-string", "networkPolicy.enabled=yes"],
            &["networkPolicy", "enabled"],
        ),
        (
            &["--set", "networkPolicy.extraIngressFrom[0].pods=all"],
            &["extraIngressFrom"],
        ),
    ];
    let mut problems = Vec::new();
    for (args, words) in cases {
        let stderr = render_error(args);
        for word in *words {
            if !stderr.contains(word) {
                problems.push(format!("{args:?}: error does not name {word:?}:\n{stderr}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

//! Harness for the cluster suite: drives `kubectl` and `helm` against whatever
//! cluster KUBECONFIG names (the from-source cluster of `e2e/cluster`, kind,
//! k3s). Each test installs the chart in a namespace of its own; dropping the
//! [`Cluster`] uninstalls it and deletes the namespace, also when a test fails.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Where `e2e/cluster/build.sh` puts kubectl and helm.
const CACHE_BIN: &str = "/var/cache/nextmini/k8s/bin";

fn tool(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let cached = PathBuf::from(CACHE_BIN).join(name);
    if cached.exists() {
        cached
    } else {
        PathBuf::from(name)
    }
}

pub struct Cluster {
    pub namespace: String,
    pub release: String,
    kubectl: PathBuf,
    helm: PathBuf,
}

impl Cluster {
    /// A namespace of its own on the cluster KUBECONFIG names.
    pub fn new(prefix: &str) -> Cluster {
        assert!(
            std::env::var_os("KUBECONFIG").is_some(),
            "KUBECONFIG must name a cluster: `make cluster-up` starts one built from source (see e2e/cluster/README.md)"
        );
        let cluster = Cluster {
            namespace: format!("{prefix}-{}", std::process::id()),
            release: "nm".into(),
            kubectl: tool("KUBECTL", "kubectl"),
            helm: tool("HELM", "helm"),
        };
        cluster.ok(&["create", "namespace", &cluster.namespace]);
        cluster
    }

    fn run(&self, program: &PathBuf, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut cmd = Command::new(program);
        cmd.args(args);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
        if let (Some(mut input), Some(text)) = (child.stdin.take(), stdin) {
            input.write_all(text.as_bytes()).expect("writing stdin");
        }
        child.wait_with_output().expect("waiting for a command")
    }

    /// `kubectl <args>` in the test's namespace.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        let mut all = vec!["-n", &self.namespace];
        all.extend_from_slice(args);
        self.run(&self.kubectl, &all, None)
    }

    /// `kubectl <args>` in another namespace.
    pub fn kubectl_in(&self, namespace: &str, args: &[&str]) -> Output {
        let mut all = vec!["-n", namespace];
        all.extend_from_slice(args);
        self.run(&self.kubectl, &all, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        self.kubectl_in_stdin(&self.namespace, args, stdin)
    }

    /// `kubectl <args>` in another namespace, with `stdin`.
    pub fn kubectl_in_stdin(&self, namespace: &str, args: &[&str], stdin: &str) -> Output {
        let mut all = vec!["-n", namespace];
        all.extend_from_slice(args);
        self.run(&self.kubectl, &all, Some(stdin))
    }

    /// `kubectl <args>`, which must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        if !out.status.success() {
            panic!(
                "kubectl {args:?} failed:\n{}{}\nwarnings in the namespace and on the node:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.warnings()
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The cluster's Warning events (evictions, OOM kills, failed probes) in
    /// every namespace, oldest first: what explains a pod that went away under
    /// a test. Node events such as EvictionThresholdMet live in `default`.
    pub fn warnings(&self) -> String {
        let out = self.run(
            &self.kubectl,
            &[
                "get",
                "events",
                "--all-namespaces",
                "--field-selector",
                "type=Warning",
                "--sort-by=.lastTimestamp",
            ],
            None,
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Applies `yaml`, which must succeed, and waits up to `timeout` (`180s`)
    /// for `topology/<name>` to be Ready; how long that took from the apply.
    pub fn apply_until_ready(&self, yaml: &str, name: &str, timeout: &str) -> Duration {
        self.apply_until_ready_in(&self.namespace, yaml, name, timeout)
    }

    /// [`Cluster::apply_until_ready`] in another namespace (the operator's
    /// log still comes from this one's).
    pub fn apply_until_ready_in(
        &self,
        namespace: &str,
        yaml: &str,
        name: &str,
        timeout: &str,
    ) -> Duration {
        let t = Instant::now();
        let applied = self.kubectl_in_stdin(namespace, &["apply", "-f", "-"], yaml);
        assert!(
            applied.status.success(),
            "{}",
            String::from_utf8_lossy(&applied.stderr)
        );
        let waited = self.kubectl_in(
            namespace,
            &[
                "wait",
                "--for=condition=Ready",
                &format!("topology/{name}"),
                &format!("--timeout={timeout}"),
            ],
        );
        if !waited.status.success() {
            // What the Topology itself says is the first thing to read.
            let show = |ns: &str, args: &[&str]| {
                let out = self.kubectl_in(ns, args);
                format!(
                    "$ kubectl -n {ns} {}\n{}{}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )
            };
            panic!(
                "topology/{name} not Ready within {timeout}:\n{}\n{}\n{}\n{}",
                show(
                    namespace,
                    &[
                        "get",
                        "topology",
                        name,
                        "-o",
                        r#"jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}"#,
                    ]
                ),
                show(
                    namespace,
                    &[
                        "get",
                        "pods",
                        "-l",
                        &format!("nextmini.io/topology={name}"),
                        "--no-headers"
                    ]
                ),
                show(namespace, &["get", "events", "--sort-by=.lastTimestamp"]),
                show(
                    &self.namespace,
                    &["logs", "deploy/nm-operator", "--tail=30"]
                ),
            );
        }
        t.elapsed()
    }

    /// `kubectl get topology <name>`, printed; the columns of its row.
    pub fn topology_row(&self, name: &str) -> Vec<String> {
        let table = self.ok(&["get", "topology", name]);
        println!("{table}");
        table
            .lines()
            .nth(1)
            .expect("a row")
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    pub fn helm(&self, args: &[&str]) -> Output {
        let mut all = vec!["--namespace", &self.namespace];
        all.extend_from_slice(args);
        self.run(&self.helm, &all, None)
    }

    pub fn helm_ok(&self, args: &[&str]) -> String {
        let out = self.helm(args);
        assert!(
            out.status.success(),
            "helm {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The API server's version (`v1.30.14`), for `helm template --kube-version`.
    pub fn server_version(&self) -> String {
        let out = self.ok(&["version", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("kubectl version -o json");
        v["serverVersion"]["gitVersion"]
            .as_str()
            .expect("serverVersion.gitVersion")
            .to_string()
    }

    /// Polls `check` every 500 ms until it holds or `timeout` passes.
    pub fn wait_for(&self, what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !check() {
            if Instant::now() > deadline {
                let pods = self.kubectl(&["get", "pods,topologies,links", "-o", "wide"]);
                let events = self.kubectl(&["get", "events", "--sort-by=.lastTimestamp"]);
                let logs = self.kubectl(&["logs", "deploy/nm-operator", "--tail=60"]);
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n{}\n{}\n{}",
                    String::from_utf8_lossy(&pods.stdout),
                    String::from_utf8_lossy(&events.stdout),
                    String::from_utf8_lossy(&logs.stdout),
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// SQL against the chart's PostgreSQL, through `kubectl exec`.
    pub fn psql(&self, sql: &str) -> String {
        self.ok(&[
            "exec",
            &format!("statefulset/{}-postgresql", self.release),
            "--",
            "sh",
            "-c",
            r#"PGPASSWORD="$POSTGRES_PASSWORD" exec psql -h 127.0.0.1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -tAc "$1""#,
            "sh",
            sql,
        ])
        .trim()
        .to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::env::var_os("NEXTMINI_E2E_KEEP").is_some() {
            eprintln!("keeping namespace {} (NEXTMINI_E2E_KEEP)", self.namespace);
            return;
        }
        // Topologies first, while the operator still runs to clear their finalizers.
        let _ = self.kubectl(&["delete", "topologies", "--all", "--timeout=60s"]);
        let _ = self.helm(&["uninstall", &self.release, "--wait", "--timeout", "120s"]);
        let _ = self.run(
            &self.kubectl,
            &["delete", "namespace", &self.namespace, "--timeout=120s"],
            None,
        );
    }
}

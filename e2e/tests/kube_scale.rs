//! How long a topology takes to become Ready on a real cluster, packed into
//! worker pods against one pod per node, measured in the same run: a line of N
//! nodes (`NEXTMINI_E2E_SCALE_NODES`, default "6,60"), applied, waited for with
//! `kubectl wait --for=condition=Ready`, then deleted until no pod is left.
//!
//! Not part of `make test`: `make bench-kube` starts the from-source cluster and
//! runs it. The figures are in BENCHMARKS.md.

use nextmini_e2e::kube::Cluster;
use nextmini_e2e::repo_path;
use std::time::{Duration, Instant};

fn sizes() -> Vec<u32> {
    std::env::var("NEXTMINI_E2E_SCALE_NODES")
        .unwrap_or_else(|_| "6,60".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

struct Run {
    placement: &'static str,
    nodes: u32,
    pods: usize,
    ready: Duration,
    deleted: Duration,
}

fn run(c: &Cluster, placement: &'static str, nodes: u32) -> Run {
    let name = format!(
        "scale{nodes}-{}",
        if placement == "packed" {
            "packed"
        } else {
            "pods"
        }
    );
    let yaml = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: {name}}}\nspec:\n  placement: {placement}\n  generator: {{line: {{nodes: {nodes}}}}}\n"
    );
    let ready = c.apply_until_ready(&yaml, &name, "900s");
    let selector = format!("nextmini.io/topology={name}");
    let pods = c
        .ok(&["get", "pods", "-l", &selector, "-o", "name"])
        .lines()
        .count();
    let t = Instant::now();
    c.ok(&["delete", "topology", &name, "--timeout=300s"]);
    c.wait_for(
        &format!("{name}'s pods to go"),
        Duration::from_secs(300),
        || {
            c.ok(&["get", "pods", "-l", &selector, "-o", "name"])
                .trim()
                .is_empty()
        },
    );
    let deleted = t.elapsed();
    println!(
        "{nodes:>4} nodes {placement:<12} {pods:>3} pods: Ready after {:.1} s, gone {:.1} s after delete",
        ready.as_secs_f64(),
        deleted.as_secs_f64()
    );
    Run {
        placement,
        nodes,
        pods,
        ready,
        deleted,
    }
}

#[test]
#[ignore = "a benchmark on the cluster KUBECONFIG names; `make bench-kube` runs it"]
fn ready_time_packed_against_pod_per_node() {
    let c = Cluster::new("nm-scale");
    let chart = repo_path("helm/nextmini");
    let values = repo_path("helm/nextmini/ci/ci-values.yaml");
    c.ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        repo_path("crds/nextmini.yaml").to_str().expect("path"),
    ]);
    c.helm_ok(&[
        "install",
        &c.release,
        chart.to_str().expect("path"),
        "-f",
        values.to_str().expect("path"),
        "--wait",
        "--timeout",
        "300s",
    ]);
    let mut runs = Vec::new();
    for nodes in sizes() {
        // One pod per node first: the baseline of the same run.
        runs.push(run(&c, "pod-per-node", nodes));
        runs.push(run(&c, "packed", nodes));
    }
    println!("\n| nodes | placement | pods | Ready after apply | gone after delete |");
    println!("|---|---|---|---|---|");
    for r in &runs {
        println!(
            "| {} | {} | {} | {:.1} s | {:.1} s |",
            r.nodes,
            r.placement,
            r.pods,
            r.ready.as_secs_f64(),
            r.deleted.as_secs_f64()
        );
    }
    for pair in runs.chunks(2) {
        if let [pods, packed] = pair {
            println!(
                "{} nodes: packed is Ready in {:.2}x the time of one pod per node",
                pods.nodes,
                packed.ready.as_secs_f64() / pods.ready.as_secs_f64()
            );
            assert!(packed.pods < pods.pods, "packing uses fewer pods");
        }
    }
}

/// The operator process on this machine (the from-source cluster runs its
/// containers as host processes): (VmRSS, VmHWM) in MiB, if found.
fn operator_memory_mib() -> Option<(f64, f64)> {
    let out = std::process::Command::new("pgrep")
        .args(["-x", "nextmini-operat"])
        .output()
        .ok()?;
    let pid = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()?
        .trim()
        .to_string();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The CRDs and the chart with its defaults, but PostgreSQL without a volume
/// (the from-source cluster has no StorageClass).
fn install_with_chart_defaults(c: &Cluster) {
    let chart = repo_path("helm/nextmini");
    c.ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        repo_path("crds/nextmini.yaml").to_str().expect("path"),
    ]);
    c.helm_ok(&[
        "install",
        &c.release,
        chart.to_str().expect("path"),
        "--set",
        "postgresql.persistence.enabled=false",
        "--wait",
        "--timeout",
        "300s",
    ]);
}

/// Deletes the Topology `ring` and waits until its pods are gone; how long.
fn delete_ring(c: &Cluster) -> Duration {
    let t = Instant::now();
    c.ok(&["delete", "topology", "ring", "--timeout=600s"]);
    c.wait_for("the ring's pods to go", Duration::from_secs(600), || {
        c.ok(&[
            "get",
            "pods",
            "-l",
            "nextmini.io/topology=ring",
            "-o",
            "name",
        ])
        .trim()
        .is_empty()
    });
    t.elapsed()
}

fn mib(memory: Option<(f64, f64)>) -> String {
    memory
        .map(|(rss, hwm)| format!("{rss:.0} MiB (peak {hwm:.0})"))
        .unwrap_or_else(|| "unknown".into())
}

/// Issue 20.4 and 20.6: a packed ring of `NEXTMINI_E2E_RING_NODES` (default
/// 2,000) nodes, `NEXTMINI_E2E_NODES_PER_WORKER` (default 50) per worker pod,
/// on the cluster: Ready within 180 s, a web page fetched between the two
/// farthest nodes, and the operator's memory with it running. (A kubelet runs
/// 110 pods, so 10,000 nodes need 100 per worker.)
#[test]
#[ignore = "a benchmark on the cluster KUBECONFIG names; `make bench-kube` runs it"]
fn packed_ring_at_scale() {
    let nodes: u32 = std::env::var("NEXTMINI_E2E_RING_NODES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let per_worker: u32 = std::env::var("NEXTMINI_E2E_NODES_PER_WORKER")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let c = Cluster::new("nm-ring");
    install_with_chart_defaults(&c);
    let idle = operator_memory_mib();
    let worker_image = std::env::var("NEXTMINI_E2E_WORKER_IMAGE")
        .unwrap_or_else(|_| "docker.io/nextmini/worker:dev".into());
    let yaml = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: ring}}\nspec:\n  placement: packed\n  nodesPerWorker: {per_worker}\n  workerImage: {worker_image}\n  generator: {{ring: {{nodes: {nodes}}}}}\n"
    );
    // The target is 180 s at 2,000 nodes; the wait grows with larger rings
    // (60 ms a node), so their figures are measured rather than cut off.
    let wait = format!("{}s", (u64::from(nodes) * 60 / 1000).max(300));
    let ready = c.apply_until_ready(&yaml, "ring", &wait);
    let running = operator_memory_mib();
    let far = nodes / 2;
    let worker_of = |i: u32| format!("ring-worker-{}", i / per_worker);
    c.ok(&[
        "exec",
        &worker_of(far),
        "--",
        "sh",
        "-c",
        &format!("mkdir -p /tmp/www && echo far > /tmp/www/index.html && setsid nextmini exec n{far} -- python3 -m http.server 8000 --directory /tmp/www </dev/null >/tmp/www.log 2>&1 &"),
    ]);
    let t = Instant::now();
    let mut page = String::new();
    while t.elapsed() < Duration::from_secs(60) && page.trim() != "far" {
        let out = c.kubectl(&[
            "exec",
            &worker_of(0),
            "--",
            "nextmini",
            "exec",
            "n0",
            "--",
            "curl",
            "-sS",
            "--max-time",
            "10",
            &format!("http://n{far}:8000/"),
        ]);
        page = String::from_utf8_lossy(&out.stdout).into_owned();
    }
    let gone = delete_ring(&c);
    let after = operator_memory_mib();
    println!(
        "packed ring of {nodes} nodes ({} workers): Ready {:.1} s after apply; n0 -> n{far} curl: {}; gone {:.1} s after delete",
        nodes.div_ceil(per_worker),
        ready.as_secs_f64(),
        if page.trim() == "far" { "ok" } else { "FAILED" },
        gone.as_secs_f64()
    );
    println!(
        "operator memory: {} idle, {} with the ring running, {} after it was deleted",
        mib(idle),
        mib(running),
        mib(after)
    );
    assert_eq!(page.trim(), "far", "n0 fetched the page of n{far}");
    assert!(ready <= Duration::from_secs(180), "Ready after {ready:?}");
}

/// Issue 20.6 at 10,000 nodes: the operator's memory with every agent of a
/// `NEXTMINI_E2E_FLEET_NODES` (default 10,000) node packed ring connected to
/// its hub. Ten thousand real agents do not run on this 2-core machine (see
/// BENCHMARKS.md), so the worker pods get an image that cannot be pulled and a
/// fleet of lightweight agents in this process (`nextmini_e2e::load`) plays
/// the nodes: each opens a real control session over TCP to the operator's
/// hub with the credential the operator wrote into its worker's Secret, takes
/// its snapshot, acknowledges it and reports. The operator does all of its
/// own work: planning, the store, 100 pods and Secrets, and 10,000 sessions.
#[test]
#[ignore = "a benchmark on the cluster KUBECONFIG names; `make bench-kube` runs it"]
fn operator_memory_with_every_agent_connected() {
    use nextmini_e2e::load::{Fleet, HubAddress, Identity};
    let nodes: usize = std::env::var("NEXTMINI_E2E_FLEET_NODES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let per_worker = 100;
    let c = Cluster::new("nm-fleet");
    install_with_chart_defaults(&c);
    let idle = operator_memory_mib();
    let yaml = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: ring}}\nspec:\n  \
         placement: packed\n  nodesPerWorker: {per_worker}\n  \
         workerImage: docker.io/nextmini/not-pulled:none\n  \
         telemetry: {{interval: 30s}}\n  generator: {{ring: {{nodes: {nodes}}}}}\n"
    );
    let applied = Instant::now();
    let out = c.kubectl_stdin(&["apply", "-f", "-"], &yaml);
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let workers = nodes.div_ceil(per_worker);
    let dir = std::env::temp_dir().join(format!("nm-fleet-{}", std::process::id()));
    let mut identities: Vec<Identity> = Vec::new();
    c.wait_for(
        "every node's credential in the workers' Secrets",
        Duration::from_secs(600),
        || {
            identities = credentials_of(&c, "ring", &dir);
            identities.len() == nodes
        },
    );
    println!(
        "{nodes} credentials in {workers} Secrets {:.1} s after apply",
        applied.elapsed().as_secs_f64()
    );
    let hub_ip = c.ok(&[
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/component=operator",
        "-o",
        "jsonpath={.items[0].status.podIP}",
    ]);
    let hub: std::net::SocketAddr = format!("{}:50051", hub_ip.trim())
        .parse()
        .expect("the operator pod's address");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let fleet = runtime.block_on(Fleet::start(HubAddress::Tcp(hub), identities));
    let connecting = Instant::now();
    let mut peak_rss = 0.0f64;
    let mut last_print = Instant::now();
    while fleet.connected() < nodes as u64 && connecting.elapsed() < Duration::from_secs(900) {
        std::thread::sleep(Duration::from_secs(1));
        if let Some((rss, _)) = operator_memory_mib() {
            peak_rss = peak_rss.max(rss);
        }
        if last_print.elapsed() >= Duration::from_secs(15) {
            last_print = Instant::now();
            println!(
                "{:.0} s: {} of {nodes} agents connected, operator RSS peak {peak_rss:.0} MiB",
                connecting.elapsed().as_secs_f64(),
                fleet.connected()
            );
        }
    }
    let connected = fleet.connected();
    println!(
        "{connected} of {nodes} agents connected {:.1} s after the fleet started",
        connecting.elapsed().as_secs_f64()
    );
    // Connected and holding: every session past its snapshot, reports flowing.
    let holding = Instant::now();
    while holding.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_secs(2));
        if let Some((rss, _)) = operator_memory_mib() {
            peak_rss = peak_rss.max(rss);
        }
    }
    let running = operator_memory_mib();
    let key = nextmini_proto::topology_key::join(Some(&c.namespace), "ring");
    let acked = c.psql(&format!(
        "SELECT count(*) FROM nodes n JOIN topologies t ON t.id = n.topology_id \
         WHERE t.key = '{key}' AND n.acked_generation >= t.generation"
    ));
    let stats = fleet.stats();
    println!(
        "holding {nodes} sessions for 60 s: {} reports, {} resyncs, {} disconnects, {} rejected; {} nodes acknowledged in the store",
        stats.reports.load(std::sync::atomic::Ordering::Relaxed),
        stats.resyncs.load(std::sync::atomic::Ordering::Relaxed),
        stats.disconnects.load(std::sync::atomic::Ordering::Relaxed),
        stats.rejected.load(std::sync::atomic::Ordering::Relaxed),
        acked
    );
    runtime.block_on(fleet.stop());
    let gone = delete_ring(&c);
    let after = operator_memory_mib();
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "operator memory: {} idle; {} with {connected} of {nodes} agents connected (highest sampled {peak_rss:.0} MiB); {} after the delete ({:.1} s)",
        mib(idle),
        mib(running),
        mib(after),
        gone.as_secs_f64()
    );
    assert_eq!(connected, nodes as u64, "every agent connected");
    assert_eq!(
        acked,
        nodes.to_string(),
        "every node acknowledged its config"
    );
    let (_, hwm) = running.expect("the operator's memory");
    assert!(
        hwm <= 1024.0,
        "operator peak {hwm:.0} MiB with {nodes} agents connected (target 1 GiB)"
    );
}

/// Every node credential in the topology's worker Secrets, written as the
/// files `nextmini` keeps for a node (`<node>`, `<node>.crt`, `<node>.key`,
/// `ca.crt`) into `dir`.
fn credentials_of(
    c: &Cluster,
    topology: &str,
    dir: &std::path::Path,
) -> Vec<nextmini_e2e::load::Identity> {
    use k8s_openapi::api::core::v1::Secret;
    let json = c.ok(&[
        "get",
        "secrets",
        "-l",
        &format!("nextmini.io/topology={topology},nextmini.io/part=credentials"),
        "-o",
        "json",
    ]);
    // kubectl answers with kind List, not SecretList.
    let list: serde_json::Value = serde_json::from_str(&json).expect("a list");
    let secrets: Vec<Secret> =
        serde_json::from_value(list["items"].clone()).expect("Secrets in the list");
    std::fs::create_dir_all(dir).expect("the credentials directory");
    let key = nextmini_proto::topology_key::join(Some(&c.namespace), topology);
    let mut identities = Vec::new();
    for secret in secrets {
        for (name, value) in secret.data.unwrap_or_default() {
            std::fs::write(dir.join(&name), &value.0).expect("a credential file");
            if let Some(node) = name.strip_suffix(".key") {
                identities.push(nextmini_e2e::load::Identity {
                    topology: key.clone(),
                    node: node.to_string(),
                    dir: dir.to_path_buf(),
                });
            }
        }
    }
    identities
}

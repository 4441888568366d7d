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
    let gone = t.elapsed();
    let after = operator_memory_mib();
    let mib = |m: Option<(f64, f64)>| {
        m.map(|(rss, hwm)| format!("{rss:.0} MiB (peak {hwm:.0})"))
            .unwrap_or_else(|| "unknown".into())
    };
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

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

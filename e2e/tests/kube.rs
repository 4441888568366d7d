//! The operator on a real cluster (the one KUBECONFIG names): `helm install`,
//! `kubectl apply -f manifests/examples/line3.yaml`, `kubectl wait` Ready, real
//! traffic between the pods (python http.server and curl in ephemeral
//! containers, so line3.yaml stays as users have it), the bytes on the middle
//! node's counters, a Link's rate changed by `kubectl patch` reaching the
//! agents, a broken Topology showing why, no database credentials in agent pods
//! (and the chart's NetworkPolicy admitting only the operator to PostgreSQL), the
//! whole bad-input corpus refused through the API while line3 stays Ready, and
//! `kubectl delete` leaving nothing.
//! Then packed placement: six nodes in two worker pods, Ready, traffic from a
//! node of one worker to a node of the other, and nothing left after delete.
//! In both placements `nextmini capture` run in the sending node's pod streams
//! annotated pcapng of a link under that traffic, which tshark reads.
//!
//! Ignored by plain `cargo test`; `make test` starts a cluster built from
//! source and runs it with `--ignored`. Against your own cluster (kind, k3s):
//! load the images, then `KUBECONFIG=... cargo test -p nextmini-e2e --test kube -- --ignored`.

use nextmini_e2e::kube::Cluster;
use nextmini_e2e::repo_path;
use std::time::{Duration, Instant};

#[path = "support/kube_bad_corpus.rs"]
mod kube_bad_corpus;

const MIB: u64 = 1 << 20;
/// Packets each in-cluster capture takes.
const CAPTURED: usize = 100;

/// Runs `traffic` while `nextmini capture LINK --node NODE -c CAPTURED -w -`
/// runs in the pod (container) of the node that sends it; checks with tshark
/// that the stream is pcapng of that many packets, each annotated as sent,
/// and that it carried the traffic (TCP segments of full size).
fn capture_during<T>(
    c: &Cluster,
    pod: &str,
    container: Option<&str>,
    link: &str,
    node: &str,
    traffic: impl FnOnce() -> T,
) -> T {
    let count = CAPTURED.to_string();
    let mut args = vec!["exec", pod];
    if let Some(container) = container {
        args.extend(["-c", container]);
    }
    args.extend(["--", "nextmini", "capture", link, "--node", node]);
    // The duration only bounds a capture that would otherwise wait for
    // packets forever (one attached after the traffic): the count is the test.
    args.extend(["-c", &count, "--duration", "90", "-w", "-"]);
    let (captured, result) = std::thread::scope(|s| {
        let capture = s.spawn(|| c.kubectl(&args));
        // kubectl exec takes a moment before the agent attaches the tap.
        std::thread::sleep(Duration::from_secs(2));
        let result = traffic();
        (capture.join().expect("capture thread"), result)
    });
    assert!(
        captured.status.success(),
        "nextmini capture in {pod}: {}",
        String::from_utf8_lossy(&captured.stderr)
    );
    let file = std::env::temp_dir().join(format!("nm-kube-{pod}-{link}.pcapng"));
    std::fs::write(&file, &captured.stdout).expect("writing the capture");
    let read = std::process::Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .args(["-T", "fields", "-E", "separator=/t", "-e", "ip.proto"])
        .args(["-e", "frame.len", "-e", "frame.comment"])
        .output()
        .expect("tshark (scripts/setup.sh --test installs it)");
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&read.stdout);
    assert!(
        read.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&read.stderr)
    );
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), CAPTURED, "packets captured in {pod}");
    for row in &rows {
        assert!(
            row.get(2).is_some_and(
                |c| c.starts_with("nextmini verdict=sent ") && c.contains(" departed=")
            ),
            "not annotated as sent: {row:?}"
        );
    }
    let full_tcp = rows
        .iter()
        .filter(|r| r[0] == "6" && r[1].parse::<u32>().unwrap_or(0) >= 1000)
        .count();
    assert!(
        full_tcp > CAPTURED / 2,
        "only {full_tcp} full TCP segments: {rows:?}"
    );
    println!(
        "capture of {link} from {node} in {pod}: {CAPTURED} packets, {full_tcp} full TCP segments, all annotated"
    );
    result
}

fn tools_image() -> String {
    std::env::var("NEXTMINI_E2E_TOOLS_IMAGE")
        .unwrap_or_else(|_| "docker.io/nextmini/tools:dev".into())
}

/// The image of packed worker pods in the test: the Nextmini image with curl
/// and python3 (`e2e/cluster/images.sh` builds it).
fn worker_image() -> String {
    std::env::var("NEXTMINI_E2E_WORKER_IMAGE")
        .unwrap_or_else(|_| "docker.io/nextmini/worker:dev".into())
}

fn pull_policy() -> String {
    std::env::var("NEXTMINI_E2E_PULL_POLICY").unwrap_or_else(|_| "Never".into())
}

/// Starts an ephemeral container running `command` in a pod: it shares the
/// pod's network namespace, so it sends and receives through the emulated
/// network like any application would.
fn ephemeral(c: &Cluster, pod: &str, name: &str, command: &str) {
    ephemeral_in(c, &c.namespace, pod, name, command);
}

/// [`ephemeral`] in a pod of `namespace`.
fn ephemeral_in(c: &Cluster, namespace: &str, pod: &str, name: &str, command: &str) {
    let started = c.kubectl_in(
        namespace,
        &[
            "debug",
            pod,
            "--image",
            &tools_image(),
            "--image-pull-policy",
            &pull_policy(),
            "--container",
            name,
            "--",
            "sh",
            "-c",
            command,
        ],
    );
    assert!(
        started.status.success(),
        "kubectl debug {pod}: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    c.wait_for(
        &format!("container {name} in {pod}"),
        Duration::from_secs(60),
        || {
            c.kubectl_in(
                namespace,
                &["exec", pod, "-c", name, "--", "python3", "-c", "pass"],
            )
            .status
            .success()
        },
    );
}

/// `sh -c` in an ephemeral container; its stdout.
fn sh(c: &Cluster, pod: &str, container: &str, script: &str) -> String {
    c.ok(&["exec", pod, "-c", container, "--", "sh", "-c", script])
        .trim()
        .to_string()
}

/// Fetches `url` with curl from the client container; (sha256, bytes/s).
fn fetch(c: &Cluster, url: &str) -> (String, f64) {
    let out = sh(
        c,
        "line3-a",
        "client",
        &format!(
            "curl -sS --fail --max-time 120 -o /tmp/got -w '%{{speed_download}}' {url} && echo && python3 -c \"import hashlib; print(hashlib.sha256(open('/tmp/got','rb').read()).hexdigest())\""
        ),
    );
    let mut lines = out.lines();
    let speed: f64 = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("curl speed");
    let sha = lines.next().expect("sha256").trim().to_string();
    (sha, speed)
}

/// Bytes b has received on link b-c, as its agent last reported them.
fn b_received(c: &Cluster) -> i64 {
    c.psql("SELECT coalesce(sum(c.rx_bytes), 0) FROM link_counters c JOIN topologies t ON t.id = c.topology_id WHERE t.name = 'line3' AND c.node = 'b' AND c.link = 'b-c'")
        .parse()
        .expect("a byte count")
}

fn generation_and_acks(c: &Cluster) -> (i64, i64) {
    let row = c.psql(
        "SELECT t.generation, min(n.acked_generation) FROM topologies t JOIN nodes n ON n.topology_id = t.id WHERE t.name = 'line3' GROUP BY t.generation",
    );
    let mut f = row.split('|');
    let g = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let a = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    (g, a)
}

#[test]
#[ignore = "needs a cluster named by KUBECONFIG; `make test` starts one"]
fn operator_runs_line3_on_a_real_cluster() {
    let c = Cluster::new("nm-e2e");
    let chart = repo_path("helm/nextmini");
    let chart = chart.to_str().expect("path");
    // What the README tells a user of this cluster to set: it has no
    // StorageClass. Everything else is the chart's defaults, including the
    // images (`make images` tags them with the chart's appVersion).
    let readme_values = ["--set", "postgresql.persistence.enabled=false"];

    // Without that value, the install fails at once, naming it.
    let refused = c.helm(&["install", &c.release, chart, "--dry-run=server"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && said.contains("postgresql.persistence: this cluster has no default StorageClass"),
        "helm install without a StorageClass: {said}"
    );

    // The rendered chart passes the API server's own schema checks.
    let version = c.server_version();
    let mut template = vec![
        "template",
        &c.release,
        chart,
        "--include-crds",
        "--kube-version",
        &version,
    ];
    template.extend(readme_values);
    let rendered = c.helm_ok(&template);
    let dry = c.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &rendered);
    assert!(
        dry.status.success(),
        "server-side dry run of the chart failed:\n{}",
        String::from_utf8_lossy(&dry.stderr)
    );

    // Helm installs CRDs but never upgrades them; a cluster that ran an older
    // chart gets the current ones the way Helm documents.
    c.ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        repo_path("crds/nextmini.yaml").to_str().expect("path"),
    ]);
    let t = Instant::now();
    let mut install = vec!["install", &c.release, chart, "--wait", "--timeout", "300s"];
    install.extend(readme_values);
    let installed = c.helm(&install);
    if !installed.status.success() {
        let show = |args: &[&str]| String::from_utf8_lossy(&c.kubectl(args).stdout).into_owned();
        panic!(
            "helm install failed: {}\n{}\n{}\n{}\n{}",
            String::from_utf8_lossy(&installed.stderr),
            show(&["get", "pods", "-o", "wide"]),
            show(&["get", "events", "--sort-by=.lastTimestamp"]),
            show(&["logs", "deploy/nm-operator", "--tail=40"]),
            show(&["logs", "statefulset/nm-postgresql", "--tail=20"]),
        );
    }
    println!("helm install --wait: {:.1} s", t.elapsed().as_secs_f64());

    let line3 = std::fs::read_to_string(repo_path("manifests/examples/line3.yaml")).expect("line3");
    let ready = c.apply_until_ready(&line3, "line3", "180s");
    println!(
        "line3 Ready {:.1} s after kubectl apply",
        ready.as_secs_f64()
    );
    assert_eq!(
        &c.topology_row("line3")[..4],
        ["line3", "3", "2", "True"],
        "NAME NODES LINKS READY"
    );
    let link = c.ok(&["get", "link", "b-c", "-o", "jsonpath={.status.up}"]);
    assert_eq!(link, "true", "the Link object reports itself up");

    // Real traffic: python http.server in c, curl in a; b forwards.
    ephemeral(
        &c,
        "line3-c",
        "web",
        "python3 -c \"import os; open('/tmp/big','wb').write(os.urandom(20*1024*1024))\" && exec python3 -m http.server 8000 --directory /tmp",
    );
    ephemeral(
        &c,
        "line3-a",
        "client",
        "exec python3 -c 'import time; time.sleep(36000)'",
    );
    let expected = sh(
        &c,
        "line3-c",
        "web",
        "python3 -c \"import hashlib; print(hashlib.sha256(open('/tmp/big','rb').read()).hexdigest())\"",
    );
    c.wait_for("the web server in c", Duration::from_secs(30), || {
        c.kubectl(&[
            "exec",
            "line3-a",
            "-c",
            "client",
            "--",
            "curl",
            "-sS",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "http://c:8000/",
        ])
        .status
        .success()
    });
    // ping through b. The debug container may hold CAP_NET_RAW, so the check
    // that tells is an ICMP echo socket, which the kernel grants only to groups
    // in the pod's net.ipv4.ping_group_range (by default, none at all).
    let icmp = sh(
        &c,
        "line3-a",
        "client",
        "python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); print('icmp echo socket: yes')\" 2>&1",
    );
    assert!(icmp.contains("icmp echo socket: yes"), "{icmp}");
    let ping = c.kubectl(&[
        "exec", "line3-a", "-c", "client", "--", "ping", "-c", "3", "-W", "3", "c",
    ]);
    assert!(
        ping.status.success(),
        "ping in a pod-per-node node: {}{}",
        String::from_utf8_lossy(&ping.stdout),
        String::from_utf8_lossy(&ping.stderr)
    );
    let before: i64 = b_received(&c);
    // The bytes from c reach a through b, which sends them on a-b.
    let (sha, speed) = capture_during(&c, "line3-b", Some("agent"), "a-b", "b", || {
        fetch(&c, "http://c:8000/big")
    });
    assert_eq!(sha, expected, "the file arrived intact");
    let unshaped_mbit = speed * 8.0 / 1e6;
    println!("20 MiB c -> b -> a across pods: {unshaped_mbit:.0} Mbit/s");
    c.wait_for(
        "b's counters to show the transfer",
        Duration::from_secs(10),
        || {
            let now: i64 = b_received(&c);
            (now - before) as u64 >= 20 * MIB
        },
    );

    // kubectl patch of a Link reaches the agents and shapes the traffic.
    let (generation, _) = generation_and_acks(&c);
    c.ok(&[
        "patch",
        "link",
        "b-c",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"rate":"20Mbit"}}"#,
    ]);
    let t = Instant::now();
    c.wait_for(
        "the agents to run the patched link",
        Duration::from_secs(30),
        || {
            let (g, acked) = generation_and_acks(&c);
            g > generation && acked >= g
        },
    );
    println!(
        "Link patch acknowledged by every agent in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let (sha, speed) = fetch(&c, "http://c:8000/big");
    assert_eq!(sha, expected);
    let shaped_mbit = speed * 8.0 / 1e6;
    println!("after rate: 20Mbit on b-c: {shaped_mbit:.1} Mbit/s");
    assert!(
        shaped_mbit < 22.0 && shaped_mbit > 12.0,
        "b-c shaped to 20 Mbit/s carried {shaped_mbit:.1} Mbit/s"
    );
    assert!(
        unshaped_mbit > 2.0 * shaped_mbit,
        "the unshaped run ({unshaped_mbit:.0} Mbit/s) must be faster"
    );
    // The fidelity guard reaches the Topology from agents in pods. Whether a
    // crowded two-core cluster kept up is not this test's question; that the
    // verdict arrives, and names a link direction when it is False, is.
    let (status, reason, message) = condition(&c, "line3", "Faithful");
    println!("line3 Faithful={status} ({reason}): {message}");
    match status.as_str() {
        "True" => assert_eq!(reason, "Faithful"),
        "False" => assert!(
            reason.starts_with("EmulatorLimited") && message.contains(" → "),
            "{reason}: {message}"
        ),
        other => panic!("line3 has no Faithful condition ({other:?}): {message}"),
    }

    // A broken Topology says why, and line3 keeps running.
    let refused = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: two-shapes}\nspec:\n  generator: {ring: {nodes: 3}, line: {nodes: 3}}\n",
    );
    assert!(
        !refused.status.success(),
        "the API server's CEL rule refuses two generator shapes"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("set exactly one of ring, line, star, fatTree"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let applied = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: broken}\nspec:\n  nodes: [{name: a}]\n  links: [{endpoints: [a, ghost]}]\n",
    );
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    c.ok(&[
        "wait",
        "--for=condition=Planned=false",
        "topology/broken",
        "--timeout=60s",
    ]);
    let message = c.ok(&[
        "get",
        "topology",
        "broken",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Planned")].message}"#,
    ]);
    assert!(
        message.contains("spec.links[0]") && message.contains("ghost"),
        "{message}"
    );
    c.wait_for(
        "a warning event on the broken topology",
        Duration::from_secs(20),
        || {
            c.ok(&[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=broken",
                "-o",
                "jsonpath={.items[*].reason}",
            ])
            .contains("InvalidSpec")
        },
    );
    let pods = c.ok(&[
        "get",
        "pods",
        "-l",
        "nextmini.io/topology=broken",
        "-o",
        "name",
    ]);
    assert!(
        pods.trim().is_empty(),
        "an invalid topology starts nothing: {pods}"
    );
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "topology/line3",
        "--timeout=10s",
    ]);
    c.ok(&["delete", "topology", "broken", "--timeout=60s"]);

    agents_hold_no_database_credentials(&c);
    faulty_rows_show_on_the_topology(&c);

    // The bad-input corpus through the API, with line3 running beside it.
    let t = Instant::now();
    let verdicts = kube_bad_corpus::run(&c, &format!("{}-bad", c.namespace));
    println!(
        "bad-input corpus through the API ({} files, {:.0} s):\n{}",
        verdicts.len(),
        t.elapsed().as_secs_f64(),
        kube_bad_corpus::table(&verdicts)
    );
    for by in [
        kube_bad_corpus::RefusedBy::Kubectl,
        kube_bad_corpus::RefusedBy::ApiServer,
        kube_bad_corpus::RefusedBy::Operator,
        kube_bad_corpus::RefusedBy::NotApplicable,
        kube_bad_corpus::RefusedBy::Nobody,
    ] {
        let n = verdicts.iter().filter(|v| v.by == by).count();
        println!("refused by {}: {n}", by.as_str());
    }
    let gaps: Vec<&str> = verdicts
        .iter()
        .filter(|v| v.by == kube_bad_corpus::RefusedBy::Nobody)
        .map(|v| v.file.as_str())
        .collect();
    let known: Vec<&str> = kube_bad_corpus::KNOWN_GAPS
        .iter()
        .map(|(f, _)| *f)
        .collect();
    assert_eq!(
        gaps, known,
        "files the cluster does not refuse (KNOWN_GAPS lists the ones it is known not to)"
    );
    let wrong: Vec<String> = verdicts
        .iter()
        .filter(|v| v.by != kube_bad_corpus::RefusedBy::Nobody)
        .filter(|v| !v.names_field || !v.created.is_empty())
        .map(|v| format!("{} ({}): {} {:?}", v.file, v.field, v.message, v.created))
        .collect();
    // Only the two files that name one object twice are outside what an API
    // without files can refuse.
    let not_applicable: Vec<&str> = verdicts
        .iter()
        .filter(|v| v.by == kube_bad_corpus::RefusedBy::NotApplicable)
        .map(|v| v.file.as_str())
        .collect();
    assert_eq!(
        not_applicable,
        ["022-duplicate-link-name.yaml", "024-duplicate-flow.yaml"]
    );
    assert!(
        wrong.is_empty(),
        "{} corpus file(s) not refused as they must be:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "topology/line3",
        "--timeout=10s",
    ]);
    same_name_in_another_namespace(&c);
    member_clusters_are_probed(&c);

    // kubectl delete leaves no pod, service, secret, row or finalizer.
    let t = Instant::now();
    c.ok(&["delete", "topology", "line3", "--timeout=120s"]);
    c.wait_for("line3's pods to go", Duration::from_secs(90), || {
        c.ok(&[
            "get",
            "pods",
            "-l",
            "nextmini.io/topology=line3",
            "-o",
            "name",
        ])
        .trim()
        .is_empty()
    });
    println!(
        "kubectl delete topology line3: everything gone in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    c.wait_for(
        "line3's Link objects to go with it (owner references)",
        Duration::from_secs(60),
        || c.ok(&["get", "links", "-o", "name"]).trim().is_empty(),
    );
    let gone = c.kubectl(&["get", "topology", "line3"]);
    assert!(
        !gone.status.success(),
        "the finalizer was removed and the object is gone"
    );
    assert!(
        !c.kubectl(&["get", "service/nm-line3"]).status.success(),
        "service left behind"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "secrets",
            "-l",
            "nextmini.io/topology=line3",
            "-o",
            "name"
        ])
        .trim(),
        "",
        "Secrets left behind"
    );
    assert_eq!(
        c.psql("SELECT count(*) FROM topologies WHERE name = 'line3'"),
        "0",
        "rows left behind"
    );

    packed_six_nodes_on_two_workers(&c);
}

/// Removes the test's MemberClusters (cluster-scoped, so the namespace's
/// deletion would leave them) however the test ends.
struct MemberClustersGone<'c>(&'c Cluster, Vec<String>);

impl Drop for MemberClustersGone<'_> {
    fn drop(&mut self) {
        for name in &self.1 {
            let _ = self
                .0
                .kubectl(&["delete", "membercluster", name, "--ignore-not-found"]);
        }
    }
}

/// Issue 17.1: the operator reaches a MemberCluster's API server with the
/// kubeconfig of its Secret and writes what it found: the round trip and the
/// version when it answers, the reason naming the server when it does not.
/// Nodes placed in a member cluster without a hub address for its agents are
/// refused by field instead of running here.
fn member_clusters_are_probed(c: &Cluster) {
    let ns = &c.namespace;
    let (reached, closed, secretless) = (
        format!("{ns}-self"),
        format!("{ns}-closed"),
        format!("{ns}-nosecret"),
    );
    let _gone = MemberClustersGone(c, vec![reached.clone(), closed.clone(), secretless.clone()]);
    let kubeconfig = std::fs::read_to_string(std::env::var("KUBECONFIG").expect("KUBECONFIG"))
        .expect("reading KUBECONFIG");
    // The same credentials at a port nothing listens on.
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("a server in the kubeconfig")
        .to_owned();
    let host = server.rsplit_once(':').map(|(h, _)| h).expect("host:port");
    let refused = kubeconfig.replace(&server, &format!("{host}:1"));
    for (secret, text) in [("self", &kubeconfig), ("closed", &refused)] {
        let file = std::env::temp_dir().join(format!("nm-{ns}-{secret}.kubeconfig"));
        std::fs::write(&file, text).expect("writing a kubeconfig");
        c.ok(&[
            "create",
            "secret",
            "generic",
            &format!("member-{secret}"),
            &format!("--from-file=kubeconfig={}", file.display()),
        ]);
        let _ = std::fs::remove_file(&file);
    }
    let member = |name: &str, secret: &str, region: &str| {
        format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: MemberCluster\nmetadata: {{name: {name}}}\nspec:\n  region: {region}\n  kubeconfigSecretRef: {{namespace: {ns}, name: {secret}}}\n---\n"
        )
    };
    let yaml = [
        member(&reached, "member-self", "eu-west"),
        member(&closed, "member-closed", "us-east"),
        member(&secretless, "member-missing", "ap-south"),
    ]
    .concat();
    let applied = c.kubectl_stdin(&["apply", "-f", "-"], &yaml);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );

    let field = |name: &str, path: &str| {
        c.ok(&[
            "get",
            "membercluster",
            name,
            "-o",
            &format!("jsonpath={{{path}}}"),
        ])
    };
    let reachable = |name: &str, part: &str| {
        field(
            name,
            &format!(r#".status.conditions[?(@.type=="Reachable")].{part}"#),
        )
    };
    let t = Instant::now();
    c.wait_for(
        "the member clusters' probes",
        Duration::from_secs(60),
        || {
            !reachable(&reached, "status").is_empty()
                && !reachable(&closed, "status").is_empty()
                && !reachable(&secretless, "status").is_empty()
        },
    );
    println!(
        "three member clusters probed in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(
        reachable(&reached, "status"),
        "True",
        "{}",
        reachable(&reached, "message")
    );
    let rtt = field(&reached, ".status.rtt");
    let rtt_ms: f64 = rtt
        .strip_suffix("ms")
        .map(|v| v.parse().expect("a number of ms"))
        .or_else(|| {
            rtt.strip_suffix("us")
                .map(|v| v.parse::<f64>().expect("µs") / 1000.0)
        })
        .or_else(|| {
            rtt.strip_suffix("µs")
                .map(|v| v.parse::<f64>().expect("µs") / 1000.0)
        })
        .unwrap_or_else(|| panic!("status.rtt {rtt:?}"));
    assert!(
        rtt_ms > 0.0 && rtt_ms < 50.0,
        "a round trip on one machine: {rtt}"
    );
    assert_eq!(field(&reached, ".status.serverVersion"), c.server_version());
    println!("member {reached}: rtt {rtt}");

    assert_eq!(reachable(&closed, "status"), "False");
    assert_eq!(reachable(&closed, "reason"), "Unreachable");
    let said = reachable(&closed, "message");
    assert!(
        said.contains(&format!("{host}:1")),
        "names the server: {said}"
    );
    assert_eq!(reachable(&secretless, "reason"), "SecretNotFound");
    let said = reachable(&secretless, "message");
    assert!(
        said.contains("spec.kubeconfigSecretRef") && said.contains("member-missing"),
        "names the field and the Secret: {said}"
    );

    second_control_plane_comes_and_goes(c, &field, &reachable);

    // A node placed in a member cluster that does not say how its agents
    // reach the hub: refused by field, nothing started.
    let wan = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: wan}}\nspec:\n  nodes: [{{name: a}}, {{name: b, cluster: {reached}}}]\n  links: [{{endpoints: [a, b], delay: 40ms}}]\n"
    );
    let applied = c.kubectl_stdin(&["apply", "-f", "-"], &wan);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    c.wait_for("wan's Planned condition", Duration::from_secs(30), || {
        !condition(c, "wan", "Planned").0.is_empty()
    });
    let (status, reason, message) = condition(c, "wan", "Planned");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "InvalidPlacement"),
        "{message}"
    );
    assert!(
        message.contains(&format!("membercluster/{reached} spec.hubAddress")),
        "{message}"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "pods",
            "-l",
            "nextmini.io/topology=wan",
            "-o",
            "name"
        ])
        .trim(),
        "",
        "no pod of a refused topology"
    );
    c.ok(&["delete", "topology", "wan", "--timeout=60s"]);
    links_cross_between_clusters(c, &reached);
    c.ok(&["delete", "secret", "member-self", "member-closed"]);
}

/// Issue 17.3: links that cross from one cluster into another, dialed at the
/// endpoint the acceptor's MemberCluster exposes rather than by a name that
/// resolves only in the topology's own namespace. The member here is this
/// cluster registered again through its kubeconfig, with its pods in another
/// namespace: the topology's headless Service does not hold them, so a link
/// into them is up only through the exposure (a NodePort Service per node on
/// the node's address, the same port for TCP and UDP; then pod IPs).
fn links_cross_between_clusters(c: &Cluster, member: &str) {
    let ns = &c.namespace;
    let far = format!("{ns}-cross");
    struct Gone<'a>(&'a Cluster, String);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            let _ = self
                .0
                .kubectl(&["delete", "topology", "cross", "--wait=false"]);
            let _ = self
                .0
                .kubectl(&["delete", "namespace", &self.1, "--wait=false"]);
        }
    }
    let _gone = Gone(c, far.clone());
    let node_ip = c.ok(&[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}"#,
    ]);
    let node_ip = node_ip.trim().to_owned();
    assert!(!node_ip.is_empty(), "the node's address");
    let declare = |exposure: &str| {
        let yaml = format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: MemberCluster\nmetadata: {{name: {member}}}\nspec:\n  region: eu-west\n  namespace: {far}\n  hubAddress: nm-hub.{ns}.svc:50051\n  kubeconfigSecretRef: {{namespace: {ns}, name: member-self}}\n  exposure: {exposure}\n"
        );
        let applied = c.kubectl_stdin(&["apply", "-f", "-"], &yaml);
        assert!(
            applied.status.success(),
            "{}",
            String::from_utf8_lossy(&applied.stderr)
        );
    };
    declare(&format!("{{type: NodePort, address: {node_ip}}}"));
    let topology = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: cross}}\nspec:\n  nodes: [{{name: a}}, {{name: b, cluster: {member}}}, {{name: c, cluster: {member}}}]\n  links: [{{endpoints: [a, b]}}, {{endpoints: [a, c], transport: quic}}, {{endpoints: [b, c]}}]\n"
    );
    let t = Instant::now();
    let applied = c.kubectl_stdin(&["apply", "-f", "-"], &topology);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    c.wait_for("cross Ready", Duration::from_secs(180), || {
        condition(c, "cross", "Ready").0 == "True"
    });
    println!(
        "cross: Ready with b and c in member {member} ({far}) {:.1} s after kubectl apply",
        t.elapsed().as_secs_f64()
    );
    let endpoint = |node: &str| {
        c.psql(&format!(
            "SELECT coalesce(n.endpoint, '') FROM nodes n JOIN topologies t ON t.id = n.topology_id WHERE t.key = '{ns}/cross' AND n.name = '{node}'"
        ))
    };
    let node_port = |node: &str, protocol: &str| {
        let out = c.kubectl_in(
            &far,
            &[
                "get",
                "service",
                &format!("cross-{node}-link"),
                "-o",
                &format!("jsonpath={{.spec.ports[?(@.protocol==\"{protocol}\")].nodePort}}"),
            ],
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    for node in ["b", "c"] {
        let port = node_port(node, "TCP");
        assert!(!port.is_empty(), "{node}'s link Service in {far}");
        assert_eq!(node_port(node, "UDP"), port, "one port for TCP and QUIC");
        assert_eq!(
            endpoint(node),
            format!("{node_ip}:{port}"),
            "{node} is dialed at its NodePort"
        );
    }
    assert_eq!(endpoint("a"), "", "a is dialed from no other cluster");
    let links_up = c.ok(&[
        "get",
        "topology",
        "cross",
        "-o",
        "jsonpath={.status.linksUp}/{.status.linksTotal}",
    ]);
    println!(
        "cross: links up {links_up}; b at {}, c at {}",
        endpoint("b"),
        endpoint("c")
    );

    // Real traffic across: python http.server in b and c, curl in a.
    for node in ["b", "c"] {
        ephemeral_in(
            c,
            &far,
            &format!("cross-{node}"),
            "web",
            "python3 -c \"import os; open('/tmp/big','wb').write(os.urandom(8*1024*1024))\" && exec python3 -m http.server 8000 --directory /tmp",
        );
    }
    ephemeral(
        c,
        "cross-a",
        "client",
        "exec python3 -c 'import time; time.sleep(36000)'",
    );
    let fetched = |node: &str| {
        let expected = String::from_utf8_lossy(
            &c.kubectl_in(
                &far,
                &[
                    "exec",
                    &format!("cross-{node}"),
                    "-c",
                    "web",
                    "--",
                    "python3",
                    "-c",
                    "import hashlib; print(hashlib.sha256(open('/tmp/big','rb').read()).hexdigest())",
                ],
            )
            .stdout,
        )
        .trim()
        .to_owned();
        assert_eq!(expected.len(), 64, "{node}'s file hashed");
        let mut got = String::new();
        c.wait_for(&format!("a's curl from {node}"), Duration::from_secs(60), || {
            let out = c.kubectl(&[
                "exec",
                "cross-a",
                "-c",
                "client",
                "--",
                "sh",
                "-c",
                &format!("curl -sS --fail --max-time 30 -o /tmp/{node} http://{node}:8000/big && sha256sum /tmp/{node}"),
            ]);
            got = String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or("").to_owned();
            out.status.success()
        });
        assert_eq!(got, expected, "the bytes from {node} arrive whole");
    };
    let received = |link: &str| -> i64 {
        c.psql(&format!(
            "SELECT coalesce(sum(k.rx_bytes), 0) FROM link_counters k JOIN topologies t ON t.id = k.topology_id WHERE t.key = '{ns}/cross' AND k.node = 'a' AND k.link = '{link}'"
        ))
        .parse()
        .expect("a byte count")
    };
    let before = (received("a-b"), received("a-c"));
    fetched("b");
    fetched("c");
    c.wait_for(
        "the transfers on the crossing links' counters",
        Duration::from_secs(30),
        || received("a-b") - before.0 > 8_000_000 && received("a-c") - before.1 > 8_000_000,
    );
    println!(
        "cross: 8 MiB curls from b (tcp) and c (quic) with sha256 equal; a received {} and {} bytes on a-b and a-c",
        received("a-b") - before.0,
        received("a-c") - before.1
    );
    // The promise itself: the QUIC link runs over UDP through c's NodePort,
    // the TCP link over TCP through b's (the node's connection tracking).
    if std::env::var("KUBECONFIG").unwrap_or_default() == "/var/lib/nextmini-k8s/kubeconfig" {
        let tracked = |protocol: &str, port: &str| {
            let out = std::process::Command::new("conntrack")
                .args([
                    "-L",
                    "-p",
                    protocol,
                    "--orig-dst",
                    &node_ip,
                    "--dport",
                    port,
                ])
                .output()
                .expect("conntrack");
            String::from_utf8_lossy(&out.stdout).lines().count()
        };
        assert!(
            tracked("udp", &node_port("c", "UDP")) > 0,
            "QUIC to c through its NodePort"
        );
        assert!(
            tracked("tcp", &node_port("b", "TCP")) > 0,
            "TCP to b through its NodePort"
        );
    }

    // Pod IPs routed between the clusters instead: the NodePort Services go,
    // the dialers get the pods' addresses and the links come up again there.
    let on_old_link = received("a-c");
    declare("{type: Address}");
    let pod_ip = |node: &str| {
        let out = c.kubectl_in(
            &far,
            &[
                "get",
                "pod",
                &format!("cross-{node}"),
                "-o",
                "jsonpath={.status.podIP}",
            ],
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let t = Instant::now();
    c.wait_for(
        "b and c dialed at their pod IPs",
        Duration::from_secs(60),
        || {
            endpoint("b") == format!("{}:7100", pod_ip("b"))
                && endpoint("c") == format!("{}:7100", pod_ip("c"))
        },
    );
    let services = || {
        let out = c.kubectl_in(
            &far,
            &["get", "services", "-l", "nextmini.io/exposes", "-o", "name"],
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    c.wait_for(
        "the NodePort Services gone",
        Duration::from_secs(30),
        || services().is_empty(),
    );
    // a's end of a-c is a new connection to the new address: its counters
    // start again from zero.
    c.wait_for(
        "a-c made afresh to c's pod IP",
        Duration::from_secs(30),
        || received("a-c") < on_old_link,
    );
    let before = received("a-c");
    fetched("c");
    println!(
        "cross: exposure Address, c's 8 MiB again over QUIC to its pod IP ({:.1} s after the change)",
        t.elapsed().as_secs_f64()
    );
    c.wait_for(
        "the transfer on a-c's counters again",
        Duration::from_secs(30),
        || received("a-c") - before > 8_000_000,
    );

    c.ok(&["delete", "topology", "cross", "--timeout=60s"]);
    let left = || {
        let out = c.kubectl_in(
            &far,
            &[
                "get",
                "pods,services,secrets",
                "-l",
                "nextmini.io/topology=cross",
                "-o",
                "name",
            ],
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    c.wait_for(
        "cross's objects in the member to go",
        Duration::from_secs(60),
        || left().is_empty(),
    );
}

/// On the project's own cluster (not a user's, `KUBECONFIG_EXTERNAL`): a
/// second control plane of its own (`e2e/cluster/member.sh`) registered as a
/// member goes away and comes back, and its MemberCluster follows within a
/// probe interval each way, keeping the round trip it had measured.
fn second_control_plane_comes_and_goes(
    c: &Cluster,
    field: &dyn Fn(&str, &str) -> String,
    reachable: &dyn Fn(&str, &str) -> String,
) {
    let own = std::env::var("KUBECONFIG").unwrap_or_default();
    if own != "/var/lib/nextmini-k8s/kubeconfig" {
        println!("not the project's own cluster: no second control plane");
        return;
    }
    let script = repo_path("e2e/cluster/member.sh");
    let member = |arg: &str| {
        let out = std::process::Command::new(&script)
            .arg(arg)
            .output()
            .expect("running member.sh");
        assert!(
            out.status.success(),
            "member.sh {arg}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    // Stopped however the test ends (down.sh would also stop it).
    struct Stopped(std::path::PathBuf);
    impl Drop for Stopped {
        fn drop(&mut self) {
            let _ = std::process::Command::new(&self.0).arg("stop").output();
        }
    }
    let _stopped = Stopped(script.clone());
    let kubeconfig = member("start");
    let name = format!("{}-second", c.namespace);
    let _gone = MemberClustersGone(c, vec![name.clone()]);
    c.ok(&[
        "create",
        "secret",
        "generic",
        "member-second",
        &format!("--from-file=kubeconfig={kubeconfig}"),
    ]);
    let yaml = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: MemberCluster\nmetadata: {{name: {name}}}\nspec:\n  region: us-west\n  kubeconfigSecretRef: {{namespace: {}, name: member-second}}\n",
        c.namespace
    );
    let applied = c.kubectl_stdin(&["apply", "-f", "-"], &yaml);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    c.wait_for(
        "the second control plane Reachable",
        Duration::from_secs(30),
        || reachable(&name, "status") == "True",
    );
    let rtt = field(&name, ".status.rtt");
    assert!(!rtt.is_empty(), "a round trip to the second API server");

    // Issue 17.2: a topology with node c in the member. The operator makes
    // c's pod, its credential and the headless Service there through the
    // member's API server, in the member's namespace (made for it), owned by
    // labels rather than owner references. The member has no kubelet: c's
    // pod stays Pending, a and b run here.
    let far = format!("{}-far", c.namespace);
    let in_member = |args: &[&str]| {
        let mut all = vec!["--kubeconfig", kubeconfig.as_str()];
        all.extend_from_slice(args);
        c.kubectl_in(&far, &all)
    };
    let member_objects = |kind: &str| {
        let out = in_member(&[
            "get",
            kind,
            "-l",
            "nextmini.io/topology=span",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let span = |nodes: &str| {
        format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: span}}\nspec:\n  nodes: [{nodes}]\n  links: [{{endpoints: [a, b]}}, {{endpoints: [b, c]}}]\n"
        )
    };
    // c serves 8 MiB of seeded random bytes, whose hash is known here (its
    // shell ends on SIGTERM: python as PID 1 would ignore it and hold the
    // pod's deletion for its whole grace period).
    let c_node = format!(
        r#"{{name: c, cluster: {name}, containers: [{{name: web, image: '{}', imagePullPolicy: {}, command: [sh, -c, "python3 -c 'import random; random.seed(17); open(\"/tmp/big\", \"wb\").write(random.randbytes(8 << 20))' && python3 -m http.server 8000 --directory /tmp & trap 'exit 0' TERM; wait"]}}]}}"#,
        tools_image(),
        pull_policy()
    );
    let expected = std::process::Command::new("python3")
        .args([
            "-c",
            "import hashlib, random; random.seed(17); print(hashlib.sha256(random.randbytes(8 << 20)).hexdigest())",
        ])
        .output()
        .expect("python3");
    let expected = String::from_utf8_lossy(&expected.stdout).trim().to_owned();
    // The member's pods reach the hub at a NodePort of this cluster's node
    // (no name of this cluster resolves there); agents check the hub's
    // certificate by its fixed name, whatever address they dial.
    c.ok(&[
        "expose",
        "service",
        "nm-hub",
        "--name",
        "nm-hub-members",
        "--type",
        "NodePort",
    ]);
    let hub_port = c.ok(&[
        "get",
        "service",
        "nm-hub-members",
        "-o",
        "jsonpath={.spec.ports[0].nodePort}",
    ]);
    let node_ip = c.ok(&[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}"#,
    ]);
    let hub_address = format!("{}:{}", node_ip.trim(), hub_port.trim());
    let member_spec = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: MemberCluster\nmetadata: {{name: {name}}}\nspec:\n  region: us-west\n  namespace: {far}\n  hubAddress: {hub_address}\n  kubeconfigSecretRef: {{namespace: {}, name: member-second}}\n  exposure: {{type: Address}}\n",
        c.namespace
    );
    let applied = c.kubectl_stdin(&["apply", "-f", "-"], &member_spec);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let applied = c.kubectl_stdin(
        &["apply", "-f", "-"],
        &span(&format!("{{name: a}}, {{name: b}}, {c_node}")),
    );
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let t = Instant::now();
    c.wait_for(
        "c's pod in the member cluster",
        Duration::from_secs(60),
        || member_objects("pods") == "span-c",
    );
    println!(
        "span: c's pod made in the member {:.1} s after kubectl apply",
        t.elapsed().as_secs_f64()
    );
    let pod: serde_json::Value =
        serde_json::from_slice(&in_member(&["get", "pod", "span-c", "-o", "json"]).stdout)
            .expect("c's pod as JSON");
    let uid = c.ok(&["get", "topology", "span", "-o", "jsonpath={.metadata.uid}"]);
    assert_eq!(
        pod["metadata"]["labels"]["nextmini.io/cluster"],
        name.as_str()
    );
    assert_eq!(
        pod["metadata"]["labels"]["nextmini.io/owner-uid"],
        uid.as_str()
    );
    assert!(
        pod["metadata"]["ownerReferences"].is_null(),
        "no owner reference across clusters: {}",
        pod["metadata"]
    );
    let args = pod["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains(&format!("\"--hub\",\"https://{hub_address}\"")),
        "c dials the member's hubAddress: {args}"
    );
    assert_eq!(member_objects("secrets"), "span-c-credentials");
    assert_eq!(member_objects("services"), "nm-span");
    let here = c.ok(&[
        "get",
        "pods",
        "-l",
        "nextmini.io/topology=span",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ]);
    assert_eq!(
        here.trim(),
        "span-a span-b",
        "only a and b run in the operator's cluster"
    );
    let placement = |cluster: &str, what: &str| {
        c.ok(&[
            "get",
            "topology",
            "span",
            "-o",
            &format!("jsonpath={{.status.clusters[?(@.cluster==\"{cluster}\")].{what}}}"),
        ])
    };
    c.wait_for(
        "span's clusters in its status",
        Duration::from_secs(60),
        || placement(&name, "pods") == "1" && placement(&name, "reachable") == "true",
    );
    assert_eq!(placement(&name, "nodes"), "1");
    assert_eq!(placement(&name, "namespace"), far);
    // The member's scheduler cannot place c (the member has no nodes); its
    // warning is repeated on the Topology here, naming the member and pod.
    let t = Instant::now();
    let mirrored = || {
        c.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.kind=Topology,involvedObject.name=span,reason=FailedScheduling",
            "-o",
            "jsonpath={.items[*].message}",
        ])
    };
    c.wait_for(
        "the member's FailedScheduling on span",
        Duration::from_secs(60),
        || mirrored().contains(&format!("member cluster {name}, pod {far}/span-c: ")),
    );
    println!(
        "span: the member's warning on the Topology {:.1} s after c's pod: {}",
        t.elapsed().as_secs_f64(),
        mirrored()
    );
    // a and b forward across a-b, whatever the member does.
    ephemeral(
        c,
        "span-a",
        "client",
        "exec python3 -c 'import time; time.sleep(36000)'",
    );
    let ping_b = || {
        c.kubectl(&[
            "exec", "span-a", "-c", "client", "--", "ping", "-c", "3", "-W", "3", "b",
        ])
        .status
        .success()
    };
    c.wait_for("a's ping to b", Duration::from_secs(120), ping_b);

    // Issue 17.4: the member gets a node of its own (containerd and a kubelet
    // in their own network namespace, pod addresses routed between the two
    // clusters). c runs there, its agent dials the hub here, b dials c at
    // its pod IP, and real traffic crosses the clusters.
    let t = Instant::now();
    member("start-node");
    let phase_of_c = || {
        String::from_utf8_lossy(
            &in_member(&["get", "pod", "span-c", "-o", "jsonpath={.status.phase}"]).stdout,
        )
        .trim()
        .to_owned()
    };
    c.wait_for("c running in the member", Duration::from_secs(90), || {
        phase_of_c() == "Running"
    });
    c.wait_for(
        "span Ready across both clusters",
        Duration::from_secs(120),
        || condition(c, "span", "Ready").0 == "True",
    );
    println!(
        "span: Ready {:.1} s after the member got a node (c's pod scheduled there)",
        t.elapsed().as_secs_f64()
    );
    let endpoint_of_c = || {
        c.psql(&format!(
            "SELECT coalesce(n.endpoint, '') FROM nodes n JOIN topologies t ON t.id = n.topology_id WHERE t.key = '{}/span' AND n.name = 'c'",
            c.namespace
        ))
    };
    let ip_of_c = || {
        String::from_utf8_lossy(
            &in_member(&["get", "pod", "span-c", "-o", "jsonpath={.status.podIP}"]).stdout,
        )
        .trim()
        .to_owned()
    };
    assert_eq!(
        endpoint_of_c(),
        format!("{}:7100", ip_of_c()),
        "b dials c at its pod IP"
    );
    let across = |what: &str| -> i64 {
        c.psql(&format!(
            "SELECT coalesce(sum(k.rx_bytes), 0) FROM link_counters k JOIN topologies t ON t.id = k.topology_id WHERE t.key = '{}/span' AND k.node = 'b' AND k.link = 'b-c'",
            c.namespace
        ))
        .parse()
        .unwrap_or_else(|e| panic!("{what}: a byte count: {e}"))
    };
    let curl_c = || {
        let before = across("before");
        let mut got = String::new();
        c.wait_for(
            "a's curl from c across the clusters",
            Duration::from_secs(60),
            || {
                let out = c.kubectl(&[
                "exec", "span-a", "-c", "client", "--", "sh", "-c",
                "curl -sS --fail --max-time 30 -o /tmp/big http://c:8000/big && sha256sum /tmp/big",
            ]);
                got = String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_owned();
                out.status.success()
            },
        );
        assert_eq!(got, expected, "c's 8 MiB arrive whole across the clusters");
        c.wait_for(
            "the bytes on b-c's counters",
            Duration::from_secs(30),
            || across("after") - before > 8_000_000,
        );
        across("after") - before
    };
    let bytes = curl_c();
    println!(
        "span: 8 MiB curl from c (member) to a (home), sha256 equal, {bytes} bytes on b's end of b-c"
    );
    // The cross-cluster link's delay, patched with kubectl and measured.
    let rtt_to_c = || -> f64 {
        let out = c.ok(&[
            "exec",
            "span-a",
            "-c",
            "client",
            "--",
            "sh",
            "-c",
            "ping -c 5 -i 0.2 -W 2 c | tail -1",
        ]);
        // "min/avg/max[/mdev] = a/b/c[/d] ms" (busybox or iputils): the second figure.
        out.split_once('=')
            .and_then(|(_, figures)| figures.split('/').nth(1))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("ping's average: {out}"))
    };
    let before = rtt_to_c();
    c.ok(&[
        "patch",
        "topology",
        "span",
        "--type",
        "json",
        "-p",
        r#"[{"op": "add", "path": "/spec/links/1/delay", "value": "20ms"}]"#,
    ]);
    let t = Instant::now();
    let mut after = before;
    c.wait_for(
        "b-c's 20 ms delay on a's pings to c",
        Duration::from_secs(30),
        || {
            after = rtt_to_c();
            after > before + 38.0
        },
    );
    assert!(
        after < before + 55.0,
        "20 ms each way, not more: {before:.1} -> {after:.1} ms"
    );
    println!(
        "span: kubectl patch of b-c's delay to 20ms: a->c RTT {before:.1} -> {after:.1} ms, seen {:.1} s after the patch",
        t.elapsed().as_secs_f64()
    );

    let uid_of_c = || {
        String::from_utf8_lossy(
            &in_member(&["get", "pod", "span-c", "-o", "jsonpath={.metadata.uid}"]).stdout,
        )
        .trim()
        .to_owned()
    };
    let c_before = uid_of_c();
    let t = Instant::now();
    member("stop-apiserver");
    c.wait_for("the member Unreachable", Duration::from_secs(40), || {
        reachable(&name, "status") == "False"
    });
    println!(
        "member gone: Unreachable after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(
        reachable(&name, "reason"),
        "Unreachable",
        "{}",
        reachable(&name, "message")
    );
    assert_eq!(
        field(&name, ".status.rtt"),
        rtt,
        "the round trip stays while it is away"
    );
    c.wait_for(
        "span Degraded naming the member",
        Duration::from_secs(40),
        || condition(c, "span", "Degraded").1 == "MemberClusterUnreachable",
    );
    let (_, _, said) = condition(c, "span", "Degraded");
    assert!(
        said.contains(&format!("member cluster {name} is unreachable"))
            && said.contains(":7443")
            && said.contains("onnection refused"),
        "names the member, its API server and what failed: {said}"
    );
    assert_eq!(placement(&name, "reachable"), "false");
    println!(
        "span Degraded {:.1} s after the member's API server stopped: {said}",
        t.elapsed().as_secs_f64()
    );
    assert!(ping_b(), "a still pings b while c's cluster is away");
    assert!(
        rtt_to_c() > 38.0,
        "c's agent keeps forwarding while its API server is away"
    );
    // A node added while the member is away is made when it returns; and a
    // topology-wide change (the dataplane's processors: every agent starts
    // afresh, though no pod spec changes) restarts c's agent there too.
    let applied = c.kubectl_stdin(
        &["apply", "-f", "-"],
        &span(&format!(
            "{{name: a}}, {{name: b}}, {c_node}, {{name: d, cluster: {name}}}"
        ))
        .replace("spec:\n", "spec:\n  dataplane: {processors: 3}\n"),
    );
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );

    let t = Instant::now();
    member("start-apiserver");
    c.wait_for(
        "the member Reachable again",
        Duration::from_secs(40),
        || reachable(&name, "status") == "True",
    );
    println!(
        "member back: Reachable after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    c.wait_for(
        "d's pod made in the member that came back",
        Duration::from_secs(60),
        || member_objects("pods") == "span-c span-d",
    );
    c.wait_for(
        "c's pod made afresh for the generation stored while its cluster was away",
        Duration::from_secs(30),
        || {
            let now = uid_of_c();
            !now.is_empty() && now != c_before
        },
    );
    c.wait_for(
        "span no longer Degraded by the member",
        Duration::from_secs(40),
        || condition(c, "span", "Degraded").1 != "MemberClusterUnreachable",
    );
    println!(
        "member resynced {:.1} s after its API server started",
        t.elapsed().as_secs_f64()
    );
    // The dataplane change made every agent's pod afresh, a's too: its
    // client container went with the old one.
    ephemeral(
        c,
        "span-a",
        "client",
        "exec python3 -c 'import time; time.sleep(36000)'",
    );
    // c's new pod has a new address: b is told and dials it there.
    c.wait_for("b dialing c's new pod", Duration::from_secs(90), || {
        let ip = ip_of_c();
        !ip.is_empty() && endpoint_of_c() == format!("{ip}:7100")
    });
    let bytes = curl_c();
    println!("span: c's new pod serves a again across the clusters ({bytes} bytes on b-c)");

    // Deleting the topology removes what it had in both clusters; pods
    // end within their grace period in either.
    c.ok(&["delete", "topology", "span", "--timeout=60s"]);
    c.wait_for(
        "span's objects in the member to go",
        Duration::from_secs(60),
        || {
            ["pods", "secrets", "services"]
                .iter()
                .all(|kind| member_objects(kind).is_empty())
        },
    );
    // The namespace the operator made there goes too, once empty.
    c.wait_for(
        "the member namespace the operator made to go",
        Duration::from_secs(60),
        || !in_member(&["get", "namespace", &far]).status.success(),
    );
    let left = || {
        c.ok(&[
            "get",
            "pods,secrets,services",
            "-l",
            "nextmini.io/topology=span",
            "-o",
            "name",
        ])
        .trim()
        .to_owned()
    };
    c.wait_for("span's objects here to go", Duration::from_secs(30), || {
        left().is_empty()
    });
    c.ok(&["delete", "secret", "member-second"]);
    c.ok(&["delete", "service", "nm-hub-members"]);
}

/// Issue 17.5: a second team's topology also called line3, in its own
/// namespace, beside the running line3 of this one. Before, the operator
/// refused it (NameTaken). Now both run, each forwards its own traffic on its
/// own links with its own parameters, and deleting one leaves the other.
fn same_name_in_another_namespace(c: &Cluster) {
    let team = format!("{}-team", c.namespace);
    let _ = c.kubectl(&["create", "namespace", &team]);
    let yaml = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: line3}}\nspec:\n  placement: packed\n  nodesPerWorker: 2\n  workerImage: {}\n  linkDefaults: {{delay: 4ms}}\n  nodes: [{{name: p}}, {{name: q}}]\n  links: [{{endpoints: [p, q]}}]\n",
        worker_image()
    );
    let ready = c.apply_until_ready_in(&team, &yaml, "line3", "240s");
    println!(
        "{team}/line3 Ready {:.1} s after kubectl apply, beside {}/line3",
        ready.as_secs_f64(),
        c.namespace
    );
    assert_eq!(
        c.psql("SELECT string_agg(key || ' ' || (SELECT count(*) FROM nodes n WHERE n.topology_id = t.id), ', ' ORDER BY key) FROM topologies t WHERE name = 'line3'"),
        format!("{team}/line3 2, {}/line3 3", c.namespace),
        "two topologies called line3, each with its own nodes"
    );
    // Traffic in the team's line3: p's ping to q takes its 4 ms each way, and
    // a curl's bytes are on the team's p-q link, not on this namespace's.
    let in_worker = |args: &[&str]| {
        let mut all = vec!["-n", team.as_str(), "exec", "line3-worker-0", "--"];
        all.extend_from_slice(args);
        c.kubectl(&all)
    };
    let in_p = |script: &str| in_worker(&["nextmini", "exec", "p", "--", "sh", "-c", script]);
    // Not through `sh -c`: the image's busybox shell has a ping applet of
    // its own, which knows no ICMP echo sockets.
    let ping = in_worker(&[
        "nextmini", "exec", "p", "--", "ping", "-c", "3", "-W", "3", "q",
    ]);
    let shown = String::from_utf8_lossy(&ping.stdout).into_owned();
    assert!(
        ping.status.success(),
        "ping q in {team}/line3: {shown}{}",
        String::from_utf8_lossy(&ping.stderr)
    );
    let avg_ms = nextmini_e2e::ping_summary_avg_ms(&shown);
    assert!(
        (8.0..20.0).contains(&avg_ms),
        "the team's p-q link runs 4 ms each way; ping said {shown}"
    );
    assert!(
        in_worker(&[
            "sh",
            "-c",
            "mkdir -p /tmp/www && head -c 3000000 /dev/urandom > /tmp/www/blob && setsid nextmini exec q -- python3 -m http.server 8000 --directory /tmp/www </dev/null >/tmp/www.log 2>&1 &",
        ])
        .status
        .success()
    );
    c.wait_for(
        "the team's web server in q",
        Duration::from_secs(30),
        || {
            in_p("curl -sSf --max-time 20 -o /tmp/got http://q:8000/blob")
                .status
                .success()
        },
    );
    let sha = |file: &str| {
        let out = in_worker(&["sha256sum", file]);
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        sha("/tmp/got"),
        sha("/tmp/www/blob"),
        "the blob crossed p-q intact"
    );
    let team_bytes = || -> i64 {
        c.psql(&format!("SELECT coalesce(sum(c.rx_bytes), 0) FROM link_counters c JOIN topologies t ON t.id = c.topology_id WHERE t.key = '{team}/line3' AND c.link = 'p-q' AND c.node = 'p'"))
            .parse()
            .expect("a byte count")
    };
    c.wait_for(
        "the blob's bytes on the team's p-q counters",
        Duration::from_secs(15),
        || team_bytes() >= 3_000_000,
    );
    println!(
        "{team}/line3: ping p -> q {avg_ms:.1} ms (4 ms links), 3 MB curl sha256 equal, {} bytes on its p-q counters",
        team_bytes()
    );
    // This namespace's line3 still forwards, untouched.
    let ours = c.kubectl(&[
        "exec",
        "line3-a",
        "-c",
        "client",
        "--",
        "curl",
        "-sS",
        "--max-time",
        "10",
        "-o",
        "/dev/null",
        "http://c:8000/",
    ]);
    assert!(
        ours.status.success(),
        "{}/line3 stopped forwarding",
        c.namespace
    );

    c.ok(&["-n", &team, "delete", "topology", "line3", "--timeout=120s"]);
    assert_eq!(
        c.psql("SELECT string_agg(key, ', ') FROM topologies WHERE name = 'line3'"),
        format!("{}/line3", c.namespace),
        "deleting the team's line3 removes its rows only"
    );
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "topology/line3",
        "--timeout=10s",
    ]);
    let _ = c.kubectl(&["delete", "namespace", &team, "--timeout=120s"]);
}

/// a — b — c — d — e — f, three nodes per worker pod: a, b, c in worker 0 and
/// d, e, f in worker 1, so the link c-d joins the two pods. b has limits.
fn packed6(image: &str) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: packed6}}\nspec:\n  placement: packed\n  nodesPerWorker: 3\n  workerImage: {image}\n  nodes: [{{name: a}}, {{name: b, resources: {{cpu: 500m, memory: 128Mi}}}}, {{name: c}}, {{name: d}}, {{name: e}}, {{name: f}}]\n  links:\n  - endpoints: [a, b]\n  - endpoints: [b, c]\n  - endpoints: [c, d]\n  - endpoints: [d, e]\n  - endpoints: [e, f]\n"
    )
}

/// `args` run inside `node`, which runs in `worker`, without a shell.
fn node_command(c: &Cluster, worker: &str, node: &str, args: &[&str]) -> std::process::Output {
    let mut all = vec!["exec", worker, "--", "nextmini", "exec", node, "--"];
    all.extend_from_slice(args);
    c.kubectl(&all)
}

/// Waits until `node` (in `worker`) gets an answer from the web server at `url`.
fn wait_for_web(c: &Cluster, worker: &str, node: &str, url: &str) {
    c.wait_for(
        &format!("the web server at {url}"),
        Duration::from_secs(30),
        || {
            node_command(
                c,
                worker,
                node,
                &["curl", "-sS", "--max-time", "5", "-o", "/dev/null", url],
            )
            .status
            .success()
        },
    );
}

/// `sh -c script` inside `node`, which runs in `worker`; its stdout.
fn in_node(c: &Cluster, worker: &str, node: &str, script: &str) -> String {
    c.ok(&[
        "exec", worker, "--", "nextmini", "exec", node, "--", "sh", "-c", script,
    ])
    .trim()
    .to_string()
}

/// Bytes c has received from d on the link between the two workers.
fn c_received(c: &Cluster) -> i64 {
    c.psql("SELECT coalesce(sum(c.rx_bytes), 0) FROM link_counters c JOIN topologies t ON t.id = c.topology_id WHERE t.name = 'packed6' AND c.node = 'c' AND c.link = 'c-d'")
        .parse()
        .expect("a byte count")
}

fn packed_six_nodes_on_two_workers(c: &Cluster) {
    // The API server refuses packing fields without packed placement.
    let refused = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: half-packed}\nspec:\n  placement: pod-per-node\n  nodesPerWorker: 4\n  nodes: [{name: a}]\n",
    );
    assert!(!refused.status.success(), "CEL refuses nodesPerWorker here");
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("nodesPerWorker, workers and workerImage need placement: packed"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let ready = c.apply_until_ready(&packed6(&worker_image()), "packed6", "240s");
    println!(
        "packed6 (6 nodes, 2 worker pods) Ready {:.1} s after kubectl apply",
        ready.as_secs_f64()
    );
    assert_eq!(
        &c.topology_row("packed6")[..4],
        ["packed6", "6", "5", "True"],
        "NAME NODES LINKS READY"
    );
    let pods = c.ok(&[
        "get",
        "pods",
        "-l",
        "nextmini.io/topology=packed6",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name}={.metadata.annotations.nextmini\.io/nodes}{"\n"}{end}"#,
    ]);
    let mut pods: Vec<&str> = pods.lines().collect();
    pods.sort();
    assert_eq!(
        pods,
        ["packed6-worker-0=a,b,c", "packed6-worker-1=d,e,f"],
        "two worker pods, three nodes each"
    );
    let namespaces = c.ok(&["exec", "packed6-worker-1", "--", "ip", "netns", "list"]);
    // Nodes' network namespaces are named after the topology's key.
    let key = format!("{}/packed6", c.namespace);
    for node in ["d", "e", "f"] {
        let ns = nextmini_operator::runtime::names::netns(&key, node);
        assert!(namespaces.contains(&ns), "{ns} in worker 1: {namespaces}");
    }

    // b's limits: a cgroup of its own inside worker 0's (cgroup v1 nodes), and
    // the worker requests them besides its own share.
    let requests = c.ok(&[
        "get",
        "pod",
        "packed6-worker-0",
        "-o",
        "jsonpath={.spec.containers[0].resources.requests.cpu} {.spec.containers[0].resources.requests.memory}",
    ]);
    assert_eq!(
        requests.trim(),
        "600m 201326592",
        "b's 500m and 128Mi plus the worker's"
    );
    let v2 = c
        .kubectl(&[
            "exec",
            "packed6-worker-0",
            "--",
            "test",
            "-e",
            "/sys/fs/cgroup/cgroup.controllers",
        ])
        .status
        .success();
    if v2 {
        println!("cgroup v2 nodes: b is held by the pod's limits only");
    } else {
        let group = format!(
            "/sys/fs/cgroup/cpu/nextmini/{}",
            nextmini_operator::runtime::names::netns(&key, "b")
        );
        let quota = c.ok(&[
            "exec",
            "packed6-worker-0",
            "--",
            "cat",
            &format!("{group}/cpu.cfs_quota_us"),
        ]);
        assert_eq!(quota.trim(), "50000", "500m of a 100 ms period");
        let procs = c.ok(&[
            "exec",
            "packed6-worker-0",
            "--",
            "cat",
            &format!("{group}/cgroup.procs"),
        ]);
        assert!(!procs.trim().is_empty(), "b's agent is in its group");
        println!(
            "b's cgroup in worker 0: quota {} us, pids {}",
            quota.trim(),
            procs.split_whitespace().collect::<Vec<_>>().join(",")
        );
    }

    // python http.server in f (worker 1), curl in a (worker 0): the bytes
    // cross e, d, the link c-d between the pods, c and b.
    let expected = c
        .ok(&[
            "exec",
            "packed6-worker-1",
            "--",
            "python3",
            "-c",
            "import os, hashlib; os.makedirs('/tmp/www', exist_ok=True); data = os.urandom(20*1024*1024); open('/tmp/www/big', 'wb').write(data); print(hashlib.sha256(data).hexdigest())",
        ])
        .trim()
        .to_string();
    c.ok(&[
        "exec",
        "packed6-worker-1",
        "--",
        "sh",
        "-c",
        "setsid nextmini exec f -- python3 -m http.server 8000 --directory /tmp/www </dev/null >/tmp/www.log 2>&1 &",
    ]);
    wait_for_web(c, "packed6-worker-0", "a", "http://f:8000/");
    let before = c_received(c);
    // d (worker 1) sends the bytes on c-d to c (worker 0).
    let out = capture_during(c, "packed6-worker-1", None, "c-d", "d", || {
        in_node(
            c,
            "packed6-worker-0",
            "a",
            "curl -sS --fail --max-time 120 -o /tmp/got -w '%{speed_download}' http://f:8000/big && echo && python3 -c \"import hashlib; print(hashlib.sha256(open('/tmp/got','rb').read()).hexdigest())\"",
        )
    });
    let mut lines = out.lines();
    let speed: f64 = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("curl speed");
    assert_eq!(
        lines.next().map(str::trim),
        Some(expected.as_str()),
        "the file arrived intact"
    );
    println!(
        "20 MiB f -> e -> d => c -> b -> a across two worker pods: {:.0} Mbit/s",
        speed * 8.0 / 1e6
    );
    c.wait_for(
        "c's counters to show the transfer",
        Duration::from_secs(10),
        || (c_received(c) - before) as u64 >= 20 * MIB,
    );

    // ping inside packed nodes, across the two workers, without privileges
    // (the worker drops CAP_NET_RAW). Not through `sh -c`: the image's busybox
    // shell runs its own ping applet, which knows no ICMP echo sockets.
    let ping = node_command(
        c,
        "packed6-worker-0",
        "a",
        &["ping", "-c", "3", "-W", "3", "f"],
    );
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&ping.stdout),
        String::from_utf8_lossy(&ping.stderr)
    );
    if !(ping.status.success() && shown.contains(" 0% packet loss")) {
        let range = node_command(
            c,
            "packed6-worker-0",
            "a",
            &["cat", "/proc/sys/net/ipv4/ping_group_range"],
        );
        let log = c.kubectl(&["logs", "packed6-worker-0", "--tail=200"]);
        panic!(
            "ping a -> f: {shown}
ping_group_range in a: {}{}
worker log:
{}",
            String::from_utf8_lossy(&range.stdout),
            String::from_utf8_lossy(&range.stderr),
            String::from_utf8_lossy(&log.stdout)
                .lines()
                .filter(|l| !l.starts_with('['))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    recreated_topology_runs_its_new_parameters(c);
    trace_from_a_configmap(c);
    scenario_kills_and_restarts_a_node(c);
    failures_show_on_the_topology(c);

    // kubectl delete leaves no pod, service, secret, row or finalizer.
    let t = Instant::now();
    c.ok(&["delete", "topology", "packed6", "--timeout=120s"]);
    c.wait_for(
        "packed6's worker pods to go",
        Duration::from_secs(90),
        || {
            c.ok(&[
                "get",
                "pods",
                "-l",
                "nextmini.io/topology=packed6",
                "-o",
                "name",
            ])
            .trim()
            .is_empty()
        },
    );
    println!(
        "kubectl delete topology packed6: everything gone in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(!c.kubectl(&["get", "topology", "packed6"]).status.success());
    assert!(
        !c.kubectl(&["get", "service/nm-packed6"]).status.success(),
        "service left behind"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "secrets,configmaps",
            "-l",
            "nextmini.io/topology=packed6",
            "-o",
            "name"
        ])
        .trim(),
        "",
        "Secrets or ConfigMaps left behind"
    );
    assert_eq!(
        c.psql("SELECT count(*) FROM topologies WHERE name = 'packed6'"),
        "0",
        "rows left behind"
    );
}

/// PostgreSQL is for the operator alone (issue 9, point 5). The chart's
/// NetworkPolicy admits only the operator's pods, but the from-source cluster's
/// CNI (the bridge plugin) does not enforce NetworkPolicy, so what is checked
/// here is what holds on any cluster: the policy exists and selects exactly the
/// operator pod, and no agent pod carries the database's URL or password, in its
/// environment or in a mounted Secret.
fn agents_hold_no_database_credentials(c: &Cluster) {
    let json = |args: &[&str]| -> serde_json::Value {
        serde_json::from_str(&c.ok(args)).expect("kubectl -o json")
    };
    let operator = json(&[
        "get",
        "deployment",
        &format!("{}-operator", c.release),
        "-o",
        "json",
    ]);
    let op_pod = &operator["spec"]["template"]["spec"];
    let mut db_secrets: Vec<String> = Vec::new();
    for container in op_pod["containers"].as_array().expect("containers") {
        for e in container["env"].as_array().into_iter().flatten() {
            if let Some(s) = e["valueFrom"]["secretKeyRef"]["name"].as_str() {
                db_secrets.push(s.to_string());
            }
        }
    }
    assert!(
        !db_secrets.is_empty(),
        "the operator gets the database credentials from a Secret"
    );

    let pods = json(&[
        "get",
        "pods",
        "-l",
        "nextmini.io/topology=line3",
        "-o",
        "json",
    ]);
    let pods = pods["items"].as_array().expect("items");
    assert_eq!(pods.len(), 3, "line3's agent pods");
    for pod in pods {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        let spec = &pod["spec"];
        for kind in ["containers", "initContainers", "ephemeralContainers"] {
            for container in spec[kind].as_array().into_iter().flatten() {
                for e in container["env"].as_array().into_iter().flatten() {
                    let var = e["name"].as_str().unwrap_or_default();
                    assert!(
                        !var.contains("DATABASE")
                            && !var.starts_with("PG")
                            && !var.starts_with("POSTGRES"),
                        "{name}: {var} in the environment"
                    );
                    if let Some(s) = e["valueFrom"]["secretKeyRef"]["name"].as_str() {
                        assert!(
                            !db_secrets.iter().any(|d| d == s),
                            "{name}: {var} from Secret {s}"
                        );
                    }
                }
                for from in container["envFrom"].as_array().into_iter().flatten() {
                    if let Some(s) = from["secretRef"]["name"].as_str() {
                        assert!(
                            !db_secrets.iter().any(|d| d == s),
                            "{name}: envFrom Secret {s}"
                        );
                    }
                }
            }
        }
        for volume in spec["volumes"].as_array().into_iter().flatten() {
            let mut secrets: Vec<&str> = volume["secret"]["secretName"]
                .as_str()
                .into_iter()
                .collect();
            for source in volume["projected"]["sources"]
                .as_array()
                .into_iter()
                .flatten()
            {
                secrets.extend(source["secret"]["name"].as_str());
            }
            for s in secrets {
                assert!(
                    !db_secrets.iter().any(|d| d == s),
                    "{name}: mounts the database Secret {s}"
                );
            }
        }
    }

    let policy = json(&[
        "get",
        "networkpolicy",
        &format!("{}-postgresql", c.release),
        "-o",
        "json",
    ]);
    let from = policy["spec"]["ingress"][0]["from"]
        .as_array()
        .expect("the policy's peers");
    assert_eq!(from.len(), 1, "one peer: {from:?}");
    let selector: Vec<String> = from[0]["podSelector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    let admitted = c.ok(&["get", "pods", "-l", &selector.join(","), "-o", "name"]);
    let admitted: Vec<&str> = admitted.lines().collect();
    assert!(
        admitted.len() == 1 && admitted[0].starts_with(&format!("pod/{}-operator-", c.release)),
        "the policy admits exactly the operator pod: {admitted:?}"
    );
    println!(
        "PostgreSQL: NetworkPolicy admits {admitted:?} only; no agent pod holds its credentials (the test cluster's bridge CNI does not enforce NetworkPolicy)"
    );
}

/// A row written behind the database's checks (triggers off) shows as the
/// RowsValid condition naming the row, while other changes still apply; a
/// bad write through the checks is refused with its message.
fn faulty_rows_show_on_the_topology(c: &Cluster) {
    let refused = c.kubectl(&[
        "exec",
        &format!("statefulset/{}-postgresql", c.release),
        "--",
        "sh",
        "-c",
        r#"PGPASSWORD="$POSTGRES_PASSWORD" psql -h 127.0.0.1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -tAc "UPDATE links SET params_forward = params_forward || '{\"loss_ppm\": 2000000}' WHERE name = 'a-b'" 2>&1 || true"#,
    ]);
    let text = String::from_utf8_lossy(&refused.stdout);
    assert!(
        text.contains("links a-b: params_forward.loss_ppm: must be at most 1000000"),
        "{text}"
    );
    c.psql(
        "SET session_replication_role = replica; \
         UPDATE links SET params_forward = params_forward || '{\"rate_bps\": \"abc\"}' WHERE name = 'b-c'",
    );
    let (generation, _) = generation_and_acks(c);
    c.psql("UPDATE links SET params_forward = params_forward || '{\"delay_us\": 2000}' WHERE name = 'a-b'");
    c.wait_for(
        "the agents to run a-b's change",
        Duration::from_secs(30),
        || {
            let (g, acked) = generation_and_acks(c);
            g > generation && acked >= g
        },
    );
    let t = Instant::now();
    c.ok(&[
        "wait",
        "--for=condition=RowsValid=false",
        "topology/line3",
        "--timeout=30s",
    ]);
    println!(
        "a faulty row showed on the Topology in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let message = c.ok(&[
        "get",
        "topology",
        "line3",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="RowsValid")].message}"#,
    ]);
    assert!(
        message.contains("links b-c params_forward")
            && message.contains("rate_bps: must be an integer or null")
            && message.contains("runs its last good parameters"),
        "{message}"
    );
    c.psql("UPDATE links SET params_forward = params_forward || '{\"rate_bps\": 20000000}' WHERE name = 'b-c'");
    c.ok(&[
        "wait",
        "--for=condition=RowsValid=true",
        "topology/line3",
        "--timeout=30s",
    ]);
    c.psql("UPDATE links SET params_forward = params_forward - 'delay_us' WHERE name = 'a-b'");
}

/// Issue 21.1 on the cluster: a topology deleted and applied again under the
/// same name, with packed6 alive beside it (so the operator's hub keeps
/// running), runs its new link parameters, not the ones of its first creation.
fn recreated_topology_runs_its_new_parameters(c: &Cluster) {
    let pair = |params: &str| {
        format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: pair2}}\nspec:\n  placement: packed\n  nodesPerWorker: 2\n  workerImage: {}\n  linkDefaults: {{{params}}}\n  nodes: [{{name: p}}, {{name: q}}]\n  links: [{{endpoints: [p, q]}}]\n",
            worker_image()
        )
    };
    // The TCP handshake's time from p to a web server in q: one round trip.
    // (Not x and y: YAML 1.1 reads a bare y as true.)
    let connect_secs = || -> f64 {
        c.ok(&[
            "exec",
            "pair2-worker-0",
            "--",
            "sh",
            "-c",
            "mkdir -p /tmp/www && head -c 2000000 /dev/urandom > /tmp/www/blob && setsid nextmini exec q -- python3 -m http.server 8000 --directory /tmp/www </dev/null >/tmp/www.log 2>&1 &",
        ]);
        wait_for_web(c, "pair2-worker-0", "p", "http://q:8000/");
        let times: Vec<f64> = (0..5)
            .map(|_| {
                in_node(
                    c,
                    "pair2-worker-0",
                    "p",
                    "curl -sS --max-time 10 -o /dev/null -w '%{time_connect}' http://q:8000/",
                )
                .parse()
                .expect("a connect time")
            })
            .collect();
        times.iter().copied().fold(f64::INFINITY, f64::min)
    };
    let loss_drops = || -> i64 {
        c.psql("SELECT coalesce(sum(c.drops_loss), 0) FROM link_counters c JOIN topologies t ON t.id = c.topology_id WHERE t.name = 'pair2'")
            .parse()
            .expect("a count")
    };
    c.apply_until_ready(&pair("rate: 200Mbit, delay: 1ms"), "pair2", "240s");
    let first = connect_secs();
    c.ok(&["delete", "topology", "pair2", "--timeout=120s"]);
    c.wait_for("pair2's worker to go", Duration::from_secs(90), || {
        c.ok(&[
            "get",
            "pods",
            "-l",
            "nextmini.io/topology=pair2",
            "-o",
            "name",
        ])
        .trim()
        .is_empty()
    });
    c.apply_until_ready(&pair("rate: 12Mbit, delay: 9ms, loss: 3%"), "pair2", "240s");
    let again = connect_secs();
    in_node(
        c,
        "pair2-worker-0",
        "p",
        "curl -sS --max-time 60 -o /dev/null http://q:8000/blob",
    );
    c.wait_for(
        "the transfer's losses in the counters",
        Duration::from_secs(10),
        || loss_drops() > 0,
    );
    println!(
        "pair2 re-created beside packed6: handshake {:.1} ms at 1 ms per direction, {:.1} ms at 9 ms; {} packets lost on purpose",
        first * 1e3,
        again * 1e3,
        loss_drops()
    );
    assert!(first < 0.008, "1 ms each way, yet {:.1} ms", first * 1e3);
    assert!(
        again > 0.017,
        "the re-created link must run 9 ms each way, yet the handshake took {:.1} ms",
        again * 1e3
    );
    c.ok(&["delete", "topology", "pair2", "--timeout=120s"]);
}

/// A trace kept in a ConfigMap (`kubectl create configmap --from-file`)
/// reaches the stored link parameters, and an edit of the ConfigMap is planned
/// again at once (the operator watches the ConfigMaps traces name).
fn trace_from_a_configmap(c: &Cluster) {
    let config_map = |lines: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: lte}}\ndata:\n  down: \"{lines}\"\n"
        )
    };
    let stored = || {
        c.psql("SELECT coalesce(l.params_forward ->> 'trace_ms', '') FROM links l JOIN topologies t ON t.id = l.topology_id WHERE t.name = 'traced'")
            .trim()
            .replace(' ', "")
    };
    let applied = c.kubectl_stdin(&["apply", "-f", "-"], &config_map("1\\n1\\n3\\n4\\n"));
    assert!(applied.status.success(), "ConfigMap lte");
    c.apply_until_ready(
        &format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: traced}}\nspec:\n  placement: packed\n  nodesPerWorker: 2\n  workerImage: {}\n  nodes: [{{name: p}}, {{name: q}}]\n  links: [{{endpoints: [p, q], forward: {{trace: {{configMap: {{name: lte, key: down}}}}}}}}]\n",
            worker_image()
        ),
        "traced",
        "240s",
    );
    assert_eq!(stored(), "[1,1,3,4]", "the ConfigMap's trace is the link's");
    let edited = Instant::now();
    let applied = c.kubectl_stdin(&["apply", "-f", "-"], &config_map("2\\n4\\n"));
    assert!(applied.status.success(), "ConfigMap lte edited");
    // The periodic re-check would take 10 s; the watch is what makes it prompt.
    c.wait_for(
        "the edited trace in the store",
        Duration::from_secs(8),
        || stored() == "[2,4]",
    );
    println!(
        "trace from ConfigMap lte stored; its edit planned again in {:.1} s",
        edited.elapsed().as_secs_f64()
    );
    c.ok(&["delete", "topology", "traced", "--timeout=120s"]);
    c.ok(&["delete", "configmap", "lte"]);
}

/// A timed scenario's node events on the cluster: q, the middle of p — q — r
/// in one worker pod, is killed at 6 s and restarted at 16 s. The agent exits
/// at the instant (the hub records when it saw the stream end), the worker
/// starts it again within about a second, and the hub holds its config back
/// until the restart instant: no ping crosses q between the two, and pings
/// cross again after.
fn scenario_kills_and_restarts_a_node(c: &Cluster) {
    const KILL_AT_S: i64 = 6;
    const RESTART_AT_S: i64 = 16;
    c.apply_until_ready(
        &format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: killed}}\nspec:\n  placement: packed\n  nodesPerWorker: 3\n  workerImage: {}\n  nodes: [{{name: p}}, {{name: q}}, {{name: r}}]\n  links: [{{endpoints: [p, q]}}, {{endpoints: [q, r]}}]\n  scenario:\n    events:\n    - {{at: {KILL_AT_S}s, node: q, action: kill}}\n    - {{at: {RESTART_AT_S}s, node: q, action: restart}}\n",
            worker_image()
        ),
        "killed",
        "240s",
    );
    let worker = "killed-worker-0";
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    };
    let mut start_ms = 0i64;
    c.wait_for("the scenario to start", Duration::from_secs(30), || {
        start_ms = c
            .psql("SELECT coalesce((extract(epoch FROM r.starts_at) * 1000)::bigint, 0) FROM scenario_runs r JOIN topologies t ON t.id = r.topology_id WHERE t.name = 'killed'")
            .parse()
            .unwrap_or(0);
        start_ms > 0
    });
    let ping = || {
        node_command(c, worker, "p", &["ping", "-c", "1", "-W", "1", "r"])
            .status
            .success()
    };
    let wait_until = |ms: i64| {
        let left = ms - unix_ms();
        if left > 0 {
            std::thread::sleep(Duration::from_millis(left as u64));
        }
    };
    // Before the kill p reaches r through q (when Ready came early enough to
    // look).
    if unix_ms() < start_ms + KILL_AT_S * 1000 - 1500 {
        assert!(ping(), "p cannot ping r before the kill");
    }
    // Held down: the worker restarted the agent long ago, but it has no config.
    wait_until(start_ms + KILL_AT_S * 1000 + 3000);
    let (mut tried, mut crossed) = (0, 0);
    while unix_ms() < start_ms + RESTART_AT_S * 1000 - 1500 {
        tried += 1;
        if ping() {
            crossed += 1;
        }
    }
    assert!(tried > 0, "no ping tried while q was held down");
    assert_eq!(
        crossed, 0,
        "{crossed} of {tried} pings crossed q while the scenario held it down"
    );
    wait_until(start_ms + RESTART_AT_S * 1000);
    c.wait_for(
        "p to reach r through the restarted q",
        Duration::from_secs(20),
        ping,
    );
    let back_after_ms = unix_ms() - (start_ms + RESTART_AT_S * 1000);
    // What PostgreSQL recorded: both events, on q, at their instants.
    let rows = c.psql(
        "SELECT a.idx, a.skew_us FROM scenario_applied a JOIN topologies t ON t.id = a.topology_id WHERE t.name = 'killed' AND a.node = 'q' AND a.error = '' ORDER BY a.idx",
    );
    let skews: Vec<(i64, i64)> = rows
        .lines()
        .filter_map(|l| {
            let (i, s) = l.split_once('|')?;
            Some((i.trim().parse().ok()?, s.trim().parse().ok()?))
        })
        .collect();
    println!(
        "scenario on the cluster: kill and restart skews {skews:?} µs; p reached r again {back_after_ms} ms after the restart"
    );
    assert_eq!(
        skews.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        [0, 1],
        "kill and restart not both recorded: {rows}"
    );
    // The kill: the agent's timer, then its stream ending at the hub. The
    // restart: the hub's own timer sending the config.
    assert!(
        (0..=100_000).contains(&skews[0].1),
        "the kill took effect {} µs from its instant",
        skews[0].1
    );
    assert!(
        (0..=10_000).contains(&skews[1].1),
        "the restart took effect {} µs from its instant",
        skews[1].1
    );
    c.ok(&["delete", "topology", "killed", "--timeout=120s"]);
}

/// One condition of a topology: (status, reason, message).
fn condition(c: &Cluster, topology: &str, type_: &str) -> (String, String, String) {
    let field = |f: &str| {
        c.ok(&[
            "get",
            "topology",
            topology,
            "-o",
            &format!(r#"jsonpath={{.status.conditions[?(@.type=="{type_}")].{f}}}"#),
        ])
    };
    (field("status"), field("reason"), field("message"))
}

/// The reasons of the Events on a topology.
fn event_reasons(c: &Cluster, topology: &str) -> String {
    c.ok(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.kind=Topology,involvedObject.name={topology}"),
        "-o",
        "jsonpath={.items[*].reason}",
    ])
}

/// Polls until `seen` holds, returning when it first did; panics with the
/// topology's conditions after `timeout`.
fn when(c: &Cluster, what: &str, timeout: Duration, mut seen: impl FnMut() -> bool) -> Instant {
    c.wait_for(what, timeout, &mut seen);
    Instant::now()
}

/// Issue 20.5: whatever stops a topology shows on it within seconds — Ready
/// false with a reason and the words of whoever refused, and an Event — for
/// an image that cannot be pulled, an object the API server refuses and a
/// worker killed under the topology.
fn failures_show_on_the_topology(c: &Cluster) {
    // An image nobody can pull. From the kubelet reporting it to the
    // topology saying it.
    let bad = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: badimage}\nspec:\n  placement: packed\n  nodesPerWorker: 2\n  workerImage: nextmini.invalid/no-such-image:0\n  nodes: [{name: p}, {name: q}]\n  links: [{endpoints: [p, q]}]\n";
    let applied = c.kubectl_stdin(&["apply", "-f", "-"], bad);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let pulled = when(
        c,
        "the kubelet to fail the pull",
        Duration::from_secs(120),
        || {
            let waiting = c.ok(&[
                "get",
                "pods",
                "-l",
                "nextmini.io/topology=badimage",
                "-o",
                "jsonpath={.items[*].status.containerStatuses[*].state.waiting.reason}",
            ]);
            // ErrImageNeverPull where the cluster pulls nothing (the suite's).
            ["ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"]
                .iter()
                .any(|r| waiting.contains(r))
        },
    );
    let shown = when(
        c,
        "the topology to name the pull failure",
        Duration::from_secs(30),
        || {
            let (status, reason, message) = condition(c, "badimage", "Ready");
            status == "False"
                && reason == "PodsFailing"
                && message.contains("badimage-worker-0 container worker: ")
                && message.contains("no-such-image")
        },
    );
    let pull_secs = shown.duration_since(pulled).as_secs_f64();
    let (_, _, message) = condition(c, "badimage", "Ready");
    println!(
        "a failed pull showed on the Topology {pull_secs:.1} s after the kubelet reported it: {message}"
    );
    assert!(pull_secs <= 10.0, "{pull_secs:.1} s");
    c.wait_for("a Degraded event", Duration::from_secs(10), || {
        event_reasons(c, "badimage").contains("Degraded")
    });
    c.ok(&["delete", "topology", "badimage", "--timeout=120s"]);

    // An object the API server refuses: a quota allowing no new Secret.
    let quota_made = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: nm-e2e-no-secrets}\nspec:\n  hard: {secrets: \"0\"}\n",
    );
    assert!(
        quota_made.status.success(),
        "{}",
        String::from_utf8_lossy(&quota_made.stderr)
    );
    let quota = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: quota2}}\nspec:\n  placement: packed\n  nodesPerWorker: 2\n  workerImage: {}\n  nodes: [{{name: p}}, {{name: q}}]\n  links: [{{endpoints: [p, q]}}]\n",
        worker_image()
    );
    let t = Instant::now();
    let applied = c.kubectl_stdin(&["apply", "-f", "-"], &quota);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let shown = when(
        c,
        "the topology to show the refusal",
        Duration::from_secs(30),
        || {
            let (status, reason, message) = condition(c, "quota2", "Ready");
            status == "False"
                && reason == "Forbidden"
                && message.contains("exceeded quota: nm-e2e-no-secrets")
        },
    );
    let (_, _, message) = condition(c, "quota2", "Ready");
    println!(
        "a refused Secret showed on the Topology {:.1} s after kubectl apply: {message}",
        shown.duration_since(t).as_secs_f64()
    );
    assert!(shown.duration_since(t) <= Duration::from_secs(10));
    c.wait_for("a Forbidden event", Duration::from_secs(10), || {
        event_reasons(c, "quota2").contains("Forbidden")
    });
    // Nothing half-made: no pod, no row.
    assert_eq!(
        c.ok(&[
            "get",
            "pods",
            "-l",
            "nextmini.io/topology=quota2",
            "-o",
            "name"
        ])
        .trim(),
        ""
    );
    assert_eq!(
        c.psql("SELECT count(*) FROM topologies WHERE name = 'quota2'"),
        "0"
    );
    // The quota gone, the retries succeed by themselves.
    c.ok(&["delete", "resourcequota", "nm-e2e-no-secrets"]);
    let t = Instant::now();
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "topology/quota2",
        "--timeout=180s",
    ]);
    println!(
        "quota2 Ready {:.1} s after the quota went",
        t.elapsed().as_secs_f64()
    );
    c.ok(&["delete", "topology", "quota2", "--timeout=120s"]);

    // A worker killed under a running topology (as the OOM killer would).
    c.ok(&[
        "exec",
        "packed6-worker-1",
        "--",
        "sh",
        "-c",
        "kill -KILL $(pidof nextmini)",
    ]);
    let t = Instant::now();
    let shown = when(
        c,
        "the topology to name the restarted worker",
        Duration::from_secs(30),
        || {
            let (status, _, message) = condition(c, "packed6", "Degraded");
            status == "True"
                && message.contains(
                    "packed6-worker-1 container worker: restarted 1 time(s), last exit 137",
                )
        },
    );
    let (_, reason, message) = condition(c, "packed6", "Degraded");
    println!(
        "a killed worker showed on the Topology {:.1} s after the kill: {reason}: {message}",
        shown.duration_since(t).as_secs_f64()
    );
    assert!(shown.duration_since(t) <= Duration::from_secs(10));
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "topology/packed6",
        "--timeout=120s",
    ]);
    println!(
        "packed6 Ready again {:.1} s after the kill",
        t.elapsed().as_secs_f64()
    );
}

//! Seeing the network, end to end: a real Prometheus (Debian's) scrapes the
//! hub's one endpoint while traffic crosses a five-node topology. Every PromQL
//! query of every Grafana dashboard returns data, every SQL query runs against
//! the store, and every metric of the contract exists with its labels. The CLI
//! views (`status -o yaml|json`, `top --once`, `graph -o mermaid|dot|html`) show
//! the same network, and headless Chromium renders the HTML graph.
//!
//! Set NEXTMINI_UPDATE_SCREENSHOTS=1 to copy the rendered graph to
//! docs/topology-graph.png.

use nextmini_e2e::{Env, repo_path};
use nextmini_operator::observe::dashboards::{self, Language};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOPOLOGY: &str = "observe";

/// a — b is shaped to 20 Mbit/s and carries the test's traffic; d — e is shaped
/// too; b — d is unshaped. Two paths from a to e, for a graph worth looking at.
const MANIFEST: &str = "\
apiVersion: nextmini.io/v1alpha1
kind: Topology
metadata: {name: observe}
spec:
  nodes: [{name: a}, {name: b}, {name: c}, {name: d}, {name: e}]
---
apiVersion: nextmini.io/v1alpha1
kind: Link
metadata: {name: a-b}
spec: {topology: observe, endpoints: [a, b], rate: 20Mbit}
---
apiVersion: nextmini.io/v1alpha1
kind: Link
metadata: {name: b-c}
spec: {topology: observe, endpoints: [b, c], rate: 100Mbit}
---
apiVersion: nextmini.io/v1alpha1
kind: Link
metadata: {name: b-d}
spec: {topology: observe, endpoints: [b, d]}
---
apiVersion: nextmini.io/v1alpha1
kind: Link
metadata: {name: c-e}
spec: {topology: observe, endpoints: [c, e], rate: 100Mbit}
---
apiVersion: nextmini.io/v1alpha1
kind: Link
metadata: {name: d-e}
spec: {topology: observe, endpoints: [d, e], rate: 10Mbit}
";

/// Families that need synthetic flows to have samples: their queries must be
/// accepted by Prometheus, and the family must be exported, but they cannot
/// return data until the flow engine reports completions.
const AWAITING_SYNTHETIC_FLOWS: [&str; 1] = ["nextmini_flow_completion_seconds"];

/// Label values of which every one must occur.
type Values = Vec<(&'static str, Vec<&'static str>)>;

/// The metric contract: name, labels every series has, and label values that
/// must all occur.
fn contract() -> Vec<(&'static str, Vec<&'static str>, Values)> {
    let link = vec!["topology", "node", "link"];
    let agent = vec!["topology", "node"];
    let dir = || vec![("direction", vec!["tx", "rx"])];
    vec![
        ("nextmini_link_bytes_total", link.clone(), dir()),
        ("nextmini_link_packets_total", link.clone(), dir()),
        (
            "nextmini_link_drops_total",
            link.clone(),
            vec![("cause", vec!["handoff", "queue", "aqm", "loss", "loop"])],
        ),
        ("nextmini_link_ecn_marks_total", link.clone(), vec![]),
        ("nextmini_link_queue_packets", link.clone(), vec![]),
        ("nextmini_link_queue_bytes", link.clone(), vec![]),
        ("nextmini_link_rate_bits_per_second", link.clone(), vec![]),
        ("nextmini_link_rtt_seconds", link.clone(), vec![]),
        ("nextmini_link_up", link.clone(), vec![]),
        ("nextmini_link_connects_total", link.clone(), vec![]),
        ("nextmini_agent_stream_connected", agent.clone(), vec![]),
        ("nextmini_agent_generation", agent.clone(), vec![]),
        ("nextmini_agent_tun_packets_total", agent.clone(), dir()),
        (
            "nextmini_agent_tun_super_packets_total",
            agent.clone(),
            dir(),
        ),
        (
            "nextmini_agent_drops_total",
            agent.clone(),
            vec![(
                "cause",
                vec!["no_route", "hop_limit", "ttl_expired", "malformed"],
            )],
        ),
        ("nextmini_hub_connected_agents", vec!["topology"], vec![]),
        (
            "nextmini_hub_control_delta_seconds_bucket",
            vec!["le"],
            vec![],
        ),
        ("nextmini_hub_db_write_seconds_bucket", vec!["le"], vec![]),
        ("nextmini_hub_reports_total", vec![], vec![]),
        (
            "nextmini_hub_reconciles_total",
            vec!["result"],
            vec![("result", vec!["applied", "failed"])],
        ),
        ("nextmini_hub_scrape_errors_total", vec![], vec![]),
    ]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// GET with curl; body, or None on an HTTP error.
fn http_get(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "5", url])
        .output()
        .expect("running curl");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A Prometheus with its own data directory, killed and removed on drop (also
/// when the test fails).
struct Prometheus {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Prometheus {
    fn start(dir: PathBuf, scrape: &str) -> Prometheus {
        std::fs::create_dir_all(dir.join("data")).expect("prometheus dir");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: nextmini\n    static_configs:\n      - targets: ['{scrape}']\n"
            ),
        )
        .expect("prometheus config");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting prometheus (scripts/setup.sh installs it)");
        Prometheus { child, dir, port }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query: the API's `data.result`, or a panic naming the query.
    fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10", "--get", "--data-urlencode"])
            .arg(format!("query={promql}"))
            .arg(format!("http://127.0.0.1:{}/api/v1/query", self.port))
            .output()
            .expect("running curl");
        let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "Prometheus gave no JSON for {promql:?} ({e}): {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                self.log()
            )
        });
        assert_eq!(
            body["status"], "success",
            "Prometheus refused {promql:?}: {body}"
        );
        body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn dashboard_files() -> Vec<(String, serde_json::Value)> {
    let dir = repo_path("grafana/dashboards");
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .expect("grafana/dashboards")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let d = serde_json::from_str(&std::fs::read_to_string(&p).expect("dashboard"))
                .expect("dashboard JSON");
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                d,
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Values for the dashboards' variables, each in the form its place needs.
const PROMQL_VALUES: [(&str, &str); 7] = [
    ("topology", TOPOLOGY),
    ("link", "a-b"),
    ("node", ".*"),
    ("__rate_interval", "10s"),
    ("__interval", "1s"),
    ("__range", "1m"),
    ("prometheus", "nextmini-prometheus"),
];
const SQL_VALUES: [(&str, &str); 1] = [("topology", "'observe'")];

fn check_dashboards(env: &Env, prometheus: &Prometheus) {
    let mut checked = 0;
    for (file, d) in dashboard_files() {
        let mut queries = dashboards::queries(&d);
        queries.extend(dashboards::variable_queries(&d));
        for q in queries {
            let at = format!("{file}: {} ({})", q.panel, q.ref_id);
            match q.language {
                Language::PromQl => {
                    let promql = match dashboards::label_values(&q.text) {
                        Some((selector, label)) => format!("count by ({label}) ({selector})"),
                        None => q.text.clone(),
                    };
                    let promql = dashboards::substitute(&promql, &PROMQL_VALUES);
                    let result = prometheus.query(&promql);
                    let awaiting = dashboards::metric_names(&promql)
                        .iter()
                        .any(|m| AWAITING_SYNTHETIC_FLOWS.iter().any(|f| m.starts_with(f)));
                    assert!(awaiting || !result.is_empty(), "{at}: no data for {promql}");
                }
                Language::Sql => {
                    let sql = dashboards::substitute(&q.text, &SQL_VALUES);
                    let rows = env.psql(&sql);
                    let wanted = match q.ref_id.as_str() {
                        "nodes" => Some(5),
                        "edges" => Some(5),
                        "topology" => Some(1),
                        _ => None,
                    };
                    if let Some(n) = wanted {
                        assert!(
                            rows.lines().count() >= n,
                            "{at}: {n} rows expected from\n{sql}\ngot:\n{rows}"
                        );
                    }
                    if q.ref_id == "edges" {
                        assert!(
                            rows.lines().any(|r| r.starts_with("a-b|a|b|")),
                            "{at}: edge a-b from a to b:\n{rows}"
                        );
                    }
                }
            }
            checked += 1;
        }
    }
    println!("{checked} dashboard queries return data");
    assert!(checked > 30, "only {checked} queries found");
}

fn check_contract(prometheus: &Prometheus, endpoint: &str) {
    for (metric, labels, values) in contract() {
        let series = prometheus.query(metric);
        assert!(
            !series.is_empty(),
            "{metric}: no series (up: {:?}, scrape errors: {:?}, scrape duration: {:?})\n{}",
            prometheus.query("up"),
            prometheus.query("nextmini_hub_scrape_errors_total"),
            prometheus.query("scrape_duration_seconds"),
            prometheus.log()
        );
        let mut seen: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for s in &series {
            let m = &s["metric"];
            for l in &labels {
                assert!(
                    m[*l].as_str().is_some_and(|v| !v.is_empty()),
                    "{metric}: series {m} lacks label {l}"
                );
            }
            for (l, _) in &values {
                if let Some(v) = m[*l].as_str() {
                    seen.entry(l).or_default().insert(v.to_string());
                }
            }
            if labels.contains(&"node") {
                assert_eq!(m["topology"], TOPOLOGY, "{metric}: {m}");
            }
        }
        for (l, wanted) in &values {
            for w in wanted {
                assert!(
                    seen.get(l).is_some_and(|s| s.contains(*w)),
                    "{metric}: no series with {l}={w:?}"
                );
            }
        }
    }
    // Every link end reports: five links, two ends each.
    assert_eq!(prometheus.query("nextmini_link_up == 1").len(), 10);
    assert_eq!(
        prometheus
            .query("nextmini_agent_stream_connected == 1")
            .len(),
        5
    );
    let text = http_get(&format!("http://{endpoint}/metrics")).expect("endpoint");
    assert!(
        text.contains("# TYPE nextmini_flow_completion_seconds histogram"),
        "the FCT histogram family is exported"
    );
    assert_eq!(
        text.matches("# TYPE nextmini_link_bytes counter").count(),
        1,
        "one family per name across agents"
    );
    assert!(text.ends_with("# EOF\n"));
}

/// Renders `html` with headless Chromium into a PNG in `dir`; returns its path.
fn screenshot(html: &Path, dir: &Path) -> PathBuf {
    let png = dir.join("topology-graph.png");
    let profile = dir.join("chromium-profile");
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1280,820",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own group: on a hang the whole browser (zygote, renderers) goes.
        .process_group(0)
        .spawn()
        .expect("starting chromium (scripts/setup.sh installs it)");
    let deadline = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for chromium") {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Whatever helper processes are left of the browser.
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
    assert!(
        status.is_some_and(|s| s.success()),
        "chromium did not render the graph"
    );
    png
}

#[test]
fn prometheus_grafana_and_the_cli_see_the_network() {
    let started = Instant::now();
    let mut env = Env::new("observe");
    let endpoint = format!("127.0.0.1:{}", free_port());
    let manifest = env.state_dir.join("observe.yaml");
    std::fs::write(&manifest, MANIFEST).expect("manifest");
    let out = env
        .command(&["up", "-f", manifest.to_str().expect("path")])
        .env("NEXTMINI_METRICS_ADDR", &endpoint)
        .output()
        .expect("nextmini up");
    assert!(
        out.status.success(),
        "up failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Each agent serves its metrics on a private socket; the hub lists them for
    // file service discovery.
    for node in ["a", "b", "c", "d", "e"] {
        let socket = env
            .state_dir
            .join(format!("metrics/{TOPOLOGY}/{node}.sock"));
        let mode = std::fs::metadata(&socket)
            .unwrap_or_else(|e| panic!("{}: {e}", socket.display()))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{} is private", socket.display());
    }
    env.wait_for("targets.json", Duration::from_secs(10), || {
        std::fs::read_to_string(env.state_dir.join("metrics/targets.json"))
            .is_ok_and(|t| t.contains("/agents/observe/e/metrics"))
    });
    let one = http_get(&format!("http://{endpoint}/agents/{TOPOLOGY}/a/metrics"))
        .expect("one agent's metrics");
    assert!(one.contains(
        "nextmini_link_bytes_total{topology=\"observe\",node=\"a\",link=\"a-b\",direction=\"tx\"}"
    ));

    let prometheus = Prometheus::start(env.state_dir.join("prometheus"), &endpoint);

    // Traffic through the shaped a — b while Prometheus scrapes and the CLI looks.
    env.spawn_in("e", &["iperf3", "-s", "-1"]);
    env.wait_for("iperf3 to listen in e", Duration::from_secs(10), || {
        String::from_utf8_lossy(&env.exec("e", &["ss", "-ltn"]).stdout).contains(":5201")
    });
    env.spawn_in("a", &["iperf3", "-c", "e", "-t", "8"]);
    env.wait_for("a — b to carry traffic", Duration::from_secs(15), || {
        let status: serde_json::Value =
            serde_json::from_str(&env.ok(&["status", "-o", "json"])).expect("status json");
        status["topologies"][0]["links"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|l| {
                l["name"] == "a-b"
                    && l["load"]["forward"]["utilisation"]
                        .as_f64()
                        .is_some_and(|u| u > 0.3)
            })
    });
    let html = env.ok(&["graph", "-o", "html"]);
    let top = env.ok(&["top", "--once"]);
    println!("{top}");
    assert!(top.contains("a → b") && top.contains("%"), "{top}");

    let yaml = env.ok(&["status", "-o", "yaml"]);
    assert!(
        yaml.contains("topologies:") && yaml.contains("name: a-b"),
        "{yaml}"
    );
    let mermaid = env.ok(&["graph", "-o", "mermaid"]);
    assert!(mermaid.contains("graph LR") && mermaid.contains("linkStyle 4"));
    let dot = env.ok(&["graph", "-o", "dot", TOPOLOGY]);
    assert!(dot.contains("\"a\" -- \"b\""), "{dot}");
    let live = http_get(&format!("http://{endpoint}/graph/{TOPOLOGY}.json")).expect("live graph");
    let live: serde_json::Value = serde_json::from_str(&live).expect("graph JSON");
    assert_eq!(live["nodes"].as_array().map(Vec::len), Some(5));

    // Enough scrapes for rates over the dashboards' windows.
    env.wait_for("Prometheus to scrape", Duration::from_secs(20), || {
        prometheus
            .query("count_over_time(nextmini_hub_reports_total[1m])")
            .first()
            .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok())
            .is_some_and(|n| n >= 6.0)
    });
    check_contract(&prometheus, &endpoint);
    check_dashboards(&env, &prometheus);
    assert_eq!(
        prometheus
            .query("nextmini_hub_reconciles_total{result=\"applied\"} >= 1")
            .len(),
        1,
        "the up was counted"
    );

    let shots = env.state_dir.join("shots");
    std::fs::create_dir_all(&shots).expect("shots dir");
    let page = shots.join("graph.html");
    std::fs::write(&page, &html).expect("graph.html");
    let png = screenshot(&page, &shots);
    let bytes = std::fs::read(&png).expect("png");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        bytes.len() > 20_000,
        "the graph was drawn ({} bytes)",
        bytes.len()
    );
    if std::env::var_os("NEXTMINI_UPDATE_SCREENSHOTS").is_some() {
        std::fs::copy(&png, repo_path("docs/topology-graph.png")).expect("docs/");
    }

    // A dead agent's socket (its agent killed before it could remove it; here
    // one nobody listens on) is left out of the scrape and counted, and the
    // agents still answer. Killing a real agent would not do: the hub's
    // supervisor restarts it.
    let errors = |text: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix("nextmini_hub_scrape_errors_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1.0)
    };
    let before = errors(&http_get(&format!("http://{endpoint}/hub/metrics")).expect("hub"));
    let dead = env.state_dir.join(format!("metrics/{TOPOLOGY}/gone.sock"));
    drop(std::os::unix::net::UnixListener::bind(&dead).expect("a socket nobody serves"));
    let text = http_get(&format!("http://{endpoint}/metrics")).expect("still served");
    let reporting: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.split("node=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        reporting,
        BTreeSet::from(["a", "b", "c", "d", "e"]),
        "every live agent answers"
    );
    assert!(errors(&text) > before, "the dead socket was counted");
    let _ = std::fs::remove_file(&dead);

    drop(prometheus);
    env.ok(&["down"]);
    assert!(
        !env.state_dir.join(format!("metrics/{TOPOLOGY}")).exists(),
        "down removes the agents' sockets"
    );
    println!("observability e2e took {:?}", started.elapsed());
}

#[test]
fn completions_and_containerlab_import() {
    // No root or running network needed, but the harness's binaries are.
    let env = Env::new("observe-cli");
    for shell in ["bash", "zsh", "fish"] {
        let script = env.ok(&["completions", shell]);
        assert!(
            script.contains("nextmini") && script.contains("graph"),
            "{shell}"
        );
    }
    let clab = env.state_dir.join("lab.clab.yml");
    std::fs::write(
        &clab,
        "name: lab\ntopology:\n  nodes:\n    r1: {kind: linux}\n    r2: {kind: linux}\n    r3: {kind: linux}\n  \
         links:\n    - endpoints: [\"r1:eth1\", \"r2:eth1\"]\n    - endpoints: [\"r2:eth2\", \"r3:eth1\"]\n",
    )
    .expect("clab file");
    let manifest = env.ok(&["import", "containerlab", clab.to_str().expect("path")]);
    let converted = env.state_dir.join("lab.yaml");
    std::fs::write(&converted, &manifest).expect("manifest");
    let plan = env.ok(&["plan", "-f", converted.to_str().expect("path")]);
    assert!(plan.contains("topology lab (3 nodes, 2 links)"), "{plan}");

    let broken = env.state_dir.join("broken.clab.yml");
    std::fs::write(
        &broken,
        "name: lab\ntopology:\n  nodes: {r1: {}}\n  links:\n    - endpoints: [\"r1:eth1\", \"r9:eth1\"]\n",
    )
    .expect("clab file");
    let out = env.run(&["import", "containerlab", broken.to_str().expect("path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("topology.links[0].endpoints[1]") && stderr.contains("r9"),
        "{stderr}"
    );
}

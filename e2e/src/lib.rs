//! Harness for the end-to-end suites: drives the real `nextmini` binary with a
//! private state directory and PostgreSQL port, and looks at the machine (namespaces,
//! interfaces, processes, rows) to check what it left behind. Dropping an [`Env`]
//! tears everything down, also when a test fails.

pub mod bench;
pub mod kube;
pub mod load;
pub mod udp_sink;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Env {
    pub state_dir: PathBuf,
    pub pg_port: u16,
    bin_dir: PathBuf,
    background: Vec<Child>,
}

const STATE_DIR_PREFIX: &str = "nextmini-e2e-";

fn pg_port_for(pid: u32) -> u16 {
    56000 + (pid % 1000) as u16
}

/// Where cargo put the binaries: next to this test's `deps/` directory, unless
/// NEXTMINI_BIN_DIR says otherwise.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("NEXTMINI_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf()
}

impl Env {
    /// A fresh environment. Needs root; the binaries must be built
    /// (`cargo build --workspace`, which `make test` does first).
    pub fn new(name: &str) -> Env {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the e2e suite needs root (network namespaces, TUN)"
        );
        let bin_dir = bin_dir();
        for bin in ["nextmini", "nextmini-agent"] {
            assert!(
                bin_dir.join(bin).exists(),
                "{} is missing: run `cargo build --workspace` first",
                bin_dir.join(bin).display()
            );
        }
        sweep_dead_runs(&bin_dir);
        let state_dir =
            std::env::temp_dir().join(format!("{STATE_DIR_PREFIX}{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state_dir);
        std::fs::create_dir_all(&state_dir).expect("state dir");
        // Private state dirs live under /tmp; PostgreSQL (another user) must reach them.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        Env {
            state_dir,
            pg_port: pg_port_for(std::process::id()),
            bin_dir,
            background: Vec::new(),
        }
    }

    /// The agent binary under test.
    pub fn agent_bin(&self) -> PathBuf {
        self.bin_dir.join("nextmini-agent")
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("nextmini"));
        cmd.args(args)
            .env("NEXTMINI_STATE_DIR", &self.state_dir)
            .env("NEXTMINI_PG_PORT", self.pg_port.to_string())
            .env("NEXTMINI_AGENT_BIN", self.bin_dir.join("nextmini-agent"))
            .env_remove("NEXTMINI_DATABASE_URL")
            .stdin(Stdio::null());
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("running nextmini")
    }

    /// Runs `nextmini args…`, fails the test unless it succeeds, returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "nextmini {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `nextmini exec <node> -- <command…>`.
    pub fn exec(&self, node: &str, command: &[&str]) -> Output {
        let mut args = vec!["exec", node, "--"];
        args.extend_from_slice(command);
        self.run(&args)
    }

    /// Serves `dir` with `python3 -m http.server 8000` inside `node`, in the
    /// background; it is stopped when the environment is dropped.
    pub fn serve_http(&mut self, node: &str, dir: &Path) {
        let dir = dir.to_str().expect("UTF-8 path").to_string();
        self.spawn_in(
            node,
            &["python3", "-m", "http.server", "8000", "--directory", &dir],
        );
    }

    /// Asserts that `from` gets answers to `ping` from every one of `targets`.
    pub fn assert_pings(&self, from: &str, targets: &[&str]) {
        for target in targets {
            let out = self.exec(from, &["ping", "-c", "3", "-W", "5", target]);
            assert!(
                out.status.success(),
                "{from} cannot ping {target}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }

    /// The body curl in `client` gets for `path` from the HTTP server of `server`.
    pub fn http_get(&self, client: &str, server: &str, path: &str, max_secs: u32) -> String {
        let url = format!("http://{server}:8000/{path}");
        let out = self.exec(
            client,
            &[
                "curl",
                "-s",
                "--fail",
                "--max-time",
                &max_secs.to_string(),
                &url,
            ],
        );
        assert!(out.status.success(), "curl {client} → {url} failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until curl in `client` gets an answer from the HTTP server of `server`.
    pub fn wait_for_http(&self, client: &str, server: &str) {
        let url = format!("http://{server}:8000/");
        self.wait_for(
            &format!("the HTTP server in {server}"),
            Duration::from_secs(20),
            || {
                self.exec(
                    client,
                    &[
                        "curl",
                        "-s",
                        "--fail",
                        "-o",
                        "/dev/null",
                        "--max-time",
                        "2",
                        &url,
                    ],
                )
                .status
                .success()
            },
        );
    }

    /// Starts `nextmini exec <node> -- <command…>` in the background; it is
    /// killed when the environment is dropped.
    pub fn spawn_in(&mut self, node: &str, command: &[&str]) -> u32 {
        let mut args = vec!["exec", node, "--"];
        args.extend_from_slice(command);
        let child = self
            .command(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning in node");
        let pid = child.id();
        self.background.push(child);
        pid
    }

    /// The Prometheus text an agent serves on its private metrics socket
    /// (empty if it does not answer).
    pub fn agent_metrics(&self, topology: &str, node: &str) -> String {
        let socket = self
            .state_dir
            .join(format!("metrics/{topology}/{node}.sock"));
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "5", "--unix-socket"])
            .arg(&socket)
            .arg("http://agent/metrics")
            .output()
            .expect("running curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A query against the private PostgreSQL, rows as `|`-separated lines.
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql)
            .unwrap_or_else(|e| panic!("psql {sql:?}: {e}"))
    }

    /// A statement as a control script sends it (psql, no operator mark): the
    /// rows as `|`-separated lines, or the database's error text.
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new("psql")
            .args(["-h"])
            .arg(self.state_dir.join("postgres-run"))
            .args([
                "-p",
                &self.pg_port.to_string(),
                "-U",
                "postgres",
                "-d",
                "nextmini",
                "-v",
                "ON_ERROR_STOP=1",
                "-tAc",
                sql,
            ])
            .output()
            .expect("running psql");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// The private PostgreSQL's URL, as `nextmini db url` prints it.
    pub fn database_url(&self) -> String {
        self.ok(&["db", "url"]).trim().to_string()
    }

    pub fn hub_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.state_dir.join("hub.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    pub fn postgres_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.state_dir.join("postgres/postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// `nextmini up -f` of `yaml` (written to the state directory), then waits up to
    /// 10 s until every agent of `topology` runs it: how a test changes a running
    /// topology as a user would.
    pub fn apply_yaml(&self, topology: &str, yaml: &str) {
        let path = self.state_dir.join(format!("{topology}.yaml"));
        std::fs::write(&path, yaml).expect("manifest");
        self.ok(&["up", "-f", path.to_str().expect("path")]);
        self.wait_for(
            "agents to apply the change",
            Duration::from_secs(10),
            || all_acked(self, topology),
        );
    }

    /// Polls `check` every 100 ms until it returns true or `limit` passes.
    pub fn wait_for(&self, what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if check() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("timed out after {limit:?} waiting for {what}");
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for child in &mut self.background {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Only this environment's topologies: other suites, benchmarks or users
        // may have theirs on the same machine.
        let _ = self.run(&["down"]);
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// Tears down what harness runs that died without dropping their [`Env`]
/// (`kill -9`, a timeout) left behind: their state directories name their pid,
/// and a directory whose process is gone is taken down with its own state.
fn sweep_dead_runs(bin_dir: &Path) {
    for entry in list_dir(&std::env::temp_dir().to_string_lossy()) {
        let Some(rest) = entry.strip_prefix(STATE_DIR_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.rsplit('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = std::env::temp_dir().join(&entry);
        let _ = Command::new(bin_dir.join("nextmini"))
            .arg("down")
            .env("NEXTMINI_STATE_DIR", &dir)
            .env("NEXTMINI_PG_PORT", pg_port_for(pid).to_string())
            .env("NEXTMINI_AGENT_BIN", bin_dir.join("nextmini-agent"))
            .env_remove("NEXTMINI_DATABASE_URL")
            .stdin(Stdio::null())
            .output();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Network namespaces on this machine that Nextmini made (`nm-<tag>-<node>`).
pub fn our_namespaces() -> Vec<String> {
    list_dir("/run/netns")
        .into_iter()
        .filter(|n| n.starts_with("nm-"))
        .collect()
}

/// Host interfaces that Nextmini made (`nm<tag>-…`).
pub fn our_interfaces() -> Vec<String> {
    list_dir("/sys/class/net")
        .into_iter()
        .filter(|n| {
            n.len() > 7 && n.starts_with("nm") && n[2..7].bytes().all(|c| c.is_ascii_hexdigit())
        })
        .collect()
}

/// Namespaces of one topology's nodes (its underlay's is in [`interfaces_of`]).
pub fn namespaces_of(topology: &str) -> Vec<String> {
    let prefix = nextmini_operator::runtime::names::netns_prefix(topology);
    our_namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .filter(|n| !nextmini_operator::runtime::names::is_underlay_netns(n))
        .collect()
}

/// Entries of one topology under /etc/netns (its nodes' directories and its
/// shared hosts file).
pub fn etc_netns_of(topology: &str) -> Vec<String> {
    let prefix = nextmini_operator::runtime::names::netns_prefix(topology);
    list_dir("/etc/netns")
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Where one topology's bridges and veth ends are outside its nodes: the host
/// interfaces of its name, and its underlay namespace, which holds them.
pub fn interfaces_of(topology: &str) -> Vec<String> {
    let mut found = host_interfaces_of(topology);
    let underlay = nextmini_operator::runtime::names::underlay_netns(topology);
    if Path::new("/run/netns").join(&underlay).exists() {
        found.push(format!("namespace {underlay}"));
    }
    found
}

/// Host interfaces of one topology: none, as its underlay has a namespace.
pub fn host_interfaces_of(topology: &str) -> Vec<String> {
    let prefix = nextmini_operator::runtime::names::link_prefix(topology);
    our_interfaces()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Pids of the running agents of one topology.
pub fn agent_pids_of(topology: &str) -> Vec<i32> {
    agent_pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0)
                    .collect::<Vec<_>>()
                    .windows(2)
                    .any(|w| w[0] == b"--topology" && w[1] == topology.as_bytes())
            })
        })
        .collect()
}

/// Pids of running `nextmini-agent` processes.
pub fn agent_pids() -> Vec<i32> {
    list_dir("/proc")
        .into_iter()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    c.split(|b| *b == 0)
                        .next()
                        .is_some_and(|a| a.ends_with(b"nextmini-agent"))
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Whether the process exists and is not a zombie.
pub fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

pub fn kill9(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

fn list_dir(dir: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Path of a file in the repository (for example manifests).
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

pub fn sha256_file(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(path).expect("reading file to hash");
    hex::encode(Sha256::digest(bytes))
}

/// Runs `iperf3 -J …` as a client in `node` and returns its JSON report.
pub fn iperf3(env: &Env, node: &str, args: &[&str]) -> serde_json::Value {
    let mut command = vec!["iperf3", "-J"];
    command.extend_from_slice(args);
    let out = env.exec(node, &command);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3 {args:?} in {node} gave no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success() && report.get("error").is_none(),
        "iperf3 {args:?} in {node} failed: {}",
        report["error"]
    );
    report
}

/// Receiver-side goodput of a TCP iperf3 run, in bit/s.
pub fn tcp_goodput(report: &serde_json::Value) -> f64 {
    report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .expect("iperf3 report has end.sum_received")
}

/// TCP payload per packet over IPv4 with timestamps, for an `mtu`-byte packet:
/// what a shaper counting IP bytes leaves for iperf3 to measure.
pub fn tcp_payload_ratio(mtu: u32) -> f64 {
    f64::from(mtu - 20 - 32) / f64::from(mtu)
}

/// Average round-trip time of `count` pings from `node` to `target`, in ms.
pub fn ping_avg_ms(env: &Env, node: &str, target: &str, count: u32) -> f64 {
    let count = count.to_string();
    let out = env.exec(
        node,
        &["ping", "-q", "-c", &count, "-i", "0.05", "-W", "2", target],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ping {target} from {node} failed: {text}"
    );
    ping_summary_avg_ms(&text)
}

/// The median RTT of `count` pings from `node` to `target`, from each reply's
/// `time=`: a fixed delay shows in full, while one reply that waited for a
/// busy CPU moves it no more than any other (it can move a mean by 0.5 ms).
pub fn ping_median_ms(env: &Env, node: &str, target: &str, count: u32) -> f64 {
    let count = count.to_string();
    let out = env.exec(
        node,
        &["ping", "-c", &count, "-i", "0.05", "-W", "2", target],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ping {target} from {node} failed: {text}"
    );
    let mut rtts: Vec<f64> = text
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("time="))
        .filter_map(|v| v.parse().ok())
        .collect();
    assert!(!rtts.is_empty(), "no replies in ping output: {text}");
    rtts.sort_by(f64::total_cmp);
    rtts[rtts.len() / 2]
}

/// The average RTT from ping's summary line
/// (`rtt min/avg/max/mdev = 0.051/0.062/0.080/0.009 ms`).
pub fn ping_summary_avg_ms(text: &str) -> f64 {
    text.lines()
        .find(|l| l.contains("min/avg/max"))
        .and_then(|l| l.split('=').nth(1))
        .and_then(|v| v.trim().split('/').nth(1))
        .and_then(|avg| avg.parse().ok())
        .unwrap_or_else(|| panic!("no rtt summary in ping output: {text}"))
}

/// The start of `topology`'s timed scenario, µs since the Unix epoch, once
/// the hub has chosen it (waits up to 15 s).
pub fn scenario_start_us(env: &Env, topology: &str) -> i64 {
    let mut start = String::new();
    env.wait_for("the scenario to start", Duration::from_secs(15), || {
        start = env.psql(&format!(
            "SELECT (extract(epoch FROM r.starts_at) * 1e6)::bigint FROM scenario_runs r \
             JOIN topologies t ON t.id = r.topology_id WHERE t.name = '{topology}'"
        ));
        !start.is_empty()
    });
    start.parse().expect("start")
}

/// One topology's row of `link_counters` for (link, node), as named columns;
/// `topology` is its key (`namespace/name`, or the bare name).
pub fn link_counter(env: &Env, topology: &str, link: &str, node: &str, column: &str) -> i64 {
    let allowed = [
        "tx_bytes",
        "rx_bytes",
        "drops",
        "drops_queue",
        "drops_aqm",
        "drops_loss",
        "drops_loop",
        "ecn_marks",
        "connects",
    ];
    assert!(allowed.contains(&column), "unknown counter column {column}");
    env.psql(&format!(
        "SELECT COALESCE(max(c.{column}), 0) FROM link_counters c JOIN topologies t ON t.id = c.topology_id \
         WHERE t.key = '{topology}' AND c.link = '{link}' AND c.node = '{node}'"
    ))
    .parse()
    .unwrap_or(0)
}

/// The fidelity guard's episodes of a topology so far, each as
/// `link node→peer: reason` (oldest first).
pub fn fidelity_episodes(env: &Env, topology: &str) -> Vec<String> {
    env.psql(&format!(
        "SELECT e.link || ' ' || e.node || '→' || e.peer || ': ' || e.reason \
         FROM fidelity_episodes e JOIN topologies t ON t.id = e.topology_id \
         WHERE t.name = '{topology}' ORDER BY e.id"
    ))
    .lines()
    .filter(|l| !l.is_empty())
    .map(str::to_owned)
    .collect()
}

/// The share of a window below which the agent's threads waiting for a CPU
/// is not the host's doing: two agents, iperf3 at both ends, the hub and
/// PostgreSQL on two cores wait a few percent of any busy second.
const HOST_CONTENTION_SHARE: f64 = 0.10;

/// The episodes the guard did not pin on the host: those whose reason does not
/// say the agent's threads waited for a CPU for at least a tenth of the window
/// (with no CPU limit of ours in the way). Such an episode is the guard
/// telling the truth about a shared test machine, not a false alarm: a CI
/// window with 0.24 s of 1 s spent waiting for a CPU made 6% of a 500 Mbit/s
/// link's packets leave 1-4.5 ms late while the flow still got its rate.
pub fn episodes_not_from_host_contention(episodes: &[String]) -> Vec<String> {
    episodes
        .iter()
        .filter(|e| {
            waited_share(e).is_none_or(|share| share < HOST_CONTENTION_SHARE)
                || e.contains("its CPU limit stopped it")
        })
        .cloned()
        .collect()
}

/// `waited / window` from "... in W s its threads waited X s for a CPU".
fn waited_share(reason: &str) -> Option<f64> {
    let (_, rest) = reason.split_once("the agent had too little CPU: in ")?;
    let (window, rest) = rest.split_once(" s its threads waited ")?;
    let (waited, _) = rest.split_once(" s for a CPU")?;
    let window: f64 = window.trim().parse().ok()?;
    let waited: f64 = waited.trim().parse().ok()?;
    (window > 0.0).then(|| waited / window)
}

/// Generation of a topology and whether every agent has acknowledged it.
pub fn all_acked(env: &Env, topology: &str) -> bool {
    env.psql(&format!(
        "SELECT bool_and(n.acked_generation >= t.generation AND n.agent_state = 'connected') \
         FROM nodes n JOIN topologies t ON t.id = n.topology_id WHERE t.name = '{topology}'"
    )) == "t"
}

/// Writes `len` pseudo-random bytes (xorshift64*, seeded): incompressible
/// enough that nothing on the path can cheat, and different per `seed`.
pub fn write_random_file(path: &Path, len: usize, seed: u64) {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15 ^ seed;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        data.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    data.truncate(len);
    std::fs::write(path, data).expect("writing test file");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_episodes_with_a_busy_host_are_put_down_to_it() {
        let ci = "a-b a→b: 2716 of 43098 packets (6%) left more than 1 ms after the link released them (worst 4.5 ms; behind schedule 0.12 s of 1.0 s); the agent had too little CPU: in 1.0 s its threads waited 0.24 s for a CPU".to_owned();
        let calm = ci.replace("waited 0.24 s", "waited 0.03 s");
        let limited = format!("{ci} and its CPU limit stopped it for 0.40 s");
        let silent =
            "a-b a→b: 3 packets dropped before the link's queue (its task fell behind)".to_owned();
        assert!(episodes_not_from_host_contention(std::slice::from_ref(&ci)).is_empty());
        assert_eq!(
            episodes_not_from_host_contention(&[calm.clone(), limited.clone(), silent.clone()]),
            vec![calm, limited, silent]
        );
    }
}

//! The fidelity guard (issue 14, item 4): agents starved of CPU by a cgroup
//! limit far below what a 200 Mbit/s link needs say so — an episode naming the
//! link, its direction and why, in `nextmini status`, the agent's metrics and
//! the flag of a flow result measured meanwhile — and say nothing when they
//! have the CPU they need.

use nextmini_e2e::{
    Env, agent_pids_of, all_acked, episodes_not_from_host_contention, fidelity_episodes, iperf3,
    tcp_goodput,
};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const TOPOLOGY: &str = "guard";
/// Of each 100 ms, the starved agents together may run this long: 5% of one
/// core, against about half a core each that 200 Mbit/s needs.
const STARVED_QUOTA_US: u32 = 5_000;

fn manifest(flow: Option<&str>) -> String {
    let mut yaml = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {TOPOLOGY}\nspec:\n  \
         dataplane:\n    mtu: 1400\n  nodes:\n    - name: a\n    - name: b\n\
         ---\napiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata:\n  name: a-b\nspec:\n  \
         topology: {TOPOLOGY}\n  endpoints: [a, b]\n  rate: 200Mbit\n  delay: 2ms\n  queue:\n    limit: 300pkt\n"
    );
    if let Some(flow) = flow {
        yaml.push_str(&format!(
            "---\napiVersion: nextmini.io/v1alpha1\nkind: Flow\nmetadata: {{name: {flow}}}\nspec:\n  \
             topology: {TOPOLOGY}\n  src: a\n  dst: b\n  size: 4MB\n  count: 1\n"
        ));
    }
    yaml
}

fn apply(env: &Env, yaml: &str) {
    let path = env.state_dir.join("guard.yaml");
    std::fs::write(&path, yaml).expect("manifest");
    env.ok(&["up", "-f", path.to_str().expect("path")]);
    env.wait_for("agents to apply", Duration::from_secs(30), || {
        all_acked(env, TOPOLOGY)
    });
}

/// A CPU cgroup (v1 `cpu` or v2) holding processes at a quota; on drop the
/// processes go back to the root group and the group is removed, also when
/// the test fails.
struct CpuLimit {
    dir: PathBuf,
    root_procs: PathBuf,
    pids: Vec<i32>,
}

impl CpuLimit {
    fn new(pids: &[i32], quota_us: u32) -> CpuLimit {
        let name = format!("nextmini-e2e-starve-{}", std::process::id());
        let v1 = PathBuf::from("/sys/fs/cgroup/cpu");
        let (root, v2) = if v1.join("cpu.cfs_quota_us").exists() {
            (v1, false)
        } else {
            (PathBuf::from("/sys/fs/cgroup"), true)
        };
        let dir = root.join(&name);
        std::fs::create_dir_all(&dir).expect("creating a CPU cgroup");
        let limit = CpuLimit {
            dir: dir.clone(),
            root_procs: root.join("cgroup.procs"),
            pids: pids.to_vec(),
        };
        if v2 {
            std::fs::write(dir.join("cpu.max"), format!("{quota_us} 100000")).expect("cpu.max");
        } else {
            std::fs::write(dir.join("cpu.cfs_period_us"), "100000").expect("period");
            std::fs::write(dir.join("cpu.cfs_quota_us"), quota_us.to_string()).expect("quota");
        }
        for pid in pids {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string()).expect("moving an agent");
        }
        limit
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        for pid in &self.pids {
            let _ = std::fs::write(&self.root_procs, pid.to_string());
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn episodes(env: &Env) -> Vec<serde_json::Value> {
    let doc: serde_json::Value =
        serde_json::from_str(&env.ok(&["status", "-o", "json", TOPOLOGY])).expect("status JSON");
    doc["topologies"][0]["unfaithful"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// `nextmini_link_faithful` of the agent `node`, from its metrics socket.
fn faithful_metric(env: &Env, node: &str) -> Option<f64> {
    env.agent_metrics(TOPOLOGY, node)
        .lines()
        .find(|l| l.starts_with("nextmini_link_faithful{") && l.contains("link=\"a-b\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn starved_agents_say_the_emulator_limited_the_link() {
    let mut env = Env::new("guard");
    apply(&env, &manifest(None));
    env.spawn_in("b", &["iperf3", "-s", "-p", "5201"]);
    env.wait_for("iperf3 server", Duration::from_secs(10), || {
        env.exec("b", &["sh", "-c", "ss -ltn | grep -q ':5201 '"])
            .status
            .success()
    });

    // With the CPU it needs, a full 200 Mbit/s link is faithful.
    let fed = tcp_goodput(&iperf3(&env, "a", &["-c", "b", "-t", "4", "-O", "1"]));
    std::thread::sleep(Duration::from_secs(2));
    println!("fed agents: {:.1} Mbit/s", fed / 1e6);
    let fed_episodes = fidelity_episodes(&env, TOPOLOGY);
    let false_alarms = episodes_not_from_host_contention(&fed_episodes);
    assert!(
        false_alarms.is_empty(),
        "the guard fired with enough CPU: {false_alarms:?}"
    );
    if fed_episodes.is_empty() {
        let status = env.ok(&["status", TOPOLOGY]);
        assert!(status.contains("faithful: no agent saw"), "{status}");
        assert_eq!(faithful_metric(&env, "a"), Some(1.0));
    } else {
        println!("fed agents: the guard named the busy host: {fed_episodes:?}");
    }

    // Starved: both agents share 5% of a core.
    let pids = agent_pids_of(TOPOLOGY);
    assert_eq!(pids.len(), 2, "two agents: {pids:?}");
    let limit = CpuLimit::new(&pids, STARVED_QUOTA_US);
    let starved_at = Instant::now();
    // A synthetic flow measured while starved: its result must carry the flag.
    apply(&env, &manifest(Some("starved")));
    let out = env.exec(
        "a",
        &[
            "iperf3",
            "-J",
            "-c",
            "b",
            "-t",
            "6",
            "--connect-timeout",
            "5000",
        ],
    );
    let starved_goodput = serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|r| r["end"]["sum_received"]["bits_per_second"].as_f64());
    println!("starved agents: {starved_goodput:?} bit/s");
    let mut seen = Vec::new();
    let starved_a_to_b = |e: &serde_json::Value| {
        e["link"] == "a-b"
            && e["node"] == "a"
            && e["peer"] == "b"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("its CPU limit stopped it for"))
    };
    env.wait_for("the guard to fire", Duration::from_secs(20), || {
        seen = episodes(&env);
        seen.iter().any(starved_a_to_b)
    });
    println!(
        "guard fired {:.1} s after starving: {seen:#?}",
        starved_at.elapsed().as_secs_f64()
    );
    let a_to_b = seen
        .iter()
        .find(|e| starved_a_to_b(e))
        .unwrap_or_else(|| panic!("no episode for a → b: {seen:#?}"));
    let why = a_to_b["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("left more than 1 ms after the link released them")
            || why.contains("dropped before the link's queue"),
        "the reason names what the agent saw: {why}"
    );
    let text = env.ok(&["status", TOPOLOGY]);
    assert!(
        text.contains("NOT FAITHFUL") && text.contains("a → b"),
        "{text}"
    );
    assert_eq!(faithful_metric(&env, "a"), Some(0.0));

    // Fed again: the episode ends, and the flow measured meanwhile is flagged.
    drop(limit);
    let _ = iperf3(&env, "a", &["-c", "b", "-t", "3"]);
    env.wait_for("the episode to end", Duration::from_secs(15), || {
        episodes(&env).iter().all(|e| !e["ended_at"].is_null())
    });
    env.wait_for("the flow's result", Duration::from_secs(60), || {
        env.psql(&format!(
            "SELECT count(*) FROM flow_results r JOIN topologies t ON t.id = r.topology_id \
             WHERE t.name = '{TOPOLOGY}' AND r.flow = 'starved'"
        )) == "1"
    });
    let flagged = env.psql(&format!(
        "SELECT bool_and(r.unfaithful) FROM flow_results_checked r JOIN topologies t ON t.id = r.topology_id \
         WHERE t.name = '{TOPOLOGY}' AND r.flow = 'starved'"
    ));
    assert_eq!(flagged, "t", "the flow that ran starved is flagged");
    let results = env.ok(&["results", TOPOLOGY]);
    assert!(
        results.contains("ran while the emulator, not the emulated links, limited traffic"),
        "{results}"
    );
    env.ok(&["down", TOPOLOGY]);
}

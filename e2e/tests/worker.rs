//! `nextmini worker`, the process of a packed worker pod, on this machine: it
//! makes a namespace per node with loopback up, starts each node's agent in its
//! own namespace with only a node-side thread (TUN, connections to the node's
//! applications) in the node's namespace, gives a node with limits its cgroup,
//! restarts an agent that was killed, and on SIGTERM stops the agents and
//! removes every namespace and cgroup. The hub is unreachable here, which an
//! agent rides out by retrying, as it does while a cluster's hub starts.
//!
//! The cluster suite (`kube.rs`) runs the same worker in pods, with traffic.

use nextmini_e2e::{Env, agent_pids_of, is_running, namespaces_of};
use nextmini_operator::runtime::names;
use std::os::unix::fs::MetadataExt;
use std::process::Child;
use std::time::{Duration, Instant};

/// Stops the worker (and anything it left, should the test fail midway).
struct Worker {
    child: Child,
    topology: String,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
        for agent in agent_pids_of(&self.topology) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(agent),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        for ns in namespaces_of(&self.topology) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &ns])
                .status();
        }
    }
}

fn ns_id(path: &str) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// The network namespaces of every thread of `pid`.
fn thread_namespaces(pid: i32) -> Vec<u64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|t| t.ok())
                .filter_map(|t| ns_id(&format!("{}/ns/net", t.path().display())))
                .collect()
        })
        .unwrap_or_default()
}

fn agent_of(topology: &str, node: &str) -> Option<i32> {
    let ns = names::netns(topology, node);
    agent_pids_of(topology).into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
            c.split(|b| *b == 0)
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w[0] == b"--tun-netns" && w[1] == ns.as_bytes())
        })
    })
}

fn cgroup_v1() -> bool {
    std::path::Path::new("/sys/fs/cgroup/cpu").is_dir()
        && !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

#[test]
fn worker_runs_its_nodes_restarts_agents_and_leaves_nothing() {
    let env = Env::new("worker");
    let topology = format!("wk{}", std::process::id());
    // Tokens, control-stream certificates and the CA, as the operator's Secret
    // has them (the agents check them at start).
    let credentials = env.state_dir.join("credentials");
    std::fs::create_dir_all(&credentials).expect("credential dir");
    let ca = nextmini_operator::pki::ControlCa::generate().expect("a control CA");
    let issued = nextmini_operator::pki::Credentials::issue(
        &ca,
        &topology,
        ["a", "b", "c"].map(String::from).iter(),
    )
    .expect("credentials");
    for (file, content) in issued.files() {
        std::fs::write(credentials.join(file), content).expect("credential file");
    }
    let nodes =
        r#"[{"name":"a"},{"name":"b","cpuMillis":200,"memoryBytes":134217728},{"name":"c"}]"#;
    let log = env.state_dir.join("worker.log");
    let log_file = std::fs::File::create(&log).expect("log");
    let started = Instant::now();
    let child = env
        .command(&[
            "worker",
            "--hub",
            "unix:/nonexistent/nextmini-hub.sock",
            "--topology",
            &topology,
            "--credential-dir",
            credentials.to_str().expect("path"),
            "--nodes",
            nodes,
        ])
        .env("RUST_LOG", "info")
        .stdout(log_file.try_clone().expect("log"))
        .stderr(log_file)
        .spawn()
        .expect("starting nextmini worker");
    let mut worker = Worker {
        child,
        topology: topology.clone(),
    };
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    env.wait_for(
        "three namespaces with an agent each",
        Duration::from_secs(20),
        || {
            ["a", "b", "c"]
                .iter()
                .all(|n| agent_of(&topology, n).is_some())
        },
    );
    println!(
        "3 namespaces and agents up in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    let mut found = namespaces_of(&topology);
    found.sort();
    assert_eq!(
        found,
        ["a", "b", "c"].map(|n| names::netns(&topology, n)),
        "one namespace per node"
    );
    for node in ["a", "b", "c"] {
        let ns = names::netns(&topology, node);
        let lo = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "ip", "-o", "link", "show", "lo"])
            .output()
            .expect("ip");
        assert!(
            String::from_utf8_lossy(&lo.stdout).contains("UP"),
            "loopback is up in {ns}"
        );
        // The agent stays in the worker's namespace; one thread of it is in the node's.
        let pid = agent_of(&topology, node).expect("agent");
        let ours = ns_id("/proc/self/ns/net").expect("own namespace");
        assert_eq!(
            ns_id(&format!("/proc/{pid}/ns/net")),
            Some(ours),
            "{node}'s agent runs in the pod's (here: the host's) namespace"
        );
        let node_ns = ns_id(&format!("/run/netns/{ns}")).expect("node namespace");
        let threads = thread_namespaces(pid);
        assert_eq!(
            threads.iter().filter(|t| **t == node_ns).count(),
            1,
            "exactly one thread of {node}'s agent is in its namespace: {threads:?}"
        );
    }

    // b's limits: its own cgroup holds its agent.
    let b = agent_of(&topology, "b").expect("b's agent");
    let group = names::netns(&topology, "b");
    if cgroup_v1() {
        let dir = format!("/sys/fs/cgroup/cpu/nextmini/{group}");
        let procs = std::fs::read_to_string(format!("{dir}/cgroup.procs")).unwrap_or_default();
        assert!(
            procs.lines().any(|p| p.trim() == b.to_string()),
            "b's agent is in {dir}: {procs:?}"
        );
        let quota = std::fs::read_to_string(format!("{dir}/cpu.cfs_quota_us")).expect("quota");
        assert_eq!(quota.trim(), "20000", "200m of a 100 ms period");
        let memory = std::fs::read_to_string(format!(
            "/sys/fs/cgroup/memory/nextmini/{group}/memory.limit_in_bytes"
        ))
        .expect("memory limit");
        assert_eq!(memory.trim(), "134217728");
    } else {
        assert!(
            log_text().contains("nodes run without limits of their own"),
            "on cgroup v2 the worker says the pod's limits hold its nodes:\n{}",
            log_text()
        );
    }

    // A killed agent comes back.
    let a = agent_of(&topology, "a").expect("a's agent");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let t = Instant::now();
    env.wait_for("a's agent to be restarted", Duration::from_secs(10), || {
        agent_of(&topology, "a").is_some_and(|p| p != a)
    });
    println!(
        "a killed agent restarted after {:.2} s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        log_text().contains("[a]"),
        "agents' output goes to the worker's log, prefixed with the node:\n{}",
        log_text()
    );
    assert!(is_running(b), "the other agents were left alone");
    assert_eq!(
        log_text().matches("agent exited").count(),
        1,
        "only the killed agent ever exited:\n{}",
        log_text()
    );

    // SIGTERM: agents stop, namespaces and cgroups go.
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = loop {
        if let Some(s) = worker.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the worker did not stop:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "worker stopped in {:.2} s: {status}",
        t.elapsed().as_secs_f64()
    );
    assert!(status.success(), "exit status {status}:\n{}", log_text());
    assert!(agent_pids_of(&topology).is_empty(), "no agent left");
    assert!(namespaces_of(&topology).is_empty(), "no namespace left");
    for controller in ["cpu", "memory", ""] {
        let dir = std::path::Path::new("/sys/fs/cgroup")
            .join(controller)
            .join("nextmini")
            .join(&group);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    worker.topology = topology;
}

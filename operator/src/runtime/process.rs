//! Agent processes of the netns runtime: started detached (they outlive the CLI
//! that started them), found again through /proc after a crash, stopped politely
//! and then for sure.

use super::RuntimeError;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct AgentLaunch<'a> {
    pub binary: &'a Path,
    pub netns: &'a str,
    pub hub: &'a str,
    pub topology: &'a str,
    pub node: &'a str,
    pub credential_file: &'a Path,
    pub log_file: &'a Path,
    /// Where the agent serves /metrics (a Unix socket the hub scrapes).
    pub metrics_socket: Option<&'a Path>,
    /// Addresses of the node's SOCKS5 servers, which the agent binds before it
    /// enters the namespace (so they are host addresses).
    pub socks_listen: Vec<std::net::SocketAddr>,
}

pub fn spawn_agent(launch: &AgentLaunch<'_>) -> Result<u32, RuntimeError> {
    // Appended, so a restarted agent's log follows the one of the agent that died.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(launch.log_file)
        .map_err(|e| RuntimeError::io(launch.log_file.display().to_string(), e))?;
    let log_err = log
        .try_clone()
        .map_err(|e| RuntimeError::io("log file", e))?;
    let mut command = Command::new(launch.binary);
    match super::tunables::for_agent(std::env::var(super::tunables::VARIABLE).ok()) {
        Some(t) => command.env(super::tunables::VARIABLE, t),
        None => command.env_remove(super::tunables::VARIABLE),
    };
    if let Some(socket) = launch.metrics_socket {
        command.arg("--metrics-socket").arg(socket);
    }
    for addr in &launch.socks_listen {
        command.arg("--socks-listen").arg(addr.to_string());
    }
    let child = command
        .arg("--netns")
        .arg(launch.netns)
        .arg("--hub")
        .arg(launch.hub)
        .arg("--topology")
        .arg(launch.topology)
        .arg("--node")
        .arg(launch.node)
        .arg("--credential-file")
        .arg(launch.credential_file)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        // Its own process group: a Ctrl-C in the terminal that ran `up` does not
        // reach the agents.
        .process_group(0)
        .spawn()
        .map_err(|e| RuntimeError::io(format!("starting {}", launch.binary.display()), e))?;
    Ok(child.id())
}

/// Pids of processes whose command line contains `--netns <ns>` (or
/// `--tun-netns <ns>`, as a packed worker starts them) for a namespace starting
/// with `netns_prefix`: the agents of one topology, whoever started them.
pub fn find_agents(netns_prefix: &str) -> Vec<u32> {
    let Ok(proc_dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let mut pids = Vec::new();
    for entry in proc_dir.filter_map(|e| e.ok()) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
        let is_agent = args.first().is_some_and(|a| a.ends_with(b"nextmini-agent"));
        let in_topology = args.windows(2).any(|w| {
            (w[0] == b"--netns" || w[0] == b"--tun-netns")
                && w[1].starts_with(netns_prefix.as_bytes())
        });
        if is_agent && in_topology {
            pids.push(pid);
        }
    }
    pids
}

/// Suspends the processes (SIGSTOP) until [`stop`] ends them or [`resume`]
/// lets them go on. `down` freezes a topology's agents before it deletes their
/// rows: running, each agent would see its session refused, reconnect and
/// repeat its TLS handshake until stopped, which at 10,000 agents was most
/// of the machine for a minute.
pub fn pause(pids: &[u32]) {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGSTOP);
    }
}

/// Lets paused processes run again (SIGCONT).
pub fn resume(pids: &[u32]) {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGCONT);
    }
}

/// SIGTERM, a grace period, then SIGKILL for whatever is left. A paused
/// process is woken to receive the SIGTERM.
pub fn stop(pids: &[u32], grace: Duration) -> usize {
    let alive = |pid: u32| {
        // A zombie child of ours still "exists" until reaped; reap it.
        let _ = nix::sys::wait::waitpid(
            Pid::from_raw(pid as i32),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        is_running(pid)
    };
    let targets: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    for pid in &targets {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGTERM);
    }
    resume(&targets);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && targets.iter().any(|p| alive(*p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for pid in &targets {
        if alive(*pid) {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && targets.iter().any(|p| alive(*p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    targets.len()
}

/// Whether the process exists and is not a zombie (a zombie whose parent never
/// reaps it, e.g. under a minimal init, must not count as running).
pub fn is_running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may contain spaces.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// Pids of the agents running in exactly the namespace `netns`.
pub fn find_agents_in(netns: &str) -> Vec<u32> {
    find_agents(netns)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                raw.split(|b| *b == 0)
                    .collect::<Vec<_>>()
                    .windows(2)
                    .any(|w| {
                        (w[0] == b"--netns" || w[0] == b"--tun-netns") && w[1] == netns.as_bytes()
                    })
            })
        })
        .collect()
}

/// Pids of every process whose network namespace is one of the namespaces
/// bound at `namespace_paths` (under /run/netns), whatever its command line:
/// a namespace is only gone once nothing runs in it.
pub fn in_namespaces(namespace_paths: &[std::path::PathBuf]) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let inodes: std::collections::HashSet<(u64, u64)> = namespace_paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect();
    if inodes.is_empty() {
        return vec![];
    }
    let Ok(proc_dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    proc_dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| inodes.contains(&(m.dev(), m.ino())))
        })
        .filter(|pid| is_running(*pid))
        .collect()
}

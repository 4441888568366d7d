//! The kernel's own forwarding as a baseline: `hops + 1` network namespaces in
//! a line, joined by `hops` veth pairs, with `ip_forward` on in the middle and
//! static /32 routes towards the two ends. The same shape as a Nextmini line of
//! `hops` links, but every hop is the kernel's IP forwarding. The veths take
//! the MTU they are given (Nextmini's overlay MTU, so both carry the same
//! segments) and keep the kernel's default offloads (GSO on, GRO off on veth),
//! which the benchmark records beside its figures.
//!
//! Namespaces are named `nmbench-<pid>-<seq>-<i>`: nothing else on the machine
//! uses that prefix (Nextmini's are `nm-<tag>-…`), the pid lets a later run
//! remove what a killed one left, and veths live only inside the namespaces,
//! so deleting the namespaces removes everything. Dropping the chain, or an
//! interrupt, deletes them.

use super::interrupt::{self, Registration};
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

const PREFIX: &str = "nmbench-";
const NETNS_DIR: &str = "/run/netns";
static SEQ: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("a kernel chain needs 1 to 250 hops, not {0}")]
    Hops(usize),
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("running `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
}

pub struct KernelChain {
    prefix: String,
    namespaces: usize,
    servers: Vec<Child>,
    registration: Registration,
}

/// Address of the left end of link `k` (in namespace `k`); the right end
/// (in namespace `k + 1`) is `.2`.
fn link_addr(k: usize, right: bool) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, k as u8, if right { 2 } else { 1 })
}

impl KernelChain {
    /// Builds a chain of `hops` links (so `hops + 1` namespaces). Removes first
    /// what earlier, killed runs left.
    pub fn build(hops: usize, mtu: u32) -> Result<KernelChain, ChainError> {
        if !(1..=250).contains(&hops) {
            return Err(ChainError::Hops(hops));
        }
        sweep_dead_runs();
        let prefix = format!(
            "{PREFIX}{}-{}-",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let cleanup_prefix = prefix.clone();
        let registration =
            interrupt::on_interrupt(move || delete_namespaces(&cleanup_prefix, hops + 1));
        // From here on a failure is cleaned up by Drop.
        let chain = KernelChain {
            prefix,
            namespaces: hops + 1,
            servers: Vec::new(),
            registration,
        };
        chain.plumb(hops, mtu)?;
        Ok(chain)
    }

    fn plumb(&self, hops: usize, mtu: u32) -> Result<(), ChainError> {
        let mtu = mtu.to_string();
        for i in 0..self.namespaces {
            run(&["ip", "netns", "add", &self.ns(i)])?;
            run(&["ip", "-n", &self.ns(i), "link", "set", "dev", "lo", "up"])?;
        }
        for k in 0..hops {
            let (left, right) = (self.ns(k), self.ns(k + 1));
            // Created in `left` with its peer in `right`: nothing touches the host.
            run(&[
                "ip", "-n", &left, "link", "add", "vr", "mtu", &mtu, "type", "veth", "peer",
                "name", "vl", "mtu", &mtu, "netns", &right,
            ])?;
            let a = format!("{}/24", link_addr(k, false));
            let b = format!("{}/24", link_addr(k, true));
            run(&["ip", "-n", &left, "addr", "add", &a, "dev", "vr"])?;
            run(&["ip", "-n", &right, "addr", "add", &b, "dev", "vl"])?;
            run(&["ip", "-n", &left, "link", "set", "dev", "vr", "up"])?;
            run(&["ip", "-n", &right, "link", "set", "dev", "vl", "up"])?;
        }
        let client = format!("{}/32", self.client_addr());
        let server = format!("{}/32", self.server_addr());
        for j in 0..self.namespaces {
            let ns = self.ns(j);
            if j + 1 < hops {
                let via = link_addr(j, true).to_string();
                run(&["ip", "-n", &ns, "route", "add", &server, "via", &via])?;
            }
            if j >= 2 {
                let via = link_addr(j - 1, false).to_string();
                run(&["ip", "-n", &ns, "route", "add", &client, "via", &via])?;
            }
            if j > 0 && j < hops {
                run(&[
                    "ip",
                    "netns",
                    "exec",
                    &ns,
                    "sysctl",
                    "-qw",
                    "net.ipv4.ip_forward=1",
                ])?;
            }
        }
        Ok(())
    }

    /// Namespace `i` (0: the client's end, `hops`: the server's).
    pub fn ns(&self, i: usize) -> String {
        format!("{}{i}", self.prefix)
    }

    /// The chain's device in namespace `i` that faces the server (`vr`), or
    /// the client in the server's namespace (`vl`).
    pub fn device(&self, i: usize) -> &'static str {
        if i < self.hops() { "vr" } else { "vl" }
    }

    pub fn hops(&self) -> usize {
        self.namespaces - 1
    }

    pub fn client_addr(&self) -> Ipv4Addr {
        link_addr(0, false)
    }

    pub fn server_addr(&self) -> Ipv4Addr {
        link_addr(self.hops() - 1, true)
    }

    /// `ip netns exec <ns i> <command…>`.
    pub fn command(&self, i: usize, command: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(i)])
            .args(command)
            .stdin(Stdio::null());
        cmd
    }

    /// Serves `dir` with `python3 -m http.server <port>` in the last namespace,
    /// on the server address; stopped when the chain is dropped.
    pub fn serve_http(&mut self, dir: &std::path::Path, port: u16) -> Result<(), ChainError> {
        let addr = self.server_addr().to_string();
        let port = port.to_string();
        let dir = dir.to_string_lossy().into_owned();
        let mut cmd = self.command(
            self.hops(),
            &[
                "python3",
                "-m",
                "http.server",
                &port,
                "--bind",
                &addr,
                "--directory",
                &dir,
            ],
        );
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| ChainError::Spawn {
                command: "python3 -m http.server".into(),
                source,
            })?;
        self.servers.push(child);
        Ok(())
    }
}

impl Drop for KernelChain {
    fn drop(&mut self) {
        for server in &mut self.servers {
            let _ = server.kill();
            let _ = server.wait();
        }
        delete_namespaces(&self.prefix, self.namespaces);
        interrupt::forget(self.registration);
    }
}

fn run(args: &[&str]) -> Result<(), ChainError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ChainError::Spawn {
            command: args.join(" "),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ChainError::Command {
            command: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Kills what runs in each namespace of the chain, then deletes it (which
/// deletes its veth ends). Missing namespaces are fine.
fn delete_namespaces(prefix: &str, count: usize) {
    for i in 0..count {
        delete_namespace(&format!("{prefix}{i}"));
    }
}

fn delete_namespace(ns: &str) {
    if !std::path::Path::new(NETNS_DIR).join(ns).exists() {
        return;
    }
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stdin(Stdio::null())
        .output();
}

/// Deletes `nmbench-<pid>-…` namespaces whose process is gone.
fn sweep_dead_runs() {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for name in dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
    {
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            delete_namespace(&name);
        }
    }
}

/// Namespaces of this process's chains that still exist (for tests of the guard).
pub fn own_namespaces() -> Vec<String> {
    let mine = format!("{PREFIX}{}-", std::process::id());
    std::fs::read_dir(NETNS_DIR)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(&mine))
                .collect()
        })
        .unwrap_or_default()
}

//! Benchmark (issue 7, 3a): hop scaling against the kernel's own forwarding.
//!
//! For each hop count (links between the client's node and the server's node of
//! a line), a Nextmini line `bench-hops-<h>` and a kernel chain of the same
//! number of namespaces and veths are built side by side, and a file of
//! `NEXTMINI_BENCH_SIZE_MIB` (default 256) from tmpfs is fetched by curl from
//! `python3 -m http.server` in the last node, along five paths:
//! - `kernel`: curl in the chain's first namespace, forwarded by the kernel;
//! - `tun`: curl in n0 (`nextmini exec`), through n0's TUN device, the agents'
//!   processors and links, and the server node's TUN device (normal mode);
//! - `socks_normal`: curl on the host through n0's SOCKS5 entry in normal mode
//!   (n0's agent connects from inside n0, then as `tun`);
//! - `socks_max`: the same through a max-mode SOCKS5 entry, spliced hop by hop
//!   by the agents' relays;
//! - `loopback`: curl from a http.server on 127.0.0.1 on the host, no hops.
//!
//! The paths take turns within each repetition, so a busy moment of the
//! machine hits all of them; each figure is the median of
//! `NEXTMINI_BENCH_REPS` (default 3) transfers, timed by curl itself. Results
//! go to bench/results/hops.json; rows of hop counts not measured in this run
//! are kept from the file.
//!
//! The kernel chain's veths get the MTU of n0's TUN device (Nextmini's overlay
//! MTU), and every row records both sides' devices (MTU, GSO/GRO sizes and
//! offloads, `bench::netdev`): n0's TUN device and underlay, the server's TUN
//! device, and the chain's two ends; and the congestion control of the
//! end-to-end flows (each namespace's default, the host's unless
//! `NEXTMINI_BENCH_CONGESTION` names one for both ends of both paths).
//!
//! `sudo NEXTMINI_BIN_DIR=$PWD/target/release cargo run --release -p nextmini-e2e --example bench_hops -- 1 2 4 8 16 40`

use nextmini_e2e::bench::{self, Transfer, chain::KernelChain, interrupt, median, netdev};
use nextmini_e2e::{Env, kill9, write_random_file};
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PATHS: [&str; 5] = ["kernel", "tun", "socks_normal", "socks_max", "loopback"];
const MAX_TIME_SECS: u32 = 900;
const HTTP_PORT: u16 = 8000;
/// The agent's TUN device and the node's underlay interface (the agent's
/// `--tun-name` default, the runtime's `UNDERLAY_IFACE`).
const TUN_DEVICE: &str = "nm0";
const UNDERLAY_DEVICE: &str = "eth0";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn manifest(topology: &str, hops: usize, socks_normal: u16, socks_max: u16) -> String {
    let mut out = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: {topology}}}\nspec:\n  nodes:\n    - name: n0\n      socks:\n        - listen: \"127.0.0.1:{socks_normal}\"\n        - listen: \"127.0.0.1:{socks_max}\"\n          mode: max\n"
    );
    for i in 1..=hops {
        out.push_str(&format!("    - name: n{i}\n"));
    }
    out.push_str("  links:\n");
    for i in 0..hops {
        out.push_str(&format!("    - endpoints: [n{i}, n{}]\n", i + 1));
    }
    out
}

/// A http.server on the host's loopback, stopped on drop or interrupt.
struct LoopbackServer {
    child: Child,
    port: u16,
    registration: interrupt::Registration,
}

impl LoopbackServer {
    fn start(dir: &Path) -> anyhow::Result<LoopbackServer> {
        let port = bench::free_ports(1)?[0];
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--directory")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pid = child.id() as i32;
        let registration = interrupt::on_interrupt(move || kill9(pid));
        Ok(LoopbackServer {
            child,
            port,
            registration,
        })
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        interrupt::forget(self.registration);
    }
}

/// Retries `attempt` until it succeeds or `limit` passes.
fn wait_until(
    what: &str,
    limit: Duration,
    mut attempt: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if attempt() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    anyhow::bail!("timed out after {limit:?} waiting for {what}")
}

fn host_curl(extra: &[&str], url: &str) -> Command {
    let args = bench::curl_args(MAX_TIME_SECS);
    let mut cmd = Command::new(&args[0]);
    cmd.args(&args[1..])
        .args(extra)
        .arg(url)
        .stdin(Stdio::null());
    cmd
}

fn measure_hops(
    env: &mut Env,
    hops: usize,
    dir: &Path,
    size: u64,
    reps: usize,
    loopback: &LoopbackServer,
) -> anyhow::Result<serde_json::Value> {
    let topology = format!("bench-hops-{hops}");
    let ports = bench::free_ports(2)?;
    let file = env.state_dir.join(format!("{topology}.yaml"));
    std::fs::write(&file, manifest(&topology, hops, ports[0], ports[1]))?;
    let started = Instant::now();
    env.ok(&[
        "up",
        "-f",
        file.to_str().expect("UTF-8 path"),
        "--timeout-secs",
        "300",
    ]);
    eprintln!(
        "{hops} hops: {topology} up in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let last = format!("n{hops}");
    let dir_arg = dir.to_str().expect("UTF-8 path");
    let server_pid = env.spawn_in(
        &last,
        &[
            "python3",
            "-m",
            "http.server",
            &HTTP_PORT.to_string(),
            "--directory",
            dir_arg,
        ],
    );
    let in_node = |node: &str| {
        let node = node.to_string();
        let env = &*env;
        let topology = topology.clone();
        move |args: &[&str]| {
            let mut c = vec!["exec", "-t", &topology, &node, "--"];
            c.extend_from_slice(args);
            env.command(&c)
        }
    };
    const CC: &str = "net.ipv4.tcp_congestion_control";
    // Both ends of both paths, when the run names an algorithm for the flows.
    let set_flows_congestion = std::env::var("NEXTMINI_BENCH_CONGESTION")
        .ok()
        .map(|cc| format!("{CC}={cc}"));
    if let Some(set) = &set_flows_congestion {
        for node in ["n0", last.as_str()] {
            netdev::sysctl_set(in_node(node), set)?;
        }
    }
    // The end-to-end flows' congestion control is each namespace's default
    // (the host's at creation); the agents set their link sockets' own.
    let mut congestion = json!({
        "nextmini_n0": netdev::sysctl(in_node("n0"), CC)?,
        // The agents' link sockets: the namespace's default unless this names one.
        "nextmini_links": std::env::var("NEXTMINI_LINK_CONGESTION").unwrap_or_else(|_| "default".into()),
    });
    let nextmini_devices = json!({
        "n0_tun": netdev::describe(in_node("n0"), TUN_DEVICE)?,
        "n0_underlay": netdev::describe(in_node("n0"), UNDERLAY_DEVICE)?,
        "server_tun": netdev::describe(in_node(&last), TUN_DEVICE)?,
    });
    let overlay_mtu = netdev::mtu(&nextmini_devices["n0_tun"])
        .ok_or_else(|| anyhow::anyhow!("n0's {TUN_DEVICE} has no MTU"))?;
    let mut chain = KernelChain::build(hops, overlay_mtu)?;
    chain.serve_http(dir, HTTP_PORT)?;
    let chain_devices = json!({
        "client": netdev::describe(|a| chain.command(0, a), chain.device(0))?,
        "server": netdev::describe(|a| chain.command(hops, a), chain.device(hops))?,
    });
    if let Some(set) = &set_flows_congestion {
        for ns in [0, hops] {
            netdev::sysctl_set(|a| chain.command(ns, a), set)?;
        }
    }
    congestion["kernel_chain"] = json!(netdev::sysctl(|a| chain.command(0, a), CC)?);
    anyhow::ensure!(
        netdev::mtu(&chain_devices["client"]) == Some(overlay_mtu),
        "the kernel chain's MTU is not Nextmini's overlay MTU ({overlay_mtu}): {chain_devices}"
    );

    let url_nextmini = format!("http://{last}:{HTTP_PORT}/file");
    let url_kernel = format!("http://{}:{HTTP_PORT}/file", chain.server_addr());
    let url_loopback = format!("http://127.0.0.1:{}/file", loopback.port);
    let socks_normal = format!("127.0.0.1:{}", ports[0]);
    let socks_max = format!("127.0.0.1:{}", ports[1]);
    let curl = bench::curl_args(MAX_TIME_SECS);
    let curl: Vec<&str> = curl.iter().map(String::as_str).collect();

    let transfer = |path: &str| -> anyhow::Result<Transfer> {
        let mut cmd = match path {
            "kernel" => {
                let mut c = curl.clone();
                c.push(&url_kernel);
                chain.command(0, &c)
            }
            "tun" => {
                let mut c = vec!["exec", "-t", &topology, "n0", "--"];
                c.extend_from_slice(&curl);
                c.push(&url_nextmini);
                env.command(&c)
            }
            "socks_normal" => host_curl(&["--socks5-hostname", &socks_normal], &url_nextmini),
            "socks_max" => host_curl(&["--socks5-hostname", &socks_max], &url_nextmini),
            "loopback" => host_curl(&[], &url_loopback),
            other => anyhow::bail!("unknown path {other}"),
        };
        bench::timed_transfer(&mut cmd, size)
    };
    let kernel_root = format!("http://{}:{HTTP_PORT}/", chain.server_addr());
    let loopback_root = format!("http://127.0.0.1:{}/", loopback.port);
    wait_until(
        "the http servers of the kernel chain and loopback",
        Duration::from_secs(30),
        || {
            let mut c = curl.clone();
            c.push(&kernel_root);
            let kernel = chain
                .command(0, &c)
                .output()
                .is_ok_and(|o| o.status.success());
            kernel
                && host_curl(&[], &loopback_root)
                    .output()
                    .is_ok_and(|o| o.status.success())
        },
    )?;
    env.wait_for_http("n0", &last);

    let mut samples: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for rep in 0..reps {
        for path in PATHS {
            let t = transfer(path)
                .map_err(|e| anyhow::anyhow!("{hops} hops, {path}, repetition {rep}: {e}"))?;
            eprintln!(
                "{hops:>2} hops  {path:<13} {:>7.3} s  {:>7.3} Gbit/s",
                t.seconds,
                t.gbps()
            );
            samples.entry(path).or_default().push(t.gbps());
        }
    }
    drop(chain);
    kill9(server_pid as i32);
    env.ok(&["down", &topology]);

    let gbps: serde_json::Map<String, serde_json::Value> = samples
        .iter()
        .map(|(k, v)| (k.to_string(), json!(median(v))))
        .collect();
    let m = |k: &str| median(&samples[k]);
    Ok(json!({
        "hops": hops,
        "namespaces": hops + 1,
        "measured_at": bench::provenance("")["measured_at"],
        "gbps": gbps,
        "devices": {"nextmini": nextmini_devices, "kernel_chain": chain_devices},
        "congestion_control": congestion,
        "samples_gbps": samples,
        "ratio": {
            "tun_vs_kernel": m("tun") / m("kernel"),
            "socks_normal_vs_kernel": m("socks_normal") / m("kernel"),
            "socks_max_vs_kernel": m("socks_max") / m("kernel"),
            "socks_max_vs_loopback": m("socks_max") / m("loopback"),
        },
    }))
}

fn main() -> anyhow::Result<()> {
    let mut hop_counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .map_err(|_| anyhow::anyhow!("not a hop count: {a}"))
        })
        .collect::<anyhow::Result<_>>()?;
    if hop_counts.is_empty() {
        hop_counts = vec![1, 2, 4, 8, 16, 40];
    }
    let reps = env_number("NEXTMINI_BENCH_REPS", 3).max(1) as usize;
    let size = env_number("NEXTMINI_BENCH_SIZE_MIB", 256) * 1024 * 1024;
    let command = format!(
        "bench_hops {}",
        hop_counts
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let provenance = bench::provenance(&command);

    let mut env = Env::new("bench-hops");
    let down = std::sync::Mutex::new(env.command(&["down"]));
    let env_guard = interrupt::on_interrupt(move || {
        let _ = down.lock().map(|mut c| c.output());
    });
    // tmpfs, so the disk is not part of any path.
    let dir = Path::new("/dev/shm").join(format!("nmbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let dir_for_cleanup = dir.clone();
    let dir_guard = interrupt::on_interrupt(move || {
        let _ = std::fs::remove_dir_all(&dir_for_cleanup);
    });
    write_random_file(&dir.join("file"), size as usize, 7);
    let loopback = LoopbackServer::start(&dir)?;

    let mut rows = Vec::new();
    let mut outcome = Ok(());
    for &hops in &hop_counts {
        match measure_hops(&mut env, hops, &dir, size, reps, &loopback) {
            Ok(row) => rows.push(row),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    drop(loopback);
    let _ = std::fs::remove_dir_all(&dir);
    interrupt::forget(dir_guard);
    drop(env);
    interrupt::forget(env_guard);
    outcome?;

    // Keep rows of hop counts this run did not measure.
    let path = bench::results_dir().join("hops.json");
    if let Ok(old) = std::fs::read_to_string(&path)
        && let Ok(old) = serde_json::from_str::<serde_json::Value>(&old)
    {
        for row in old["rows"].as_array().cloned().unwrap_or_default() {
            let h = row["hops"].as_u64().unwrap_or(0) as usize;
            if !hop_counts.contains(&h) {
                rows.push(row);
            }
        }
    }
    rows.sort_by_key(|r| r["hops"].as_u64().unwrap_or(0));

    println!(
        "| hops | kernel | TUN | SOCKS normal | SOCKS max | loopback | TUN/kernel | max/loopback |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let g = |k: &str| r["gbps"][k].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}× | {:.2}× |",
            r["hops"],
            g("kernel"),
            g("tun"),
            g("socks_normal"),
            g("socks_max"),
            g("loopback"),
            r["ratio"]["tun_vs_kernel"].as_f64().unwrap_or(f64::NAN),
            r["ratio"]["socks_max_vs_loopback"]
                .as_f64()
                .unwrap_or(f64::NAN),
        );
    }
    bench::write_results(
        "hops",
        &json!({
            "benchmark": "hops",
            "provenance": provenance,
            "size_bytes": size,
            "repetitions": reps,
            "targets": {"tun_vs_kernel": 1.0, "socks_max_vs_loopback": 0.9},
            "rows": rows,
        }),
    )?;
    Ok(())
}

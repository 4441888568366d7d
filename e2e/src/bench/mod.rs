//! Shared parts of the `make bench` binaries (e2e/examples/bench_*.rs): the
//! kernel-forwarding baseline, clean-up on interrupt, process memory, HTTP
//! transfers timed by curl itself, and the JSON results that bench/plot.py
//! turns into the plot and the table in BENCHMARKS.md.

pub mod chain;
pub mod interrupt;
pub mod netdev;

use std::path::PathBuf;
use std::process::Command;

/// The value at fraction `p` (0.5 the median, 0.99 the p99) of `sorted`, by
/// nearest rank; NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Median of the values (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// One timed HTTP transfer as curl measured it (so the time excludes starting
/// curl, `ip netns exec` and `nextmini exec`).
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    pub bytes: u64,
    pub seconds: f64,
}

impl Transfer {
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.seconds / 1e9
    }
}

/// Arguments for curl that make it print `<bytes> <seconds>` and fail on
/// HTTP errors, discarding the body.
pub fn curl_args(max_time_secs: u32) -> Vec<String> {
    [
        "curl",
        "-sS",
        "--fail",
        "--max-time",
        &max_time_secs.to_string(),
        "-o",
        "/dev/null",
        "-w",
        "%{size_download} %{time_total}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs a command ending in curl built with [`curl_args`]; checks that it
/// fetched `expected` bytes. Proxy variables are removed (`--noproxy` would
/// also switch off `--socks5-hostname`).
pub fn timed_transfer(cmd: &mut Command, expected: u64) -> anyhow::Result<Transfer> {
    let out = cmd
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("all_proxy")
        .env_remove("ALL_PROXY")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        anyhow::bail!(
            "curl failed ({}): {}{}",
            out.status,
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut fields = text.split_whitespace();
    let bytes: u64 = fields
        .next()
        .and_then(|b| b.parse::<f64>().ok())
        .map(|b| b as u64)
        .ok_or_else(|| anyhow::anyhow!("no size in curl's output {text:?}"))?;
    let seconds: f64 = fields
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no time in curl's output {text:?}"))?;
    if bytes != expected {
        anyhow::bail!("curl fetched {bytes} bytes, expected {expected}");
    }
    Ok(Transfer { bytes, seconds })
}

/// Resident memory of a process, in bytes: RSS from /proc/PID/status; from
/// /proc/PID/smaps_rollup the proportional set size (shared pages divided
/// among their users) and the unique set size (pages no other process maps:
/// what the process alone costs).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Memory {
    pub rss: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub hwm: u64,
    pub pss: u64,
    pub pss_anon: u64,
    pub pss_file: u64,
    pub uss: u64,
    pub threads: u64,
}

impl Memory {
    /// Field by field median of several samples (of one process over time, or
    /// of several similar processes).
    pub fn median(samples: &[Memory]) -> Memory {
        let m = |f: fn(&Memory) -> u64| {
            median(&samples.iter().map(|x| f(x) as f64).collect::<Vec<_>>()) as u64
        };
        Memory {
            rss: m(|x| x.rss),
            rss_anon: m(|x| x.rss_anon),
            rss_file: m(|x| x.rss_file),
            hwm: m(|x| x.hwm),
            pss: m(|x| x.pss),
            pss_anon: m(|x| x.pss_anon),
            pss_file: m(|x| x.pss_file),
            uss: m(|x| x.uss),
            threads: m(|x| x.threads),
        }
    }
}

fn kb_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))
        .and_then(|l| l[key.len() + 1..].split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
}

pub fn memory_of(pid: i32) -> anyhow::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let kb = |text: &str, key: &str| -> anyhow::Result<u64> {
        kb_field(text, key)
            .map(|v| v * 1024)
            .ok_or_else(|| anyhow::anyhow!("no {key} for pid {pid}"))
    };
    Ok(Memory {
        rss: kb(&status, "VmRSS")?,
        rss_anon: kb(&status, "RssAnon")?,
        rss_file: kb(&status, "RssFile")?,
        hwm: kb(&status, "VmHWM")?,
        pss: kb(&rollup, "Pss")?,
        pss_anon: kb(&rollup, "Pss_Anon")?,
        pss_file: kb(&rollup, "Pss_File")?,
        uss: kb(&rollup, "Private_Clean")? + kb(&rollup, "Private_Dirty")?,
        threads: kb_field(&status, "Threads").unwrap_or(0),
    })
}

/// Resident memory of one kind of mapping: all of it, and the part that is
/// anonymous (written pages, also copy-on-write pages of file mappings such as
/// relocated read-only data).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MappingRss {
    pub mapping: String,
    pub rss_bytes: u64,
    pub anonymous_bytes: u64,
}

/// Resident bytes per kind of mapping in /proc/PID/smaps (the agent binary by
/// permissions, heap, anonymous mappings such as thread stacks and allocator
/// arenas, shared libraries, other): where an agent's memory is.
pub fn rss_by_mapping(pid: i32) -> anyhow::Result<Vec<MappingRss>> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut totals: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    let mut current = String::new();
    let kb = |rest: &str| -> u64 {
        rest.split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = fields.get(5).copied().unwrap_or("");
            current = if path.is_empty() {
                "anonymous (thread stacks, allocator arenas)".to_string()
            } else if path == "[heap]" {
                "[heap] (main allocator arena)".to_string()
            } else if path.starts_with('[') {
                path.to_string()
            } else if path.contains("nextmini-agent") {
                format!("agent binary ({})", fields.get(1).copied().unwrap_or(""))
            } else if path.contains(".so") {
                "shared libraries".to_string()
            } else {
                "other files".to_string()
            };
        } else if let Some(rest) = line.strip_prefix("Rss:") {
            totals.entry(current.clone()).or_default().0 += kb(rest);
        } else if let Some(rest) = line.strip_prefix("Anonymous:") {
            totals.entry(current.clone()).or_default().1 += kb(rest);
        }
    }
    let mut out: Vec<MappingRss> = totals
        .into_iter()
        .filter(|(_, (rss, _))| *rss > 0)
        .map(|(mapping, (rss_bytes, anonymous_bytes))| MappingRss {
            mapping,
            rss_bytes,
            anonymous_bytes,
        })
        .collect();
    out.sort_by_key(|m| std::cmp::Reverse(m.rss_bytes));
    Ok(out)
}

/// Where results go: bench/results/ in the repository, or $NEXTMINI_BENCH_RESULTS.
pub fn results_dir() -> PathBuf {
    std::env::var_os("NEXTMINI_BENCH_RESULTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_path("bench/results"))
}

fn stdout_of(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// What the figures were measured on and when, stored with every result.
pub fn provenance(command: &str) -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    let repo = crate::repo_path(".");
    let repo = repo.to_string_lossy();
    serde_json::json!({
        "command": command,
        "measured_at": stdout_of("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        "git_commit": stdout_of("git", &["-C", &repo, "rev-parse", "--short", "HEAD"]),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu,
        "kernel": stdout_of("uname", &["-r"]),
        "load_average_before": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    })
}

/// Writes `bench/results/<name>.json` (pretty, for review in diffs).
pub fn write_results(name: &str, value: &serde_json::Value) -> anyhow::Result<PathBuf> {
    let dir = results_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(value)? + "\n")?;
    println!("wrote {}", path.display());
    Ok(path)
}

/// Ports nobody listens on right now on 127.0.0.1.
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(held
        .iter()
        .filter_map(|l| l.local_addr().ok().map(|a| a.port()))
        .collect())
}

/// utime + stime of a process and all its threads, in seconds.
fn process_cpu_seconds(pid: i32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which may hold spaces: state is field 3,
    // utime 14 and stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("odd /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i - 3)
            .ok_or_else(|| anyhow::anyhow!("short /proc/{pid}/stat"))?
            .parse::<f64>()?)
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
    Ok((ticks(14)? + ticks(15)?) / hz)
}

/// utime + stime of the processes and all their threads, in seconds.
pub fn cpu_seconds(pids: &[i32]) -> anyhow::Result<f64> {
    pids.iter().map(|&p| process_cpu_seconds(p)).sum()
}

/// `NEXTMINI_BENCH_SECS`, the length of each measured run, or `default`.
pub fn bench_secs(default: u64) -> u64 {
    std::env::var("NEXTMINI_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `body` in a fresh [`crate::Env`] named `name`, which is taken down
/// when `body` returns and also on Ctrl-C (drop guards do not run on a signal;
/// `down` stops every process in the topologies' namespaces, iperf3 included).
pub fn with_env<T>(
    name: &str,
    body: impl FnOnce(&mut crate::Env) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let mut env = crate::Env::new(name);
    let down = std::sync::Mutex::new(env.command(&["down"]));
    let guard = interrupt::on_interrupt(move || {
        let _ = down.lock().map(|mut c| c.output());
    });
    let outcome = body(&mut env);
    drop(env);
    interrupt::forget(guard);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn reads_fields_in_kilobytes() {
        let status = "Name:\tx\nVmRSS:\t    1234 kB\nVmRSSx:\t 1 kB\n";
        assert_eq!(kb_field(status, "VmRSS"), Some(1234));
        assert_eq!(kb_field(status, "Pss"), None);
    }

    #[test]
    fn own_memory_is_readable() {
        let m = memory_of(std::process::id() as i32).expect("own memory");
        assert!(m.rss > 0 && m.pss > 0 && m.pss <= m.rss + 4096);
        assert!(m.uss > 0 && m.uss <= m.pss + 4096);
        assert!(
            !rss_by_mapping(std::process::id() as i32)
                .expect("smaps")
                .is_empty()
        );
    }
}

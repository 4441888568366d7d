//! What the run reads from the machine: /proc, PostgreSQL's statistics and the
//! hub's metrics endpoint.

use std::collections::BTreeMap;
use std::time::Duration;

/// CPU time (user + system) of a process, from /proc/<pid>/stat.
pub fn cpu_time(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    Some(Duration::from_millis(ticks * 1000 / hz))
}

/// Resident memory of a process in bytes, from /proc/<pid>/status.
pub fn rss_bytes(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The processes of the PostgreSQL whose postmaster is `pid`: it and its children.
pub(super) fn postgres_pids(postmaster: i32) -> Vec<i32> {
    let mut pids = vec![postmaster];
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in dir.filter_map(|e| e.ok()) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = s[s.rfind(')')? + 2..].to_string();
                rest.split_whitespace().nth(1)?.parse::<i32>().ok()
            });
        if parent == Some(postmaster) {
            pids.push(pid);
        }
    }
    pids
}

pub(super) fn total_cpu(pids: &[i32]) -> Duration {
    pids.iter().filter_map(|p| cpu_time(*p)).sum()
}

/// `GET /metrics` of the hub's endpoint, as text.
pub fn scrape(addr: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The value of one sample line (`name{labels} value`) of a scrape; 0 when absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .filter(|rest| rest.starts_with(' '))
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// Inserts and updates per table since the statistics were last reset.
pub(super) async fn table_writes(
    pool: &sqlx::PgPool,
) -> anyhow::Result<BTreeMap<String, (i64, i64)>> {
    let rows: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT relname::text, n_tup_ins, n_tup_upd FROM pg_stat_user_tables")
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(|(t, i, u)| (t, (i, u))).collect())
}

/// Port of the hub's metrics endpoint for this run (a free one near 19000).
pub(super) fn metrics_addr() -> String {
    let port = (19000..19999)
        .map(|p| p + (std::process::id() % 500) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .unwrap_or(19464);
    format!("127.0.0.1:{port}")
}

//! Benchmark (issue 9, point 2): 1,000 agents connected to one hub, reporting
//! every 100 ms for 5 minutes, while a route rule is flipped every 2 s (with
//! `link`, a link's delay is changed in place instead). Prints the hub's CPU and memory, the database's write rate, the control-delta latency and
//! whether anything was dropped (see `nextmini_e2e::load`).
//!
//! `sudo cargo run --release -p nextmini-e2e --example control_load -- [agents] [seconds] [interval_ms] [route|link]`
//! (defaults 1000, 300, 100, route; `make bench-load`). Needs the release binaries built.

use nextmini_e2e::Env;
use nextmini_e2e::load::{Change, LoadConfig, LoadReport, run};
use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<u64> = raw
        .iter()
        .take(3)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let cfg = LoadConfig {
        agents: args.first().copied().unwrap_or(1000) as usize,
        duration: Duration::from_secs(args.get(1).copied().unwrap_or(300)),
        report_interval: Duration::from_millis(args.get(2).copied().unwrap_or(100)),
        change_every: Duration::from_secs(2),
        change: raw.get(3).map_or(Ok(Change::RouteRule), |c| c.parse())?,
    };
    let env = Env::new("load");
    let report = run(&env, &cfg).await?;
    drop(env);
    println!("{}", LoadReport::header());
    println!("{}", report.row());
    println!(
        "history rows sent {}, stored {}; node updates (acks) {:.0}/s; fleet CPU {:.0}%; connected in {:.1} s",
        report.rows_sent,
        report.rows_stored,
        report.node_updates_per_sec,
        report.fleet_cpu_percent,
        report.connect_secs
    );
    let problems = report.check_nothing_lost();
    if !problems.is_empty() {
        anyhow::bail!("{}", problems.join("\n"));
    }
    Ok(())
}

//! The control plane under load, short (issue 9, point 2; issue 16.4): 200
//! agents reporting every 100 ms to one hub for 20 s while a route rule flips
//! every second. Every agent connects and stays, every change reaches the agents
//! whose config it changes, and no other, within the bounds, every node is
//! acknowledged at its generation, and every counter row sent is stored (the hub
//! drops nothing, and would count it if it did). The 1,000-agent, 5-minute run
//! is `make bench-load`.

use nextmini_e2e::Env;
use nextmini_e2e::load::{Change, Latencies, LoadConfig, LoadReport, run};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_agents_report_every_100ms_and_nothing_is_dropped() {
    under_load(Change::RouteRule, Duration::from_secs(20)).await;
}

/// The same with a script changing one link's delay in place: only its two
/// ends are sent anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_changed_in_place_reaches_its_two_ends_under_load() {
    under_load(Change::LinkDelay, Duration::from_secs(10)).await;
}

async fn under_load(change: Change, duration: Duration) {
    let cfg = LoadConfig {
        agents: 200,
        duration,
        report_interval: Duration::from_millis(100),
        change_every: Duration::from_secs(1),
        change,
    };
    let env = Env::new("load");
    let report = run(&env, &cfg).await.expect("the load runs");
    drop(env);
    println!("{}", LoadReport::header());
    println!("{}", report.row());
    println!(
        "rows sent {}, stored {}; fleet CPU {:.0}%",
        report.rows_sent, report.rows_stored, report.fleet_cpu_percent
    );
    let problems = report.check_nothing_lost();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        report.reports_per_sec >= 0.8 * report.target_reports_per_sec,
        "the hub took {:.0} reports/s of {:.0}",
        report.reports_per_sec,
        report.target_reports_per_sec
    );
    p99_within(&report.affected, 100.0, "the changed node");
    // The rule a→c over a→b→c changes the config of those three nodes only,
    // a link's delay that of its two ends (issue 16.4): the other agents are
    // sent nothing, and the hub records them at the new generation itself.
    assert!(
        (1..=change.nodes_touched()).contains(&report.sent_to_max),
        "a {change:?} change was sent to {} of {} agents",
        report.sent_to_max,
        report.agents
    );
    p99_within(
        &report.needed,
        100.0,
        "the last agent that needs the change",
    );
    p99_within(
        &report.all_acked,
        500.0,
        "every node acknowledged in the store",
    );
}

fn p99_within(latencies: &Latencies, bound_ms: f64, what: &str) {
    let p99 = latencies.p99();
    assert!(
        p99 <= bound_ms,
        "p99 from COMMIT to {what}: {p99:.1} ms (bound {bound_ms} ms)"
    );
}

//! The figures of a run, and the checks that nothing was lost.

use crate::bench::percentile;

/// Latencies of one kind, in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct Latencies(pub Vec<f64>);

impl Latencies {
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v
    }
    pub fn p50(&self) -> f64 {
        percentile(&self.sorted(), 0.5)
    }
    pub fn p99(&self) -> f64 {
        percentile(&self.sorted(), 0.99)
    }
    pub fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(f64::NAN)
    }
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub agents: usize,
    pub connected: u64,
    pub connect_secs: f64,
    pub measured_secs: f64,
    pub report_interval_ms: u128,
    pub reports_per_sec: f64,
    pub target_reports_per_sec: f64,
    pub rows_sent: u64,
    pub rows_stored: i64,
    pub rows_dropped_by_hub: f64,
    pub messages_dropped_by_hub: f64,
    pub metrics_rows_per_sec: f64,
    pub counter_upserts_per_sec: f64,
    pub node_updates_per_sec: f64,
    pub hub_cpu_percent: f64,
    pub hub_rss_max: u64,
    pub hub_rss_end: u64,
    pub postgres_cpu_percent: f64,
    pub fleet_cpu_percent: f64,
    pub changes: usize,
    /// Changes the store did not show acknowledged by every node within the wait.
    pub changes_incomplete: usize,
    /// Commit to the delta at the node the change touches (the rule's source).
    pub affected: Latencies,
    /// Commit to the delta at the last agent sent the change, per change.
    pub needed: Latencies,
    /// Commit to the store showing every node at the change's generation.
    pub all_acked: Latencies,
    /// The most agents any one change was sent to: the rest need nothing.
    pub sent_to_max: usize,
    pub resyncs: u64,
    pub disconnects: u64,
    pub rejected: u64,
}

impl LoadReport {
    /// One Markdown table row; `header()` names the columns.
    pub fn row(&self) -> String {
        format!(
            "| {} | {} ms | {:.0} s | {:.0} of {:.0} | {:.0} | {:.0} | {:.1}% | {:.0} MiB (end {:.0}) | {:.1}% | {} | {:.1} / {:.1} / {:.1} ms | {:.1} / {:.1} ms | {} of {} | {:.1} / {:.1} ms | {} | {} rows, {} messages | {} / {} |",
            self.agents,
            self.report_interval_ms,
            self.measured_secs,
            self.reports_per_sec,
            self.target_reports_per_sec,
            self.metrics_rows_per_sec,
            self.counter_upserts_per_sec,
            self.hub_cpu_percent,
            self.hub_rss_max as f64 / 1048576.0,
            self.hub_rss_end as f64 / 1048576.0,
            self.postgres_cpu_percent,
            self.changes,
            self.affected.p50(),
            self.affected.p99(),
            self.affected.max(),
            self.needed.p50(),
            self.needed.p99(),
            self.sent_to_max,
            self.agents,
            self.all_acked.p50(),
            self.all_acked.p99(),
            self.changes_incomplete,
            self.rows_dropped_by_hub,
            self.messages_dropped_by_hub,
            self.resyncs,
            self.disconnects,
        )
    }

    pub fn header() -> &'static str {
        "| agents | report every | measured | reports/s (target) | history rows/s | counter upserts/s | hub CPU (one core) | hub RSS max | PostgreSQL CPU | route changes | delta at the changed node p50 / p99 / max | delta at the last agent that needs it p50 / p99 | agents sent a change (most) | every node acknowledged in the store p50 / p99 | changes not acknowledged everywhere | dropped by the hub | resyncs / disconnects |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    }

    /// Everything a run must show: every agent connected and stayed, every change
    /// took effect at every node, every row sent was stored, the hub dropped
    /// nothing.
    pub fn check_nothing_lost(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.connected != self.agents as u64 {
            problems.push(format!(
                "{} of {} agents connected",
                self.connected, self.agents
            ));
        }
        if self.disconnects > 0 || self.resyncs > 0 || self.rejected > 0 {
            problems.push(format!(
                "{} disconnects, {} resyncs, {} rejections",
                self.disconnects, self.resyncs, self.rejected
            ));
        }
        if self.changes == 0 || self.changes_incomplete > 0 {
            problems.push(format!(
                "{} of {} route changes were not acknowledged by every node",
                self.changes_incomplete, self.changes
            ));
        }
        if self.rows_stored + self.rows_dropped_by_hub as i64 != self.rows_sent as i64 {
            problems.push(format!(
                "{} rows sent, {} stored, {} counted as dropped: {} lost silently",
                self.rows_sent,
                self.rows_stored,
                self.rows_dropped_by_hub,
                self.rows_sent as i64 - self.rows_stored - self.rows_dropped_by_hub as i64
            ));
        }
        if self.rows_dropped_by_hub > 0.0 || self.messages_dropped_by_hub > 0.0 {
            problems.push(format!(
                "the hub dropped {} rows and {} messages",
                self.rows_dropped_by_hub, self.messages_dropped_by_hub
            ));
        }
        problems
    }
}

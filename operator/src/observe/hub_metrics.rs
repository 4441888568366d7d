//! The hub's own metrics: agents connected, control-delta and database-write
//! latency, reports received, rows written and every row or message dropped (with
//! its reason), reconciles, and scrapes of local agents that failed.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How a reconcile (an `up`, or later a controller's pass) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileResult {
    Applied,
    Failed,
}

impl ReconcileResult {
    pub fn as_str(self) -> &'static str {
        match self {
            ReconcileResult::Applied => "applied",
            ReconcileResult::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<ReconcileResult> {
        match s {
            "applied" => Some(ReconcileResult::Applied),
            "failed" => Some(ReconcileResult::Failed),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// Why the hub refused a control connection or session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The TLS handshake failed: no client certificate, or not the CA's.
    TlsHandshake,
    /// The certificate verified but names no node.
    NoIdentity,
    /// Hello claimed another topology or node than the certificate names.
    IdentityMismatch,
    /// The node exists but the token is not its current one.
    BadCredential,
    /// No such topology or node in the store.
    UnknownNode,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::TlsHandshake => "tls_handshake",
            Refusal::NoIdentity => "no_identity",
            Refusal::IdentityMismatch => "identity_mismatch",
            Refusal::BadCredential => "bad_credential",
            Refusal::UnknownNode => "unknown_node",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// Why the hub let counter rows go unwritten. Every row it receives is written,
/// or counted under one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowDrop {
    /// PostgreSQL was unreachable for longer than the bounded buffer covers;
    /// the oldest samples went.
    DbBacklog,
    /// Their topology was deleted between the report and the write.
    TopologyDeleted,
    /// The writer task had stopped (the hub is shutting down).
    WriterStopped,
}

impl RowDrop {
    pub const ALL: [RowDrop; 3] = [
        RowDrop::DbBacklog,
        RowDrop::TopologyDeleted,
        RowDrop::WriterStopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RowDrop::DbBacklog => "db_backlog",
            RowDrop::TopologyDeleted => "topology_deleted",
            RowDrop::WriterStopped => "writer_stopped",
        }
    }
}

/// Why a message to an agent was not queued on its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageDrop {
    /// The session's queue was full (the agent reads slower than changes come).
    QueueFull,
    /// The stream had ended.
    Closed,
}

impl MessageDrop {
    pub const ALL: [MessageDrop; 2] = [MessageDrop::QueueFull, MessageDrop::Closed];

    pub fn as_str(self) -> &'static str {
        match self {
            MessageDrop::QueueFull => "queue_full",
            MessageDrop::Closed => "closed",
        }
    }
}

/// 1 ms to about 65 s, doubling.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 17)
}

pub struct HubMetrics {
    registry: Registry,
    connected: Arc<TopologyGauge>,
    problems: Arc<TopologyGauge>,
    control_delta: Histogram,
    db_write: Histogram,
    reports: Counter,
    reconciles: Family<ResultLabel, Counter>,
    reconcile_duration: Family<ResultLabel, Histogram>,
    scrape_errors: Counter,
    refused: Family<ReasonLabel, Counter>,
    rows_written: Counter,
    rows_dropped: Family<ReasonLabel, Counter>,
    messages_dropped: Family<ReasonLabel, Counter>,
}

impl std::fmt::Debug for HubMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubMetrics").finish_non_exhaustive()
    }
}

impl Default for HubMetrics {
    fn default() -> Self {
        HubMetrics::new()
    }
}

impl HubMetrics {
    pub fn new() -> HubMetrics {
        let mut registry = Registry::default();
        let connected = Arc::new(TopologyGauge::new(
            "nextmini_hub_connected_agents",
            "Agents with a live control stream to the hub, per topology",
        ));
        registry.register_collector(Box::new(connected.clone()));
        let problems = Arc::new(TopologyGauge::new(
            "nextmini_hub_topology_problems",
            "Stored rows of a topology the hub cannot run as written (it runs their last good \
             state instead); `nextmini status` lists them",
        ));
        registry.register_collector(Box::new(problems.clone()));
        let control_delta = Histogram::new(latency_buckets());
        registry.register_with_unit(
            "nextmini_hub_control_delta",
            "Time from a change notification to its deltas queued on every affected agent session",
            Unit::Seconds,
            control_delta.clone(),
        );
        let db_write = Histogram::new(latency_buckets());
        registry.register_with_unit(
            "nextmini_hub_db_write",
            "Time to write one batch of agent counters (history and latest values) to PostgreSQL",
            Unit::Seconds,
            db_write.clone(),
        );
        let reports = Counter::default();
        registry.register(
            "nextmini_hub_reports",
            "Counter reports received from agents",
            reports.clone(),
        );
        let reconciles = Family::<ResultLabel, Counter>::default();
        registry.register(
            "nextmini_hub_reconciles",
            "Desired-state applies (nextmini up, controllers), by result: applied or failed",
            reconciles.clone(),
        );
        let reconcile_duration =
            Family::<ResultLabel, Histogram>::new_with_constructor(|| -> Histogram {
                Histogram::new(exponential_buckets(0.05, 2.0, 14))
            });
        registry.register_with_unit(
            "nextmini_hub_reconcile_duration",
            "Duration of desired-state applies, by result",
            Unit::Seconds,
            reconcile_duration.clone(),
        );
        let scrape_errors = Counter::default();
        registry.register(
            "nextmini_hub_scrape_errors",
            "Local agent metrics endpoints that could not be scraped (dead or slow agents)",
            scrape_errors.clone(),
        );
        let refused = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "nextmini_hub_refused_connections",
            "Control connections or sessions the hub refused, by reason (TLS, identity, credential)",
            refused.clone(),
        );
        let rows_written = Counter::default();
        registry.register(
            "nextmini_hub_counter_rows_written",
            "Link counter rows (one per link per agent report) written to the metrics history",
            rows_written.clone(),
        );
        let rows_dropped = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "nextmini_hub_counter_rows_dropped",
            "Link counter rows received but not written, by reason: db_backlog (PostgreSQL \
             unreachable longer than the buffer covers), topology_deleted, writer_stopped",
            rows_dropped.clone(),
        );
        let messages_dropped = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "nextmini_hub_control_messages_dropped",
            "Messages to agents (snapshots, deltas, flow notices) not queued on their session, \
             by reason: queue_full or closed",
            messages_dropped.clone(),
        );
        for r in RowDrop::ALL {
            drop(rows_dropped.get_or_create(&ReasonLabel {
                reason: r.as_str().into(),
            }));
        }
        for r in MessageDrop::ALL {
            drop(messages_dropped.get_or_create(&ReasonLabel {
                reason: r.as_str().into(),
            }));
        }
        // Both results exist from the start, so a rate over them is never "no data".
        for r in [ReconcileResult::Applied, ReconcileResult::Failed] {
            drop(reconciles.get_or_create(&ResultLabel {
                result: r.as_str().into(),
            }));
        }
        HubMetrics {
            registry,
            connected,
            problems,
            control_delta,
            db_write,
            reports,
            reconciles,
            reconcile_duration,
            scrape_errors,
            refused,
            rows_written,
            rows_dropped,
            messages_dropped,
        }
    }

    pub fn refused(&self, why: Refusal) {
        self.refused
            .get_or_create(&ReasonLabel {
                reason: why.as_str().into(),
            })
            .inc();
    }

    pub fn observe_control_delta(&self, took: Duration) {
        self.control_delta.observe(took.as_secs_f64());
    }

    pub fn observe_db_write(&self, took: Duration) {
        self.db_write.observe(took.as_secs_f64());
    }

    pub fn report_received(&self) {
        self.reports.inc();
    }

    pub fn reconciled(&self, result: ReconcileResult, took: Duration) {
        let label = ResultLabel {
            result: result.as_str().into(),
        };
        self.reconciles.get_or_create(&label).inc();
        self.reconcile_duration
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }

    pub fn scrape_failed(&self) {
        self.scrape_errors.inc();
    }

    pub fn counter_rows_written(&self, rows: usize) {
        self.rows_written.inc_by(rows as u64);
    }

    pub fn counter_rows_dropped(&self, reason: RowDrop, rows: usize) {
        self.rows_dropped
            .get_or_create(&ReasonLabel {
                reason: reason.as_str().into(),
            })
            .inc_by(rows as u64);
    }

    pub fn control_message_dropped(&self, reason: MessageDrop) {
        self.messages_dropped
            .get_or_create(&ReasonLabel {
                reason: reason.as_str().into(),
            })
            .inc();
    }

    /// Replaces the per-topology counts of connected agents. Topologies the
    /// hub knows with no agent connected should be passed with 0.
    pub fn set_connected_agents(&self, counts: BTreeMap<String, u64>) {
        *self.connected.values() = counts;
    }

    /// Sets how many faulty rows the hub found in a topology (`None`: the
    /// topology is gone).
    pub fn set_topology_problems(&self, topology: &str, problems: Option<u64>) {
        let mut values = self.problems.values();
        match problems {
            Some(n) => {
                values.insert(topology.to_string(), n);
            }
            None => {
                values.remove(topology);
            }
        }
    }

    /// The hub's metrics in the OpenMetrics text format, ending with `# EOF`.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// A gauge per topology (`nextmini_hub_connected_agents{topology}`, ...): values
/// the hub sets as it learns them, encoded from one copy so a scrape never sees
/// half an update, and topologies that are gone simply leave the map.
#[derive(Debug)]
struct TopologyGauge {
    name: &'static str,
    help: &'static str,
    values: Mutex<BTreeMap<String, u64>>,
}

impl TopologyGauge {
    fn new(name: &'static str, help: &'static str) -> Self {
        TopologyGauge {
            name,
            help,
            values: Mutex::new(BTreeMap::new()),
        }
    }

    fn values(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.values.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Collector for TopologyGauge {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let counts = self.values().clone();
        let mut family =
            encoder.encode_descriptor(self.name, self.help, None, MetricType::Gauge)?;
        for (topology, n) in &counts {
            let labels = nextmini_proto::topology_key::labels(topology);
            family.encode_family(&labels)?.encode_gauge(n)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_contract() {
        let m = HubMetrics::new();
        m.observe_control_delta(Duration::from_millis(3));
        m.observe_db_write(Duration::from_millis(2));
        m.report_received();
        m.reconciled(ReconcileResult::Applied, Duration::from_secs(2));
        m.scrape_failed();
        m.counter_rows_written(40);
        m.counter_rows_dropped(RowDrop::DbBacklog, 7);
        m.control_message_dropped(MessageDrop::QueueFull);
        m.set_connected_agents(BTreeMap::from([("line3".to_string(), 3)]));
        let text = m.encode().expect("encodes");
        for line in [
            "nextmini_hub_connected_agents{topology=\"line3\"} 3",
            "nextmini_hub_control_delta_seconds_count 1",
            "nextmini_hub_db_write_seconds_count 1",
            "nextmini_hub_reports_total 1",
            "nextmini_hub_reconciles_total{result=\"applied\"} 1",
            "nextmini_hub_reconciles_total{result=\"failed\"} 0",
            "nextmini_hub_reconcile_duration_seconds_count{result=\"applied\"} 1",
            "nextmini_hub_scrape_errors_total 1",
            "nextmini_hub_counter_rows_written_total 40",
            "nextmini_hub_counter_rows_dropped_total{reason=\"db_backlog\"} 7",
            "nextmini_hub_counter_rows_dropped_total{reason=\"topology_deleted\"} 0",
            "nextmini_hub_counter_rows_dropped_total{reason=\"writer_stopped\"} 0",
            "nextmini_hub_control_messages_dropped_total{reason=\"queue_full\"} 1",
            "nextmini_hub_control_messages_dropped_total{reason=\"closed\"} 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }
}

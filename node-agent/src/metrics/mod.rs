//! Prometheus metrics of the agent, served on `/metrics` over a Unix socket.
//!
//! The dataplane already counts everything in atomics (see [`crate::counters`]);
//! the collectors here read them when Prometheus scrapes, so the packet path does
//! no extra work for metrics. Every series carries the `topology` and `node`
//! labels; link series add `link`.

mod collector;
mod flows;
mod server;

pub use collector::DataplaneCollector;
pub use flows::{FlowCollector, observe_flow_completion};
pub use server::{Endpoints, PCAPNG, serve};

use crate::counters::NodeCounters;
use crate::listener::LinkMap;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Media type of the OpenMetrics text format that `prometheus-client` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the control loop knows that the dataplane's counters do not.
#[derive(Debug, Default)]
pub struct AgentState {
    stream_connected: AtomicBool,
    generation: AtomicU64,
}

impl AgentState {
    pub fn set_generation(&self, generation: u64) {
        self.generation.store(generation, Relaxed);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    pub fn stream_connected(&self) -> bool {
        self.stream_connected.load(Relaxed)
    }

    /// Marks the control stream connected until the returned guard is dropped,
    /// so every way out of a session (error, hub gone, `?`) marks it down again.
    pub fn stream_up(self: &Arc<Self>) -> StreamGuard {
        self.stream_connected.store(true, Relaxed);
        StreamGuard(self.clone())
    }
}

pub struct StreamGuard(Arc<AgentState>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.stream_connected.store(false, Relaxed);
    }
}

/// The dataplane's shared state the collectors read.
#[derive(Clone)]
pub struct Source {
    pub links: LinkMap,
    pub node: Arc<NodeCounters>,
    pub state: Arc<AgentState>,
    pub relay: Arc<crate::counters::RelayCounters>,
}

/// The agent's registry: dataplane and flow collectors, with `topology` and
/// `node` on every series, and `namespace` for a topology of a namespace
/// (`topology` is then its name alone, as Kubernetes shows it).
pub fn registry(topology: &str, node: &str, source: Source) -> Registry {
    let labels = nextmini_proto::topology_key::labels(topology)
        .into_iter()
        .chain([("node", node)])
        .map(|(k, v)| (Cow::Borrowed(k), Cow::Owned(v.to_string())));
    let mut registry = Registry::with_labels(labels);
    registry.register_collector(Box::new(DataplaneCollector::new(source)));
    registry.register_collector(Box::new(FlowCollector));
    registry
}

/// Every metric family the agent exports, with no series: what dashboards and
/// their tests may refer to.
pub fn describe() -> String {
    let source = Source {
        links: Arc::new(arc_swap::ArcSwap::from_pointee(Default::default())),
        node: Arc::default(),
        state: Arc::default(),
        relay: Arc::default(),
    };
    encode(&registry("", "", source)).unwrap_or_default()
}

/// The registry in the OpenMetrics text format, ending with `# EOF`.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arc_swap::ArcSwap;

    #[test]
    fn agent_series_carry_topology_and_node() {
        let state = Arc::new(AgentState::default());
        let source = Source {
            links: Arc::new(ArcSwap::from_pointee(Default::default())),
            node: Arc::new(NodeCounters::default()),
            state: state.clone(),
            relay: Arc::default(),
        };
        source.node.no_route.fetch_add(3, Relaxed);
        state.set_generation(7);
        let registry = registry("lab", "a", source);
        let text = {
            let _up = state.stream_up();
            encode(&registry).expect("encodes")
        };
        for line in [
            "nextmini_agent_generation{topology=\"lab\",node=\"a\"} 7",
            "nextmini_agent_stream_connected{topology=\"lab\",node=\"a\"} 1",
            "nextmini_agent_drops_total{topology=\"lab\",node=\"a\",cause=\"no_route\"} 3",
            "# TYPE nextmini_link_bytes counter",
            "# UNIT nextmini_link_rate_bits_per_second bits_per_second",
            "# TYPE nextmini_flow_completion_seconds histogram",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        assert!(!state.stream_connected(), "the guard marks the stream down");
    }

    #[test]
    fn a_namespaced_topology_labels_its_namespace_and_name_apart() {
        let source = Source {
            links: Arc::new(ArcSwap::from_pointee(Default::default())),
            node: Arc::new(NodeCounters::default()),
            state: Arc::default(),
            relay: Arc::default(),
        };
        let text = encode(&registry("team-a/wan", "a", source)).expect("encodes");
        let line = "nextmini_agent_generation{namespace=\"team-a\",topology=\"wan\",node=\"a\"} 0";
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

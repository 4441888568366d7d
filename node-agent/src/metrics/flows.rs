//! Flow completion times of synthetic flows, per flow class.
//!
//! A process-wide histogram set: the flow engine reports a finished flow with
//! [`observe_flow_completion`] from wherever it runs, without being handed a
//! registry. The agent's registry adds `topology` and `node`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Unit;
use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};

static FLOWS: LazyLock<Mutex<BTreeMap<String, Histogram>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// 100 µs to about 52 s, doubling: a flow of a few packets on a LAN-like link up
/// to a bulk transfer over a slow one.
fn buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 2.0, 20)
}

/// Records that a flow of `class` completed after `seconds`
/// (`nextmini_flow_completion_seconds{class}`).
pub fn observe_flow_completion(class: &str, seconds: f64) {
    let histogram = {
        let mut flows = FLOWS.lock().unwrap_or_else(|e| e.into_inner());
        flows
            .entry(class.to_string())
            .or_insert_with(|| Histogram::new(buckets()))
            .clone()
    };
    histogram.observe(seconds);
}

/// Encodes the FCT histograms. The family is described even before any flow
/// completed, so dashboards and scrapers can see it exists.
#[derive(Debug)]
pub struct FlowCollector;

impl Collector for FlowCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let flows: Vec<(String, Histogram)> = FLOWS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(c, h)| (c.clone(), h.clone()))
            .collect();
        let mut family = encoder.encode_descriptor(
            "nextmini_flow_completion",
            "Flow completion time of synthetic flows, by flow class",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (class, histogram) in &flows {
            let labels = [("class", class.as_str())];
            histogram.encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_are_counted_per_class() {
        observe_flow_completion("test-mice", 0.002);
        observe_flow_completion("test-mice", 0.004);
        observe_flow_completion("test-elephants", 3.0);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(FlowCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(text.contains("# TYPE nextmini_flow_completion_seconds histogram"));
        assert!(text.contains("nextmini_flow_completion_seconds_count{class=\"test-mice\"} 2"));
        assert!(
            text.contains("nextmini_flow_completion_seconds_count{class=\"test-elephants\"} 1")
        );
    }
}

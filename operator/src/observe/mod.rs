//! Seeing the network: the hub's Prometheus metrics and the one scrape endpoint
//! that serves them with every local agent's, file service discovery, the load
//! of a running topology read from the store, and its rendering as Mermaid,
//! DOT or a self-contained HTML page.

pub mod dashboards;
pub mod endpoint;
pub mod exposition;
pub mod format;
pub mod graph;
pub mod http;
pub mod hub_metrics;
pub mod load;
pub mod memory;
pub mod reconcile;
pub mod sockets;
pub mod targets;

pub use hub_metrics::{HubMetrics, MessageDrop, ReconcileResult, Refusal, RowDrop};
pub use memory::{process_rss_bytes, return_free_memory};

/// Where the hub serves metrics unless told otherwise (the port Prometheus'
/// own exporters conventionally leave for applications).
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";

/// Where the hub serves metrics: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsAddr(pub Option<std::net::SocketAddr>);

impl std::str::FromStr for MetricsAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "off" | "none" | "" => Ok(MetricsAddr(None)),
            addr => addr
                .parse()
                .map(|a| MetricsAddr(Some(a)))
                .map_err(|_| format!("{s:?} is not an address like 127.0.0.1:9464 (or \"off\")")),
        }
    }
}

impl std::fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(a) => write!(f, "{a}"),
            None => f.write_str("off"),
        }
    }
}

/// `<state-dir>/metrics/address`: where the running hub serves metrics, for
/// `status` and `graph` to point at.
pub fn address_file(state_dir: &std::path::Path) -> std::path::PathBuf {
    sockets::metrics_dir(state_dir).join("address")
}

/// The running hub's metrics address, if it serves one.
pub fn running_address(state_dir: &std::path::Path) -> Option<std::net::SocketAddr> {
    std::fs::read_to_string(address_file(state_dir))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_addr_parses_addresses_and_off() {
        assert_eq!(
            "127.0.0.1:9464".parse::<MetricsAddr>(),
            Ok(MetricsAddr(Some("127.0.0.1:9464".parse().expect("addr"))))
        );
        assert_eq!("off".parse::<MetricsAddr>(), Ok(MetricsAddr(None)));
        assert!("9464".parse::<MetricsAddr>().is_err());
        assert_eq!(MetricsAddr(None).to_string(), "off");
    }
}

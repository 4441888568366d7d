//! The host's one scrape endpoint in local mode (default 127.0.0.1:9464):
//!
//! - `/metrics`: the hub's metrics and every local agent's, in one exposition;
//! - `/hub/metrics`: the hub's alone;
//! - `/agents/<topology>/<node>/metrics`: one agent's (for file service discovery).
//!
//! Agents are scraped through their Unix sockets on each request, in parallel,
//! each with a short timeout; one that does not answer is left out and counted
//! in `nextmini_hub_scrape_errors_total`.

use super::http::{Get, Handler, Reply, fetch_unix};
use super::{exposition, graph, load, sockets};
use crate::hub::Hub;
use std::path::PathBuf;
use std::time::Duration;

/// The media type `prometheus-client` writes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long an agent may take when the scraper does not say how long it waits.
pub const AGENT_TIMEOUT: Duration = Duration::from_millis(500);

/// Most of the scraper's own timeout (Prometheus says it in a header), leaving
/// time to merge and send; [`AGENT_TIMEOUT`] when it does not say.
pub fn agent_timeout(scrape_timeout: Option<Duration>) -> Duration {
    match scrape_timeout {
        Some(t) => t
            .mul_f64(0.8)
            .saturating_sub(Duration::from_millis(50))
            .clamp(Duration::from_millis(100), Duration::from_secs(5)),
        None => AGENT_TIMEOUT,
    }
}

pub struct Endpoint {
    hub: Hub,
    metrics_dir: PathBuf,
}

impl Endpoint {
    pub fn new(hub: Hub, metrics_dir: PathBuf) -> Endpoint {
        Endpoint { hub, metrics_dir }
    }

    async fn hub_text(&self) -> Result<String, std::fmt::Error> {
        self.hub.refresh_connected_agents().await;
        self.hub.metrics().encode()
    }

    /// One agent's exposition, or `None` (counted) when it does not answer.
    async fn agent_text(&self, socket: &sockets::AgentSocket, timeout: Duration) -> Option<String> {
        match fetch_unix(&socket.path, "/metrics", timeout).await {
            Ok(text) => Some(text),
            Err(e) => {
                self.hub.metrics().scrape_failed();
                tracing::debug!(topology = %socket.topology, node = %socket.node, error = %e, "agent metrics scrape failed");
                None
            }
        }
    }

    async fn everything(&self, timeout: Duration) -> Reply {
        let agents = sockets::list(&self.metrics_dir);
        // Agents first, so this very scrape's failures are in the hub's count.
        let agent_texts =
            futures::future::join_all(agents.iter().map(|s| self.agent_text(s, timeout))).await;
        let hub = match self.hub_text().await {
            Ok(h) => h,
            Err(e) => return Reply::error(format!("encoding hub metrics: {e}\n")),
        };
        let parts =
            std::iter::once(hub.as_str()).chain(agent_texts.iter().flatten().map(String::as_str));
        Reply::ok(OPENMETRICS, exposition::merge(parts))
    }

    async fn one_agent(&self, topology: &str, node: &str, timeout: Duration) -> Reply {
        if !sockets::is_plain_key(topology) || !sockets::is_plain_name(node) {
            return Reply::not_found("no such agent\n");
        }
        let socket = sockets::AgentSocket {
            topology: topology.to_string(),
            node: node.to_string(),
            path: self.metrics_dir.join(topology).join(format!("{node}.sock")),
        };
        if !socket.path.exists() {
            return Reply::not_found(format!("no local agent {topology}/{node}\n"));
        }
        match self.agent_text(&socket, timeout).await {
            Some(text) => Reply::ok(OPENMETRICS, text),
            None => Reply {
                status: 503,
                content_type: "text/plain; charset=utf-8",
                body: format!("agent {topology}/{node} did not answer\n"),
            },
        }
    }
}

impl Endpoint {
    /// `/graph/<topology>`: the live HTML graph; `/graph/<topology>.json`: its data.
    async fn graph(&self, page: &str) -> Reply {
        let (topology, json) = match page.strip_suffix(".json") {
            Some(t) => (t, true),
            None => (page, false),
        };
        if !sockets::is_plain_key(topology) {
            return Reply::not_found("no such topology\n");
        }
        let topo = match load::load(self.hub.store(), topology).await {
            Ok(Some(l)) => l,
            Ok(None) => return Reply::not_found(format!("no topology {topology}\n")),
            Err(e) => return Reply::error(format!("reading the store: {e}\n")),
        };
        let live = format!("/graph/{topology}.json");
        let now = chrono::Utc::now()
            .format("%Y-%m-%d %H:%M:%S UTC")
            .to_string();
        if json {
            Reply::ok(
                "application/json",
                graph::page_data(&topo, Some(&live), &now).to_string(),
            )
        } else {
            Reply::ok(
                "text/html; charset=utf-8",
                graph::html(&topo, Some(&live), &now),
            )
        }
    }
}

/// `/agents/<topology>/<node>/metrics` → (topology, node).
fn agent_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/agents/")?.strip_suffix("/metrics")?;
    // The topology's key may be `namespace/name`; the node is the last part.
    let (topology, node) = rest.rsplit_once('/')?;
    (!node.contains('/')).then_some((topology, node))
}

impl Handler for Endpoint {
    async fn get(&self, request: Get<'_>) -> Reply {
        let agent_timeout = agent_timeout(request.scrape_timeout);
        match request.path {
            "/metrics" => self.everything(agent_timeout).await,
            "/hub/metrics" => match self.hub_text().await {
                Ok(text) => Reply::ok(OPENMETRICS, text),
                Err(e) => Reply::error(format!("encoding hub metrics: {e}\n")),
            },
            "/" => Reply::ok(
                "text/plain; charset=utf-8",
                "Nextmini metrics\n  /metrics                              hub and every local agent\n  \
                 /hub/metrics                          hub only\n  \
                 /agents/<topology>/<node>/metrics     one agent\n  \
                 /graph/<topology>                     live topology graph\n"
                    .into(),
            ),
            other => {
                if let Some((topology, node)) = agent_path(other) {
                    return self.one_agent(topology, node, agent_timeout).await;
                }
                if let Some(page) = other.strip_prefix("/graph/") {
                    return self.graph(page).await;
                }
                Reply::not_found("not found; try /metrics\n")
            }
        }
    }
}

/// Binds `addr` and serves the endpoint, `targets.json` and the address file in
/// the background for as long as the process runs; returns the bound address.
/// Failing to bind (a port in use) is for the caller to report: the hub's
/// control plane matters more than its metrics.
pub async fn start(
    hub: Hub,
    state_dir: &std::path::Path,
    addr: std::net::SocketAddr,
) -> std::io::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let dir = sockets::metrics_dir(state_dir);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(super::address_file(state_dir), format!("{bound}\n"))?;
    let endpoint = std::sync::Arc::new(Endpoint::new(hub, dir));
    tokio::spawn(super::http::serve(
        listener,
        endpoint,
        std::future::pending::<()>(),
    ));
    tokio::spawn(super::targets::keep_written(state_dir.to_path_buf(), bound));
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_get_most_of_the_scrapers_timeout() {
        assert_eq!(agent_timeout(None), AGENT_TIMEOUT);
        assert_eq!(
            agent_timeout(Some(Duration::from_secs(1))),
            Duration::from_millis(750)
        );
        assert_eq!(
            agent_timeout(Some(Duration::from_secs(60))),
            Duration::from_secs(5)
        );
        assert_eq!(
            agent_timeout(Some(Duration::from_millis(10))),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn agent_paths_parse() {
        assert_eq!(agent_path("/agents/line3/a/metrics"), Some(("line3", "a")));
        assert_eq!(
            agent_path("/agents/team-a/line3/a/metrics"),
            Some(("team-a/line3", "a")),
            "a namespace's topology"
        );
        assert_eq!(agent_path("/agents/line3/metrics"), None);
        assert_eq!(agent_path("/metrics"), None);
    }
}

//! File-based service discovery (`<state-dir>/metrics/targets.json`) for users
//! who prefer one Prometheus target per agent over the combined `/metrics`:
//!
//! ```yaml
//! scrape_configs:
//!   - job_name: nextmini
//!     file_sd_configs: [{files: [/var/lib/nextmini/metrics/targets.json]}]
//! ```
//!
//! Each agent is a path on the hub's endpoint. Series already carry `topology`
//! and `node`, so the target labels are `__meta_` ones (for relabelling) and do
//! not clash with them. Use this or the combined `/metrics`, not both.

use super::sockets::{self, AgentSocket};
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the hub looks for agents that came or went.
const RESCAN_EVERY: Duration = Duration::from_secs(2);

/// The target groups: the hub itself, then one per agent.
pub fn document(endpoint: SocketAddr, agents: &[AgentSocket]) -> serde_json::Value {
    // A wildcard bind is reachable on loopback; the file needs a concrete address.
    let addr = if endpoint.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), endpoint.port())
    } else {
        endpoint
    };
    let target = addr.to_string();
    let mut groups = vec![json!({
        "targets": [target],
        "labels": {"__metrics_path__": "/hub/metrics", "__meta_nextmini_role": "hub"},
    })];
    groups.extend(agents.iter().map(|a| {
        json!({
            "targets": [target],
            "labels": {
                "__metrics_path__": format!("/agents/{}/{}/metrics", a.topology, a.node),
                "__meta_nextmini_role": "agent",
                "__meta_nextmini_topology": a.topology,
                "__meta_nextmini_node": a.node,
            },
        })
    }));
    serde_json::Value::Array(groups)
}

/// Replaces `path` with `contents` atomically, so Prometheus never reads half a file.
fn write_atomically(path: &Path, contents: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

pub fn targets_file(state_dir: &Path) -> PathBuf {
    sockets::metrics_dir(state_dir).join("targets.json")
}

/// Keeps `targets.json` in step with the agents' sockets until dropped.
pub async fn keep_written(state_dir: PathBuf, endpoint: SocketAddr) {
    let dir = sockets::metrics_dir(&state_dir);
    let path = targets_file(&state_dir);
    let mut last = String::new();
    let mut tick = tokio::time::interval(RESCAN_EVERY);
    loop {
        tick.tick().await;
        let agents = sockets::list(&dir);
        let text = match serde_json::to_string_pretty(&document(endpoint, &agents)) {
            Ok(t) => t + "\n",
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode targets.json");
                continue;
            }
        };
        if text == last {
            continue;
        }
        match std::fs::create_dir_all(&dir).and_then(|()| write_atomically(&path, &text)) {
            Ok(()) => last = text,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "writing targets.json failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_group_for_the_hub_and_one_per_agent() {
        let agents = [AgentSocket {
            topology: "line3".into(),
            node: "a".into(),
            path: "/x/line3/a.sock".into(),
        }];
        let doc = document("0.0.0.0:9464".parse().expect("addr"), &agents);
        assert_eq!(doc[0]["targets"][0], "127.0.0.1:9464");
        assert_eq!(doc[0]["labels"]["__metrics_path__"], "/hub/metrics");
        assert_eq!(
            doc[1]["labels"]["__metrics_path__"],
            "/agents/line3/a/metrics"
        );
        assert_eq!(doc[1]["labels"]["__meta_nextmini_node"], "a");
        assert_eq!(doc.as_array().map(Vec::len), Some(2));
    }
}

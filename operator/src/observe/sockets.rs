//! Where local agents serve their metrics: `<state-dir>/metrics/<topology>/<node>.sock`.
//! The runtime passes each agent its path; the hub finds them all by listing.

use std::path::{Path, PathBuf};

/// The state directory inside agent and worker pods: the `nextmini` command's
/// default, so `nextmini capture --node X` run in the pod finds X's socket.
pub const POD_STATE_DIR: &str = "/var/lib/nextmini";

/// `<state-dir>/metrics`: agents' sockets below it, `targets.json` in it.
pub fn metrics_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("metrics")
}

/// The socket of one node's agent.
pub fn agent_socket(state_dir: &Path, topology: &str, node: &str) -> PathBuf {
    metrics_dir(state_dir)
        .join(topology)
        .join(format!("{node}.sock"))
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AgentSocket {
    pub topology: String,
    pub node: String,
    pub path: PathBuf,
}

/// Every agent socket under `metrics_dir`, sorted by topology and node. A
/// directory that cannot be read simply contributes nothing.
pub fn list(metrics_dir: &Path) -> Vec<AgentSocket> {
    let mut out = Vec::new();
    let Ok(topologies) = std::fs::read_dir(metrics_dir) else {
        return out;
    };
    for t in topologies.filter_map(|e| e.ok()) {
        let Ok(topology) = t.file_name().into_string() else {
            continue;
        };
        if !t.file_type().is_ok_and(|ft| ft.is_dir()) {
            continue;
        }
        let Ok(nodes) = std::fs::read_dir(t.path()) else {
            continue;
        };
        for n in nodes.filter_map(|e| e.ok()) {
            let Some(node) = n
                .file_name()
                .to_str()
                .and_then(|f| f.strip_suffix(".sock"))
                .map(str::to_string)
            else {
                continue;
            };
            out.push(AgentSocket {
                topology: topology.clone(),
                node,
                path: n.path(),
            });
        }
    }
    out.sort();
    out
}

/// Whether `name` is safe as one path component (a topology or node name taken
/// from a URL): DNS-label characters only, so no `/` and no `..`.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && name != "."
        && name != ".."
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_sockets_by_topology_and_node() {
        let dir = std::env::temp_dir().join(format!("nextmini-sockets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let state = dir.join("state");
        for (t, n) in [("line3", "b"), ("line3", "a"), ("ring", "r1")] {
            let p = agent_socket(&state, t, n);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, "").expect("touch");
        }
        std::fs::write(metrics_dir(&state).join("targets.json"), "[]").expect("targets");
        std::fs::write(metrics_dir(&state).join("line3/notes.txt"), "").expect("other file");
        let found: Vec<(String, String)> = list(&metrics_dir(&state))
            .into_iter()
            .map(|s| (s.topology, s.node))
            .collect();
        assert_eq!(
            found,
            [("line3", "a"), ("line3", "b"), ("ring", "r1")]
                .map(|(t, n)| (t.to_string(), n.to_string()))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn names_from_urls_cannot_escape() {
        assert!(is_plain_name("line3"));
        assert!(is_plain_name("r-1"));
        for bad in ["", "..", ".", "a/b", "a b", "%2e%2e"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
    }
}

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
/// topology of a namespace sits one level deeper (`<namespace>/<name>/`, as
/// its key reads); a directory that cannot be read contributes nothing.
pub fn list(metrics_dir: &Path) -> Vec<AgentSocket> {
    let mut out = Vec::new();
    for (key, dir) in subdirs(metrics_dir, None) {
        // A namespace's directory holds its topologies' directories.
        for (nested, nested_dir) in subdirs(&dir, Some(&key)) {
            sockets_in(&nested_dir, &nested, &mut out);
        }
        sockets_in(&dir, &key, &mut out);
    }
    out.sort();
    out
}

fn subdirs(dir: &Path, parent: Option<&str>) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|ft| ft.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let key = match parent {
                Some(p) => format!("{p}/{name}"),
                None => name,
            };
            Some((key, e.path()))
        })
        .collect()
}

fn sockets_in(dir: &Path, topology: &str, out: &mut Vec<AgentSocket>) {
    let Ok(nodes) = std::fs::read_dir(dir) else {
        return;
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
            topology: topology.to_string(),
            node,
            path: n.path(),
        });
    }
}

/// Whether a topology key from a URL is safe as a path: one plain name, or
/// two (`namespace/name`).
pub fn is_plain_key(key: &str) -> bool {
    let (namespace, name) = nextmini_proto::topology_key::split(key);
    namespace.is_none_or(is_plain_name) && is_plain_name(name)
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
        for (t, n) in [
            ("line3", "b"),
            ("line3", "a"),
            ("ring", "r1"),
            ("team-a/line3", "a"),
            ("team-a", "x"),
        ] {
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
            [
                ("line3", "a"),
                ("line3", "b"),
                ("ring", "r1"),
                ("team-a", "x"),
                ("team-a/line3", "a")
            ]
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
        assert!(is_plain_key("team-a/line3") && is_plain_key("line3"));
        for bad in ["a/../b", "../x", "a/b/c", "/x"] {
            assert!(!is_plain_key(bad), "{bad:?}");
        }
    }
}

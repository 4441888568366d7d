//! How a topology is known to the store, the hub, the agents and their
//! credentials: its namespace and name, as one string.
//!
//! A topology from a Kubernetes namespace (or a local manifest that names one)
//! is `namespace/name`; a local topology without a namespace is its bare name,
//! so every name of before stays valid. Kubernetes names cannot hold a `/`, so
//! the key splits back without ambiguity, and two teams' topologies of the
//! same name in two namespaces never meet.

/// The key of topology `name` in `namespace` (`None` or empty: no namespace).
pub fn join(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// The namespace (if any) and the name of a key.
pub fn split(key: &str) -> (Option<&str>, &str) {
    match key.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, key),
    }
}

/// The name alone: what Kubernetes objects, labels and the experiment's
/// random streams are derived from, so the same manifest draws the same
/// numbers in any namespace and in local mode.
pub fn name_of(key: &str) -> &str {
    split(key).1
}

/// The Prometheus labels a topology's series carry: `namespace` when it has
/// one, and `topology`, its name (as Kubernetes shows it). Agents and the hub
/// label alike, so their series join.
pub fn labels(key: &str) -> Vec<(&'static str, &str)> {
    let (namespace, name) = split(key);
    namespace
        .map(|ns| ("namespace", ns))
        .into_iter()
        .chain([("topology", name)])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_back_into_what_made_them() {
        assert_eq!(join(Some("team-a"), "wan"), "team-a/wan");
        assert_eq!(join(None, "wan"), "wan");
        assert_eq!(join(Some(""), "wan"), "wan");
        assert_eq!(split("team-a/wan"), (Some("team-a"), "wan"));
        assert_eq!(split("wan"), (None, "wan"));
        assert_eq!(name_of("team-b/wan"), name_of("wan"));
        assert_eq!(
            labels("team-a/wan"),
            [("namespace", "team-a"), ("topology", "wan")]
        );
        assert_eq!(labels("wan"), [("topology", "wan")]);
    }
}

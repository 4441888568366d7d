//! Rules a topology must satisfy before it can be planned. Every rule reports into the
//! same list so the user sees all problems at once.

use super::address;
use super::assemble::{Draft, DraftLink};
use super::errors::ValidationErrors;
use super::params_check;
use super::routes::Graph;
use crate::api::DNS_LABEL_MAX;
use crate::units::Size;
use std::collections::{HashMap, HashSet};

pub(crate) const PROCESSORS: std::ops::RangeInclusive<u32> = 1..=64;
pub(crate) const MTU: std::ops::RangeInclusive<u32> = 576..=9000;

pub(crate) fn check(draft: &Draft, errors: &mut ValidationErrors) {
    dataplane(draft, errors);
    address::check(draft, errors);
    let nodes = nodes(draft, errors);
    packing(draft, errors);
    super::socks::check(draft, errors);
    params_check::check(draft, errors);
    let graph = links(draft, &nodes, errors);
    super::flows::check(draft, &graph, errors);
    super::scenario::check(draft, &graph, errors);
}

fn dataplane(draft: &Draft, errors: &mut ValidationErrors) {
    let dp = &draft.doc.object.spec.dataplane;
    let origin = &draft.doc.origin;
    if !PROCESSORS.contains(&dp.processors) {
        errors.push(
            origin,
            "spec.dataplane.processors",
            format!("must be between 1 and 64, got {}", dp.processors),
        );
    }
    if !MTU.contains(&dp.mtu) {
        errors.push(
            origin,
            "spec.dataplane.mtu",
            format!("must be between 576 and 9000, got {}", dp.mtu),
        );
    }
    let interval = draft.doc.object.spec.telemetry.interval.as_std();
    if interval < std::time::Duration::from_millis(100)
        || interval > std::time::Duration::from_secs(60)
    {
        errors.push(
            origin,
            "spec.telemetry.interval",
            format!(
                "must be between 100ms and 60s, got {}",
                draft.doc.object.spec.telemetry.interval
            ),
        );
    }
}

/// `nodesPerWorker` and `workers` (the API server checks the same with CEL, but
/// local manifests never meet it).
fn packing(draft: &Draft, errors: &mut ValidationErrors) {
    use super::model::MAX_NODES_PER_WORKER;
    use crate::api::Placement;
    let spec = &draft.doc.object.spec;
    let origin = &draft.doc.origin;
    let packed = matches!(spec.placement, Placement::Packed | Placement::Netns);
    for (field, set) in [
        ("spec.nodesPerWorker", spec.nodes_per_worker.is_some()),
        ("spec.workers", spec.workers.is_some()),
        ("spec.workerImage", spec.worker_image.is_some()),
    ] {
        if set && !packed {
            errors.push(
                origin,
                field,
                "only packed placement has worker pods: set placement: packed, or remove this field",
            );
        }
    }
    if spec.nodes_per_worker.is_some() && spec.workers.is_some() {
        errors.push(
            origin,
            "spec.workers",
            "set nodesPerWorker or workers, not both",
        );
    }
    if let Some(n) = spec.nodes_per_worker
        && !(1..=MAX_NODES_PER_WORKER).contains(&n)
    {
        errors.push(
            origin,
            "spec.nodesPerWorker",
            format!("must be between 1 and {MAX_NODES_PER_WORKER}, got {n}"),
        );
    }
    if let Some(w) = spec.workers {
        let nodes = u32::try_from(draft.nodes.len()).unwrap_or(u32::MAX);
        if w == 0 {
            errors.push(origin, "spec.workers", "must be at least 1");
        } else if nodes.div_ceil(w) > MAX_NODES_PER_WORKER {
            errors.push(
                origin,
                "spec.workers",
                format!(
                    "{w} workers for {nodes} nodes put {} nodes in one worker, more than {MAX_NODES_PER_WORKER}; use at least {} workers",
                    nodes.div_ceil(w),
                    nodes.div_ceil(MAX_NODES_PER_WORKER)
                ),
            );
        }
    }
    if let Some(image) = &spec.worker_image
        && image.trim().is_empty()
    {
        errors.push(origin, "spec.workerImage", "must name an image");
    }
}

/// Why `name` cannot be a node name (it becomes a host name), if it cannot.
pub fn dns_label_problem(name: &str) -> Option<String> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if name.is_empty() {
        Some("must not be empty".to_owned())
    } else if name.len() > DNS_LABEL_MAX {
        Some(format!(
            "{name:?} is {} characters long; node names are host names of at most 63",
            name.len()
        ))
    } else if !name.chars().all(|c| alnum(c) || c == '-')
        || !name.starts_with(alnum)
        || !name.ends_with(alnum)
    {
        Some(format!(
            "{name:?} is not a DNS label: use lowercase letters, digits and '-', starting and ending with a letter or digit"
        ))
    } else {
        None
    }
}

/// Checks names and resources; returns the known node names (first occurrence wins).
fn nodes<'d>(draft: &'d Draft, errors: &mut ValidationErrors) -> Vec<&'d str> {
    let origin = &draft.doc.origin;
    // A broken generator was already reported and explains the missing nodes.
    if draft.nodes.is_empty() && draft.doc.object.spec.generator.is_none() {
        errors.push(
            origin,
            "spec.nodes",
            "a topology needs at least one node: list nodes or set a generator",
        );
    }
    let mut seen: HashMap<&str, &str> = HashMap::new();
    let mut names = Vec::with_capacity(draft.nodes.len());
    for node in &draft.nodes {
        if let Some(problem) = dns_label_problem(&node.name) {
            errors.push(origin, &node.field, problem);
        }
        if let Some(first) = seen.get(node.name.as_str()) {
            let also = if first.starts_with("spec.generator") {
                "also generated by"
            } else {
                "also"
            };
            errors.push(
                origin,
                &node.field,
                format!("duplicate node name {:?} ({also} {first})", node.name),
            );
            continue;
        }
        seen.insert(&node.name, &node.field);
        names.push(node.name.as_str());
        if let Some(resources) = node.resources {
            // Only listed nodes have resources, and their field is `spec.nodes[i].name`.
            let prefix = node.field.trim_end_matches(".name");
            if resources.cpu.is_some_and(|c| c.millis() == 0) {
                errors.push(
                    origin,
                    format!("{prefix}.resources.cpu"),
                    "must be greater than 0",
                );
            }
            match resources.memory {
                Some(Size::Packets(_)) => {
                    errors.push(
                        origin,
                        format!("{prefix}.resources.memory"),
                        "must be in bytes, e.g. 64Mi",
                    );
                }
                Some(Size::Bytes(0)) => errors.push(
                    origin,
                    format!("{prefix}.resources.memory"),
                    "must be greater than 0",
                ),
                _ => {}
            }
        }
    }
    names
}

/// Checks every link; returns the graph of the well-formed ones for the flow checks.
fn links<'d>(draft: &'d Draft, nodes: &[&'d str], errors: &mut ValidationErrors) -> Graph<'d> {
    let known: HashSet<&str> = nodes.iter().copied().collect();
    let mut names: HashMap<&str, &DraftLink> = HashMap::new();
    let mut pairs: HashMap<(&str, &str), &DraftLink> = HashMap::new();
    let mut good = Vec::with_capacity(draft.links.len());
    for link in &draft.links {
        let doc = link.document;
        match names.get(link.name.as_str()) {
            Some(first) => errors.push(
                doc,
                &link.name_field,
                format!(
                    "duplicate link name {:?} (also {} {})",
                    link.name, first.document, first.name_field
                ),
            ),
            None => {
                names.insert(&link.name, link);
            }
        }
        let [a, b] = link.endpoints.as_slice() else {
            errors.push(
                doc,
                &link.endpoints_field,
                format!(
                    "a link joins exactly 2 nodes, found {}",
                    link.endpoints.len()
                ),
            );
            continue;
        };
        let mut ok = true;
        for (i, endpoint) in [a, b].into_iter().enumerate() {
            if !known.contains(endpoint.as_str()) {
                ok = false;
                errors.push(
                    doc,
                    format!("{}[{i}]", link.endpoints_field),
                    format!("no node {endpoint:?} in topology {:?}", draft.name),
                );
            }
        }
        if a == b {
            errors.push(
                doc,
                format!("{}[1]", link.endpoints_field),
                format!("a link cannot connect node {a:?} to itself"),
            );
            continue;
        }
        let key = if a < b {
            (a.as_str(), b.as_str())
        } else {
            (b.as_str(), a.as_str())
        };
        if let Some(first) = pairs.get(&key) {
            errors.push(
                doc,
                &link.endpoints_field,
                format!(
                    "{a:?} and {b:?} are already linked by {:?} ({} {})",
                    first.name, first.document, first.endpoints_field
                ),
            );
            continue;
        }
        pairs.insert(key, link);
        if ok {
            good.push((link.name.as_str(), a.as_str(), b.as_str()));
        }
    }
    Graph::new(nodes.iter().copied(), good)
}

/// Fields namespace mode (`nextmini up`) accepts but cannot use, each as
/// `<origin> <field>: why`: they shape the worker pods of a cluster, and the
/// same YAML must run in both places, so they are named, not refused.
pub fn local_warnings(m: &super::Manifest) -> Vec<String> {
    let mut warnings = Vec::new();
    for doc in &m.topologies {
        let spec = &doc.object.spec;
        // `placement: packed` on one machine is `netns` (DESIGN.md).
        for (field, set) in [
            ("spec.nodesPerWorker", spec.nodes_per_worker.is_some()),
            ("spec.workers", spec.workers.is_some()),
            ("spec.workerImage", spec.worker_image.is_some()),
        ] {
            if set {
                warnings.push(format!(
                    "{} {field}: has no effect in namespace mode, where every node is a network namespace on this machine (worker pods exist only in a cluster)",
                    doc.origin
                ));
            }
        }
    }
    for doc in &m.member_clusters {
        if doc.object.spec.kubeconfig_secret_ref.is_some() {
            warnings.push(format!(
                "{}: in namespace mode every node runs on this machine; its nodes keep their region's link parameters, and no real round trip is subtracted from their delays",
                doc.origin
            ));
        }
    }
    warnings
}

/// What namespace mode (`nextmini up`, no cluster) cannot honour: a field it
/// would otherwise accept and silently drop.
pub fn check_local(m: &super::Manifest) -> Result<(), ValidationErrors> {
    let mut errors = ValidationErrors::default();
    for doc in &m.topologies {
        // The namespace becomes part of the topology's key (`namespace/name`),
        // as in a cluster, where the API server holds it to these rules.
        if let Some(problem) = doc
            .object
            .metadata
            .namespace
            .as_deref()
            .and_then(dns_label_problem)
        {
            errors.push(&doc.origin, "metadata.namespace", problem);
        }
        if doc
            .object
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.contains('/'))
        {
            errors.push(
                &doc.origin,
                "metadata.name",
                "must not contain '/' (a topology is known as namespace/name)",
            );
        }
        let spec = &doc.object.spec;
        for (i, node) in spec.nodes.iter().enumerate() {
            if !node.containers.is_empty() {
                errors.push(
                    &doc.origin,
                    format!("spec.nodes[{i}].containers"),
                    "application containers run only in a cluster (one pod per node); in namespace mode start applications with `nextmini exec <node> -- <command>`",
                );
            }
        }
    }
    errors.into_result(())
}

//! Phase 2 (pure): plan the topology with the same planner as local mode, plus
//! what only a cluster needs checked. Errors become an `Invalid` condition that
//! names the object, the field and the reason; nothing running is touched.

use crate::api::{MemberCluster, Topology};
use crate::plan::{self, LINK_PORT, Manifest, Packing, Placement, Plan};
use crate::runtime::pods;
use k8s_openapi::api::core::v1::Container;
use nextmini_proto::topology_key;
use std::collections::BTreeMap;

/// A plan the cluster can run, with the user containers of each node.
#[derive(Debug, Clone)]
pub struct Validated {
    pub plan: Plan,
    pub containers: BTreeMap<String, Vec<Container>>,
    /// Packed placement: the image of the worker pods, when the spec names one.
    pub worker_image: Option<String>,
    /// The member clusters running some of the nodes, by MemberCluster name.
    pub remote: BTreeMap<String, RemoteCluster>,
}

impl Validated {
    /// The member cluster a node runs in, when not the operator's own.
    pub fn remote_of(&self, node: &crate::plan::PlannedNode) -> Option<&RemoteCluster> {
        self.remote.get(node.cluster.as_deref()?)
    }
}

/// Why a topology cannot run; shown as the reason and message of its
/// `Planned` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub reason: &'static str,
    pub message: String,
}

/// The most nodes of a pod-per-node topology: each pod lists every node's
/// name as a host alias, about 60 bytes each in the stored pod, so this keeps
/// a pod under 256 KiB (packed workers read names from ConfigMaps instead).
pub const MAX_POD_PER_NODE: usize = 4096;

/// Containers the agent pod reserves for itself.
const AGENT_CONTAINER: &str = "agent";

pub fn validate(
    manifest: &Manifest,
    namespace: &str,
    stored_runtime: Option<&str>,
) -> Result<Validated, Invalid> {
    let topology = manifest
        .topologies
        .first()
        .map(|d| &d.object)
        .ok_or_else(|| Invalid {
            reason: "InvalidSpec",
            message: "no Topology".into(),
        })?;
    let mut plans = plan::plan_manifest(manifest).map_err(|errors| Invalid {
        reason: "InvalidSpec",
        message: errors.to_string(),
    })?;
    let mut plan = plans.pop().ok_or_else(|| Invalid {
        reason: "InvalidSpec",
        message: "the topology planned to nothing".into(),
    })?;
    // Known by namespace and name from here on: the store, the hub, the
    // agents and their certificates keep two namespaces' topologies apart.
    plan.topology = topology_key::join(Some(namespace), &plan.topology);
    // Namespaces in a cluster are namespaces packed into worker pods.
    if plan.placement == Placement::Netns {
        plan.placement = Placement::Packed(Packing::default());
    }
    if let Some(runtime) = stored_runtime
        && runtime != pods::runtime_name(namespace)
    {
        let other = pods::namespace_of(runtime)
            .map(|ns| format!("namespace {ns}"))
            .unwrap_or_else(|| format!("local mode ({runtime})"));
        return Err(Invalid {
            reason: "NameTaken",
            message: format!(
                "metadata.name: a topology {} already runs in {other}; a namespace's topology names are unique per database",
                plan.topology
            ),
        });
    }
    let remote = remote_clusters(manifest, &plan, namespace)?;
    if !remote.is_empty() {
        let home = super::exposure::home_member(manifest);
        let sites = sites(&plan, &remote);
        super::exposure::check(
            &plan,
            |node| sites.get(node).cloned().flatten(),
            |site| match site {
                Some(c) => remote.get(c).and_then(|r| r.member.spec.exposure.clone()),
                None => home.and_then(|h| h.spec.exposure.clone()),
            },
            home.and_then(|h| h.metadata.name.as_deref()),
        )?;
    }
    let containers = user_containers(topology)?;
    match plan.packing() {
        Some(packing) => packed_fits(topology, &plan, packing, &containers)?,
        None if plan.nodes.len() > MAX_POD_PER_NODE => {
            return Err(Invalid {
                reason: "InvalidSpec",
                message: format!(
                    "spec.placement: pod-per-node runs at most {MAX_POD_PER_NODE} nodes (every pod lists every node's name, and a pod per node would need as many pods), this topology has {}; use placement: packed",
                    plan.nodes.len()
                ),
            });
        }
        None => {}
    }
    Ok(Validated {
        plan,
        containers,
        worker_image: topology.spec.worker_image.clone(),
        remote,
    })
}

/// Where each node runs: the member cluster's name, or `None` for the
/// operator's own.
pub(super) fn sites(
    plan: &Plan,
    remote: &BTreeMap<String, RemoteCluster>,
) -> std::collections::HashMap<String, super::exposure::Site> {
    plan.nodes
        .iter()
        .map(|n| {
            let site = n.cluster.clone().filter(|c| remote.contains_key(c));
            (n.name.clone(), site)
        })
        .collect()
}

/// A member cluster that runs some of the topology's nodes, and what its
/// pods need: the hub address they dial and the namespace they go into.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteCluster {
    pub member: MemberCluster,
    pub hub_address: String,
    pub namespace: String,
}

/// The member clusters (those with a kubeconfig) that run nodes of the plan.
/// Refused by name: packed placement across clusters (a worker pod hosts
/// nodes of one cluster, and workers are dealt out by node index, not by
/// cluster), and a member whose agents would not know where the hub is.
fn remote_clusters(
    manifest: &Manifest,
    plan: &Plan,
    namespace: &str,
) -> Result<BTreeMap<String, RemoteCluster>, Invalid> {
    let mut remote = BTreeMap::new();
    for doc in &manifest.member_clusters {
        let member = &doc.object;
        let name = member.metadata.name.clone().unwrap_or_default();
        if member.spec.kubeconfig_secret_ref.is_none() {
            continue;
        }
        let placed: Vec<&str> = plan
            .nodes
            .iter()
            .filter(|n| n.cluster.as_deref() == Some(name.as_str()))
            .map(|n| n.name.as_str())
            .collect();
        let Some(first) = placed.first() else {
            continue;
        };
        if plan.packing().is_some() {
            return Err(Invalid {
                reason: "InvalidPlacement",
                message: format!(
                    "spec.placement: packed placement runs in the operator's own cluster only, yet node {first} is placed in member cluster {name}; use placement: pod-per-node (or leave it unset) for a topology across clusters"
                ),
            });
        }
        let Some(hub_address) = member.spec.hub_address.clone() else {
            return Err(Invalid {
                reason: "InvalidPlacement",
                message: format!(
                    "membercluster/{name} spec.hubAddress: required to run nodes there ({} node(s), e.g. {first}): the hub Service resolves only in the operator's own cluster, so agents in {name} need an address that reaches it",
                    placed.len()
                ),
            });
        };
        let hub_address = if hub_address.contains("://") {
            hub_address
        } else {
            format!("https://{hub_address}")
        };
        remote.insert(
            name,
            RemoteCluster {
                member: member.clone(),
                hub_address,
                namespace: member
                    .spec
                    .namespace
                    .clone()
                    .unwrap_or_else(|| namespace.to_owned()),
            },
        );
    }
    Ok(remote)
}

/// What packed placement cannot run: containers of a node (its namespace is
/// inside a shared worker pod, where containers cannot join it) and SOCKS
/// servers on the worker's link and relay ports.
fn packed_fits(
    topology: &Topology,
    plan: &Plan,
    packing: Packing,
    containers: &BTreeMap<String, Vec<Container>>,
) -> Result<(), Invalid> {
    let field_of = |node: &str| {
        topology
            .spec
            .nodes
            .iter()
            .position(|n| n.name == node)
            .map_or_else(|| "spec.nodes".to_string(), |i| format!("spec.nodes[{i}]"))
    };
    if let Some(node) = containers.keys().next() {
        return Err(Invalid {
            reason: "InvalidSpec",
            message: format!(
                "{}.containers: placement packed runs nodes as network namespaces in shared worker pods, which containers cannot join; use placement: pod-per-node, or put your tools into spec.workerImage and run them with `kubectl exec <worker> -- nextmini exec {node} -- <command>`",
                field_of(node)
            ),
        });
    }
    let nodes = u32::try_from(plan.nodes.len()).unwrap_or(u32::MAX);
    let used = LINK_PORT
        ..LINK_PORT.saturating_add(
            u16::try_from(packing.busiest_worker(nodes).saturating_mul(2)).unwrap_or(u16::MAX),
        );
    for node in plan.nodes.iter() {
        if let Some((j, s)) = node
            .socks
            .iter()
            .enumerate()
            .find(|(_, s)| used.contains(&s.listen.port()))
        {
            return Err(Invalid {
                reason: "InvalidSpec",
                message: format!(
                    "{}.socks[{j}].listen: port {} is one of the ports {}-{} the worker pods' links and relays use; choose another port",
                    field_of(&node.name),
                    s.listen.port(),
                    used.start,
                    used.end - 1
                ),
            });
        }
    }
    Ok(())
}

fn user_containers(topology: &Topology) -> Result<BTreeMap<String, Vec<Container>>, Invalid> {
    let mut out = BTreeMap::new();
    for (i, node) in topology.spec.nodes.iter().enumerate() {
        let mut parsed = Vec::with_capacity(node.containers.len());
        for (j, value) in node.containers.iter().enumerate() {
            let field = format!("spec.nodes[{i}].containers[{j}]");
            let c: Container = serde_json::from_value(value.clone()).map_err(|e| Invalid {
                reason: "InvalidSpec",
                message: format!("{field}: not a container: {e}"),
            })?;
            if c.name == AGENT_CONTAINER || c.name.is_empty() {
                return Err(Invalid {
                    reason: "InvalidSpec",
                    message: format!(
                        "{field}.name: {:?} is reserved or empty; name the container something else",
                        c.name
                    ),
                });
            }
            if c.image.as_deref().unwrap_or("").is_empty() {
                return Err(Invalid {
                    reason: "InvalidSpec",
                    message: format!("{field}.image: required"),
                });
            }
            parsed.push(c);
        }
        if !parsed.is_empty() {
            out.insert(node.name.clone(), parsed);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fetch::assemble;

    fn topology(yaml: &str) -> Topology {
        serde_norway::from_str(yaml).expect("fixture parses")
    }

    const LINE3: &str = include_str!("../../../manifests/examples/line3.yaml");

    fn line3() -> Manifest {
        crate::plan::parse_manifest("line3.yaml", LINE3).expect("line3 parses")
    }

    #[test]
    fn line3_plans_for_a_cluster_and_keeps_its_namespace() {
        let v = validate(&line3(), "lab", None).expect("valid");
        assert_eq!(v.plan.topology, "lab/line3", "known by namespace and name");
        assert_eq!(v.plan.nodes.len(), 3);
        assert!(v.containers.is_empty());
        assert!(validate(&line3(), "lab", Some("kubernetes/lab")).is_ok());
        let taken =
            validate(&line3(), "lab", Some("kubernetes/other")).expect_err("must be refused");
        assert_eq!(taken.reason, "NameTaken");
        assert!(
            taken.message.contains("namespace other"),
            "{}",
            taken.message
        );
        let local = validate(&line3(), "lab", Some("netns")).expect_err("must be refused");
        assert!(local.message.contains("local mode"), "{}", local.message);
    }

    #[test]
    fn planner_errors_name_the_object_and_field() {
        let t = topology(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: bad}\nspec:\n  nodes: [{name: a}, {name: b}]\n  links: [{endpoints: [a, z]}]\n",
        );
        let e = validate(&assemble(&t, vec![], vec![]), "lab", None).expect_err("must be refused");
        assert_eq!(e.reason, "InvalidSpec");
        assert!(e.message.contains("topology/bad"), "{}", e.message);
        assert!(e.message.contains("spec.links[0]"), "{}", e.message);
    }

    #[test]
    fn namespaces_in_a_cluster_are_packed_into_workers() {
        let t = topology(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: p}\nspec:\n  placement: netns\n  nodes: [{name: a}]\n",
        );
        let v = validate(&assemble(&t, vec![], vec![]), "lab", None).expect("valid");
        assert_eq!(v.plan.packing(), Some(Packing::NodesPerWorker(50)));
        let t = topology(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: p}\nspec:\n  placement: packed\n  workers: 3\n  workerImage: example.org/tools:1\n  nodes: [{name: a}]\n",
        );
        let v = validate(&assemble(&t, vec![], vec![]), "lab", None).expect("valid");
        assert_eq!(v.plan.packing(), Some(Packing::Workers(3)));
        assert_eq!(v.worker_image.as_deref(), Some("example.org/tools:1"));
    }

    #[test]
    fn packed_refuses_containers_and_socks_on_worker_ports_naming_the_field() {
        let t = topology(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: p}\nspec:\n  placement: packed\n  nodes:\n  - name: a\n  - name: b\n    containers: [{name: web, image: 'nginx:1'}]\n",
        );
        let e = validate(&assemble(&t, vec![], vec![]), "lab", None).expect_err("refused");
        assert_eq!(e.reason, "InvalidSpec");
        assert!(
            e.message
                .starts_with("spec.nodes[1].containers: placement packed"),
            "{}",
            e.message
        );
        // Three nodes per worker use ports 7100-7105.
        let t = topology(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: p}\nspec:\n  placement: packed\n  nodesPerWorker: 3\n  nodes:\n  - name: a\n  - name: b\n    socks: [{listen: '0.0.0.0:7105'}]\n  - name: c\n",
        );
        let e = validate(&assemble(&t, vec![], vec![]), "lab", None).expect_err("refused");
        assert!(
            e.message
                .starts_with("spec.nodes[1].socks[0].listen: port 7105"),
            "{}",
            e.message
        );
        let fine = t.clone();
        let mut fine = fine;
        fine.spec.nodes[1].socks[0].listen = "0.0.0.0:7106".into();
        assert!(validate(&assemble(&fine, vec![], vec![]), "lab", None).is_ok());
    }

    #[test]
    fn packing_fields_need_packed_placement_and_fit_a_worker() {
        let e = validate(
            &assemble(
                &topology(
                    "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: p}\nspec:\n  workers: 2\n  nodes: [{name: a}]\n",
                ),
                vec![],
                vec![],
            ),
            "lab",
            None,
        )
        .expect_err("refused");
        assert!(e.message.contains("spec.workers"), "{}", e.message);
        assert!(e.message.contains("placement: packed"), "{}", e.message);
        let e = validate(
            &assemble(
                &topology(
                    "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: p}\nspec:\n  placement: packed\n  workers: 1\n  generator: {ring: {nodes: 1001}}\n",
                ),
                vec![],
                vec![],
            ),
            "lab",
            None,
        )
        .expect_err("refused");
        assert!(
            e.message.contains("spec.workers") && e.message.contains("at least 2 workers"),
            "{}",
            e.message
        );
    }

    #[test]
    fn node_events_of_a_scenario_run_in_a_cluster_too() {
        // The agents apply kills themselves and the hub holds a killed node's
        // config until its restart (hub/scenario.rs).
        let m = crate::plan::parse_manifest(
            "t.yaml",
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: s}\nspec:\n  nodes: [{name: a}, {name: b}]\n  links: [{endpoints: [a, b]}]\n  scenario:\n    events:\n    - {at: 1s, link: a-b, state: down}\n    - {at: 2s, node: b, action: kill}\n    - {at: 3s, node: b, action: restart}\n",
        )
        .expect("parses");
        let v = validate(&m, "lab", None).expect("node events run in a cluster");
        assert_eq!(v.plan.scenario.len(), 3);
    }

    #[test]
    fn user_containers_are_checked_and_kept() {
        let t = topology(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: c}\nspec:\n  nodes:\n  - name: a\n    containers: [{name: web, image: 'nginx:1', ports: [{containerPort: 80}]}]\n  - name: b\n",
        );
        let v = validate(&assemble(&t, vec![], vec![]), "lab", None).expect("valid");
        assert_eq!(v.containers["a"][0].name, "web");
        let bad = topology(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: c}\nspec:\n  nodes:\n  - name: a\n    containers: [{name: agent, image: x}]\n",
        );
        let e =
            validate(&assemble(&bad, vec![], vec![]), "lab", None).expect_err("must be refused");
        assert!(
            e.message.starts_with("spec.nodes[0].containers[0].name"),
            "{}",
            e.message
        );
        let wrong = topology(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: c}\nspec:\n  nodes:\n  - name: a\n    containers: [{name: web, image: x, ports: 80}]\n",
        );
        let e =
            validate(&assemble(&wrong, vec![], vec![]), "lab", None).expect_err("must be refused");
        assert!(
            e.message.starts_with("spec.nodes[0].containers[0]"),
            "{}",
            e.message
        );
    }
}

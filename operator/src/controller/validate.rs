//! Phase 2 (pure): plan the topology with the same planner as local mode, plus
//! what only a cluster needs checked. Errors become an `Invalid` condition that
//! names the object, the field and the reason; nothing running is touched.

use crate::api::Topology;
use crate::plan::{self, Manifest, Placement, Plan};
use crate::runtime::pods;
use k8s_openapi::api::core::v1::Container;
use std::collections::BTreeMap;

/// A plan the cluster can run, with the user containers of each node.
#[derive(Debug, Clone)]
pub struct Validated {
    pub plan: Plan,
    pub containers: BTreeMap<String, Vec<Container>>,
}

/// Why a topology cannot run; shown as the reason and message of its
/// `Planned` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub reason: &'static str,
    pub message: String,
}

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
    let plan = plans.pop().ok_or_else(|| Invalid {
        reason: "InvalidSpec",
        message: "the topology planned to nothing".into(),
    })?;
    if plan.placement == Placement::Netns {
        return Err(Invalid {
            reason: "UnsupportedPlacement",
            message: "spec.placement: netns (many nodes packed into a few pods) is not supported in a cluster yet; use pod-per-node or leave placement unset".into(),
        });
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
                "metadata.name: a topology named {} already runs in {other}; topology names are unique per database",
                plan.topology
            ),
        });
    }
    let containers = user_containers(topology)?;
    Ok(Validated { plan, containers })
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
    fn packed_placement_is_refused_with_the_field() {
        let t = topology(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: p}\nspec:\n  placement: netns\n  nodes: [{name: a}]\n",
        );
        let e = validate(&assemble(&t, vec![], vec![]), "lab", None).expect_err("must be refused");
        assert_eq!(e.reason, "UnsupportedPlacement");
        assert!(e.message.starts_with("spec.placement"));
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

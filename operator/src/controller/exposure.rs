//! Where a node's link listener is dialed from, across clusters (issue 17.3).
//!
//! A link's dialer reaches its acceptor by the acceptor's name in the
//! topology's headless Service, which resolves only in the cluster and
//! namespace the Service is in. So the operator records, per node, an
//! endpoint that works from where its dialers are (`nodes.endpoint`; the hub
//! hands it to them as the link's peer address):
//! - a node that accepts a link from another cluster: how its cluster's
//!   MemberCluster says it is reached (`spec.exposure`): its pod IP
//!   (`Address`: pod addresses are routed between the clusters, as with
//!   Submariner or Cilium ClusterMesh), a NodePort of a Service of its own on
//!   the cluster's given address (the same port number for TCP and UDP, so a
//!   QUIC link crosses too), or a load balancer's address (`LoadBalancer`);
//! - any other node in a member cluster: its name in the headless Service of
//!   the member's namespace, which need not be the topology's;
//! - nothing otherwise (the topology's own names, as in one cluster).
//!
//! Every link authenticates its peer whatever the path (DESIGN.md, link
//! authentication), so an exposed port admits no one without the topology's
//! link key.

use super::apply::{self, Target};
use super::validate::Invalid;
use super::{Error, NODE_LABEL, TOPOLOGY_LABEL, build, remote};
use crate::api::{ExposureKind, ExposureSpec, MemberCluster, Topology};
use crate::plan::{LINK_PORT, Manifest, Plan};
use crate::runtime::pods;
use k8s_openapi::api::core::v1::{Pod, Service, ServicePort, ServiceSpec};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use nextmini_proto::topology_key::name_of;
use std::collections::{BTreeMap, BTreeSet};

/// Marks the Services that expose a node's links (value: the node).
pub const EXPOSES_LABEL: &str = "nextmini.io/exposes";

/// The cluster a node runs in: a member's name, or `None` for the operator's own.
pub(super) type Site = Option<String>;

/// The nodes that accept a link dialed from another cluster, with the link
/// (the first by name) and where it is dialed from.
pub(super) fn crossing_acceptors(
    plan: &Plan,
    site_of: impl Fn(&str) -> Site,
) -> BTreeMap<&str, (&str, Site)> {
    let mut out = BTreeMap::new();
    for link in &plan.links {
        let from = site_of(&link.dialer);
        if from != site_of(&link.acceptor) {
            out.entry(link.acceptor.as_str())
                .or_insert((link.name.as_str(), from));
        }
    }
    out
}

/// The MemberCluster standing for the operator's own cluster (no kubeconfig).
pub(super) fn home_member(manifest: &Manifest) -> Option<&MemberCluster> {
    manifest
        .member_clusters
        .iter()
        .map(|d| &d.object)
        .find(|m| m.spec.kubeconfig_secret_ref.is_none())
}

/// Refuses a topology with a link whose acceptor's cluster gives other
/// clusters no way in: it would stay down, dialing a name that does not
/// resolve where its dialer runs.
pub(super) fn check(
    plan: &Plan,
    site_of: impl Fn(&str) -> Site,
    exposure_of: impl Fn(&Site) -> Option<ExposureSpec>,
    home: Option<&str>,
) -> Result<(), Invalid> {
    let name_of_site = |s: &Site| match s {
        Some(c) => format!("member cluster {c}"),
        None => "the operator's own cluster".to_owned(),
    };
    for (node, (link, from)) in crossing_acceptors(plan, &site_of) {
        let site = site_of(node);
        if exposure_of(&site).is_some() {
            continue;
        }
        let fix = match (&site, home) {
            (Some(c), _) => format!("set membercluster/{c} spec.exposure"),
            (None, Some(h)) => format!("set membercluster/{h} spec.exposure"),
            (None, None) => "declare a MemberCluster without kubeconfigSecretRef for the operator's own cluster, with spec.exposure".to_owned(),
        };
        return Err(Invalid {
            reason: "InvalidPlacement",
            message: format!(
                "links {link}: its acceptor {node} runs in {}, which gives other clusters no way in, yet the link is dialed from {}; {fix} (NodePort with an address, LoadBalancer, or Address when pod IPs are routed between the clusters)",
                name_of_site(&site),
                name_of_site(&from)
            ),
        });
    }
    Ok(())
}

/// What to record for the nodes of one cluster.
#[derive(Default)]
pub(super) struct ClusterNodes<'a> {
    /// Nodes dialed from another cluster.
    pub crossing: Vec<&'a str>,
    /// A member's other nodes (they get their name in its namespace).
    pub local: Vec<&'a str>,
    pub exposure: Option<&'a ExposureSpec>,
}

/// Per cluster holding nodes (`None`: the operator's own), which of its
/// nodes get an endpoint and how; empty when every node runs at home.
pub(super) fn per_site<'a>(
    validated: &'a super::validate::Validated,
    manifest: &'a Manifest,
) -> BTreeMap<Site, ClusterNodes<'a>> {
    let mut out: BTreeMap<Site, ClusterNodes<'a>> = BTreeMap::new();
    if validated.remote.is_empty() {
        return out;
    }
    let home = home_member(manifest);
    let sites = super::validate::sites(&validated.plan, &validated.remote);
    let site_of = |node: &str| sites.get(node).cloned().flatten();
    let crossing = crossing_acceptors(&validated.plan, site_of);
    for node in validated.plan.nodes.iter() {
        let site = site_of(&node.name);
        let entry = out.entry(site.clone()).or_insert_with(|| ClusterNodes {
            crossing: Vec::new(),
            local: Vec::new(),
            exposure: match &site {
                Some(c) => validated
                    .remote
                    .get(c)
                    .and_then(|r| r.member.spec.exposure.as_ref()),
                None => home.and_then(|h| h.spec.exposure.as_ref()),
            },
        });
        if crossing.contains_key(node.name.as_str()) {
            entry.crossing.push(&node.name);
        } else if site.is_some() {
            entry.local.push(&node.name);
        }
    }
    out
}

/// Records every node's endpoint: those found in the member clusters that
/// answered (`found`), those of the operator's own cluster found here (its
/// share of `sites`), and for the nodes of members that did not answer
/// (`kept`), what was recorded before. A topology that never ran outside its
/// own cluster costs nothing.
pub(super) async fn record(
    ctx: &super::Context,
    owner: &Topology,
    sites: &BTreeMap<Site, ClusterNodes<'_>>,
    home: &Target,
    key: &str,
    mut found: BTreeMap<String, Option<String>>,
    kept: &[String],
) -> Result<(), Error> {
    let held = owner
        .status
        .as_ref()
        .is_some_and(|s| !s.clusters.is_empty());
    if sites.is_empty() && !held {
        return Ok(());
    }
    // With nothing to expose at home, this removes what exposed it before.
    let nothing = ClusterNodes::default();
    let at_home = sites.get(&None).unwrap_or(&nothing);
    found.extend(endpoints(home, key, owner, at_home).await?);
    if !kept.is_empty() {
        let recorded = ctx.store.endpoints(key).await?;
        for node in kept {
            found.insert(node.clone(), recorded.get(node).cloned());
        }
    }
    if ctx.store.record_endpoints(key, &found).await? {
        let known = found.values().filter(|e| e.is_some()).count();
        tracing::info!(topology = %key, known, "recorded new link endpoints");
    }
    Ok(())
}

/// Makes the Services `nodes` need at `target` (and removes the topology's
/// other exposing Services there); returns each node's endpoint, `None` for
/// one whose address is not known yet (no pod IP, no load balancer address).
pub(super) async fn endpoints(
    target: &Target,
    key: &str,
    owner: &Topology,
    nodes: &ClusterNodes<'_>,
) -> Result<BTreeMap<String, Option<String>>, Error> {
    let mut out: BTreeMap<String, Option<String>> = nodes
        .local
        .iter()
        .map(|n| {
            let name = format!(
                "{n}.{}.{}.svc:{LINK_PORT}",
                pods::service_name(key),
                target.namespace
            );
            (n.to_string(), Some(name))
        })
        .collect();
    let kind = nodes.exposure.map(|e| e.kind);
    let by_service = matches!(
        kind,
        Some(ExposureKind::NodePort | ExposureKind::LoadBalancer)
    );
    let wanted: BTreeSet<&str> = if by_service {
        nodes.crossing.iter().copied().collect()
    } else {
        BTreeSet::new()
    };
    let live = keep_exposing(target, key, &wanted).await?;
    let (Some(kind), Some(exposure)) = (kind, nodes.exposure) else {
        return Ok(out);
    };
    match kind {
        ExposureKind::Address => {
            let ips = pod_ips(target, key).await?;
            for node in &nodes.crossing {
                let at = ips.get(*node).map(|ip| format!("{ip}:{LINK_PORT}"));
                out.insert(node.to_string(), at);
            }
        }
        ExposureKind::NodePort | ExposureKind::LoadBalancer => {
            for node in &nodes.crossing {
                let live = live
                    .iter()
                    .find(|s| s.labels().get(EXPOSES_LABEL).map(String::as_str) == Some(node));
                let service = expose(target, key, owner, node, kind, live).await?;
                out.insert(node.to_string(), endpoint_of(&service, exposure));
            }
        }
    }
    Ok(out)
}

/// Deletes the topology's exposing Services at `target` but those of the
/// nodes in `wanted`, and returns those.
pub(super) async fn keep_exposing(
    target: &Target,
    key: &str,
    wanted: &BTreeSet<&str>,
) -> Result<Vec<Service>, Error> {
    let services = Api::<Service>::namespaced(target.client.clone(), &target.namespace);
    let live = services
        .list(&ListParams::default().labels(&format!("{},{EXPOSES_LABEL}", target.selector(key))))
        .await?;
    let mut kept = Vec::new();
    for service in live.items {
        let exposes = service.labels().get(EXPOSES_LABEL).map(String::as_str);
        if exposes.is_some_and(|n| wanted.contains(n)) {
            kept.push(service);
        } else {
            apply::ignore_missing(
                services
                    .delete(&service.name_any(), &DeleteParams::default())
                    .await
                    .map(|_| ()),
            )?;
        }
    }
    Ok(kept)
}

/// Each node's pod IP at `target`, from its pods not being deleted.
async fn pod_ips(target: &Target, key: &str) -> Result<BTreeMap<String, String>, Error> {
    let pods = Api::<Pod>::namespaced(target.client.clone(), &target.namespace)
        .list(&ListParams::default().labels(&target.selector(key)))
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let node = p.labels().get(NODE_LABEL)?.clone();
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            Some((node, ip))
        })
        .collect())
}

/// The node's exposing Service as it runs after this call. A NodePort
/// Service is made with its TCP port first, so that the cluster picks a free
/// node port, then given the same port for UDP: a link dials one
/// `address:port` whether it runs over TCP or QUIC.
async fn expose(
    target: &Target,
    key: &str,
    owner: &Topology,
    node: &str,
    kind: ExposureKind,
    live: Option<&Service>,
) -> Result<Service, Error> {
    let node_port = live.and_then(|s| port_of(s, "TCP"));
    if let Some(live) = live
        && service_type(live) == type_name(kind)
        && (kind == ExposureKind::LoadBalancer
            || (node_port.is_some() && node_port == port_of(live, "UDP")))
    {
        return Ok(live.clone());
    }
    let api = Api::<Service>::namespaced(target.client.clone(), &target.namespace);
    let name = pods::link_service_name(key, node);
    let at = (target.cluster.as_deref(), target.namespace.as_str());
    let node_port = match (kind, node_port) {
        (ExposureKind::NodePort, None) => {
            apply::apply_object(
                &target.client,
                &target.namespace,
                &link_service(at, key, owner, node, kind, None, false),
            )
            .await?;
            port_of(&api.get(&name).await?, "TCP")
        }
        (_, port) => port,
    };
    let desired = link_service(at, key, owner, node, kind, node_port, true);
    apply::apply_object(&target.client, &target.namespace, &desired).await?;
    Ok(api.get(&name).await?)
}

fn type_name(kind: ExposureKind) -> &'static str {
    match kind {
        ExposureKind::LoadBalancer => "LoadBalancer",
        _ => "NodePort",
    }
}

fn service_type(s: &Service) -> &str {
    s.spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("ClusterIP")
}

/// The node port of the Service's link port for `protocol`.
fn port_of(s: &Service, protocol: &str) -> Option<i32> {
    s.spec.as_ref()?.ports.as_ref()?.iter().find_map(|p| {
        (p.port == i32::from(LINK_PORT) && p.protocol.as_deref().unwrap_or("TCP") == protocol)
            .then_some(p.node_port)
            .flatten()
    })
}

/// The Service that exposes `node`'s link listener, TCP and (with `udp`)
/// UDP on the link port, at `node_port` when given.
fn link_service(
    (cluster, namespace): (Option<&str>, &str),
    key: &str,
    owner: &Topology,
    node: &str,
    kind: ExposureKind,
    node_port: Option<i32>,
    udp: bool,
) -> Service {
    let mut labels = build::labels(key, Some(node));
    labels.insert(EXPOSES_LABEL.to_owned(), node.to_owned());
    let mut metadata = build::owned_meta(owner, pods::link_service_name(key, node), labels);
    match cluster {
        Some(cluster) => remote::move_into(
            &mut metadata,
            cluster,
            namespace,
            owner.metadata.uid.as_deref(),
        ),
        None => metadata.namespace = Some(namespace.to_owned()),
    }
    let port = |protocol: &str| ServicePort {
        name: Some(format!("link-{}", protocol.to_lowercase())),
        protocol: Some(protocol.to_owned()),
        port: i32::from(LINK_PORT),
        node_port,
        ..ServicePort::default()
    };
    let mut ports = vec![port("TCP")];
    if udp {
        ports.push(port("UDP"));
    }
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some(type_name(kind).to_owned()),
            selector: Some(BTreeMap::from([
                (TOPOLOGY_LABEL.to_owned(), name_of(key).to_owned()),
                (NODE_LABEL.to_owned(), node.to_owned()),
            ])),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Where other clusters dial the node behind `service`.
fn endpoint_of(service: &Service, exposure: &ExposureSpec) -> Option<String> {
    match exposure.kind {
        ExposureKind::NodePort => {
            let port = port_of(service, "TCP")?;
            Some(format!("{}:{port}", exposure.address.as_deref()?))
        }
        ExposureKind::LoadBalancer => {
            let ingress = service
                .status
                .as_ref()?
                .load_balancer
                .as_ref()?
                .ingress
                .as_ref()?
                .first()?;
            let host = ingress.ip.clone().or_else(|| ingress.hostname.clone())?;
            Some(format!("{host}:{LINK_PORT}"))
        }
        ExposureKind::Address => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::build::tests::with_member;
    use crate::controller::validate::validate;

    fn topology(yaml: &str) -> Topology {
        serde_norway::from_str(yaml).expect("fixture parses")
    }

    /// a at home dials b in `eu`; b and c (both in `eu`) share a link.
    const SPAN: &str = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: span}\nspec:\n  nodes: [{name: a}, {name: b, cluster: eu}, {name: c, cluster: eu}]\n  links: [{endpoints: [a, b], transport: quic}, {endpoints: [b, c]}]\n";
    const MEMBER: &str = "region: eu-west, namespace: far, hubAddress: 'h:1', kubeconfigSecretRef: {namespace: nextmini, name: eu}";

    #[test]
    fn a_link_into_a_cluster_without_a_way_in_is_refused_naming_link_and_fix() {
        let t = topology(SPAN);
        let refused = validate(&with_member(&t, &format!("{{{MEMBER}}}")), "lab", None)
            .expect_err("must be refused");
        assert_eq!(refused.reason, "InvalidPlacement");
        for part in [
            "links a-b",
            "acceptor b",
            "member cluster eu",
            "dialed from the operator's own cluster",
            "membercluster/eu spec.exposure",
        ] {
            assert!(
                refused.message.contains(part),
                "{part:?} in {}",
                refused.message
            );
        }
        // Dialed the other way, into the operator's own cluster.
        let back = topology(&SPAN.replace("[a, b]", "[b, a]"));
        let refused = validate(
            &with_member(&back, &format!("{{{MEMBER}, exposure: {{type: Address}}}}")),
            "lab",
            None,
        )
        .expect_err("must be refused");
        assert!(
            refused
                .message
                .contains("acceptor a runs in the operator's own cluster")
                && refused
                    .message
                    .contains("declare a MemberCluster without kubeconfigSecretRef"),
            "{}",
            refused.message
        );
        validate(
            &with_member(
                &t,
                &format!("{{{MEMBER}, exposure: {{type: NodePort, address: 198.18.0.1}}}}"),
            ),
            "lab",
            None,
        )
        .expect("a way in: valid");
    }

    #[test]
    fn only_nodes_dialed_across_are_exposed_the_rest_get_their_members_names() {
        let t = topology(SPAN);
        let m = with_member(&t, &format!("{{{MEMBER}, exposure: {{type: Address}}}}"));
        let v = validate(&m, "lab", None).expect("valid");
        let sites = per_site(&v, &m);
        assert_eq!(sites.len(), 2, "home and eu");
        let eu = &sites[&Some("eu".to_owned())];
        assert_eq!(eu.crossing, ["b"]);
        assert_eq!(eu.local, ["c"]);
        assert_eq!(eu.exposure.map(|e| e.kind), Some(ExposureKind::Address));
        let home = &sites[&None];
        assert!(
            home.crossing.is_empty() && home.local.is_empty(),
            "a keeps the topology's own name"
        );
        // All at home: nothing to record.
        let t = topology(&SPAN.replace(", cluster: eu", ""));
        let m = with_member(&t, &format!("{{{MEMBER}}}"));
        let v = validate(&m, "lab", None).expect("valid");
        assert!(per_site(&v, &m).is_empty());
    }

    #[test]
    fn a_node_port_service_serves_tcp_and_udp_on_one_port_and_is_dialed_there() {
        let t = topology(SPAN);
        let service = link_service(
            (Some("eu"), "far"),
            "lab/span",
            &t,
            "b",
            ExposureKind::NodePort,
            Some(31234),
            true,
        );
        assert_eq!(service.metadata.name.as_deref(), Some("span-b-link"));
        assert_eq!(service.metadata.namespace.as_deref(), Some("far"));
        assert!(
            service.metadata.owner_references.is_none(),
            "no owner across clusters"
        );
        assert_eq!(service.labels()[EXPOSES_LABEL], "b");
        assert_eq!(port_of(&service, "TCP"), Some(31234));
        assert_eq!(port_of(&service, "UDP"), Some(31234));
        let spec = service.spec.as_ref().expect("spec");
        assert_eq!(spec.type_.as_deref(), Some("NodePort"));
        assert_eq!(spec.selector.as_ref().expect("selector")[NODE_LABEL], "b");
        let exposure = ExposureSpec {
            kind: ExposureKind::NodePort,
            address: Some("198.18.0.1".into()),
        };
        assert_eq!(
            endpoint_of(&service, &exposure).as_deref(),
            Some("198.18.0.1:31234")
        );
        let lb = ExposureSpec {
            kind: ExposureKind::LoadBalancer,
            address: None,
        };
        assert_eq!(
            endpoint_of(&service, &lb),
            None,
            "no address from the load balancer yet"
        );
    }
}

//! Turns a validated draft into a `Plan`. Runs only after validation found nothing, so
//! the fallbacks below are never taken; they exist so no user input can panic here.

use super::address;
use super::assemble::Draft;
use super::model::{
    Dataplane, Mapping, Packing, Placement, Plan, PlannedLink, PlannedNode, Resources, Transport,
};
use super::params::resolve;
use crate::api;
use crate::units::Size;

/// `packed`, and `netns` with a packing set, pack; `netns` alone stays `netns`
/// (a cluster packs it with the default packing).
fn placement(spec: &api::TopologySpec) -> Placement {
    let packing = match (spec.nodes_per_worker, spec.workers) {
        (Some(n), _) => Some(Packing::NodesPerWorker(n)),
        (None, Some(w)) => Some(Packing::Workers(w)),
        (None, None) => None,
    };
    match spec.placement {
        api::Placement::Auto => Placement::Auto,
        api::Placement::PodPerNode => Placement::PodPerNode,
        api::Placement::Netns => packing.map_or(Placement::Netns, Placement::Packed),
        api::Placement::Packed => Placement::Packed(packing.unwrap_or_default()),
    }
}

impl From<api::Mapping> for Mapping {
    fn from(m: api::Mapping) -> Self {
        match m {
            api::Mapping::Sequential => Mapping::Sequential,
            api::Mapping::Concurrent => Mapping::Concurrent,
        }
    }
}

impl From<api::Transport> for Transport {
    fn from(t: api::Transport) -> Self {
        match t {
            api::Transport::Tcp => Transport::Tcp,
            api::Transport::Quic => Transport::Quic,
        }
    }
}

pub(crate) fn plan(draft: &Draft, clusters: &super::sites::Clusters) -> Plan {
    let spec = &draft.doc.object.spec;
    let overlay = spec.addressing.overlay.0;
    let underlay = spec.addressing.underlay.0;
    let dataplane = Dataplane {
        processors: spec.dataplane.processors,
        mapping: spec.dataplane.mapping.into(),
        mtu: spec.dataplane.mtu,
        ttl_decrement: spec.dataplane.ttl == api::TtlMode::Decrement,
    };

    let nodes = draft
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let site = draft.sites.get(i).cloned().unwrap_or_default();
            PlannedNode {
                cluster: site.cluster,
                region: site.region,
                name: node.name.clone(),
                index,
                overlay: address::assign(overlay, index),
                underlay: address::assign(underlay, index),
                resources: Resources {
                    cpu_millis: node.resources.and_then(|r| r.cpu).map(|c| c.millis()),
                    memory_bytes: node.resources.and_then(|r| r.memory).and_then(Size::bytes),
                },
                socks: node.socks.iter().filter_map(super::socks::plan).collect(),
            }
        })
        .collect::<Vec<_>>();

    let default_transport = spec.link_defaults.as_ref().and_then(|d| d.transport);
    let mut links: Vec<PlannedLink> = draft
        .links
        .iter()
        .map(|link| {
            let endpoint = |i: usize| link.endpoints.get(i).cloned().unwrap_or_default();
            // Checked by `sites::check_delays`: the delay covers the real one.
            let real = super::sites::real_one_way(clusters, link)
                .map_or(std::time::Duration::ZERO, |(d, _)| d);
            let direction = |over: Option<&api::LinkParamsSpec>| {
                let layers = draft.layers(link, over, &[]);
                let mut params = resolve(&layers);
                params.delay = params.delay.map(|d| d.saturating_sub(real));
                params
            };
            let region_transport = link
                .region_link
                .and_then(|i| spec.region_links.get(i))
                .and_then(|r| r.transport);
            PlannedLink {
                name: link.name.clone(),
                dialer: endpoint(0),
                acceptor: endpoint(1),
                transport: link
                    .transport
                    .or(region_transport)
                    .or(default_transport)
                    .map_or(Transport::Tcp, Transport::from),
                forward: direction(link.forward.as_ref()),
                backward: direction(link.backward.as_ref()),
            }
        })
        .collect();
    links.sort_by(|a, b| a.name.cmp(&b.name));

    let flows = super::flows::build(draft, &links);

    Plan {
        topology: draft.name.to_owned(),
        overlay,
        underlay,
        placement: placement(spec),
        dataplane,
        report_interval_ms: spec
            .telemetry
            .interval
            .as_std()
            .as_millis()
            .min(u128::from(u32::MAX)) as u32,
        seed: spec.seed,
        scenario: super::scenario::build(draft, clusters),
        nodes: nodes.into(),
        links: links.into_iter().map(std::sync::Arc::new).collect(),
        flows,
    }
}

//! Address pools: how many nodes they hold, that they do not overlap, and which address
//! node i gets (host i+1 of each pool, so the network address itself is never used).

use super::assemble::Draft;
use super::errors::ValidationErrors;
use crate::api::AddressingSpec;
use ipnet::Ipv4Net;
use std::net::Ipv4Addr;

/// Host addresses a pool can hand out (network and broadcast excluded).
pub(crate) fn pool_size(net: Ipv4Net) -> u64 {
    let addresses = 1u64 << (32 - u32::from(net.prefix_len()));
    addresses.saturating_sub(2)
}

/// Nodes that fit: every node needs one address from each pool.
pub(crate) fn capacity(spec: &AddressingSpec) -> u64 {
    pool_size(spec.overlay.0).min(pool_size(spec.underlay.0))
}

pub(crate) fn too_many(count: u64, spec: &AddressingSpec) -> String {
    let (pool, net) = if pool_size(spec.overlay.0) <= pool_size(spec.underlay.0) {
        ("overlay", spec.overlay.0)
    } else {
        ("underlay", spec.underlay.0)
    };
    format!(
        "{count} nodes do not fit the address pools: the {pool} pool {net} holds {} (make spec.addressing.{pool} larger)",
        pool_size(net)
    )
}

/// Reports overlapping pools and more nodes than the pools hold.
pub(crate) fn check(draft: &Draft, errors: &mut ValidationErrors) {
    let spec = &draft.doc.object.spec.addressing;
    let origin = draft.doc.origin.as_str();
    let (overlay, underlay) = (spec.overlay.0, spec.underlay.0);
    if overlay.contains(&underlay.network()) || underlay.contains(&overlay.network()) {
        errors.push(
            origin,
            "spec.addressing.underlay",
            format!("{underlay} overlaps the overlay pool {overlay}; the two pools must not share addresses"),
        );
    }
    let count = u64::try_from(draft.nodes.len()).unwrap_or(u64::MAX);
    if count > capacity(spec) {
        errors.push(origin, "spec.nodes", too_many(count, spec));
    }
}

/// Address of the node at `index`; `check` guarantees it lies inside `net`.
pub(crate) fn assign(net: Ipv4Net, index: u32) -> Ipv4Addr {
    Ipv4Addr::from(
        u32::from(net.network())
            .saturating_add(index)
            .saturating_add(1),
    )
}

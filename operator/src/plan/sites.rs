//! Where nodes run: the member cluster and region of every node, the `regionLinks`
//! entry each link inherits, and the real round trip between two clusters that an
//! emulated delay must leave room for.
//!
//! A node names a `cluster`, a `region` (one of the region's clusters, taken in turn
//! by name) or neither (the operator's own cluster: the MemberCluster without a
//! kubeconfig, if one is declared). Generated nodes follow `spec.spread`. With no
//! MemberCluster at all, regions are labels: every node runs where the topology
//! does, and links between regions still get their parameters.

use super::assemble::{Draft, NodePlace};
use super::errors::ValidationErrors;
use super::parse::{Doc, Manifest};
use crate::api::MemberCluster;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Where one node runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Site {
    /// The MemberCluster (None: where the topology is, with no MemberCluster for it).
    pub cluster: Option<String>,
    pub region: Option<String>,
}

/// Whether nodes run in the clusters the plan names, or all on this machine
/// (namespace mode), where no real round trip lies between two clusters' nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    Clusters,
    OneMachine,
}

/// The manifest's MemberClusters, by name.
pub(crate) struct Clusters<'a> {
    by_name: BTreeMap<&'a str, &'a Doc<MemberCluster>>,
    /// The one without a kubeconfig: the operator's own cluster.
    home: Option<&'a str>,
    place: Where,
}

fn name_of(doc: &Doc<MemberCluster>) -> &str {
    doc.object.metadata.name.as_deref().unwrap_or_default()
}

/// Whether a topology places nodes anywhere or names regions at all.
pub fn uses_sites(spec: &crate::api::TopologySpec) -> bool {
    spec.spread.is_some()
        || !spec.region_links.is_empty()
        || spec
            .nodes
            .iter()
            .any(|n| n.cluster.is_some() || n.region.is_some())
}

impl<'a> Clusters<'a> {
    /// Problems of the MemberClusters themselves are reported on one machine,
    /// where the user wrote them into the manifest, and in a cluster only to
    /// topologies that place nodes: one team's misdeclared cluster must not
    /// stop every other team's topology.
    pub(crate) fn new(m: &'a Manifest, place: Where, errors: &mut ValidationErrors) -> Self {
        let mut own = ValidationErrors::default();
        let clusters = Self::read(m, place, &mut own);
        if place == Where::OneMachine || m.topologies.iter().any(|t| uses_sites(&t.object.spec)) {
            errors.0.extend(own.0);
        }
        clusters
    }

    fn read(m: &'a Manifest, place: Where, errors: &mut ValidationErrors) -> Self {
        let mut clusters = Clusters {
            by_name: BTreeMap::new(),
            home: None,
            place,
        };
        for doc in &m.member_clusters {
            let name = name_of(doc);
            if let Some(first) = clusters.by_name.get(name) {
                errors.push(
                    &doc.origin,
                    "metadata.name",
                    format!("duplicate MemberCluster {name:?} (also {})", first.origin),
                );
                continue;
            }
            if doc.object.spec.kubeconfig_secret_ref.is_none() {
                if let Some(home) = clusters.home {
                    errors.push(
                        &doc.origin,
                        "spec.kubeconfigSecretRef",
                        format!(
                            "missing, and MemberCluster {home:?} already stands for the operator's own cluster (the one without a kubeconfig); only one may"
                        ),
                    );
                    continue;
                }
                clusters.home = Some(name);
            }
            clusters.by_name.insert(name, doc);
        }
        clusters
    }

    fn region_of(&self, cluster: &str) -> Option<&'a str> {
        self.by_name
            .get(cluster)
            .map(|d| d.object.spec.region.as_str())
    }

    /// The clusters of a region, by name.
    fn in_region(&self, region: &str) -> Vec<&'a str> {
        self.by_name
            .iter()
            .filter(|(_, d)| d.object.spec.region == region)
            .map(|(n, _)| *n)
            .collect()
    }

    fn known(&self) -> String {
        if self.by_name.is_empty() {
            "none is declared".to_owned()
        } else {
            let names: Vec<&str> = self.by_name.keys().copied().collect();
            format!("declared: {}", names.join(", "))
        }
    }

    fn home_site(&self) -> Site {
        Site {
            cluster: self.home.map(str::to_owned),
            region: self.home.and_then(|h| self.region_of(h)).map(str::to_owned),
        }
    }

    /// The round trip between the pods of two clusters (None: the operator's own),
    /// and where the figure comes from; an error says why none is known.
    pub(crate) fn rtt(
        &self,
        a: Option<&str>,
        b: Option<&str>,
    ) -> Result<(Duration, String), String> {
        let a = a.or(self.home);
        let b = b.or(self.home);
        if self.place == Where::OneMachine || a == b {
            return Ok((Duration::ZERO, "the same machine".to_owned()));
        }
        let declared = |x: Option<&str>, y: Option<&str>| {
            let doc = self.by_name.get(x?)?;
            let y = y.or(self.home)?;
            doc.object
                .spec
                .rtt
                .iter()
                .find(|p| p.cluster == y)
                .map(|p| {
                    (
                        p.rtt.as_std(),
                        format!("MemberCluster {}'s spec.rtt", name_of(doc)),
                    )
                })
        };
        if let Some(found) = declared(a, b).or_else(|| declared(b, a)) {
            return Ok(found);
        }
        let measured = |x: Option<&str>| {
            x.and_then(|x| self.by_name.get(x))
                .and_then(|d| d.object.status.as_ref())
                .and_then(|s| s.rtt)
                .map(|r| r.as_std())
        };
        let show = |x: Option<&str>| x.unwrap_or("(the operator's own)").to_owned();
        let is_home = |x: Option<&str>| x.is_none() || x == self.home;
        match (is_home(a), is_home(b)) {
            (true, _) | (_, true) => {
                let remote = if is_home(a) { b } else { a };
                measured(remote)
                    .map(|r| (r, format!("MemberCluster {}'s status.rtt", show(remote))))
                    .ok_or_else(|| {
                        format!(
                            "no round trip to cluster {} is known yet: the operator has not reached it (its status.rtt is empty); wait for Reachable=True or declare spec.rtt",
                            show(remote)
                        )
                    })
            }
            // Both remote: the triangle inequality gives a lower bound from two
            // measurements from here, so subtracting it never makes a delay too short
            // by more than the clusters' real distance.
            _ => match (measured(a), measured(b)) {
                (Some(x), Some(y)) => Ok((
                    x.abs_diff(y),
                    format!(
                        "a lower bound from MemberClusters {} and {}'s status.rtt; declare spec.rtt between them for the real figure",
                        show(a),
                        show(b)
                    ),
                )),
                _ => Err(format!(
                    "no round trip between clusters {} and {} is known: declare it in either one's spec.rtt",
                    show(a),
                    show(b)
                )),
            },
        }
    }
}

/// Resolves every node's site and every link's `regionLinks` entry, reporting
/// names that lead nowhere.
pub(crate) fn place(draft: &mut Draft, clusters: &Clusters, errors: &mut ValidationErrors) {
    let spec = &draft.doc.object.spec;
    let origin = draft.doc.origin.as_str();
    let generated = draft
        .nodes
        .iter()
        .filter(|n| matches!(n.place, NodePlace::Generated { .. }))
        .count();
    if spec.spread.is_some() && generated == 0 {
        errors.push(
            origin,
            "spec.spread",
            "spreads generated nodes, and spec.generator makes none; give listed nodes their own cluster or region",
        );
    }
    let mut turn: HashMap<String, usize> = HashMap::new();
    let mut by_region = |region: &str, field: &str, errors: &mut ValidationErrors| -> Site {
        let candidates = clusters.in_region(region);
        if candidates.is_empty() {
            if !clusters.by_name.is_empty() {
                let mut regions: Vec<&str> = clusters
                    .by_name
                    .values()
                    .map(|d| d.object.spec.region.as_str())
                    .collect();
                regions.sort_unstable();
                regions.dedup();
                errors.push(
                    origin,
                    field,
                    format!(
                        "no MemberCluster is in region {region:?} (regions: {})",
                        regions.join(", ")
                    ),
                );
            }
            return Site {
                cluster: None,
                region: Some(region.to_owned()),
            };
        }
        let k = turn.entry(region.to_owned()).or_default();
        let cluster = candidates[*k % candidates.len()];
        *k += 1;
        Site {
            cluster: Some(cluster.to_owned()),
            region: Some(region.to_owned()),
        }
    };
    let by_cluster = |cluster: &str, field: &str, errors: &mut ValidationErrors| -> Site {
        match clusters.region_of(cluster) {
            Some(region) => Site {
                cluster: Some(cluster.to_owned()),
                region: Some(region.to_owned()),
            },
            None => {
                errors.push(
                    origin,
                    field,
                    format!("no MemberCluster {cluster:?} ({})", clusters.known()),
                );
                Site::default()
            }
        }
    };

    let mut sites = Vec::with_capacity(draft.nodes.len());
    for node in &draft.nodes {
        let site = match node.place {
            NodePlace::Home => clusters.home_site(),
            NodePlace::Listed {
                index,
                cluster,
                region,
            } => {
                let field = |f: &str| format!("spec.nodes[{index}].{f}");
                match (cluster, region) {
                    (Some(_), Some(_)) => {
                        errors.push(
                            origin,
                            field("region"),
                            "set cluster or region, not both (a cluster has one region)",
                        );
                        Site::default()
                    }
                    (Some(c), None) => by_cluster(c, &field("cluster"), errors),
                    (None, Some(r)) => by_region(r, &field("region"), errors),
                    (None, None) => clusters.home_site(),
                }
            }
            NodePlace::Generated { ordinal } => match &spec.spread {
                Some(spread) => {
                    let block = |count: usize| ordinal * count / generated.max(1);
                    match (&spread.regions, &spread.clusters) {
                        (Some(regions), _) if !regions.is_empty() => {
                            let j = block(regions.len());
                            by_region(&regions[j], &format!("spec.spread.regions[{j}]"), errors)
                        }
                        (_, Some(names)) if !names.is_empty() => {
                            let j = block(names.len());
                            by_cluster(&names[j], &format!("spec.spread.clusters[{j}]"), errors)
                        }
                        _ => {
                            errors.push(
                                origin,
                                "spec.spread",
                                "set exactly one of regions, clusters (a non-empty list)",
                            );
                            clusters.home_site()
                        }
                    }
                }
                None => clusters.home_site(),
            },
        };
        sites.push(site);
    }
    draft.sites = sites;
    region_links(draft, errors);
}

/// Gives every link its `regionLinks` entry; refuses entries that repeat a pair
/// or name a region no node is in (a typo would leave a WAN without its delay).
fn region_links(draft: &mut Draft, errors: &mut ValidationErrors) {
    let spec = &draft.doc.object.spec;
    let origin = draft.doc.origin.as_str();
    let region_of: HashMap<&str, &str> = draft
        .nodes
        .iter()
        .zip(&draft.sites)
        .filter_map(|(n, s)| Some((n.name.as_str(), s.region.as_deref()?)))
        .collect();
    let mut used: Vec<&str> = region_of.values().copied().collect();
    used.sort_unstable();
    used.dedup();
    let mut pairs: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, entry) in spec.region_links.iter().enumerate() {
        let [a, b] = entry.regions.as_slice() else {
            errors.push(
                origin,
                format!("spec.regionLinks[{i}].regions"),
                "must name exactly two regions (the same one twice for links inside it)",
            );
            continue;
        };
        for (j, r) in [a, b].into_iter().enumerate() {
            if !used.contains(&r.as_str()) {
                errors.push(
                    origin,
                    format!("spec.regionLinks[{i}].regions[{j}]"),
                    format!(
                        "no node is in region {r:?} (regions of this topology's nodes: {})",
                        if used.is_empty() {
                            "none".to_owned()
                        } else {
                            used.join(", ")
                        }
                    ),
                );
            }
        }
        let key = if a <= b {
            (a.as_str(), b.as_str())
        } else {
            (b.as_str(), a.as_str())
        };
        if let Some(first) = pairs.insert(key, i) {
            errors.push(
                origin,
                format!("spec.regionLinks[{i}].regions"),
                format!("the same pair of regions as spec.regionLinks[{first}]"),
            );
            pairs.insert(key, first);
        }
    }
    let cluster_of: HashMap<&str, &str> = draft
        .nodes
        .iter()
        .zip(&draft.sites)
        .filter_map(|(n, s)| Some((n.name.as_str(), s.cluster.as_deref()?)))
        .collect();
    for link in &mut draft.links {
        let end = |i: usize| link.endpoints.get(i).map(String::as_str);
        let region = |i: usize| end(i).and_then(|e| region_of.get(e));
        if let (Some(a), Some(b)) = (region(0), region(1)) {
            let key = if a <= b { (*a, *b) } else { (*b, *a) };
            link.region_link = pairs.get(&key).copied();
        }
        let cluster = |i: usize| {
            end(i)
                .and_then(|e| cluster_of.get(e))
                .map(|c| (*c).to_owned())
        };
        link.clusters = [cluster(0), cluster(1)];
    }
}

/// The real one-way delay under a link: half the round trip between its ends'
/// clusters (zero in one cluster or on one machine), or why it is unknown.
pub(crate) fn real_one_way(
    clusters: &Clusters,
    link: &super::assemble::DraftLink,
) -> Result<(Duration, String), String> {
    let [a, b] = &link.clusters;
    clusters
        .rtt(a.as_deref(), b.as_deref())
        .map(|(rtt, source)| (rtt / 2, source))
}

/// Every direction's delay must cover the real one-way delay between its ends'
/// clusters, which the plan subtracts from it.
pub(crate) fn check_delays(draft: &Draft, clusters: &Clusters, errors: &mut ValidationErrors) {
    if clusters.place == Where::OneMachine {
        return;
    }
    // Links inside one cluster (all of them, without MemberClusters) have
    // nothing to subtract: skip resolving their parameters.
    for link in draft
        .links
        .iter()
        .filter(|l| l.clusters[0] != l.clusters[1])
    {
        let inherited = draft.inherited(link);
        for (direction, over) in [("forward", &link.forward), ("backward", &link.backward)] {
            let layers = draft.layers(link, over.as_ref(), &[]);
            let Some(delay) = super::params::resolve(&layers).delay else {
                // No delay asked: the link has the real one, whatever it is.
                continue;
            };
            // Blame the layer that set the delay.
            let mut paths: Vec<(&str, String)> = inherited
                .iter()
                .map(|(_, path)| (draft.doc.origin.as_str(), (*path).to_owned()))
                .collect();
            paths.push((link.document, link.params_field.clone()));
            paths.push((link.document, format!("{}.{direction}", link.params_field)));
            let (document, path) = super::params::pick(&layers, |l| l.delay)
                .and_then(|(_, i)| paths.get(i).cloned())
                .unwrap_or((link.document, link.params_field.clone()));
            let field = format!("{path}.delay");
            match real_one_way(clusters, link) {
                Ok((real, _)) if delay >= real => {}
                Ok((real, source)) => errors.push(
                    document,
                    &field,
                    format!(
                        "link {} ({direction}): the delay {} is shorter than the real one-way delay between its ends' clusters, {} (half the round trip, from {source}); ask for at least that, or leave delay unset",
                        link.name,
                        crate::units::Duration::from_std(delay),
                        crate::units::Duration::from_std(real),
                    ),
                ),
                Err(reason) => errors.push(
                    document,
                    &field,
                    format!(
                        "link {} ({direction}) crosses clusters and has a delay, from which the real one-way delay must be subtracted: {reason}",
                        link.name
                    ),
                ),
            }
        }
    }
    scenario_delays(draft, clusters, errors);
}

/// A scenario event that sets a cross-cluster link's delay is held to the same
/// floor as the link, with what its earlier events left.
fn scenario_delays(draft: &Draft, clusters: &Clusters, errors: &mut ValidationErrors) {
    let Some(scenario) = &draft.doc.object.spec.scenario else {
        return;
    };
    let mut earlier: HashMap<&str, Vec<&crate::api::LinkParamsSpec>> = HashMap::new();
    for (i, event) in scenario.events.iter().enumerate() {
        let (Some(name), Some(set)) = (event.link.as_deref(), &event.set) else {
            continue;
        };
        let Some(link) = draft.links.iter().find(|l| l.name == name) else {
            continue;
        };
        let sets = earlier.entry(name).or_default();
        sets.push(set);
        let Ok((real, source)) = real_one_way(clusters, link) else {
            continue;
        };
        for (direction, over) in [("forward", &link.forward), ("backward", &link.backward)] {
            let layers = draft.layers(link, over.as_ref(), sets);
            if let Some(delay) = super::params::resolve(&layers).delay
                && delay < real
            {
                errors.push(
                    &draft.doc.origin,
                    format!("spec.scenario.events[{i}].set.delay"),
                    format!(
                        "link {name} ({direction}) would have a delay of {} from this event on, shorter than the real one-way delay between its ends' clusters, {} (from {source})",
                        crate::units::Duration::from_std(delay),
                        crate::units::Duration::from_std(real),
                    ),
                );
            }
        }
    }
}

//! Gathers what belongs to each topology (its own nodes and inline links, generated
//! ones, `Link` and `Flow` objects naming it) into one draft, remembering for every item
//! the document and field it came from so later errors can point there.

use super::address;
use super::errors::ValidationErrors;
use super::generate::Shape;
use super::parse::{Doc, Manifest};
use crate::api::{Flow, Link, LinkParamsSpec, ResourcesSpec, SocksSpec, Topology, Transport};
use std::collections::HashMap;

/// A topology with the Link and Flow objects that name it.
pub(crate) struct Group<'a> {
    pub topology: &'a Doc<Topology>,
    pub links: Vec<&'a Doc<Link>>,
    pub flows: Vec<&'a Doc<Flow>>,
}

pub(crate) struct DraftNode<'a> {
    pub name: String,
    pub resources: Option<&'a ResourcesSpec>,
    /// SOCKS5 servers (only listed nodes have them).
    pub socks: &'a [SocksSpec],
    /// Field naming the node, e.g. `spec.nodes[2].name` or `spec.generator.ring`.
    pub field: String,
    /// Where the node asked to run.
    pub place: NodePlace<'a>,
}

/// Where a node asked to run, before `sites` resolves it.
#[derive(Clone, Copy)]
pub(crate) enum NodePlace<'a> {
    /// Listed without `cluster` or `region`: the operator's own cluster.
    Home,
    /// Listed with `cluster` and/or `region` (`index` into `spec.nodes`).
    Listed {
        index: usize,
        cluster: Option<&'a str>,
        region: Option<&'a str>,
    },
    /// The `ordinal`-th generated node, placed by `spec.spread`.
    Generated { ordinal: usize },
}

pub(crate) struct DraftLink<'a> {
    pub name: String,
    pub document: &'a str,
    /// Field to blame for a duplicate name.
    pub name_field: String,
    pub endpoints: Vec<String>,
    pub endpoints_field: String,
    /// The link's own parameters, before `linkDefaults`.
    pub params: LinkParamsSpec,
    pub transport: Option<Transport>,
    /// Overrides for what the first endpoint sends, and for what the second sends.
    pub forward: Option<LinkParamsSpec>,
    pub backward: Option<LinkParamsSpec>,
    /// Prefix of the parameter fields, e.g. `spec` or `spec.links[1]`.
    pub params_field: String,
    /// The `spec.regionLinks` entry between its ends' regions (set by `sites`).
    pub region_link: Option<usize>,
    /// The MemberClusters of its two ends (set by `sites`; None: where the
    /// topology is).
    pub clusters: [Option<String>; 2],
}

pub(crate) struct Draft<'a> {
    pub name: &'a str,
    pub doc: &'a Doc<Topology>,
    pub nodes: Vec<DraftNode<'a>>,
    pub links: Vec<DraftLink<'a>>,
    pub flows: Vec<&'a Doc<Flow>>,
    /// Where each node runs, parallel to `nodes` (set by `sites`).
    pub sites: Vec<super::sites::Site>,
    /// `linkDefaults`' parameters and path, made once (not per link).
    pub defaults: Option<(LinkParamsSpec, String)>,
    /// Each `regionLinks` entry's parameters and path.
    pub region_templates: Vec<(LinkParamsSpec, String)>,
}

impl<'a> Draft<'a> {
    /// The layers a link inherits before its own fields, least specific first,
    /// each with its path: `linkDefaults`, then its regions' `regionLinks` entry.
    pub(crate) fn inherited(&self, link: &DraftLink) -> Vec<(&LinkParamsSpec, &str)> {
        let region = link.region_link.and_then(|i| self.region_templates.get(i));
        self.defaults
            .iter()
            .chain(region)
            .map(|(p, path)| (p, path.as_str()))
            .collect()
    }

    /// Every layer of one direction of `link`, least specific first: what it
    /// inherits, its own fields, the direction's override `over`, then `later`
    /// (scenario events' sets, in order).
    pub(crate) fn layers<'s>(
        &'s self,
        link: &'s DraftLink,
        over: Option<&'s LinkParamsSpec>,
        later: &[&'s LinkParamsSpec],
    ) -> Vec<&'s LinkParamsSpec> {
        self.inherited(link)
            .into_iter()
            .map(|(p, _)| p)
            .chain([&link.params])
            .chain(over)
            .chain(later.iter().copied())
            .collect()
    }
}

pub(crate) fn name_of<T: kube::Resource>(object: &T) -> &str {
    object.meta().name.as_deref().unwrap_or_default()
}

/// Attaches Links and Flows to their topology by `spec.topology`.
pub(crate) fn group<'a>(m: &'a Manifest, errors: &mut ValidationErrors) -> Vec<Group<'a>> {
    let mut groups: Vec<Group> = Vec::new();
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for doc in &m.topologies {
        let name = name_of(&doc.object);
        if let Some(&first) = by_name.get(name) {
            let first = &groups[first].topology.origin;
            errors.push(
                &doc.origin,
                "metadata.name",
                format!("duplicate Topology {name:?} (also {first})"),
            );
            continue;
        }
        by_name.insert(name, groups.len());
        groups.push(Group {
            topology: doc,
            links: Vec::new(),
            flows: Vec::new(),
        });
    }
    let unknown = |origin: &str, topology: &str, errors: &mut ValidationErrors| {
        errors.push(
            origin,
            "spec.topology",
            format!("no Topology {topology:?} in the manifest"),
        );
    };
    for doc in &m.links {
        match by_name.get(doc.object.spec.topology.as_str()) {
            Some(&i) => groups[i].links.push(doc),
            None => unknown(&doc.origin, &doc.object.spec.topology, errors),
        }
    }
    for doc in &m.flows {
        match by_name.get(doc.object.spec.topology.as_str()) {
            Some(&i) => groups[i].flows.push(doc),
            None => unknown(&doc.origin, &doc.object.spec.topology, errors),
        }
    }
    groups
}

/// Lists the topology's nodes (generated first, then listed) and links (generated,
/// inline, then Link objects). Generator problems are reported here because a bad
/// generator produces nothing to validate further.
pub(crate) fn draft<'a>(group: &Group<'a>, errors: &mut ValidationErrors) -> Draft<'a> {
    let doc = group.topology;
    let spec = &doc.object.spec;
    let origin = doc.origin.as_str();
    let mut draft = Draft {
        name: name_of(&doc.object),
        doc,
        nodes: Vec::new(),
        links: Vec::new(),
        flows: group.flows.clone(),
        sites: Vec::new(),
        defaults: spec
            .link_defaults
            .as_ref()
            .map(|d| (d.params(), "spec.linkDefaults".to_owned())),
        region_templates: spec
            .region_links
            .iter()
            .enumerate()
            .map(|(i, r)| (r.params(), format!("spec.regionLinks[{i}]")))
            .collect(),
    };

    if let Some(generator) = &spec.generator {
        match Shape::of(generator) {
            Err(reason) => errors.push(origin, "spec.generator", reason),
            Ok(shape) => {
                let capacity = address::capacity(&spec.addressing);
                if let Err(reason) = shape.check() {
                    errors.push(origin, shape.field(), reason);
                } else if shape.node_count() > capacity {
                    // Refuse before generating: a typo like k: 400 must not allocate millions of names.
                    errors.push(
                        origin,
                        shape.field(),
                        address::too_many(shape.node_count(), &spec.addressing),
                    );
                } else {
                    let generated = shape.generate();
                    let field = shape.path();
                    draft
                        .nodes
                        .extend(
                            generated
                                .nodes
                                .into_iter()
                                .enumerate()
                                .map(|(ordinal, name)| DraftNode {
                                    name,
                                    resources: None,
                                    socks: &[],
                                    field: field.to_owned(),
                                    place: NodePlace::Generated { ordinal },
                                }),
                        );
                    draft
                        .links
                        .extend(generated.links.into_iter().map(|(a, b)| DraftLink {
                            name: format!("{a}-{b}"),
                            document: origin,
                            name_field: field.to_owned(),
                            endpoints: vec![a, b],
                            endpoints_field: field.to_owned(),
                            params: LinkParamsSpec::default(),
                            transport: None,
                            forward: None,
                            backward: None,
                            params_field: field.to_owned(),
                            region_link: None,
                            clusters: [None, None],
                        }));
                }
            }
        }
    }

    draft
        .nodes
        .extend(spec.nodes.iter().enumerate().map(|(i, node)| DraftNode {
            name: node.name.clone(),
            resources: node.resources.as_ref(),
            socks: &node.socks,
            field: format!("spec.nodes[{i}].name"),
            place: match (node.cluster.as_deref(), node.region.as_deref()) {
                (None, None) => NodePlace::Home,
                (cluster, region) => NodePlace::Listed {
                    index: i,
                    cluster,
                    region,
                },
            },
        }));

    draft
        .links
        .extend(spec.links.iter().enumerate().map(|(i, link)| {
            let prefix = format!("spec.links[{i}]");
            let (name, name_field) = match &link.name {
                Some(name) => (name.clone(), format!("{prefix}.name")),
                // The default name derives from the endpoints, so blame them for duplicates.
                None => (link.endpoints.join("-"), format!("{prefix}.endpoints")),
            };
            DraftLink {
                name,
                document: origin,
                name_field,
                endpoints: link.endpoints.clone(),
                endpoints_field: format!("{prefix}.endpoints"),
                params: link.params(),
                transport: link.transport,
                forward: link.forward.clone(),
                backward: link.backward.clone(),
                params_field: prefix,
                region_link: None,
                clusters: [None, None],
            }
        }));

    draft.links.extend(group.links.iter().map(|doc| {
        let spec = &doc.object.spec;
        DraftLink {
            name: name_of(&doc.object).to_owned(),
            document: doc.origin.as_str(),
            name_field: "metadata.name".to_owned(),
            endpoints: spec.endpoints.clone(),
            endpoints_field: "spec.endpoints".to_owned(),
            params: spec.params(),
            transport: spec.transport,
            forward: spec.forward.clone(),
            backward: spec.backward.clone(),
            params_field: "spec".to_owned(),
            region_link: None,
            clusters: [None, None],
        }
    }));
    draft
}

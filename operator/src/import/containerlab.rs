//! `nextmini import containerlab topo.clab.yml`: a containerlab topology's
//! nodes and links as a Nextmini Topology and its Links.
//!
//! Containerlab nodes are containers of some `kind` and `image`; in Nextmini
//! every node runs the same agent, so only names and links carry over. Names
//! become DNS labels. Links to the host (`host:`, `mgmt-net:`, `macvlan:`, …),
//! links from a node to itself, and further links between an already linked
//! pair have no Nextmini equivalent: they are left out, each with a note.

use serde_norway::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{source_name}: not YAML: {reason}")]
    Yaml { source_name: String, reason: String },
    #[error("{source_name}: {field}: {reason}")]
    Field {
        source_name: String,
        field: String,
        reason: String,
    },
}

/// The manifest and what did not carry over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    pub manifest: String,
    /// One line each: renamed nodes, links left out.
    pub notes: Vec<String>,
}

/// Pseudo-nodes containerlab endpoints may name instead of a node.
const HOST_SIDE: [&str; 6] = [
    "host",
    "mgmt-net",
    "macvlan",
    "vxlan",
    "vxlan-stitch",
    "dummy",
];

/// A containerlab name as a DNS label: lowercase, other characters as '-'.
fn dns_label(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let trimmed = out.trim_matches('-');
    trimmed[..trimmed.len().min(crate::api::DNS_LABEL_MAX)]
        .trim_end_matches('-')
        .to_string()
}

struct Endpoint {
    node: String,
    interface: String,
}

impl Endpoint {
    fn show(&self) -> String {
        format!("{}:{}", self.node, self.interface)
    }
}

struct Ctx<'a> {
    source: &'a str,
}

impl Ctx<'_> {
    fn err(&self, field: impl Into<String>, reason: impl Into<String>) -> ImportError {
        ImportError::Field {
            source_name: self.source.to_string(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// `"r1:eth1"` (the short form) or `{node: r1, interface: eth1}`.
    fn endpoint(&self, field: &str, v: &Value) -> Result<Endpoint, ImportError> {
        match v {
            Value::String(s) => {
                let (node, interface) = s.split_once(':').ok_or_else(|| {
                    self.err(
                        field,
                        format!("{s:?} is not NODE:INTERFACE (e.g. \"r1:eth1\")"),
                    )
                })?;
                if node.is_empty() || interface.is_empty() {
                    return Err(self.err(
                        field,
                        format!("{s:?} is not NODE:INTERFACE (e.g. \"r1:eth1\")"),
                    ));
                }
                Ok(Endpoint {
                    node: node.to_string(),
                    interface: interface.to_string(),
                })
            }
            Value::Mapping(m) => {
                let get = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
                let node = get("node").ok_or_else(|| {
                    self.err(format!("{field}.node"), "missing (the node this end is on)")
                })?;
                Ok(Endpoint {
                    node,
                    interface: get("interface").unwrap_or_default(),
                })
            }
            _ => Err(self.err(field, "expected \"NODE:INTERFACE\" or {node, interface}")),
        }
    }
}

/// Converts the containerlab topology `text` (read from `source_name`).
pub fn convert(source_name: &str, text: &str) -> Result<Imported, ImportError> {
    let ctx = Ctx {
        source: source_name,
    };
    let doc: Value = serde_norway::from_str(text).map_err(|e| ImportError::Yaml {
        source_name: source_name.to_string(),
        reason: e.to_string(),
    })?;
    let mut notes = Vec::new();
    let clab_name = doc
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ctx.err("name", "missing: a containerlab topology has a name"))?;
    let topology = dns_label(clab_name);
    if topology.is_empty() {
        return Err(ctx.err(
            "name",
            format!("{clab_name:?} has no letter or digit to name a topology by"),
        ));
    }
    if topology != clab_name {
        notes.push(format!(
            "topology {clab_name:?} is named {topology:?} (a DNS label)"
        ));
    }
    let topo = doc
        .get("topology")
        .ok_or_else(|| ctx.err("topology", "missing: nodes and links live under topology:"))?;
    let nodes = topo
        .get("nodes")
        .and_then(Value::as_mapping)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ctx.err("topology.nodes", "missing or empty: a topology needs nodes"))?;

    // containerlab name -> (Nextmini name, kind)
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut order: Vec<(String, String, Option<String>)> = Vec::new();
    let mut taken: HashMap<String, String> = HashMap::new();
    for (key, spec) in nodes {
        let Some(clab) = key.as_str() else {
            return Err(ctx.err(
                "topology.nodes",
                format!("node names must be strings, found {key:?}"),
            ));
        };
        let name = dns_label(clab);
        if name.is_empty() {
            return Err(ctx.err(
                format!("topology.nodes.{clab}"),
                "the name has no letter or digit to make a host name of",
            ));
        }
        if let Some(other) = taken.insert(name.clone(), clab.to_string()) {
            return Err(ctx.err(
                format!("topology.nodes.{clab}"),
                format!("becomes {name:?} as a DNS label, like node {other:?}: rename one of them"),
            ));
        }
        if name != clab {
            notes.push(format!("node {clab:?} is named {name:?} (a DNS label)"));
        }
        let kind = spec
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| {
                topo.get("defaults")
                    .and_then(|d| d.get("kind"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
        names.insert(clab.to_string(), name.clone());
        order.push((clab.to_string(), name, kind));
    }

    struct Link {
        name: String,
        a: String,
        b: String,
        wires: Vec<String>,
    }
    let mut links: Vec<Link> = Vec::new();
    let mut pairs: HashMap<(String, String), usize> = HashMap::new();
    let mut link_names: HashSet<String> = HashSet::new();
    let empty = Vec::new();
    let clab_links = match topo.get("links") {
        None | Some(Value::Null) => &empty,
        Some(Value::Sequence(s)) => s,
        Some(_) => return Err(ctx.err("topology.links", "expected a list of links")),
    };
    for (i, link) in clab_links.iter().enumerate() {
        let field = format!("topology.links[{i}]");
        if let Some(kind) = link.get("type").and_then(Value::as_str)
            && kind != "veth"
        {
            notes.push(format!("{field}: a {kind:?} link attaches to the host, which Nextmini does not emulate; left out"));
            continue;
        }
        let endpoints = link
            .get("endpoints")
            .and_then(Value::as_sequence)
            .ok_or_else(|| {
                ctx.err(
                    format!("{field}.endpoints"),
                    "missing: a link lists its two endpoints",
                )
            })?;
        let ends: Vec<Endpoint> = endpoints
            .iter()
            .enumerate()
            .map(|(j, e)| ctx.endpoint(&format!("{field}.endpoints[{j}]"), e))
            .collect::<Result<_, _>>()?;
        let [a, b] = ends.as_slice() else {
            return Err(ctx.err(
                format!("{field}.endpoints"),
                format!("a link joins exactly 2 endpoints, found {}", ends.len()),
            ));
        };
        let wire = format!("{} <-> {}", a.show(), b.show());
        if let Some(host) = [a, b]
            .iter()
            .find(|e| HOST_SIDE.contains(&e.node.as_str()) && !names.contains_key(&e.node))
        {
            notes.push(format!("{field} ({wire}): {} is on the host side, which Nextmini does not emulate; left out", host.show()));
            continue;
        }
        let mut resolved = Vec::with_capacity(2);
        for (j, e) in [a, b].iter().enumerate() {
            let Some(n) = names.get(&e.node) else {
                let known: Vec<&str> = names.keys().map(String::as_str).collect();
                return Err(ctx.err(
                    format!("{field}.endpoints[{j}]"),
                    format!(
                        "{:?} names node {:?}, which topology.nodes does not define (nodes: {})",
                        e.show(),
                        e.node,
                        known.join(", ")
                    ),
                ));
            };
            resolved.push(n.clone());
        }
        let (na, nb) = (resolved[0].clone(), resolved[1].clone());
        if na == nb {
            notes.push(format!("{field} ({wire}) loops back to one node; left out"));
            continue;
        }
        let key = if na < nb {
            (na.clone(), nb.clone())
        } else {
            (nb.clone(), na.clone())
        };
        if let Some(&k) = pairs.get(&key) {
            notes.push(format!(
                "{field} ({wire}): {na} and {nb} are already joined by link {}; Nextmini has one link per pair, so it is left out",
                links[k].name
            ));
            links[k].wires.push(wire);
            continue;
        }
        let mut name = format!("{na}-{nb}");
        let mut n = 2;
        while link_names.contains(&name) {
            name = format!("{na}-{nb}-{n}");
            n += 1;
        }
        link_names.insert(name.clone());
        pairs.insert(key, links.len());
        links.push(Link {
            name,
            a: na,
            b: nb,
            wires: vec![wire],
        });
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Converted from containerlab topology {clab_name:?} ({source_name}) by `nextmini import containerlab`."
    );
    let _ = writeln!(
        out,
        "# Kinds and images do not carry over: every node runs Nextmini's agent. Interfaces are noted per link."
    );
    let _ = writeln!(
        out,
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {topology}\nspec:\n  nodes:"
    );
    for (clab, name, kind) in &order {
        let mut comment = Vec::new();
        if let Some(k) = kind {
            comment.push(format!("kind {k}"));
        }
        if clab != name {
            comment.push(format!("containerlab name {clab:?}"));
        }
        if comment.is_empty() {
            let _ = writeln!(out, "    - name: {name}");
        } else {
            let _ = writeln!(out, "    - name: {name}  # {}", comment.join(", "));
        }
    }
    for l in &links {
        let _ = writeln!(
            out,
            "---\napiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata:\n  name: {}\nspec:\n  topology: {topology}\n  endpoints: [{}, {}]  # {}",
            l.name,
            l.a,
            l.b,
            l.wires.join("; ")
        );
    }
    Ok(Imported {
        manifest: out,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRL: &str = r#"
name: srl_ceos01
topology:
  defaults:
    kind: linux
  nodes:
    srl:
      kind: nokia_srlinux
      image: ghcr.io/nokia/srlinux
    ceos:
      kind: ceos
    Client_1: {}
  links:
    - endpoints: ["srl:e1-1", "ceos:eth1"]
    - endpoints: ["srl:e1-2", "ceos:eth2"]
    - type: veth
      endpoints:
        - node: ceos
          interface: eth3
        - node: Client_1
          interface: eth1
    - endpoints: ["srl:e1-3", "host:srl-e1-3"]
    - type: macvlan
      endpoint: {node: srl, interface: e1-4}
      host-interface: enp0s3
"#;

    #[test]
    fn converts_nodes_and_links_into_a_valid_manifest() {
        let imported = convert("lab.clab.yml", SRL).expect("converts");
        let m = &imported.manifest;
        assert!(m.contains("  name: srl-ceos01\n"), "{m}");
        assert!(m.contains("    - name: srl  # kind nokia_srlinux\n"), "{m}");
        assert!(
            m.contains("    - name: client-1  # kind linux, containerlab name \"Client_1\"\n"),
            "{m}"
        );
        assert!(
            m.contains(
                "  endpoints: [srl, ceos]  # srl:e1-1 <-> ceos:eth1; srl:e1-2 <-> ceos:eth2\n"
            ),
            "{m}"
        );
        assert!(m.contains("  name: ceos-client-1\n"), "{m}");
        let notes = imported.notes.join("\n");
        for needle in [
            "already joined by link srl-ceos",
            "host:srl-e1-3",
            "\"macvlan\" link",
            "\"Client_1\" is named \"client-1\"",
        ] {
            assert!(notes.contains(needle), "notes lack {needle:?}:\n{notes}");
        }
        // What Nextmini itself makes of the result.
        let manifest = crate::plan::parse_manifest("imported.yaml", m).expect("parses");
        let plans = crate::plan::plan_manifest(&manifest).expect("plans");
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].nodes.len(), 3);
        assert_eq!(plans[0].links.len(), 2);
    }

    #[test]
    fn errors_name_the_field_and_what_is_wrong() {
        let unknown = "name: x\ntopology:\n  nodes: {r1: {}, r2: {}}\n  links:\n    - endpoints: [\"r1:eth1\", \"r3:eth1\"]\n";
        let e = convert("t.clab.yml", unknown)
            .expect_err("r3 is unknown")
            .to_string();
        assert!(
            e.contains("t.clab.yml: topology.links[0].endpoints[1]"),
            "{e}"
        );
        assert!(e.contains("\"r3\"") && e.contains("nodes: r1, r2"), "{e}");

        let bad_endpoint = "name: x\ntopology:\n  nodes: {r1: {}}\n  links:\n    - endpoints: [\"r1-eth1\", \"r1:eth2\"]\n";
        let e = convert("t", bad_endpoint)
            .expect_err("no colon")
            .to_string();
        assert!(e.contains("NODE:INTERFACE"), "{e}");

        let clash = "name: x\ntopology:\n  nodes: {R1: {}, r1: {}}\n";
        let e = convert("t", clash).expect_err("clash").to_string();
        assert!(e.contains("like node \"R1\""), "{e}");

        assert!(
            convert("t", "name: x\n")
                .expect_err("no nodes")
                .to_string()
                .contains("topology")
        );
        assert!(
            convert("t", ": : :")
                .expect_err("not yaml")
                .to_string()
                .contains("not YAML")
        );
    }

    #[test]
    fn names_become_dns_labels() {
        assert_eq!(dns_label("Spine_01"), "spine-01");
        assert_eq!(dns_label("--a..b--"), "a-b");
        assert_eq!(dns_label(&"x".repeat(80)).len(), 63);
    }
}

//! Expands a `generator` into node names and links.

use crate::api::GeneratorSpec;

/// Which shape was asked for, with the field to blame in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Ring(u32),
    Line(u32),
    Star(u32),
    FatTree(u32),
}

/// Nodes in order and links as `(dialer, acceptor)`.
#[derive(Debug, Default)]
pub(crate) struct Generated {
    pub nodes: Vec<String>,
    pub links: Vec<(String, String)>,
}

impl Shape {
    /// The one shape set in `spec`, or the reason it is not exactly one.
    pub fn of(spec: &GeneratorSpec) -> Result<Shape, String> {
        let set: Vec<(&str, Shape)> = [
            spec.ring.as_ref().map(|c| ("ring", Shape::Ring(c.nodes))),
            spec.line.as_ref().map(|c| ("line", Shape::Line(c.nodes))),
            spec.star.as_ref().map(|c| ("star", Shape::Star(c.nodes))),
            spec.fat_tree
                .as_ref()
                .map(|f| ("fatTree", Shape::FatTree(f.k))),
        ]
        .into_iter()
        .flatten()
        .collect();
        match set.as_slice() {
            [(_, shape)] => Ok(*shape),
            [] => Err("set exactly one of ring, line, star, fatTree (found none)".to_owned()),
            many => {
                let names: Vec<&str> = many.iter().map(|(name, _)| *name).collect();
                Err(format!(
                    "set exactly one of ring, line, star, fatTree (found {})",
                    names.join(", ")
                ))
            }
        }
    }

    /// Field of the shape itself, e.g. `spec.generator.ring`.
    pub fn path(self) -> &'static str {
        match self {
            Shape::Ring(_) => "spec.generator.ring",
            Shape::Line(_) => "spec.generator.line",
            Shape::Star(_) => "spec.generator.star",
            Shape::FatTree(_) => "spec.generator.fatTree",
        }
    }

    /// Field holding the shape's size, e.g. `spec.generator.ring.nodes`.
    pub fn field(self) -> &'static str {
        match self {
            Shape::Ring(_) => "spec.generator.ring.nodes",
            Shape::Line(_) => "spec.generator.line.nodes",
            Shape::Star(_) => "spec.generator.star.nodes",
            Shape::FatTree(_) => "spec.generator.fatTree.k",
        }
    }

    /// Why the size is unusable, if it is.
    pub fn check(self) -> Result<(), String> {
        match self {
            Shape::Ring(n) if n < 3 => Err(format!("a ring needs at least 3 nodes, got {n}")),
            Shape::Line(0) | Shape::Star(0) => Err("needs at least 1 node, got 0".to_owned()),
            Shape::FatTree(k) if k < 2 || k % 2 != 0 => {
                Err(format!("k must be even and at least 2, got {k}"))
            }
            _ => Ok(()),
        }
    }

    /// Node count without generating anything, so absurd sizes are refused cheaply.
    pub fn node_count(self) -> u64 {
        match self {
            Shape::Ring(n) | Shape::Line(n) | Shape::Star(n) => u64::from(n),
            Shape::FatTree(k) => {
                let k = u128::from(k);
                // (k/2)^2 core + k*(k/2) aggregation + k*(k/2) edge + k^3/4 hosts
                let count = (k / 2) * (k / 2) + k * k + k * k * k / 4;
                u64::try_from(count).unwrap_or(u64::MAX)
            }
        }
    }

    /// The nodes and links; call only after `check` passed.
    pub fn generate(self) -> Generated {
        match self {
            Shape::Ring(n) => {
                let nodes = numbered(n);
                let links = (0..nodes.len())
                    .map(|i| (nodes[i].clone(), nodes[(i + 1) % nodes.len()].clone()))
                    .collect();
                Generated { nodes, links }
            }
            Shape::Line(n) => {
                let nodes = numbered(n);
                let links = nodes
                    .windows(2)
                    .map(|w| (w[0].clone(), w[1].clone()))
                    .collect();
                Generated { nodes, links }
            }
            Shape::Star(n) => {
                let nodes = numbered(n);
                let links = nodes
                    .iter()
                    .skip(1)
                    .map(|leaf| (nodes[0].clone(), leaf.clone()))
                    .collect();
                Generated { nodes, links }
            }
            Shape::FatTree(k) => fat_tree(k),
        }
    }
}

fn numbered(n: u32) -> Vec<String> {
    (0..n).map(|i| format!("n{i}")).collect()
}

/// The k-ary fat tree of Al-Fares et al.: k pods of k/2 aggregation and k/2 edge
/// switches, k/2 hosts per edge switch, and (k/2)^2 core switches; aggregation switch
/// `a` of every pod connects to cores `a*k/2 .. a*k/2 + k/2 - 1`. The upper layer dials.
fn fat_tree(k: u32) -> Generated {
    let half = k / 2;
    let mut g = Generated::default();
    g.nodes
        .extend((0..half * half).map(|c| format!("core-{c}")));
    for p in 0..k {
        g.nodes.extend((0..half).map(|a| format!("agg-{p}-{a}")));
    }
    for p in 0..k {
        g.nodes.extend((0..half).map(|e| format!("edge-{p}-{e}")));
    }
    for p in 0..k {
        for e in 0..half {
            g.nodes
                .extend((0..half).map(|h| format!("host-{p}-{e}-{h}")));
        }
    }
    for p in 0..k {
        for a in 0..half {
            for c in 0..half {
                g.links
                    .push((format!("core-{}", a * half + c), format!("agg-{p}-{a}")));
            }
            for e in 0..half {
                g.links
                    .push((format!("agg-{p}-{a}"), format!("edge-{p}-{e}")));
            }
        }
        for e in 0..half {
            for h in 0..half {
                g.links
                    .push((format!("edge-{p}-{e}"), format!("host-{p}-{e}-{h}")));
            }
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn fat_tree_k4_has_the_textbook_counts() {
        let g = Shape::FatTree(4).generate();
        assert_eq!(g.nodes.len(), 36);
        assert_eq!(Shape::FatTree(4).node_count(), 36);
        assert_eq!(
            g.nodes.iter().filter(|n| n.starts_with("host-")).count(),
            16
        );
        assert_eq!(g.nodes.iter().filter(|n| n.starts_with("core-")).count(), 4);
        // k^3/4 host links + k^3/4 edge-agg links + k^3/4 agg-core links
        assert_eq!(g.links.len(), 48);
        let names: HashSet<&String> = g.nodes.iter().collect();
        assert!(
            g.links
                .iter()
                .all(|(a, b)| names.contains(a) && names.contains(b))
        );
        // Every core switch serves one aggregation switch per pod.
        for c in 0..4 {
            let core = format!("core-{c}");
            assert_eq!(g.links.iter().filter(|(a, _)| *a == core).count(), 4);
        }
    }

    #[test]
    fn ring_line_star_shapes() {
        let ring = Shape::Ring(4).generate();
        assert_eq!(ring.links.last(), Some(&("n3".to_owned(), "n0".to_owned())));
        assert_eq!(ring.links.len(), 4);
        assert_eq!(Shape::Line(1).generate().links.len(), 0);
        assert_eq!(Shape::Line(5).generate().links.len(), 4);
        let star = Shape::Star(4).generate();
        assert!(star.links.iter().all(|(hub, _)| hub == "n0"));
        assert_eq!(star.links.len(), 3);
    }

    #[test]
    fn bad_sizes_are_explained() {
        assert_eq!(
            Shape::Ring(2).check(),
            Err("a ring needs at least 3 nodes, got 2".to_owned())
        );
        assert_eq!(
            Shape::FatTree(3).check(),
            Err("k must be even and at least 2, got 3".to_owned())
        );
        assert_eq!(
            Shape::FatTree(0).check(),
            Err("k must be even and at least 2, got 0".to_owned())
        );
        assert!(Shape::Star(0).check().is_err());
        assert!(Shape::FatTree(2).check().is_ok());
        assert!(Shape::FatTree(u32::MAX - 1).node_count() > 1 << 60);
    }
}

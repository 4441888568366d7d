//! Shortest-path routing over the planned links.

use super::model::{NextHop, Plan};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Undirected graph over node indices; adjacency lists are sorted by link name so the
/// first equally-short choice is always the lowest link name.
pub(crate) struct Graph<'a> {
    pub names: Vec<&'a str>,
    index: HashMap<&'a str, usize>,
    /// `(peer, link name)` per node.
    adjacency: Vec<Vec<(usize, &'a str)>>,
}

const UNREACHED: usize = usize::MAX;

impl<'a> Graph<'a> {
    /// Links naming unknown nodes are ignored; validation reports them separately.
    pub fn new(
        nodes: impl IntoIterator<Item = &'a str>,
        links: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
    ) -> Self {
        let names: Vec<&str> = nodes.into_iter().collect();
        let index: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let mut adjacency = vec![Vec::new(); names.len()];
        for (link, a, b) in links {
            if let (Some(&ia), Some(&ib)) = (index.get(a), index.get(b)) {
                adjacency[ia].push((ib, link));
                adjacency[ib].push((ia, link));
            }
        }
        for peers in &mut adjacency {
            peers.sort_by(|x, y| x.1.cmp(y.1).then(x.0.cmp(&y.0)));
        }
        Graph {
            names,
            index,
            adjacency,
        }
    }

    pub fn from_plan(plan: &'a Plan) -> Self {
        Graph::new(node_names(plan), edges(plan))
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Hop counts from `origin` to every node (`UNREACHED` where there is no path).
    fn distances(&self, origin: usize) -> Vec<usize> {
        let mut dist = vec![UNREACHED; self.names.len()];
        let mut queue = VecDeque::new();
        dist[origin] = 0;
        queue.push_back(origin);
        while let Some(u) = queue.pop_front() {
            for &(v, _) in &self.adjacency[u] {
                if dist[v] == UNREACHED {
                    dist[v] = dist[u] + 1;
                    queue.push_back(v);
                }
            }
        }
        dist
    }

    /// Connected-component id per node.
    pub fn components(&self) -> Vec<usize> {
        let mut component = vec![UNREACHED; self.names.len()];
        for start in 0..self.names.len() {
            if component[start] != UNREACHED {
                continue;
            }
            component[start] = start;
            let mut stack = vec![start];
            while let Some(u) = stack.pop() {
                for &(v, _) in &self.adjacency[u] {
                    if component[v] == UNREACHED {
                        component[v] = start;
                        stack.push(v);
                    }
                }
            }
        }
        component
    }

    /// The nodes of the shortest path from `from` to `to` (both included), the
    /// one destination routing takes: at each node the lowest link name wins.
    pub fn shortest_path(&self, from: usize, to: usize) -> Option<Vec<usize>> {
        let dist = self.distances(to);
        if dist.get(from).is_none_or(|d| *d == UNREACHED) {
            return None;
        }
        let mut path = vec![from];
        let mut at = from;
        while at != to {
            at = self.adjacency[at]
                .iter()
                .find(|(v, _)| dist[*v] + 1 == dist[at])
                .map(|(v, _)| *v)?;
            path.push(at);
        }
        Some(path)
    }

    /// The link joining `a` and `b` directly, if any.
    pub fn link_between(&self, a: usize, b: usize) -> Option<&'a str> {
        self.adjacency
            .get(a)?
            .iter()
            .find(|(peer, _)| *peer == b)
            .map(|(_, link)| *link)
    }
}

/// The link index a [`HopRun`] gives for a node's own address.
pub const TO_ITSELF: u32 = u32::MAX;
/// The link index of a [`HopRun`] over destinations the node cannot reach.
pub const UNREACHABLE: u32 = u32::MAX - 1;

/// Destinations from `first` (an index in `plan.nodes`) up to the next run's
/// `first` (or the last node) all go by `link` (an index in `plan.links`,
/// [`TO_ITSELF`] or [`UNREACHABLE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopRun {
    pub first: u32,
    pub link: u32,
}

/// The graph's nodes, in the order that gives them their indices.
fn node_names(plan: &Plan) -> impl Iterator<Item = &str> {
    plan.nodes.iter().map(|n| n.name.as_str())
}

/// The graph's edges: each link's name and ends, in the plan's order (which
/// gives links their indices in next-hop runs).
fn edges(plan: &Plan) -> impl Iterator<Item = (&str, &str, &str)> {
    plan.links
        .iter()
        .map(|l| (l.name.as_str(), l.dialer.as_str(), l.acceptor.as_str()))
}

/// Whether two plans have the same graph, node and link indices included: then
/// their [`next_hop_runs`] are equal, whatever else (link parameters, flows,
/// routes) changed.
pub fn same_graph(a: &Plan, b: &Plan) -> bool {
    node_names(a).eq(node_names(b)) && edges(a).eq(edges(b))
}

/// For every node (by index in `plan.nodes`), its next hop towards every node
/// by fewest hops (ties go to the lowest link name), as runs of consecutive
/// destinations that share the next hop. A generator numbers its nodes along
/// the topology's structure, so a row holds a handful of runs however large
/// the topology is (a ring's row has 4, a line's 3, a fat-tree host's 3): the
/// hub keeps these rows for every topology, and the full table was 8 bytes a
/// pair (800 MB at 10,000 nodes). One BFS per destination: O(n·(n+m)) time,
/// O(n) besides the runs.
pub fn next_hop_runs(plan: &Plan) -> Vec<Vec<HopRun>> {
    let graph = Graph::from_plan(plan);
    let link_index: HashMap<&str, u32> = plan
        .links
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name.as_str(), i as u32))
        .collect();
    let n = graph.names.len();
    let mut rows: Vec<Vec<HopRun>> = vec![Vec::new(); n];
    for dst in 0..n {
        // Distances *to* dst equal distances from it: links are bidirectional.
        let dist = graph.distances(dst);
        for (u, row) in rows.iter_mut().enumerate() {
            let link = match dist[u] {
                UNREACHED => UNREACHABLE,
                0 => TO_ITSELF,
                d => graph.adjacency[u]
                    .iter()
                    .find(|(v, _)| dist[*v] == d - 1)
                    .and_then(|(_, l)| link_index.get(l).copied())
                    .unwrap_or(UNREACHABLE),
            };
            if row.last().is_none_or(|run| run.link != link) {
                row.push(HopRun {
                    first: dst as u32,
                    link,
                });
            }
        }
    }
    for row in &mut rows {
        row.shrink_to_fit();
    }
    rows
}

/// The runs of a row as `(destinations, link)`, with the unreachable ones left out.
pub fn expand_runs(
    row: &[HopRun],
    nodes: usize,
) -> impl Iterator<Item = (std::ops::Range<u32>, u32)> + '_ {
    row.iter().enumerate().filter_map(move |(i, run)| {
        let end = row.get(i + 1).map_or(nodes as u32, |next| next.first);
        (run.link != UNREACHABLE).then_some((run.first..end, run.link))
    })
}

/// [`next_hop_runs`] by name: for every node, the next hop towards every
/// reachable node (itself included, with no link).
pub fn next_hops(plan: &Plan) -> BTreeMap<String, Vec<NextHop>> {
    next_hop_runs(plan)
        .into_iter()
        .zip(plan.nodes.iter())
        .map(|(row, node)| {
            let hops = expand_runs(&row, plan.nodes.len())
                .flat_map(|(dsts, link)| dsts.map(move |dst| (dst, link)))
                .map(|(dst, link)| NextHop {
                    dst: plan.nodes[dst as usize].name.clone(),
                    link: plan.links.get(link as usize).map(|l| l.name.clone()),
                })
                .collect();
            (node.name.clone(), hops)
        })
        .collect()
}

/// Links on the longest of the shortest paths between any two nodes (the graph's
/// diameter; 0 for a plan without links). One BFS per node, as `next_hops`.
pub fn longest_path(plan: &Plan) -> usize {
    let graph = Graph::from_plan(plan);
    (0..graph.names.len())
        .flat_map(|origin| graph.distances(origin).into_iter())
        .filter(|&d| d != UNREACHED)
        .max()
        .unwrap_or(0)
}

/// What a valid plan may still do that its author did not expect: printed by
/// `nextmini up` before it starts, one line each, naming the field.
pub fn warnings(plan: &Plan) -> Vec<String> {
    // With 65 nodes or fewer no path has more than 64 links; skip the BFS.
    const LINUX_TTL: usize = 64;
    if !plan.dataplane.ttl_decrement || plan.nodes.len() <= LINUX_TTL + 1 {
        return Vec::new();
    }
    let longest = longest_path(plan);
    if longest <= LINUX_TTL {
        return Vec::new();
    }
    vec![format!(
        "spec.dataplane.ttl: decrement: the longest path crosses {longest} links, more than the \
         TTL of 64 that Linux gives new packets, so they expire on the way (set a larger TTL, \
         e.g. `ping -t 255`, `sysctl net.ipv4.ip_default_ttl=255` in the nodes, or use ttl: transparent)"
    )]
}

/// Link names along an explicit node path; `None` if two consecutive nodes are not
/// directly linked, a node is unknown, or the path is empty.
pub fn path_links(plan: &Plan, path: &[String]) -> Option<Vec<String>> {
    let graph = Graph::from_plan(plan);
    let indices = path
        .iter()
        .map(|name| graph.index_of(name))
        .collect::<Option<Vec<_>>>()?;
    if indices.is_empty() {
        return None;
    }
    indices
        .windows(2)
        .map(|pair| graph.link_between(pair[0], pair[1]).map(str::to_owned))
        .collect()
}

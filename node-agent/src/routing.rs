//! The node's forwarding table: given a packet's flow key and the label of the frame
//! it came in (0 for packets from the TUN device), where does it go?
//!
//! Built once from the operator's `RouteTable` message and then only read, so the
//! dataplane can swap whole tables atomically and look up without locks. Generic over
//! the link handle `L` so this stays pure: the agent passes its link senders, tests
//! pass names or numbers.
//!
//! Lookup order:
//! 1. A frame that carries a label follows that label route (explicit paths).
//! 2. Otherwise the first matching flow rule pins the flow to a label route.
//! 3. Otherwise the destination address picks the next hop; with several next hops
//!    the flow hash makes a weighted, per-flow-stable choice.
//!
//! Destinations are address ranges, sorted and searched by halves: the hub
//! merges consecutive addresses with the same next hop, so a node of a
//! 10,000-node ring holds four ranges, not 10,000 entries.

use crate::flow::{FlowKey, Fnv1a, fmix64};
use nextmini_proto::v1 as pb;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("{used_by}: unknown link `{link}`")]
    UnknownLink { link: String, used_by: String },
    #[error("{used_by}: bad address `{addr}`")]
    BadAddress { addr: String, used_by: String },
    #[error("two destination routes for {0}")]
    DuplicateDestination(IpAddr),
    #[error("{used_by}: {first} and {last} are not an ascending range of one address family")]
    BadRange {
        first: IpAddr,
        last: IpAddr,
        used_by: String,
    },
    #[error("two label routes with route id {0}")]
    DuplicateLabel(u32),
    #[error("{used_by}: route id 0 is reserved for destination routing")]
    ZeroRouteId { used_by: String },
    #[error("flow rule #{rule}: {field} {value} is out of range")]
    OutOfRange {
        rule: usize,
        field: &'static str,
        value: u32,
    },
    #[error("flow rule #{rule}: no label route with route id {route_id} at this node")]
    RuleWithoutLabel { rule: usize, route_id: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// No destination route for the packet's destination address.
    NoRoute,
    /// The frame's label has no label route at this node.
    UnknownLabel,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<L> {
    /// Deliver to this node's TUN device.
    Local,
    /// Send on `link` with `label` in the frame header (0 = route by destination).
    Forward {
        link: L,
        label: u32,
    },
    Drop(DropReason),
}

#[derive(Clone, Debug)]
pub struct RouteTable<L> {
    /// Sorted by `lo`, not overlapping.
    destinations: Vec<DestinationRange<L>>,
    labels: HashMap<u32, Hop<L>>,
    rules: Vec<Rule>,
    hop_limit: crate::hop_limit::HopLimit,
    /// `ttl: decrement`: the address this node answers expired packets from.
    ttl_reply_from: Option<std::net::Ipv4Addr>,
}

#[derive(Clone, Debug)]
enum Hop<L> {
    Local,
    Link(L),
}

/// Addresses `lo..=hi` (as [`addr_key`]s) and where they go.
#[derive(Clone, Debug)]
struct DestinationRange<L> {
    lo: u128,
    hi: u128,
    to: Destination<L>,
}

/// An address as one ordered number: IPv4 as its IPv4-mapped IPv6 address,
/// so both families sort in one table without colliding.
fn addr_key(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn key_addr(key: u128) -> IpAddr {
    Ipv6Addr::from(key).to_canonical()
}

#[derive(Clone, Debug)]
enum Destination<L> {
    Local,
    One(L),
    Weighted(Weighted<L>),
}

/// Next hops as a partition of `0..total`: hop `i` owns `[bounds[i-1], bounds[i])`.
#[derive(Clone, Debug)]
struct Weighted<L> {
    /// Cumulative weights, strictly increasing; the last one is the total.
    bounds: Vec<u64>,
    links: Vec<L>,
    /// Mixed into the flow hash. Derived from this node's own link names, so two nodes
    /// on one path make independent choices. With one shared hash, the flows a first
    /// split sends to a node would all land in the same part of the next node's split
    /// (ECMP polarisation).
    salt: u64,
}

impl<L> Weighted<L> {
    /// `None` only for an empty set of hops, which `from_proto` never builds.
    fn pick(&self, flow_hash: u64) -> Option<&L> {
        let total = *self.bounds.last()?;
        let h = fmix64(flow_hash ^ self.salt);
        // Multiply-shift maps the hash onto 0..total from its high bits, avoiding the
        // modulo's bias and cost.
        let point = ((u128::from(h) * u128::from(total)) >> 64) as u64;
        let i = self.bounds.partition_point(|&b| b <= point);
        // point < total = the last bound, so some bound exceeds it and i is in range.
        self.links.get(i)
    }
}

/// What traffic a flow rule takes, with its unset fields as `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RuleMatch {
    src: Option<IpAddr>,
    dst: Option<IpAddr>,
    src_port: Option<u16>,
    dst_port: Option<u16>,
    protocol: Option<u8>,
}

/// A flow rule: matching traffic takes `route`.
#[derive(Clone, Debug)]
struct Rule {
    matching: RuleMatch,
    route: RuleRoute,
}

/// Where a rule sends matching flows: one route, or one of several by weight.
#[derive(Clone, Debug)]
enum RuleRoute {
    One(u32),
    Weighted(Weighted<u32>),
}

impl RuleRoute {
    fn pick(&self, key: &FlowKey) -> Option<u32> {
        match self {
            RuleRoute::One(id) => Some(*id),
            RuleRoute::Weighted(w) => w.pick(key.stable_hash()).copied(),
        }
    }
}

impl RuleMatch {
    fn matches(&self, key: &FlowKey) -> bool {
        self.src.is_none_or(|a| a == key.src)
            && self.dst.is_none_or(|a| a == key.dst)
            && self.src_port.is_none_or(|p| p == key.src_port)
            && self.dst_port.is_none_or(|p| p == key.dst_port)
            && self.protocol.is_none_or(|p| p == key.protocol)
    }
}

impl<L> Default for RouteTable<L> {
    fn default() -> Self {
        Self::empty()
    }
}

impl<L> RouteTable<L> {
    /// A table that routes nothing: every packet is dropped with `NoRoute` (or
    /// `UnknownLabel`). What a node uses before its first snapshot arrives.
    pub fn empty() -> Self {
        Self {
            destinations: Vec::new(),
            labels: HashMap::new(),
            rules: Vec::new(),
            hop_limit: crate::hop_limit::HopLimit::DEFAULT,
            ttl_reply_from: None,
        }
    }

    /// How many links a packet may cross in this topology (the loop guard).
    pub fn hop_limit(&self) -> crate::hop_limit::HopLimit {
        self.hop_limit
    }

    /// Makes this node a router for packets it forwards (`ttl: decrement`):
    /// it decrements their TTL and answers expiry from `overlay`.
    pub fn with_ttl_decrement(mut self, overlay: std::net::Ipv4Addr) -> Self {
        self.ttl_reply_from = Some(overlay);
        self
    }

    /// The address to answer expired packets from, when the node decrements TTLs.
    pub fn ttl_reply_from(&self) -> Option<std::net::Ipv4Addr> {
        self.ttl_reply_from
    }

    /// Builds the table, resolving link names to handles with `resolve`.
    ///
    /// Fails on the first inconsistency, naming it: an unknown link, an unparsable
    /// address, duplicate destinations or route ids, route id 0, out-of-range rule
    /// fields, or a flow rule whose route has no label route at this node. A next-hop
    /// weight of 0 (proto3's "unset") counts as 1, so unweighted routes split evenly.
    pub fn from_proto(
        table: &pb::RouteTable,
        resolve: impl Fn(&str) -> Option<L>,
    ) -> Result<RouteTable<L>, RouteError> {
        let link = |name: &str, used_by: &dyn Fn() -> String| {
            resolve(name).ok_or_else(|| RouteError::UnknownLink {
                link: name.to_owned(),
                used_by: used_by(),
            })
        };

        let mut labels = HashMap::with_capacity(table.labels.len());
        for route in &table.labels {
            let used_by = || format!("label route {}", route.route_id);
            if route.route_id == 0 {
                return Err(RouteError::ZeroRouteId { used_by: used_by() });
            }
            let hop = if route.next_link.is_empty() {
                Hop::Local
            } else {
                Hop::Link(link(&route.next_link, &used_by)?)
            };
            if labels.insert(route.route_id, hop).is_some() {
                return Err(RouteError::DuplicateLabel(route.route_id));
            }
        }

        let mut destinations = Vec::with_capacity(table.destinations.len() + table.ranges.len());
        for route in &table.destinations {
            let used_by = || format!("destination route to `{}`", route.node);
            let addr = parse_addr(&route.overlay_addr, &used_by)?;
            let used_by = || format!("destination route to `{}` ({addr})", route.node);
            destinations.push(DestinationRange {
                lo: addr_key(addr),
                hi: addr_key(addr),
                to: destination(&route.next_hops, &link, &used_by)?,
            });
        }
        for range in &table.ranges {
            let used_by = || format!("destination range {}-{}", range.first, range.last);
            let first = parse_addr(&range.first, &used_by)?;
            let last = parse_addr(&range.last, &used_by)?;
            if first.is_ipv4() != last.is_ipv4() || addr_key(first) > addr_key(last) {
                return Err(RouteError::BadRange {
                    first,
                    last,
                    used_by: used_by(),
                });
            }
            destinations.push(DestinationRange {
                lo: addr_key(first),
                hi: addr_key(last),
                to: destination(&range.next_hops, &link, &used_by)?,
            });
        }
        destinations.sort_by_key(|d| d.lo);
        if let Some(pair) = destinations
            .windows(2)
            .find(|pair| pair[1].lo <= pair[0].hi)
        {
            return Err(RouteError::DuplicateDestination(key_addr(pair[1].lo)));
        }

        let mut rules = Vec::with_capacity(table.flow_rules.len());
        for (i, rule) in table.flow_rules.iter().enumerate() {
            rules.push(parse_rule(i, rule, &labels)?);
        }

        Ok(RouteTable {
            destinations,
            labels,
            rules,
            hop_limit: crate::hop_limit::HopLimit::from_proto(table.hop_limit),
            ttl_reply_from: None,
        })
    }

    /// True when the table has no routes of any kind.
    pub fn is_empty(&self) -> bool {
        self.destinations.is_empty() && self.labels.is_empty() && self.rules.is_empty()
    }
}

impl<L: Clone> RouteTable<L> {
    /// This table with a timed scenario's flow rules on top (scenario.rs):
    /// each replaces the table's rules with the same match and goes first, the
    /// latest first. Their routes need label routes at this node, which the
    /// hub installs along every scenario path from the start; a rule that
    /// cannot apply is left out and returned with its error, so the others
    /// and the table still hold.
    pub fn with_rule_overrides(
        mut self,
        overrides: &[pb::FlowRule],
    ) -> (Self, Vec<(usize, RouteError)>) {
        let mut refused = Vec::new();
        for (i, over) in overrides.iter().enumerate() {
            match parse_rule(i, over, &self.labels) {
                Ok(rule) => {
                    self.rules.retain(|r| r.matching != rule.matching);
                    self.rules.insert(0, rule);
                }
                Err(e) => refused.push((i, e)),
            }
        }
        (self, refused)
    }

    /// Where a packet goes. `label` is the frame's label (0 for packets from the TUN
    /// device or frames routed by destination). Does not allocate; `L` should be cheap
    /// to clone (an index or an `Arc`).
    pub fn lookup(&self, key: &FlowKey, label: u32) -> Decision<L> {
        if label != 0 {
            return self.follow_label(label);
        }
        if let Some(rule) = self.rules.iter().find(|r| r.matching.matches(key)) {
            return match rule.route.pick(key) {
                Some(route_id) => self.follow_label(route_id),
                None => Decision::Drop(DropReason::NoRoute),
            };
        }
        let at = addr_key(key.dst);
        let found = self
            .destinations
            .partition_point(|d| d.lo <= at)
            .checked_sub(1)
            .and_then(|i| self.destinations.get(i))
            .filter(|d| at <= d.hi)
            .map(|d| &d.to);
        match found {
            None => Decision::Drop(DropReason::NoRoute),
            Some(Destination::Local) => Decision::Local,
            Some(Destination::One(link)) => Decision::Forward {
                link: link.clone(),
                label: 0,
            },
            Some(Destination::Weighted(w)) => match w.pick(key.stable_hash()) {
                Some(link) => Decision::Forward {
                    link: link.clone(),
                    label: 0,
                },
                None => Decision::Drop(DropReason::NoRoute),
            },
        }
    }

    fn follow_label(&self, label: u32) -> Decision<L> {
        match self.labels.get(&label) {
            None => Decision::Drop(DropReason::UnknownLabel),
            Some(Hop::Local) => Decision::Local,
            Some(Hop::Link(link)) => Decision::Forward {
                link: link.clone(),
                label,
            },
        }
    }
}

/// Resolves a link name to its handle, or says which route named an unknown one.
type LinkResolver<'a, L> = dyn Fn(&str, &dyn Fn() -> String) -> Result<L, RouteError> + 'a;

/// Where a destination's `hops` go: local when empty, else one link or a
/// weighted choice among several (a weight of 0, proto3's "unset", counts as 1).
fn destination<L>(
    hops: &[pb::NextHop],
    link: &LinkResolver<'_, L>,
    used_by: &dyn Fn() -> String,
) -> Result<Destination<L>, RouteError> {
    Ok(match hops {
        [] => Destination::Local,
        [hop] => Destination::One(link(&hop.link, used_by)?),
        hops => {
            let mut bounds = Vec::with_capacity(hops.len());
            let mut links = Vec::with_capacity(hops.len());
            let mut total = 0u64;
            let mut salt = Fnv1a::new();
            for hop in hops {
                total += u64::from(hop.weight.max(1));
                bounds.push(total);
                links.push(link(&hop.link, used_by)?);
                salt.write(hop.link.as_bytes());
                salt.write(&[0]);
            }
            Destination::Weighted(Weighted {
                bounds,
                links,
                salt: salt.finish(),
            })
        }
    })
}

/// The match of flow rule `i`: its addresses and ranges checked.
fn parse_match(i: usize, rule: &pb::FlowRule) -> Result<RuleMatch, RouteError> {
    let used_by = || format!("flow rule #{i}");
    let optional_addr = |s: &str| {
        if s.is_empty() {
            Ok(None)
        } else {
            parse_addr(s, &used_by).map(Some)
        }
    };
    let small = |field: &'static str, value: u32, max: u32| {
        if value <= max {
            Ok(value)
        } else {
            Err(RouteError::OutOfRange {
                rule: i,
                field,
                value,
            })
        }
    };
    // Proto3 has no u16/u8; 0 doubles as "unset", which also means "any".
    let src_port = small("src_port", rule.src_port, u32::from(u16::MAX))? as u16;
    let dst_port = small("dst_port", rule.dst_port, u32::from(u16::MAX))? as u16;
    let protocol = small("protocol", rule.protocol, u32::from(u8::MAX))? as u8;
    Ok(RuleMatch {
        src: optional_addr(&rule.src_addr)?,
        dst: optional_addr(&rule.dst_addr)?,
        src_port: (src_port != 0).then_some(src_port),
        dst_port: (dst_port != 0).then_some(dst_port),
        protocol: (protocol != 0).then_some(protocol),
    })
}

/// Flow rule `i`, whose routes must have label routes at this node.
fn parse_rule<L>(
    i: usize,
    rule: &pb::FlowRule,
    labels: &HashMap<u32, Hop<L>>,
) -> Result<Rule, RouteError> {
    let used_by = || format!("flow rule #{i}");
    // A rule names one route, or weighted choices among several.
    let choices: Vec<(u32, u32)> = if rule.choices.is_empty() {
        vec![(rule.route_id, 1)]
    } else {
        rule.choices
            .iter()
            .map(|c| (c.route_id, c.weight.max(1)))
            .collect()
    };
    for &(route_id, _) in &choices {
        if route_id == 0 {
            return Err(RouteError::ZeroRouteId { used_by: used_by() });
        }
        if !labels.contains_key(&route_id) {
            return Err(RouteError::RuleWithoutLabel { rule: i, route_id });
        }
    }
    let route = match choices.as_slice() {
        [(id, _)] => RuleRoute::One(*id),
        many => {
            let mut bounds = Vec::with_capacity(many.len());
            let mut ids = Vec::with_capacity(many.len());
            let mut total = 0u64;
            let mut salt = Fnv1a::new();
            for &(id, weight) in many {
                total += u64::from(weight);
                bounds.push(total);
                ids.push(id);
                salt.write(&id.to_be_bytes());
            }
            RuleRoute::Weighted(Weighted {
                bounds,
                links: ids,
                salt: salt.finish(),
            })
        }
    };
    Ok(Rule {
        matching: parse_match(i, rule)?,
        route,
    })
}

fn parse_addr(s: &str, used_by: &dyn Fn() -> String) -> Result<IpAddr, RouteError> {
    s.parse().map_err(|_| RouteError::BadAddress {
        addr: s.to_owned(),
        used_by: used_by(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{PROTO_TCP, PROTO_UDP};
    use std::net::{Ipv4Addr, Ipv6Addr};

    const LINKS: [&str; 5] = ["a-b", "a-c", "a-d", "b-d", "b-e"];

    /// Link handles in tests are indices into `LINKS`.
    fn resolve(name: &str) -> Option<usize> {
        LINKS.iter().position(|l| *l == name)
    }

    fn addr(last: u8) -> IpAddr {
        Ipv4Addr::new(198, 18, 0, last).into()
    }

    fn link(name: &str) -> usize {
        resolve(name).expect("test link")
    }

    fn next_hops(hops: &[(&str, u32)]) -> Vec<pb::NextHop> {
        hops.iter()
            .map(|&(link, weight)| pb::NextHop {
                link: link.into(),
                weight,
            })
            .collect()
    }

    fn dest(node: &str, last: u8, hops: &[(&str, u32)]) -> pb::DestinationRoute {
        pb::DestinationRoute {
            node: node.into(),
            overlay_addr: addr(last).to_string(),
            next_hops: next_hops(hops),
        }
    }

    fn label(route_id: u32, next_link: &str) -> pb::LabelRoute {
        pb::LabelRoute {
            route_id,
            next_link: next_link.into(),
        }
    }

    fn key(dst: u8, src_port: u16) -> FlowKey {
        FlowKey {
            src: addr(1),
            dst: addr(dst),
            protocol: PROTO_TCP,
            src_port,
            dst_port: 80,
        }
    }

    /// Deterministic pseudo-random flows (splitmix64), so statistics are repeatable.
    fn random_flows(n: usize, dst: u8, mut seed: u64) -> Vec<FlowKey> {
        (0..n)
            .map(|_| {
                seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let r = fmix64(seed);
                FlowKey {
                    src: Ipv4Addr::from((r >> 32) as u32).into(),
                    dst: addr(dst),
                    protocol: if r & 1 == 0 { PROTO_TCP } else { PROTO_UDP },
                    src_port: (r >> 8) as u16,
                    dst_port: (r >> 24) as u16,
                }
            })
            .collect()
    }

    fn build(table: pb::RouteTable) -> RouteTable<usize> {
        RouteTable::from_proto(&table, resolve).expect("valid table")
    }

    fn node_a() -> RouteTable<usize> {
        build(pb::RouteTable {
            destinations: vec![
                dest("a", 1, &[]),
                dest("b", 2, &[("a-b", 1)]),
                dest("d", 4, &[("a-b", 1), ("a-c", 3)]),
            ],
            labels: vec![label(7, "a-c"), label(8, ""), label(9, "a-d")],
            flow_rules: vec![
                pb::FlowRule {
                    dst_addr: addr(4).to_string(),
                    dst_port: 5201,
                    route_id: 9,
                    ..Default::default()
                },
                pb::FlowRule {
                    protocol: u32::from(PROTO_UDP),
                    route_id: 7,
                    ..Default::default()
                },
            ],
            ranges: Vec::new(),
            hop_limit: 300,
        })
    }

    #[test]
    fn the_hop_limit_comes_from_the_table() {
        assert_eq!(node_a().hop_limit().get(), 300);
        assert_eq!(
            RouteTable::<usize>::empty().hop_limit(),
            crate::hop_limit::HopLimit::DEFAULT
        );
    }

    #[test]
    fn empty_table_drops_everything() {
        let t = RouteTable::<usize>::empty();
        assert!(t.is_empty());
        assert_eq!(t.lookup(&key(2, 1), 0), Decision::Drop(DropReason::NoRoute));
        assert_eq!(
            t.lookup(&key(2, 1), 5),
            Decision::Drop(DropReason::UnknownLabel)
        );
        assert!(RouteTable::<usize>::default().is_empty());
        assert!(
            RouteTable::from_proto(&pb::RouteTable::default(), resolve)
                .expect("empty is valid")
                .is_empty()
        );
    }

    #[test]
    fn destination_routes() {
        let t = node_a();
        assert!(!t.is_empty());
        assert_eq!(t.lookup(&key(1, 1), 0), Decision::Local);
        assert_eq!(
            t.lookup(&key(2, 1), 0),
            Decision::Forward {
                link: link("a-b"),
                label: 0
            }
        );
        assert_eq!(t.lookup(&key(3, 1), 0), Decision::Drop(DropReason::NoRoute));
    }

    #[test]
    fn labels_take_precedence_over_everything() {
        let t = node_a();
        // Destination 2 has a route, and UDP matches a flow rule, but the label wins.
        let mut k = key(2, 1);
        k.protocol = PROTO_UDP;
        assert_eq!(
            t.lookup(&k, 9),
            Decision::Forward {
                link: link("a-d"),
                label: 9
            }
        );
        assert_eq!(t.lookup(&k, 8), Decision::Local);
        assert_eq!(t.lookup(&k, 1234), Decision::Drop(DropReason::UnknownLabel));
    }

    #[test]
    fn flow_rules_pin_flows_to_label_routes() {
        let t = node_a();
        // First rule: dst 198.18.0.4, port 5201 -> label 9 via a-d.
        assert_eq!(
            t.lookup(
                &FlowKey {
                    dst_port: 5201,
                    ..key(4, 1)
                },
                0
            ),
            Decision::Forward {
                link: link("a-d"),
                label: 9
            }
        );
        // Second rule: any UDP -> label 7 via a-c, even to a destination with no route.
        let udp = FlowKey {
            protocol: PROTO_UDP,
            ..key(99, 1)
        };
        assert_eq!(
            t.lookup(&udp, 0),
            Decision::Forward {
                link: link("a-c"),
                label: 7
            }
        );
        // Both match: the first rule wins.
        let both = FlowKey {
            protocol: PROTO_UDP,
            dst_port: 5201,
            ..key(4, 1)
        };
        assert_eq!(
            t.lookup(&both, 0),
            Decision::Forward {
                link: link("a-d"),
                label: 9
            }
        );
        // Neither matches: destination routing.
        assert_eq!(
            t.lookup(&key(2, 1), 0),
            Decision::Forward {
                link: link("a-b"),
                label: 0
            }
        );
    }

    #[test]
    fn scenario_rules_replace_the_same_match_and_go_first() {
        let to_d_5201 = FlowKey {
            dst_port: 5201,
            ..key(4, 1)
        };
        let udp_to_d = FlowKey {
            protocol: PROTO_UDP,
            ..key(4, 1)
        };
        let over = |route_id: u32, dst_port: u32, protocol: u8| pb::FlowRule {
            dst_addr: addr(4).to_string(),
            dst_port,
            protocol: u32::from(protocol),
            route_id,
            ..Default::default()
        };
        // The table's own rule for d:5201 takes label 9; the scenario's rule
        // with the same match moves it to label 7 and leaves other traffic.
        let (t, refused) = node_a().with_rule_overrides(&[over(7, 5201, 0)]);
        assert!(refused.is_empty());
        assert_eq!(
            t.lookup(&to_d_5201, 0),
            Decision::Forward {
                link: link("a-c"),
                label: 7
            }
        );
        assert_eq!(
            t.lookup(&key(2, 1), 0),
            Decision::Forward {
                link: link("a-b"),
                label: 0
            }
        );
        // A scenario rule goes before the table's: UDP to d matched the
        // table's UDP rule (label 7), now the scenario's (label 9).
        let (t, _) = node_a().with_rule_overrides(&[over(9, 0, PROTO_UDP)]);
        assert_eq!(
            t.lookup(&udp_to_d, 0),
            Decision::Forward {
                link: link("a-d"),
                label: 9
            }
        );
        // No overrides: the table as it was.
        let (t, _) = node_a().with_rule_overrides(&[]);
        assert_eq!(
            t.lookup(&to_d_5201, 0),
            Decision::Forward {
                link: link("a-d"),
                label: 9
            }
        );
        // A route without a label route here is refused, naming it; the
        // other overrides still apply.
        let (t, refused) = node_a().with_rule_overrides(&[over(42, 0, 0), over(7, 5201, 0)]);
        assert_eq!(
            refused
                .iter()
                .map(|(i, e)| (*i, e.to_string()))
                .collect::<Vec<_>>(),
            [(
                0,
                "flow rule #0: no label route with route id 42 at this node".to_string()
            )]
        );
        assert_eq!(
            t.lookup(&to_d_5201, 0),
            Decision::Forward {
                link: link("a-c"),
                label: 7
            }
        );
    }

    #[test]
    fn flow_rule_to_a_local_label_delivers_locally() {
        let t = build(pb::RouteTable {
            labels: vec![label(3, "")],
            flow_rules: vec![pb::FlowRule {
                src_port: 1,
                route_id: 3,
                ..Default::default()
            }],
            ..Default::default()
        });
        assert_eq!(t.lookup(&key(50, 1), 0), Decision::Local);
        assert_eq!(
            t.lookup(&key(50, 2), 0),
            Decision::Drop(DropReason::NoRoute)
        );
    }

    #[test]
    fn flow_rule_fields_each_filter() {
        let base = FlowKey {
            src: addr(1),
            dst: addr(2),
            protocol: PROTO_TCP,
            src_port: 1000,
            dst_port: 80,
        };
        let rule = pb::FlowRule {
            src_addr: addr(1).to_string(),
            dst_addr: addr(2).to_string(),
            src_port: 1000,
            dst_port: 80,
            protocol: u32::from(PROTO_TCP),
            route_id: 7,
            choices: vec![],
        };
        let t = build(pb::RouteTable {
            labels: vec![label(7, "a-c")],
            flow_rules: vec![rule],
            ..Default::default()
        });
        let pinned = Decision::Forward {
            link: link("a-c"),
            label: 7,
        };
        assert_eq!(t.lookup(&base, 0), pinned);
        let misses = [
            FlowKey {
                src: addr(9),
                ..base
            },
            FlowKey {
                dst: addr(9),
                ..base
            },
            FlowKey {
                src_port: 1001,
                ..base
            },
            FlowKey {
                dst_port: 81,
                ..base
            },
            FlowKey {
                protocol: PROTO_UDP,
                ..base
            },
        ];
        for k in misses {
            assert_eq!(
                t.lookup(&k, 0),
                Decision::Drop(DropReason::NoRoute),
                "{k:?}"
            );
        }
    }

    #[test]
    fn ipv6_destinations() {
        let v6: IpAddr = "2001:db8::4".parse::<Ipv6Addr>().expect("addr").into();
        let t = build(pb::RouteTable {
            destinations: vec![pb::DestinationRoute {
                node: "d".into(),
                overlay_addr: v6.to_string(),
                next_hops: vec![pb::NextHop {
                    link: "a-d".into(),
                    weight: 0,
                }],
            }],
            ..Default::default()
        });
        let k = FlowKey {
            src: v6,
            dst: v6,
            protocol: PROTO_TCP,
            src_port: 1,
            dst_port: 2,
        };
        assert_eq!(
            t.lookup(&k, 0),
            Decision::Forward {
                link: link("a-d"),
                label: 0
            }
        );
    }

    fn range(first: u8, last: u8, hops: &[(&str, u32)]) -> pb::DestinationRange {
        pb::DestinationRange {
            first: addr(first).to_string(),
            last: addr(last).to_string(),
            next_hops: next_hops(hops),
        }
    }

    /// Issue 16.2: a node's table as a few ranges, the way the hub sends a
    /// ring's: every address from `first` to `last` takes the range's hop, both
    /// ends included, beside single-address routes; nothing outside them routes.
    #[test]
    fn ranges_route_every_address_between_their_ends() {
        let t = build(pb::RouteTable {
            destinations: vec![dest("e", 200, &[("b-e", 1)])],
            ranges: vec![
                range(1, 1, &[]),
                range(2, 100, &[("a-b", 1)]),
                range(101, 150, &[("a-c", 1)]),
                range(151, 160, &[("a-b", 1), ("a-d", 1)]),
            ],
            ..Default::default()
        });
        let via = |last: u8| match t.lookup(&key(last, 1), 0) {
            Decision::Forward { link, .. } => Some(LINKS[link]),
            Decision::Local => Some("local"),
            Decision::Drop(_) => None,
        };
        assert_eq!(via(1), Some("local"));
        for (last, expected) in [
            (2, Some("a-b")),
            (57, Some("a-b")),
            (100, Some("a-b")),
            (101, Some("a-c")),
            (150, Some("a-c")),
            (161, None),
            (199, None),
            (200, Some("b-e")),
            (201, None),
            (0, None),
        ] {
            assert_eq!(via(last), expected, "198.18.0.{last}");
        }
        assert!(matches!(via(155), Some("a-b" | "a-d")));
        let v6: IpAddr = "::ffff:198.18.0.3"
            .parse::<Ipv6Addr>()
            .expect("addr")
            .into();
        let mut k = key(3, 1);
        k.dst = "2001:db8::3".parse::<Ipv6Addr>().expect("addr").into();
        assert_eq!(t.lookup(&k, 0), Decision::Drop(DropReason::NoRoute));
        k.dst = v6;
        assert!(
            matches!(t.lookup(&k, 0), Decision::Forward { .. }),
            "the mapped form is the same address"
        );
    }

    #[test]
    fn overlapping_or_reversed_ranges_are_refused() {
        let err = |table: pb::RouteTable| {
            RouteTable::from_proto(&table, resolve)
                .map(|_| ())
                .expect_err("refused")
        };
        assert_eq!(
            err(pb::RouteTable {
                ranges: vec![range(2, 10, &[("a-b", 1)]), range(10, 12, &[("a-c", 1)])],
                ..Default::default()
            }),
            RouteError::DuplicateDestination(addr(10))
        );
        assert_eq!(
            err(pb::RouteTable {
                destinations: vec![dest("e", 5, &[("b-e", 1)])],
                ranges: vec![range(2, 10, &[("a-b", 1)])],
                ..Default::default()
            }),
            RouteError::DuplicateDestination(addr(5))
        );
        assert!(matches!(
            err(pb::RouteTable {
                ranges: vec![range(9, 2, &[("a-b", 1)])],
                ..Default::default()
            }),
            RouteError::BadRange { .. }
        ));
        let mixed = pb::DestinationRange {
            first: "198.18.0.1".into(),
            last: "2001:db8::1".into(),
            next_hops: Vec::new(),
        };
        assert!(matches!(
            err(pb::RouteTable {
                ranges: vec![mixed],
                ..Default::default()
            }),
            RouteError::BadRange { .. }
        ));
        assert!(matches!(
            err(pb::RouteTable {
                ranges: vec![range(2, 10, &[("nope", 1)])],
                ..Default::default()
            }),
            RouteError::UnknownLink { .. }
        ));
    }

    #[test]
    fn multipath_is_stable_per_flow() {
        let t = node_a();
        let rebuilt = node_a();
        for k in random_flows(1000, 4, 1) {
            let k = FlowKey {
                dst_port: k.dst_port.max(5202),
                protocol: PROTO_TCP,
                ..k
            };
            let first = t.lookup(&k, 0);
            assert!(matches!(first, Decision::Forward { label: 0, .. }));
            assert_eq!(t.lookup(&k, 0), first);
            // Same answer from an independently built table: nothing per-process.
            assert_eq!(rebuilt.lookup(&k, 0), first);
        }
    }

    fn split(t: &RouteTable<usize>, flows: &[FlowKey]) -> HashMap<usize, usize> {
        let mut counts = HashMap::new();
        for k in flows {
            match t.lookup(k, 0) {
                Decision::Forward { link, label: 0 } => *counts.entry(link).or_insert(0) += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        counts
    }

    #[test]
    fn multipath_respects_weights() {
        let t = build(pb::RouteTable {
            destinations: vec![dest("d", 4, &[("a-b", 1), ("a-c", 3)])],
            ..Default::default()
        });
        let counts = split(&t, &random_flows(10_000, 4, 2));
        let share = counts[&link("a-c")] as f64 / 10_000.0;
        assert!(
            (share - 0.75).abs() < 0.02,
            "a-c share {share}, counts {counts:?}"
        );
        assert_eq!(counts.values().sum::<usize>(), 10_000);
    }

    #[test]
    fn multipath_zero_weights_split_evenly() {
        let t = build(pb::RouteTable {
            destinations: vec![dest("d", 4, &[("a-b", 0), ("a-c", 0), ("a-d", 0)])],
            ..Default::default()
        });
        let counts = split(&t, &random_flows(9_000, 4, 3));
        for l in ["a-b", "a-c", "a-d"] {
            let c = counts[&link(l)];
            assert!((2800..3200).contains(&c), "{l}: {counts:?}");
        }
    }

    #[test]
    fn multipath_choices_at_successive_nodes_are_independent() {
        // a splits evenly to b and c; b splits evenly to d and e. Without a per-node
        // salt the flows b receives would all fall into one half of b's split.
        let a = build(pb::RouteTable {
            destinations: vec![dest("z", 9, &[("a-b", 1), ("a-c", 1)])],
            ..Default::default()
        });
        let b = build(pb::RouteTable {
            destinations: vec![dest("z", 9, &[("b-d", 1), ("b-e", 1)])],
            ..Default::default()
        });
        let at_b: Vec<FlowKey> = random_flows(10_000, 9, 4)
            .into_iter()
            .filter(|k| {
                a.lookup(k, 0)
                    == Decision::Forward {
                        link: link("a-b"),
                        label: 0,
                    }
            })
            .collect();
        let counts = split(&b, &at_b);
        let share = counts.get(&link("b-d")).copied().unwrap_or(0) as f64 / at_b.len() as f64;
        assert!(
            (share - 0.5).abs() < 0.03,
            "b-d share {share} of {} flows",
            at_b.len()
        );
    }

    #[test]
    fn handles_are_cloned_not_moved() {
        // A non-Copy handle type, as the agent's link senders are.
        let t = RouteTable::from_proto(
            &pb::RouteTable {
                destinations: vec![dest("b", 2, &[("a-b", 1)])],
                ..Default::default()
            },
            |name| Some(std::sync::Arc::new(name.to_owned())),
        )
        .expect("valid");
        for _ in 0..2 {
            match t.lookup(&key(2, 1), 0) {
                Decision::Forward { link, .. } => assert_eq!(link.as_str(), "a-b"),
                other => panic!("{other:?}"),
            }
        }
    }

    fn build_err(table: pb::RouteTable) -> RouteError {
        RouteTable::from_proto(&table, resolve).expect_err("invalid table")
    }

    #[test]
    fn errors_name_the_culprit() {
        let err = build_err(pb::RouteTable {
            destinations: vec![dest("b", 2, &[("a-zz", 1)])],
            ..Default::default()
        });
        assert_eq!(
            err,
            RouteError::UnknownLink {
                link: "a-zz".into(),
                used_by: "destination route to `b` (198.18.0.2)".into()
            }
        );
        assert!(err.to_string().contains("a-zz"), "{err}");

        let err = build_err(pb::RouteTable {
            destinations: vec![dest("b", 2, &[("a-b", 1), ("nope", 1)])],
            ..Default::default()
        });
        assert!(
            matches!(&err, RouteError::UnknownLink { link, .. } if link == "nope"),
            "{err}"
        );

        let err = build_err(pb::RouteTable {
            labels: vec![label(4, "gone")],
            ..Default::default()
        });
        assert_eq!(
            err,
            RouteError::UnknownLink {
                link: "gone".into(),
                used_by: "label route 4".into()
            }
        );

        let mut bad = dest("b", 2, &[]);
        bad.overlay_addr = "198.18.0.300".into();
        let err = build_err(pb::RouteTable {
            destinations: vec![bad],
            ..Default::default()
        });
        assert_eq!(
            err,
            RouteError::BadAddress {
                addr: "198.18.0.300".into(),
                used_by: "destination route to `b`".into()
            }
        );
        assert!(err.to_string().contains("198.18.0.300"), "{err}");
    }

    #[test]
    fn rejects_duplicates_and_reserved_ids() {
        let err = build_err(pb::RouteTable {
            destinations: vec![dest("b", 2, &[]), dest("b2", 2, &[])],
            ..Default::default()
        });
        assert_eq!(err, RouteError::DuplicateDestination(addr(2)));
        let err = build_err(pb::RouteTable {
            labels: vec![label(3, ""), label(3, "a-b")],
            ..Default::default()
        });
        assert_eq!(err, RouteError::DuplicateLabel(3));
        let err = build_err(pb::RouteTable {
            labels: vec![label(0, "")],
            ..Default::default()
        });
        assert!(matches!(err, RouteError::ZeroRouteId { .. }));
        let err = build_err(pb::RouteTable {
            flow_rules: vec![pb::FlowRule::default()],
            ..Default::default()
        });
        assert_eq!(
            err,
            RouteError::ZeroRouteId {
                used_by: "flow rule #0".into()
            }
        );
    }

    #[test]
    fn rejects_bad_flow_rules() {
        let with_rule = |rule: pb::FlowRule| pb::RouteTable {
            labels: vec![label(7, "")],
            flow_rules: vec![rule],
            ..Default::default()
        };
        let err = build_err(with_rule(pb::FlowRule {
            route_id: 8,
            ..Default::default()
        }));
        assert_eq!(
            err,
            RouteError::RuleWithoutLabel {
                rule: 0,
                route_id: 8
            }
        );
        let err = build_err(with_rule(pb::FlowRule {
            route_id: 7,
            src_port: 70_000,
            ..Default::default()
        }));
        assert_eq!(
            err,
            RouteError::OutOfRange {
                rule: 0,
                field: "src_port",
                value: 70_000
            }
        );
        let err = build_err(with_rule(pb::FlowRule {
            route_id: 7,
            dst_port: 65_536,
            ..Default::default()
        }));
        assert_eq!(
            err,
            RouteError::OutOfRange {
                rule: 0,
                field: "dst_port",
                value: 65_536
            }
        );
        let err = build_err(with_rule(pb::FlowRule {
            route_id: 7,
            protocol: 256,
            ..Default::default()
        }));
        assert_eq!(
            err,
            RouteError::OutOfRange {
                rule: 0,
                field: "protocol",
                value: 256
            }
        );
        let err = build_err(with_rule(pb::FlowRule {
            route_id: 7,
            src_addr: "10.0.0.0/8".into(),
            ..Default::default()
        }));
        assert_eq!(
            err,
            RouteError::BadAddress {
                addr: "10.0.0.0/8".into(),
                used_by: "flow rule #0".into()
            }
        );
        // Boundary values are accepted.
        let ok = with_rule(pb::FlowRule {
            route_id: 7,
            src_port: 65_535,
            protocol: 255,
            ..Default::default()
        });
        assert!(RouteTable::from_proto(&ok, resolve).is_ok());
    }

    #[test]
    fn weighted_rules_split_an_aggregate_per_flow() {
        let table = pb::RouteTable {
            labels: vec![label(5, "via-x"), label(6, "via-y")],
            flow_rules: vec![pb::FlowRule {
                dst_addr: "10.0.0.9".into(),
                choices: vec![
                    pb::RouteChoice {
                        route_id: 5,
                        weight: 1,
                    },
                    pb::RouteChoice {
                        route_id: 6,
                        weight: 3,
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let t: RouteTable<String> =
            RouteTable::from_proto(&table, |n| Some(n.to_string())).expect("table");
        let mut via_y = 0;
        let flows = 10_000u16;
        for port in 0..flows {
            let key = FlowKey {
                src: "10.0.0.1".parse().expect("addr"),
                dst: "10.0.0.9".parse().expect("addr"),
                protocol: 6,
                src_port: 1024 + port,
                dst_port: 80,
            };
            let first = t.lookup(&key, 0);
            // The same flow always takes the same route, and carries its label.
            match (&first, t.lookup(&key, 0)) {
                (Decision::Forward { link, label }, Decision::Forward { link: again, .. }) => {
                    assert_eq!(link, &again);
                    assert_eq!(*label, if link == "via-y" { 6 } else { 5 });
                    if link == "via-y" {
                        via_y += 1;
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let share = f64::from(via_y) / f64::from(flows);
        assert!((share - 0.75).abs() < 0.03, "weight 3 of 4 got {share}");
    }

    #[test]
    fn weighted_rule_choices_need_label_routes() {
        let table = pb::RouteTable {
            labels: vec![label(5, "via-x")],
            flow_rules: vec![pb::FlowRule {
                choices: vec![
                    pb::RouteChoice {
                        route_id: 5,
                        weight: 1,
                    },
                    pb::RouteChoice {
                        route_id: 8,
                        weight: 1,
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let err = RouteTable::<String>::from_proto(&table, |n| Some(n.to_string()))
            .expect_err("route 8 unknown");
        assert!(
            matches!(err, RouteError::RuleWithoutLabel { route_id: 8, .. }),
            "{err}"
        );
    }
}

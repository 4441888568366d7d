//! When a node's agent may start while a topology's nodes are being made: once
//! the node and every link peer being made with it are wired (namespace, veth
//! on its bridge, static forwarding entry). An agent dials its link peers at
//! once; a SYN to a node whose port is not on a bridge yet is unknown unicast,
//! which every bridge walks all its ports for, at each retransmission too (a
//! quarter of the machine in a k=32 fat-tree's `up`). To a wired node whose
//! agent is not listening yet, the dial is refused by that namespace's kernel
//! and retried. Starting agents as their neighbourhood is wired, rather than
//! all after every node is, keeps their arrival at the hub at the pace of
//! wiring: 9,472 agents started within seconds overran its database pool.

use crate::plan::Plan;
use std::collections::HashMap;

pub struct StartGate<'p> {
    /// Per node being made: how many of itself and its peers being made are
    /// not wired yet.
    unwired: HashMap<&'p str, usize>,
    /// Per node being made: the nodes whose count its wiring lowers (itself
    /// and its link peers being made).
    waiting_on: HashMap<&'p str, Vec<&'p str>>,
}

impl<'p> StartGate<'p> {
    /// `made` names the nodes being made; peers outside it run already.
    pub fn new(plan: &'p Plan, made: &[&'p str]) -> StartGate<'p> {
        let mut waiting_on: HashMap<&str, Vec<&str>> =
            made.iter().map(|n| (*n, vec![*n])).collect();
        for link in &plan.links {
            let (a, b) = (link.dialer.as_str(), link.acceptor.as_str());
            if a == b || !waiting_on.contains_key(a) || !waiting_on.contains_key(b) {
                continue;
            }
            for (from, to) in [(a, b), (b, a)] {
                if let Some(list) = waiting_on.get_mut(from)
                    && !list.contains(&to)
                {
                    list.push(to);
                }
            }
        }
        let mut unwired: HashMap<&str, usize> = made.iter().map(|n| (*n, 0)).collect();
        for list in waiting_on.values() {
            for n in list {
                if let Some(count) = unwired.get_mut(n) {
                    *count += 1;
                }
            }
        }
        StartGate {
            unwired,
            waiting_on,
        }
    }

    /// Notes that `node` is wired; returns the nodes whose agents may start
    /// now (each exactly once over all calls).
    pub fn wired(&mut self, node: &str) -> Vec<&'p str> {
        let mut ready = Vec::new();
        for n in self.waiting_on.remove(node).unwrap_or_default() {
            if let Some(count) = self.unwired.get_mut(n) {
                *count -= 1;
                if *count == 0 {
                    ready.push(n);
                }
            }
        }
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::{line3, planned};

    #[test]
    fn an_agent_starts_once_it_and_every_peer_being_made_are_wired() {
        let plan = line3();
        let mut gate = StartGate::new(&plan, &["a", "b", "c"]);
        assert!(gate.wired("b").is_empty(), "b's peers are not wired");
        assert_eq!(gate.wired("a"), vec!["a"]);
        let mut last = gate.wired("c");
        last.sort_unstable();
        assert_eq!(last, vec!["b", "c"]);
        assert!(gate.wired("c").is_empty(), "nothing starts twice");
    }

    #[test]
    fn peers_already_running_do_not_hold_a_node_back() {
        let plan = line3();
        let mut gate = StartGate::new(&plan, &["c"]);
        assert_eq!(gate.wired("c"), vec!["c"]);
    }

    #[test]
    fn every_node_starts_whatever_the_wiring_order() {
        let plan = planned(
            "fattree.yaml",
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  generator: {fatTree: {k: 4}}\n",
        );
        let names: Vec<&str> = plan.nodes.iter().map(|n| n.name.as_str()).collect();
        let mut gate = StartGate::new(&plan, &names);
        let mut started: Vec<&str> = names.iter().rev().flat_map(|n| gate.wired(n)).collect();
        started.sort_unstable();
        let mut all = names.clone();
        all.sort_unstable();
        assert_eq!(started, all);
    }
}

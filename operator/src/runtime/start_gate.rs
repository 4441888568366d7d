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

/// Nodes are numbered by their place in the list being made.
pub struct StartGate {
    /// Per node: how many of itself and its peers being made are not wired yet.
    unwired: Vec<usize>,
    /// Per node: the nodes whose count its wiring lowers (itself and its link
    /// peers being made); emptied once it is wired.
    lowers: Vec<Vec<usize>>,
}

impl StartGate {
    /// `made` names the nodes being made; peers outside it run already.
    pub fn new(plan: &Plan, made: &[&str]) -> StartGate {
        let place: HashMap<&str, usize> = made.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let mut lowers: Vec<Vec<usize>> = (0..made.len()).map(|i| vec![i]).collect();
        for link in &plan.links {
            let (Some(&a), Some(&b)) = (
                place.get(link.dialer.as_str()),
                place.get(link.acceptor.as_str()),
            ) else {
                continue;
            };
            for (from, to) in [(a, b), (b, a)] {
                if !lowers[from].contains(&to) {
                    lowers[from].push(to);
                }
            }
        }
        let mut unwired = vec![0; made.len()];
        for to in lowers.iter().flatten() {
            unwired[*to] += 1;
        }
        StartGate { unwired, lowers }
    }

    /// Notes that node `wired` is; returns the nodes whose agents may start
    /// now (each exactly once over all calls).
    pub fn wired(&mut self, wired: usize) -> Vec<usize> {
        let lowered = self.lowers.get_mut(wired).map(std::mem::take);
        let mut ready = Vec::new();
        for n in lowered.unwrap_or_default() {
            self.unwired[n] -= 1;
            if self.unwired[n] == 0 {
                ready.push(n);
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
        let (a, b, c) = (0, 1, 2);
        let mut gate = StartGate::new(&plan, &["a", "b", "c"]);
        assert!(gate.wired(b).is_empty(), "b's peers are not wired");
        assert_eq!(gate.wired(a), vec![a]);
        let mut last = gate.wired(c);
        last.sort_unstable();
        assert_eq!(last, vec![b, c]);
        assert!(gate.wired(c).is_empty(), "nothing starts twice");
    }

    #[test]
    fn peers_already_running_do_not_hold_a_node_back() {
        let plan = line3();
        let mut gate = StartGate::new(&plan, &["c"]);
        assert_eq!(gate.wired(0), vec![0]);
    }

    #[test]
    fn every_node_starts_whatever_the_wiring_order() {
        let plan = planned(
            "fattree.yaml",
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  generator: {fatTree: {k: 4}}\n",
        );
        let names: Vec<&str> = plan.nodes.iter().map(|n| n.name.as_str()).collect();
        let mut gate = StartGate::new(&plan, &names);
        let mut started: Vec<usize> = (0..names.len()).rev().flat_map(|i| gate.wired(i)).collect();
        started.sort_unstable();
        assert_eq!(started, (0..names.len()).collect::<Vec<_>>());
    }
}

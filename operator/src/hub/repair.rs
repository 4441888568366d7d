//! What runs in place of a faulty row (`store::RowFault`): the last good state
//! the hub served for that one link direction, transport, node or flow, so a bad
//! row written behind the database's checks never stops the rest of the
//! topology, and never silently changes what the agents run.

use super::TopologyView;
use crate::plan::Plan;
use crate::store::{FaultyPart, RowFault, TopologyProblem};

/// Puts the last good state from `old` (a view of the same creation) into
/// `plan` for each fault, and says what runs instead.
pub fn put_back(
    plan: &mut Plan,
    faults: &[RowFault],
    old: Option<&TopologyView>,
) -> Vec<TopologyProblem> {
    let old = old.map(|o| &*o.plan);
    faults
        .iter()
        .map(|fault| TopologyProblem {
            subject: fault.subject.clone(),
            problem: fault.problem.clone(),
            consequence: put_back_one(plan, &fault.part, old),
        })
        .collect()
}

fn put_back_one(plan: &mut Plan, part: &FaultyPart, old: Option<&Plan>) -> String {
    match part {
        FaultyPart::LinkForward(name) | FaultyPart::LinkBackward(name) => {
            let forward = matches!(part, FaultyPart::LinkForward(_));
            let last = old.and_then(|o| o.link(name)).map(|l| {
                if forward {
                    l.forward.clone()
                } else {
                    l.backward.clone()
                }
            });
            let Some(link) = plan.links.iter_mut().find(|l| &l.name == name) else {
                return "is not run".into();
            };
            let link = std::sync::Arc::make_mut(link);
            match last {
                Some(params) => {
                    *if forward {
                        &mut link.forward
                    } else {
                        &mut link.backward
                    } = params;
                    "runs its last good parameters".into()
                }
                None => "runs unimpaired: this hub has served no good parameters for it".into(),
            }
        }
        FaultyPart::LinkTransport(name) => {
            let last = old.and_then(|o| o.link(name)).map(|l| l.transport);
            let Some(link) = plan.links.iter_mut().find(|l| &l.name == name) else {
                return "is not run".into();
            };
            let link = std::sync::Arc::make_mut(link);
            match last {
                Some(t) => {
                    link.transport = t;
                    "runs its last good transport".into()
                }
                None => "runs on tcp: this hub has served no good transport for it".into(),
            }
        }
        FaultyPart::NodeSocks(name) => {
            let last = old.and_then(|o| o.node(name)).map(|n| n.socks.clone());
            let Some(node) = plan.nodes_mut().iter_mut().find(|n| &n.name == name) else {
                return "is not run".into();
            };
            match last {
                Some(socks) => {
                    node.socks = socks;
                    "runs its last good SOCKS servers".into()
                }
                None => "runs no SOCKS server".into(),
            }
        }
        FaultyPart::Flow(name) => {
            match old.and_then(|o| o.flows.iter().find(|f| &f.name == name)) {
                Some(flow) => {
                    plan.flows.push(flow.clone());
                    plan.flows.sort_by(|a, b| a.name.cmp(&b.name));
                    "runs its last good definition".into()
                }
                None => "is not run".into(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::plan::fixtures::line3;

    fn fault(part: FaultyPart) -> RowFault {
        RowFault {
            part,
            subject: "links a-b params_forward".into(),
            problem: "params_forward.rate_bps: must be an integer or null, got \"abc\"".into(),
        }
    }

    #[test]
    fn a_faulty_direction_runs_what_it_ran_and_says_so() {
        let good = line3();
        let old = TopologyView::new(good.clone(), 3);
        let name = good.links[0].name.clone();
        let mut loaded = good.clone();
        loaded.link_mut(0).forward = Default::default();
        loaded.link_mut(0).backward.rate_bps = Some(7);
        let problems = put_back(
            &mut loaded,
            &[fault(FaultyPart::LinkForward(name.clone()))],
            Some(&old),
        );
        assert_eq!(loaded.links[0].forward, good.links[0].forward);
        assert_eq!(
            loaded.links[0].backward.rate_bps,
            Some(7),
            "the good direction keeps its change"
        );
        assert_eq!(problems[0].consequence, "runs its last good parameters");

        let mut fresh = good.clone();
        fresh.link_mut(0).forward = Default::default();
        let problems = put_back(&mut fresh, &[fault(FaultyPart::LinkForward(name))], None);
        assert_eq!(fresh.links[0].forward, Default::default());
        assert!(problems[0].consequence.starts_with("runs unimpaired"));
    }
}

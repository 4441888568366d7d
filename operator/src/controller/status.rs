//! Phase 5: the Topology's status. Conditions are computed by pure code from
//! what was observed and compared without timestamps, so an unchanged status
//! keeps its transition times and writes nothing new.

use super::validate::Invalid;
use crate::api::{Condition, ConditionStatus, TopologyStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// What the store and the API server say about a running topology.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub nodes_total: u32,
    /// Agents connected and running the current generation.
    pub nodes_ready: u32,
    pub links_total: u32,
    /// Links that forward: both ends connected and a probe across.
    pub links_up: u32,
    /// The others, each with why (`b-c: connected, but no probe has crossed
    /// it yet`).
    pub links_down: Vec<String>,
    /// Pods that cannot run, with the reason (`line3-b: ImagePullBackOff`).
    pub pod_problems: Vec<String>,
    /// Pods (or the operator) that run but failed recently: restarts, OOM
    /// kills. The topology forwards, but its nodes lost their state.
    pub pod_warnings: Vec<String>,
    /// Stored rows the hub cannot run as written (`links s-y params_forward:
    /// ...; runs its last good parameters`).
    pub row_problems: Vec<String>,
    /// Links whose traffic the emulator rather than the emulated link
    /// limited, now or within the last minute (`s-y (n0 → n1): why`), ongoing
    /// ones first: the fidelity guard's episodes.
    pub unfaithful: Vec<String>,
    /// Whether any of them is still going on.
    pub unfaithful_now: bool,
    /// Per member cluster, when nodes run outside the operator's own.
    pub clusters: Vec<crate::api::ClusterPlacementStatus>,
    /// The topology's pods in the operator's own cluster, and how many run.
    pub home_pods: (u32, u32),
}

impl Observed {
    /// The member clusters the operator could not reach, each with why.
    fn unreachable_clusters(&self) -> Vec<String> {
        self.clusters
            .iter()
            .filter(|c| !c.reachable)
            .map(|c| {
                format!(
                    "member cluster {} is unreachable ({} node(s) there; their pods are left as they were until it answers): {}",
                    c.cluster.as_deref().unwrap_or("(the operator's own)"),
                    c.nodes,
                    c.message.as_deref().unwrap_or("no answer")
                )
            })
            .collect()
    }
}

/// The outcome of planning, for the `Planned` condition.
pub enum Planning<'a> {
    Planned,
    Refused(&'a Invalid),
    /// The spec is valid, but making it so failed: the API server refused an
    /// object, or the store was unreachable. Retried; shown until it succeeds.
    Failed(&'a Failure),
}

/// Why applying a valid spec failed, in the words of whoever refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `ObjectRefused`, `Forbidden`, `ApiUnreachable`, `StoreUnavailable`, …
    pub reason: &'static str,
    pub message: String,
}

/// How long links may take to forward after every agent runs the spec
/// before the topology counts as Degraded.
pub const LINKS_GRACE: k8s_openapi::jiff::SignedDuration =
    k8s_openapi::jiff::SignedDuration::from_secs(30);

/// At most this many problems are named in one condition; the rest are
/// counted, so a status stays small however many pods fail.
const NAMED_PROBLEMS: usize = 10;

/// `problems` joined, the first [`NAMED_PROBLEMS`] by name.
pub fn summarize(problems: &[String]) -> String {
    let mut text = problems
        .iter()
        .take(NAMED_PROBLEMS)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > NAMED_PROBLEMS {
        text.push_str(&format!("; and {} more", problems.len() - NAMED_PROBLEMS));
    }
    text
}

/// The next status from the previous one: conditions whose status is unchanged
/// keep their transition time.
pub fn next(
    previous: Option<&TopologyStatus>,
    generation: Option<i64>,
    planning: Planning<'_>,
    observed: Option<&Observed>,
    now: Time,
) -> TopologyStatus {
    let previous_conditions = previous.map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    let mut wanted: Vec<(String, ConditionStatus, String, String)> = Vec::new();
    let mut push = |t: &str, s: ConditionStatus, r: &str, m: String| {
        wanted.push((t.to_string(), s, r.to_string(), m));
    };
    match &planning {
        Planning::Planned => push(
            "Planned",
            ConditionStatus::True,
            "Planned",
            "the spec is valid and stored".into(),
        ),
        Planning::Failed(_) => push(
            "Planned",
            ConditionStatus::True,
            "Valid",
            "the spec is valid; applying it failed (see the Ready condition)".into(),
        ),
        Planning::Refused(invalid) => push(
            "Planned",
            ConditionStatus::False,
            invalid.reason,
            invalid.message.clone(),
        ),
    }
    let o = observed.cloned().unwrap_or_default();
    let nodes_ok = observed.is_some() && o.nodes_ready == o.nodes_total;
    let links_ok = observed.is_some() && o.links_up == o.links_total;
    if observed.is_some() {
        push(
            "NodesReady",
            bool_status(nodes_ok),
            if nodes_ok {
                "AgentsReady"
            } else {
                "AgentsStarting"
            },
            format!(
                "{}/{} agents connected and running the current generation",
                o.nodes_ready, o.nodes_total
            ),
        );
        push(
            "LinksReady",
            bool_status(links_ok),
            if links_ok {
                "LinksUp"
            } else {
                "LinksConnecting"
            },
            if links_ok {
                format!("{}/{} links forward", o.links_up, o.links_total)
            } else {
                format!(
                    "{}/{} links forward; {}",
                    o.links_up,
                    o.links_total,
                    summarize(&o.links_down)
                )
            },
        );
        // Agents that have run the current spec for a while, with links that
        // still do not forward: something between them is broken (an
        // underlay that cannot connect, a peer that refuses the link).
        let agents_ready_since = previous_conditions
            .iter()
            .find(|c| c.type_ == "NodesReady" && c.status == ConditionStatus::True)
            .map(|c| c.last_transition_time.0);
        let links_stuck = nodes_ok
            && !links_ok
            && agents_ready_since.is_some_and(|since| now.0.duration_since(since) >= LINKS_GRACE);
        let unreachable = o.unreachable_clusters();
        if !unreachable.is_empty() {
            push(
                "Degraded",
                ConditionStatus::True,
                "MemberClusterUnreachable",
                summarize(&unreachable),
            );
        } else if !o.pod_problems.is_empty() {
            let all: Vec<String> = o
                .pod_problems
                .iter()
                .chain(&o.pod_warnings)
                .cloned()
                .collect();
            push(
                "Degraded",
                ConditionStatus::True,
                "PodsFailing",
                summarize(&all),
            );
        } else if links_stuck {
            push(
                "Degraded",
                ConditionStatus::True,
                "LinksNotForwarding",
                format!(
                    "{} of {} links do not forward {} s after every agent ran the spec: {}",
                    o.links_down.len(),
                    o.links_total,
                    LINKS_GRACE.as_secs(),
                    summarize(&o.links_down)
                ),
            );
        } else if !o.pod_warnings.is_empty() {
            push(
                "Degraded",
                ConditionStatus::True,
                "PodsRestarted",
                summarize(&o.pod_warnings),
            );
        } else {
            push(
                "Degraded",
                ConditionStatus::False,
                "PodsHealthy",
                "no pod is failing".into(),
            );
        }
        if o.unfaithful.is_empty() {
            push(
                "Faithful",
                ConditionStatus::True,
                "Faithful",
                "no agent saw the emulator limit a link's traffic in the last minute".into(),
            );
        } else {
            push(
                "Faithful",
                ConditionStatus::False,
                if o.unfaithful_now {
                    "EmulatorLimited"
                } else {
                    "EmulatorLimitedRecently"
                },
                format!(
                    "the emulator, not the emulated network, limited {} link direction(s){}; results measured then may be wrong: {}",
                    o.unfaithful.len(),
                    if o.unfaithful_now {
                        ""
                    } else {
                        " in the last minute"
                    },
                    summarize(&o.unfaithful)
                ),
            );
        }
        if o.row_problems.is_empty() {
            push(
                "RowsValid",
                ConditionStatus::True,
                "RowsValid",
                "every stored row runs as written".into(),
            );
        } else {
            push(
                "RowsValid",
                ConditionStatus::False,
                "RowsFaulty",
                format!(
                    "{} stored row(s) cannot run as written: {}",
                    o.row_problems.len(),
                    summarize(&o.row_problems)
                ),
            );
        }
    }
    match (&planning, nodes_ok && links_ok) {
        (Planning::Refused(invalid), _) => push(
            "Ready",
            ConditionStatus::False,
            invalid.reason,
            "the last change was refused (see the Planned condition); what ran before runs on"
                .into(),
        ),
        (Planning::Failed(failure), _) => push(
            "Ready",
            ConditionStatus::False,
            failure.reason,
            failure.message.clone(),
        ),
        (Planning::Planned, true) => push(
            "Ready",
            ConditionStatus::True,
            "Ready",
            "every agent runs the current spec and every link is up".into(),
        ),
        // A pod that cannot run is why the topology is not ready, whatever
        // the counts say.
        (Planning::Planned, false) if !o.pod_problems.is_empty() => push(
            "Ready",
            ConditionStatus::False,
            "PodsFailing",
            summarize(&o.pod_problems),
        ),
        (Planning::Planned, false) => push(
            "Ready",
            ConditionStatus::False,
            "Starting",
            format!(
                "{}/{} agents ready, {}/{} links forward{}",
                o.nodes_ready,
                o.nodes_total,
                o.links_up,
                o.links_total,
                if o.links_down.is_empty() {
                    String::new()
                } else {
                    format!("; {}", summarize(&o.links_down))
                }
            ),
        ),
    }
    // Conditions not looked at this time (nothing was observed) keep what
    // they said last.
    let kept = previous_conditions
        .iter()
        .filter(|c| !wanted.iter().any(|(t, ..)| *t == c.type_))
        .cloned()
        .collect::<Vec<_>>();
    let conditions = wanted
        .into_iter()
        .map(|(type_, status, reason, message)| {
            let kept_time = previous_conditions
                .iter()
                .find(|c| c.type_ == type_ && c.status == status)
                .map(|c| c.last_transition_time.clone());
            Condition {
                type_,
                status,
                reason,
                message,
                last_transition_time: kept_time.unwrap_or_else(|| now.clone()),
                observed_generation: generation,
            }
        })
        .chain(kept)
        .collect();
    let (nodes_ready, nodes_total, links_up, links_total) = match observed {
        Some(o) => (o.nodes_ready, o.nodes_total, o.links_up, o.links_total),
        // A refused change: the counts of what runs are kept.
        None => previous
            .map(|p| (p.nodes_ready, p.nodes_total, p.links_up, p.links_total))
            .unwrap_or_default(),
    };
    // Also what tells a later reconcile (and the cleanup) which member
    // clusters may still hold the topology's pods.
    let clusters = match observed {
        Some(o) => o.clusters.clone(),
        None => previous.map(|p| p.clusters.clone()).unwrap_or_default(),
    };
    TopologyStatus {
        observed_generation: generation,
        conditions,
        nodes_ready,
        nodes_total,
        links_up,
        links_total,
        clusters,
    }
}

fn bool_status(b: bool) -> ConditionStatus {
    if b {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    }
}

/// Whether two statuses differ in anything but transition times.
pub fn same_ignoring_time(a: &TopologyStatus, b: &TopologyStatus) -> bool {
    let strip = |s: &TopologyStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}

/// The status of a condition type, if set.
pub fn condition<'a>(status: Option<&'a TopologyStatus>, type_: &str) -> Option<&'a Condition> {
    status?.conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("valid time"))
    }

    fn observed(ready: u32, up: u32) -> Observed {
        Observed {
            nodes_total: 3,
            nodes_ready: ready,
            links_total: 2,
            links_up: up,
            links_down: (up..2)
                .map(|i| format!("l{i}: connected, but no probe has crossed it yet"))
                .collect(),
            pod_problems: vec![],
            pod_warnings: vec![],
            row_problems: vec![],
            ..Observed::default()
        }
    }

    fn get<'a>(s: &'a TopologyStatus, t: &str) -> &'a Condition {
        condition(Some(s), t).expect("condition present")
    }

    #[test]
    fn an_unreachable_member_cluster_degrades_the_topology_by_name() {
        let mut o = observed(3, 2);
        o.clusters = vec![
            crate::api::ClusterPlacementStatus {
                nodes: 2,
                reachable: true,
                ..Default::default()
            },
            crate::api::ClusterPlacementStatus {
                cluster: Some("eu-west".into()),
                nodes: 1,
                reachable: false,
                message: Some("API server https://10.0.0.9:7443: connection refused".into()),
                ..Default::default()
            },
        ];
        let s = next(None, Some(1), Planning::Planned, Some(&o), at(0));
        let d = get(&s, "Degraded");
        assert_eq!(
            (d.status, d.reason.as_str()),
            (ConditionStatus::True, "MemberClusterUnreachable")
        );
        assert!(
            d.message
                .contains("member cluster eu-west is unreachable (1 node(s) there")
                && d.message.contains("connection refused"),
            "{}",
            d.message
        );
        // The nodes elsewhere still forward: Ready goes by the agents and links.
        assert_eq!(get(&s, "Ready").status, ConditionStatus::True);
        assert_eq!(
            s.clusters, o.clusters,
            "the status remembers where pods are"
        );
        // Back: no longer degraded.
        o.clusters[1].reachable = true;
        o.clusters[1].message = None;
        let back = next(Some(&s), Some(1), Planning::Planned, Some(&o), at(10));
        assert_eq!(get(&back, "Degraded").status, ConditionStatus::False);
    }

    #[test]
    fn ready_needs_every_agent_and_link() {
        let s = next(
            None,
            Some(1),
            Planning::Planned,
            Some(&observed(3, 1)),
            at(10),
        );
        assert_eq!(get(&s, "Ready").status, ConditionStatus::False);
        assert_eq!(
            get(&s, "LinksReady").message,
            "1/2 links forward; l1: connected, but no probe has crossed it yet"
        );
        let s = next(
            Some(&s),
            Some(1),
            Planning::Planned,
            Some(&observed(3, 2)),
            at(20),
        );
        assert_eq!(get(&s, "Ready").status, ConditionStatus::True);
        assert_eq!((s.nodes_ready, s.links_up), (3, 2));
        assert_eq!(s.observed_generation, Some(1));
    }

    #[test]
    fn transition_times_move_only_when_the_status_does() {
        let first = next(
            None,
            Some(1),
            Planning::Planned,
            Some(&observed(3, 2)),
            at(10),
        );
        let again = next(
            Some(&first),
            Some(1),
            Planning::Planned,
            Some(&observed(3, 2)),
            at(99),
        );
        assert_eq!(get(&again, "Ready").last_transition_time, at(10));
        assert!(same_ignoring_time(&first, &again));
        let down = next(
            Some(&again),
            Some(1),
            Planning::Planned,
            Some(&observed(2, 2)),
            at(120),
        );
        assert_eq!(get(&down, "Ready").last_transition_time, at(120));
        assert_eq!(get(&down, "Planned").last_transition_time, at(10));
        assert!(!same_ignoring_time(&again, &down));
    }

    #[test]
    fn a_refused_change_says_why_and_keeps_the_counts() {
        let running = next(
            None,
            Some(1),
            Planning::Planned,
            Some(&observed(3, 2)),
            at(10),
        );
        let invalid = Invalid {
            reason: "InvalidSpec",
            message: "link/a-z spec.endpoints[1]: unknown node z".into(),
        };
        let s = next(
            Some(&running),
            Some(2),
            Planning::Refused(&invalid),
            None,
            at(20),
        );
        let planned = get(&s, "Planned");
        assert_eq!(
            (planned.status, planned.reason.as_str()),
            (ConditionStatus::False, "InvalidSpec")
        );
        assert!(planned.message.contains("spec.endpoints[1]"));
        assert_eq!(get(&s, "Ready").status, ConditionStatus::False);
        assert_eq!((s.nodes_ready, s.links_up), (3, 2));
    }

    #[test]
    fn faulty_rows_are_named_on_the_topology() {
        let mut o = observed(3, 2);
        o.row_problems = vec![
            "links s-y params_forward: params_forward.rate_bps: must be an integer or null, got \"abc\"; runs its last good parameters".into(),
        ];
        let s = next(None, Some(2), Planning::Planned, Some(&o), at(1));
        let c = get(&s, "RowsValid");
        assert_eq!(c.status, ConditionStatus::False);
        assert_eq!(c.reason, "RowsFaulty");
        assert!(
            c.message.contains("links s-y params_forward"),
            "{}",
            c.message
        );
        let s = next(
            None,
            Some(2),
            Planning::Planned,
            Some(&observed(3, 2)),
            at(1),
        );
        assert_eq!(get(&s, "RowsValid").status, ConditionStatus::True);
    }

    #[test]
    fn failing_pods_mark_the_topology_degraded_and_not_ready() {
        let mut o = observed(2, 2);
        o.pod_problems = vec!["line3-b: CrashLoopBackOff".into()];
        let s = next(None, Some(1), Planning::Planned, Some(&o), at(10));
        let d = get(&s, "Degraded");
        assert_eq!(d.status, ConditionStatus::True);
        assert!(d.message.contains("line3-b"));
        let r = get(&s, "Ready");
        assert_eq!(
            (r.status, r.reason.as_str()),
            (ConditionStatus::False, "PodsFailing")
        );
        assert!(r.message.contains("CrashLoopBackOff"), "{}", r.message);
        // A pod that restarted but runs again degrades, but does not block.
        let mut o = observed(3, 2);
        o.pod_warnings = vec![
            "line3-b container agent: restarted 1 time(s), last exit 137 (OOMKilled) 3 s ago"
                .into(),
        ];
        let s = next(None, Some(1), Planning::Planned, Some(&o), at(10));
        let d = get(&s, "Degraded");
        assert_eq!(
            (d.status, d.reason.as_str()),
            (ConditionStatus::True, "PodsRestarted")
        );
        assert!(d.message.contains("OOMKilled"));
        assert_eq!(get(&s, "Ready").status, ConditionStatus::True);
    }

    #[test]
    fn a_failed_apply_shows_the_apis_words_and_keeps_the_rest() {
        let running = next(
            None,
            Some(1),
            Planning::Planned,
            Some(&observed(3, 2)),
            at(10),
        );
        let failure = Failure {
            reason: "ObjectRefused",
            message: "Secret \"nm-ring-credentials\" is invalid: data: Too long".into(),
        };
        let s = next(
            Some(&running),
            Some(2),
            Planning::Failed(&failure),
            None,
            at(20),
        );
        let ready = get(&s, "Ready");
        assert_eq!(
            (ready.status, ready.reason.as_str()),
            (ConditionStatus::False, "ObjectRefused")
        );
        assert!(ready.message.contains("Too long"));
        assert_eq!(get(&s, "Planned").status, ConditionStatus::True);
        // What was observed before still shows, with its counts.
        assert_eq!(get(&s, "LinksReady").message, "2/2 links forward");
        assert_eq!((s.nodes_ready, s.links_up), (3, 2));
        let again = next(Some(&s), Some(2), Planning::Failed(&failure), None, at(30));
        assert!(
            same_ignoring_time(&s, &again),
            "a repeated failure writes nothing"
        );
    }

    #[test]
    fn links_that_never_forward_degrade_the_topology_naming_them() {
        let starting = next(
            None,
            Some(1),
            Planning::Planned,
            Some(&observed(3, 1)),
            at(10),
        );
        assert_eq!(
            get(&starting, "Degraded").status,
            ConditionStatus::False,
            "links get time"
        );
        assert!(
            get(&starting, "Ready")
                .message
                .contains("l1: connected, but no probe")
        );
        let later = next(
            Some(&starting),
            Some(1),
            Planning::Planned,
            Some(&observed(3, 1)),
            at(39),
        );
        assert_eq!(
            get(&later, "Degraded").status,
            ConditionStatus::False,
            "29 s in"
        );
        let stuck = next(
            Some(&later),
            Some(1),
            Planning::Planned,
            Some(&observed(3, 1)),
            at(40),
        );
        let d = get(&stuck, "Degraded");
        assert_eq!(
            (d.status, d.reason.as_str()),
            (ConditionStatus::True, "LinksNotForwarding")
        );
        assert!(
            d.message.contains("1 of 2 links do not forward 30 s after"),
            "{}",
            d.message
        );
        assert!(
            d.message.contains("l1: connected, but no probe"),
            "{}",
            d.message
        );
        let fixed = next(
            Some(&stuck),
            Some(1),
            Planning::Planned,
            Some(&observed(3, 2)),
            at(50),
        );
        assert_eq!(get(&fixed, "Degraded").status, ConditionStatus::False);
        assert_eq!(get(&fixed, "Ready").status, ConditionStatus::True);
    }

    #[test]
    fn many_problems_are_counted_not_listed() {
        let problems: Vec<String> = (0..10_000)
            .map(|i| format!("ring-worker-{i}: OOMKilled"))
            .collect();
        let text = summarize(&problems);
        assert!(text.len() < 1_000, "{} bytes", text.len());
        assert!(text.starts_with("ring-worker-0: OOMKilled; "));
        assert!(text.ends_with("; and 9990 more"), "{text}");
        assert_eq!(
            summarize(&problems[..2]),
            "ring-worker-0: OOMKilled; ring-worker-1: OOMKilled"
        );
    }

    #[test]
    fn the_emulator_limiting_a_link_makes_the_topology_unfaithful_naming_it() {
        let calm = next(
            None,
            Some(1),
            Planning::Planned,
            Some(&observed(3, 2)),
            at(0),
        );
        let f = get(&calm, "Faithful");
        assert_eq!(f.status, ConditionStatus::True);
        let mut o = observed(3, 2);
        o.unfaithful =
            vec!["a-b (a → b): 900 of 2000 packets (45%) left more than 1 ms late".into()];
        o.unfaithful_now = true;
        let limited = next(Some(&calm), Some(1), Planning::Planned, Some(&o), at(10));
        let f = get(&limited, "Faithful");
        assert_eq!(f.status, ConditionStatus::False);
        assert_eq!(f.reason, "EmulatorLimited");
        assert!(
            f.message.contains("a-b (a → b): 900 of 2000"),
            "{}",
            f.message
        );
        // Faithfulness is not readiness: the topology still forwards.
        assert_eq!(get(&limited, "Ready").status, ConditionStatus::True);
        o.unfaithful_now = false;
        let after = next(Some(&limited), Some(1), Planning::Planned, Some(&o), at(20));
        assert_eq!(get(&after, "Faithful").reason, "EmulatorLimitedRecently");
    }
}

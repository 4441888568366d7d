//! Pure: why a topology's pod, or the operator itself, is unhealthy, from the
//! status the kubelet reports. Two kinds: a pod that cannot run at all (the
//! topology is not Ready), and one that ran into trouble recently but runs
//! again (a restart, an OOM kill: the topology is Degraded, its nodes lost
//! their state, but it forwards).

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

/// A restart or OOM kill this recent still shows on the topology.
pub const RECENT: SignedDuration = SignedDuration::from_secs(300);
/// How much of the kubelet's own message a problem quotes.
const QUOTED: usize = 200;

/// Waiting reasons after which a container does not start by itself.
const STUCK: &[&str] = &[
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "InvalidImageName",
];

/// What is wrong with one pod.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PodHealth {
    /// The pod cannot run: the topology is not Ready while this lasts.
    pub blocking: Vec<String>,
    /// The pod runs, but failed recently.
    pub recent: Vec<String>,
}

fn quoted(message: Option<&String>) -> String {
    match message.map(|m| m.trim()).filter(|m| !m.is_empty()) {
        Some(m) => format!(": {}", m.chars().take(QUOTED).collect::<String>()),
        None => String::new(),
    }
}

fn ago(then: Timestamp, now: Timestamp) -> String {
    format!("{} s ago", now.duration_since(then).as_secs().max(0))
}

/// The pod's problems at `now`.
pub fn of_pod(pod: &Pod, now: Timestamp) -> PodHealth {
    let mut health = PodHealth::default();
    let name = pod.name_any();
    let Some(status) = pod.status.as_ref() else {
        return health;
    };
    if status.phase.as_deref() == Some("Failed") {
        health.blocking.push(format!(
            "{name}: failed{}",
            quoted(status.message.as_ref().or(status.reason.as_ref()))
        ));
        return health;
    }
    if let Some(c) = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    }) {
        health.blocking.push(format!(
            "{name}: unschedulable{}",
            quoted(c.message.as_ref())
        ));
    }
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for c in containers {
        container_problems(&name, c, now, &mut health);
    }
    health
}

fn container_problems(pod: &str, c: &ContainerStatus, now: Timestamp, health: &mut PodHealth) {
    let who = format!("{pod} container {}", c.name);
    let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let last_exit = last.map(|t| {
        format!(
            "last exit {} ({}){}",
            t.exit_code,
            t.reason.as_deref().unwrap_or("no reason given"),
            t.finished_at
                .as_ref()
                .map(|at| format!(" {}", ago(at.0, now)))
                .unwrap_or_default()
        )
    });
    if let Some(w) = waiting
        && let Some(reason) = w.reason.as_deref()
        && STUCK.contains(&reason)
    {
        let mut problem = format!("{who}: {reason}{}", quoted(w.message.as_ref()));
        if let Some(exit) = &last_exit {
            problem.push_str(&format!(" ({exit})"));
        }
        health.blocking.push(problem);
        return;
    }
    let recent = last
        .and_then(|t| t.finished_at.as_ref())
        .is_some_and(|at| now.duration_since(at.0) <= RECENT);
    if c.restart_count > 0 && recent {
        let oom = last.and_then(|t| t.reason.as_deref()) == Some("OOMKilled");
        let problem = format!(
            "{who}: restarted {} time(s), {}{}",
            c.restart_count,
            last_exit.unwrap_or_default(),
            if oom {
                "; it needs a higher memory limit"
            } else {
                ""
            }
        );
        if c.ready {
            health.recent.push(problem);
        } else {
            health.blocking.push(problem);
        }
    }
}

/// The operator's own restarts, read from its pod when it starts: a recent
/// one (an OOM kill, a crash) shows on every topology it runs, with what to
/// change when memory was the cause.
pub fn operator_restarts(pod: &Pod, now: Timestamp) -> Option<String> {
    let status = pod.status.as_ref()?;
    let c = status.container_statuses.iter().flatten().next()?;
    let last = c.last_state.as_ref()?.terminated.as_ref()?;
    let at = last.finished_at.as_ref()?;
    if c.restart_count == 0 || now.duration_since(at.0) > RECENT {
        return None;
    }
    let limit = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
        .map(|q| q.0.clone());
    let hint = match (last.reason.as_deref(), limit) {
        (Some("OOMKilled"), Some(limit)) => format!(
            "; its memory limit {limit} is too low for the topologies it runs: raise the chart's operator.resources.limits.memory"
        ),
        (Some("OOMKilled"), None) => "; the node ran out of memory".to_string(),
        _ => String::new(),
    };
    Some(format!(
        "operator {}: restarted {} time(s), last exit {} ({}) {}{hint}",
        pod.name_any(),
        c.restart_count,
        last.exit_code,
        last.reason.as_deref().unwrap_or("no reason given"),
        ago(at.0, now),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("a pod")
    }

    fn now() -> Timestamp {
        "2026-11-25T10:00:00Z".parse().expect("time")
    }

    fn restarted(reason: &str, finished: &str, ready: bool) -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "ring-worker-3"},
            "spec": {"containers": [{"name": "worker", "resources": {"limits": {"memory": "512Mi"}}}]},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "worker", "ready": ready, "restartCount": 2, "image": "x", "imageID": "",
                "state": {"running": {}},
                "lastState": {"terminated": {"exitCode": 137, "reason": reason, "finishedAt": finished}}
            }]}
        }))
    }

    #[test]
    fn a_pull_failure_blocks_with_the_kubelets_words() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "bad-worker-0"},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": "worker", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
                "state": {"waiting": {"reason": "ErrImagePull", "message": "failed to pull \"nextmini/none:0\": not found"}}
            }]}
        }));
        let h = of_pod(&p, now());
        assert_eq!(
            h.blocking,
            [
                "bad-worker-0 container worker: ErrImagePull: failed to pull \"nextmini/none:0\": not found"
            ]
        );
        assert!(h.recent.is_empty());
    }

    #[test]
    fn a_recent_oom_kill_is_named_and_old_ones_are_forgotten() {
        let h = of_pod(&restarted("OOMKilled", "2026-11-25T09:59:30Z", true), now());
        assert!(h.blocking.is_empty());
        assert_eq!(
            h.recent,
            [
                "ring-worker-3 container worker: restarted 2 time(s), last exit 137 (OOMKilled) 30 s ago; it needs a higher memory limit"
            ]
        );
        let h = of_pod(&restarted("OOMKilled", "2026-11-25T09:00:00Z", true), now());
        assert_eq!(h, PodHealth::default(), "an hour ago is history");
        // Not ready again yet: the topology is not Ready either.
        let h = of_pod(&restarted("Error", "2026-11-25T09:59:58Z", false), now());
        assert_eq!(h.blocking.len(), 1, "{h:?}");
        assert!(h.blocking[0].contains("last exit 137 (Error) 2 s ago"));
    }

    #[test]
    fn unschedulable_and_failed_pods_block() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "big-worker-0"},
            "status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient memory."
            }]}
        }));
        assert_eq!(
            of_pod(&p, now()).blocking,
            ["big-worker-0: unschedulable: 0/1 nodes are available: 1 Insufficient memory."]
        );
        let p = pod(serde_json::json!({
            "metadata": {"name": "x"},
            "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
        }));
        assert_eq!(
            of_pod(&p, now()).blocking,
            ["x: failed: The node was low on resource: memory."]
        );
    }

    #[test]
    fn the_operators_oom_kills_say_what_to_raise() {
        let mut p = restarted("OOMKilled", "2026-11-25T09:58:00Z", true);
        p.metadata.name = Some("nm-operator-5d9".into());
        let text = operator_restarts(&p, now()).expect("a recent restart");
        assert_eq!(
            text,
            "operator nm-operator-5d9: restarted 2 time(s), last exit 137 (OOMKilled) 120 s ago; its memory limit 512Mi is too low for the topologies it runs: raise the chart's operator.resources.limits.memory"
        );
        let old = restarted("OOMKilled", "2026-11-25T08:00:00Z", true);
        assert_eq!(operator_restarts(&old, now()), None);
    }
}

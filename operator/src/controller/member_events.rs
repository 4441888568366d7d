//! Warnings about the topology's pods in a member cluster (the member's
//! scheduler cannot place one, its kubelet cannot pull the image, ...),
//! repeated as events of the Topology in the operator's cluster, naming the
//! member and the pod: `kubectl describe topology` and `kubectl get events`
//! at home show what goes wrong everywhere, without a kubeconfig per member.
//!
//! What was already repeated is remembered per topology and member by each
//! event's UID and how often it had happened, so an event repeats once per
//! occurrence the member records, and the memory holds only events the
//! member still keeps.

use super::Context;
use super::apply::Target;
use crate::api::Topology;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::events::EventType;
use std::collections::{BTreeMap, HashMap};

/// Warnings older than this when the operator first looks at a member are
/// history, not news (an operator restart does not repeat them all).
const LOOKBACK: SignedDuration = SignedDuration::from_mins(5);
/// At most this many events per member and reconcile: a member in trouble
/// says the same thing about every pod.
const MAX_PER_SYNC: usize = 10;

/// What was repeated, per (topology key, member): event UID → occurrence.
pub type Repeated = super::remote::PerMember<HashMap<String, String>>;

/// One event to publish on the Topology.
#[derive(Debug, PartialEq, Eq)]
pub struct Mirror {
    pub reason: String,
    pub note: String,
}

/// Lists the member's warnings about `pods` (name → UID) in `namespace` and
/// publishes the new ones on the topology. A member that refuses the list
/// (its kubeconfig may not read events) costs a log line, nothing else.
pub(super) async fn mirror(
    ctx: &Context,
    topology: &Topology,
    key: &str,
    member: &Target,
    pods: &BTreeMap<String, String>,
) {
    let cluster = member.cluster.as_deref().unwrap_or_default();
    let namespace = member.namespace.as_str();
    let listed = Api::<Event>::namespaced(member.client.clone(), namespace)
        .list(&ListParams::default().fields("involvedObject.kind=Pod,type=Warning"))
        .await;
    let events = match listed {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(topology = %key, %cluster, error = %e, "reading a member cluster's events failed");
            return;
        }
    };
    let slot = (key.to_owned(), cluster.to_owned());
    let mirrors = ctx.member_events.update(slot, |before| {
        let (mirrors, now_seen) = news(
            &events,
            pods,
            before.as_ref(),
            Timestamp::now(),
            (cluster, namespace),
        );
        (now_seen, mirrors)
    });
    for m in mirrors.unwrap_or_default() {
        super::apply::publish(ctx, topology, EventType::Warning, &m.reason, &m.note).await;
    }
}

/// The warnings about `pods` not yet repeated (newest first, at most
/// [`MAX_PER_SYNC`]), and what is repeated after them. With no memory of
/// this member yet, only warnings of the last [`LOOKBACK`] count as new.
pub fn news(
    events: &[Event],
    pods: &BTreeMap<String, String>,
    before: Option<&HashMap<String, String>>,
    now: Timestamp,
    (cluster, namespace): (&str, &str),
) -> (Vec<Mirror>, HashMap<String, String>) {
    let ours: Vec<(&Event, Timestamp)> = events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| {
            let o = &e.involved_object;
            o.kind.as_deref() == Some("Pod")
                && o.name
                    .as_ref()
                    .and_then(|n| pods.get(n))
                    .is_some_and(|uid| o.uid.is_none() || o.uid.as_ref() == Some(uid))
        })
        .filter_map(|e| Some((e, last_seen(e)?)))
        .collect();
    let seen: HashMap<String, String> = ours
        .iter()
        .filter_map(|(e, when)| Some((e.metadata.uid.clone()?, occurrence(e, *when))))
        .collect();
    let mut fresh: Vec<(&Event, Timestamp)> = ours
        .into_iter()
        .filter(|(e, when)| {
            let Some(uid) = &e.metadata.uid else {
                return false;
            };
            match before {
                Some(b) => b.get(uid) != Some(&occurrence(e, *when)),
                None => now.duration_since(*when) <= LOOKBACK,
            }
        })
        .collect();
    fresh.sort_by_key(|(_, when)| std::cmp::Reverse(*when));
    let more = fresh.len().saturating_sub(MAX_PER_SYNC);
    let mut mirrors: Vec<Mirror> = fresh
        .into_iter()
        .take(MAX_PER_SYNC)
        .map(|(e, _)| {
            let pod = e.involved_object.name.as_deref().unwrap_or_default();
            let count = e
                .series
                .as_ref()
                .map(|s| s.count.unwrap_or(1))
                .or(e.count)
                .unwrap_or(1);
            let times = if count > 1 {
                format!(" ({count} times)")
            } else {
                String::new()
            };
            Mirror {
                reason: e.reason.clone().unwrap_or_else(|| "MemberWarning".into()),
                note: format!(
                    "member cluster {cluster}, pod {namespace}/{pod}: {}{times}",
                    e.message.as_deref().unwrap_or("(no message)")
                ),
            }
        })
        .collect();
    if more > 0
        && let Some(last) = mirrors.last_mut()
    {
        last.note.push_str(&format!(
            "; and {more} more warnings there (kubectl get events -n {namespace} in that cluster)"
        ));
    }
    (mirrors, seen)
}

/// When the member last saw it happen: the series' last observation for
/// events.k8s.io events, else the legacy last timestamp, else when made.
fn last_seen(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Changes when the member records the event again.
fn occurrence(e: &Event, when: Timestamp) -> String {
    let count = e.series.as_ref().and_then(|s| s.count).or(e.count);
    format!("{}@{when}", count.unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(uid: &str, pod: &str, pod_uid: &str, count: i32, at: &str) -> Event {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{pod}.{uid}"), "uid": uid},
            "involvedObject": {"kind": "Pod", "name": pod, "uid": pod_uid},
            "type": "Warning",
            "reason": "FailedScheduling",
            "message": "0/0 nodes are available",
            "count": count,
            "lastTimestamp": at,
        }))
        .expect("an event")
    }

    fn pods() -> BTreeMap<String, String> {
        BTreeMap::from([("span-c".into(), "u-c".into())])
    }

    const WHERE: (&str, &str) = ("eu", "far");

    fn now() -> Timestamp {
        "2026-11-29T01:00:00Z".parse().expect("a time")
    }

    #[test]
    fn a_warning_is_repeated_once_per_occurrence_naming_cluster_and_pod() {
        let first = [event("e1", "span-c", "u-c", 1, "2026-11-29T00:59:00Z")];
        let (m, seen) = news(&first, &pods(), None, now(), WHERE);
        assert_eq!(
            m,
            vec![Mirror {
                reason: "FailedScheduling".into(),
                note: "member cluster eu, pod far/span-c: 0/0 nodes are available".into()
            }]
        );
        let (again, seen) = news(&first, &pods(), Some(&seen), now(), WHERE);
        assert!(again.is_empty(), "{again:?}");
        let recurred = [event("e1", "span-c", "u-c", 2, "2026-11-29T00:59:30Z")];
        let (m, _) = news(&recurred, &pods(), Some(&seen), now(), WHERE);
        assert_eq!(m.len(), 1);
        assert!(m[0].note.ends_with("(2 times)"), "{m:?}");
    }

    #[test]
    fn other_pods_and_old_news_are_not_repeated() {
        let events = [
            event("e1", "someone-else", "u-x", 1, "2026-11-29T00:59:00Z"),
            // An earlier pod of the same name.
            event("e2", "span-c", "u-old", 1, "2026-11-29T00:59:00Z"),
            // Before the operator first looked, beyond the lookback.
            event("e3", "span-c", "u-c", 1, "2026-11-29T00:50:00Z"),
        ];
        let (m, seen) = news(&events, &pods(), None, now(), WHERE);
        assert!(m.is_empty(), "{m:?}");
        assert_eq!(seen.len(), 1, "only span-c's own event is remembered");
    }

    #[test]
    fn a_flood_is_cut_with_a_count_of_the_rest() {
        let events: Vec<Event> = (0..15)
            .map(|i| event(&format!("e{i}"), "span-c", "u-c", 1, "2026-11-29T00:59:00Z"))
            .collect();
        let (m, seen) = news(&events, &pods(), None, now(), WHERE);
        assert_eq!(m.len(), MAX_PER_SYNC);
        assert!(m[MAX_PER_SYNC - 1].note.contains("and 5 more warnings"));
        assert_eq!(seen.len(), 15, "the cut ones are not repeated later either");
    }
}

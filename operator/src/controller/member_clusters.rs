//! MemberClusters: the operator reaches each one's API server with the kubeconfig
//! its Secret holds and writes what it found: `Reachable` (with the reason when
//! not), the round trip to the API server and the server's version.
//!
//! The round trip feeds link delays between clusters (`plan::sites`), so it is
//! written only when it moved by more than `RTT_HYSTERESIS`: a figure that
//! changed at every probe would change every cross-cluster link's parameters
//! with it.

use super::MANAGER;
use crate::api::{API_VERSION, Condition, ConditionStatus, MemberCluster, MemberClusterStatus};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const REACHABLE: &str = "Reachable";

/// How often a reachable cluster is probed again, and an unreachable one: a
/// member that goes away shows within this, and a probe costs five handshakes
/// and one small request.
const RECHECK: Duration = Duration::from_secs(15);
const RETRY: Duration = Duration::from_secs(5);
/// TCP handshakes per probe; the smallest is the round trip (the others carry
/// scheduling and queueing delay).
const HANDSHAKES: usize = 5;
/// A probe's every step gives up after this.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// A new round trip replaces the written one only when it differs by more than
/// this fraction of it, or by more than `RTT_FLOOR`, whichever is larger.
const RTT_HYSTERESIS: f64 = 0.1;
const RTT_FLOOR: Duration = Duration::from_micros(500);

struct Ctx {
    client: Client,
}

/// Watches MemberClusters until SIGTERM/SIGINT.
pub async fn run(client: Client) {
    let api = Api::<MemberCluster>::all(client.clone());
    Controller::new(api, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(Ctx { client }))
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::warn!(error = %e, "member cluster check failed");
            }
        })
        .await;
}

/// What one probe found.
#[derive(Debug, Clone, PartialEq)]
pub enum Probe {
    Reached {
        rtt: Option<Duration>,
        version: String,
    },
    Failed {
        reason: &'static str,
        message: String,
    },
}

async fn reconcile(cluster: Arc<MemberCluster>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let probe = probe(&ctx.client, &cluster).await;
    let wanted = status(cluster.status.as_ref(), &probe, cluster.metadata.generation);
    if cluster.status.as_ref() != Some(&wanted) {
        let patch = json!({
            "apiVersion": API_VERSION,
            "kind": "MemberCluster",
            "status": wanted,
        });
        Api::<MemberCluster>::all(ctx.client.clone())
            .patch_status(
                &cluster.name_any(),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        match &probe {
            Probe::Reached { rtt, version } => {
                tracing::info!(cluster = %cluster.name_any(), ?rtt, %version, "member cluster reachable")
            }
            Probe::Failed { reason, message } => {
                tracing::warn!(cluster = %cluster.name_any(), %reason, %message, "member cluster unreachable")
            }
        }
    }
    Ok(Action::requeue(match probe {
        Probe::Reached { .. } => RECHECK,
        Probe::Failed { .. } => RETRY,
    }))
}

fn error_policy(_: Arc<MemberCluster>, _: &kube::Error, _: Arc<Ctx>) -> Action {
    Action::requeue(RETRY)
}

/// The status to write after `probe`: the condition keeps its transition time
/// while its status holds, and the round trip moves only past the hysteresis.
pub fn status(
    old: Option<&MemberClusterStatus>,
    probe: &Probe,
    generation: Option<i64>,
) -> MemberClusterStatus {
    let old_rtt = old.and_then(|s| s.rtt);
    let (state, reason, message, rtt, server_version) = match probe {
        Probe::Reached { rtt, version } => {
            // The message names the round trip written, not every probe's,
            // so an unchanged cluster writes nothing.
            let written = settled_rtt(old_rtt.map(|r| r.as_std()), *rtt)
                .map(crate::units::Duration::from_std);
            let message = match written {
                Some(rtt) => format!("the API server answered; TCP round trip {rtt}"),
                None => "the operator's own cluster".to_owned(),
            };
            let version = Some(version.clone());
            (ConditionStatus::True, "Reached", message, written, version)
        }
        // What was measured stays: topologies keep their delays while the
        // cluster is away.
        Probe::Failed { reason, message } => (
            ConditionStatus::False,
            *reason,
            message.clone(),
            old_rtt,
            old.and_then(|s| s.server_version.clone()),
        ),
    };
    let old_condition = old.and_then(|s| s.conditions.iter().find(|c| c.type_ == REACHABLE));
    let last_transition_time = match old_condition {
        Some(c) if c.status == state => c.last_transition_time.clone(),
        _ => Time(k8s_openapi::jiff::Timestamp::now()),
    };
    MemberClusterStatus {
        observed_generation: generation,
        conditions: vec![Condition {
            type_: REACHABLE.into(),
            status: state,
            reason: reason.into(),
            message,
            last_transition_time,
            observed_generation: generation,
        }],
        rtt,
        server_version,
    }
}

/// The round trip to write: the old one unless the new one moved past the
/// hysteresis.
pub fn settled_rtt(old: Option<Duration>, new: Option<Duration>) -> Option<Duration> {
    match (old, new) {
        (Some(old), Some(new)) => {
            let band = old.mul_f64(RTT_HYSTERESIS).max(RTT_FLOOR);
            if old.abs_diff(new) > band {
                Some(new)
            } else {
                Some(old)
            }
        }
        (_, new) => new,
    }
}

/// Reaches the cluster: its kubeconfig from the Secret, the round trip by TCP
/// handshakes to the API server, then the server's version through the API.
pub async fn probe(client: &Client, cluster: &MemberCluster) -> Probe {
    let Some(secret_ref) = &cluster.spec.kubeconfig_secret_ref else {
        // The operator's own cluster: no round trip lies between it and itself.
        return match tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await {
            Ok(Ok(info)) => Probe::Reached {
                rtt: None,
                version: info.git_version,
            },
            Ok(Err(e)) => failed("ApiError", format!("the operator's own API server: {e}")),
            Err(_) => failed(
                "Timeout",
                "the operator's own API server did not answer".into(),
            ),
        };
    };
    let config = match super::remote::config_from_secret(client, secret_ref, PROBE_TIMEOUT).await {
        Ok((config, _)) => config,
        Err(e) => return failed(e.reason, e.message),
    };
    let server = config.cluster_url.to_string();
    let rtt = match handshake_rtt(&config.cluster_url).await {
        Ok(rtt) => rtt,
        Err(e) => return failed("Unreachable", format!("API server {server}: {e}")),
    };
    let member = match Client::try_from(config) {
        Ok(c) => c,
        Err(e) => return failed("InvalidKubeconfig", format!("API server {server}: {e}")),
    };
    match tokio::time::timeout(PROBE_TIMEOUT, member.apiserver_version()).await {
        Ok(Ok(info)) => Probe::Reached {
            rtt: Some(rtt),
            version: info.git_version,
        },
        Ok(Err(e)) => failed("ApiError", format!("API server {server}: {e}")),
        Err(_) => failed(
            "Timeout",
            format!("API server {server}: no answer in {PROBE_TIMEOUT:?}"),
        ),
    }
}

fn failed(reason: &'static str, message: String) -> Probe {
    Probe::Failed { reason, message }
}

/// The smallest of `HANDSHAKES` TCP connection times to the URL's host and port.
async fn handshake_rtt(url: &http::Uri) -> Result<Duration, String> {
    let host = url.host().ok_or("the server URL has no host")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_u16().unwrap_or(match url.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("resolving {host}: {e}"))?
        .collect();
    let addr = *addrs
        .first()
        .ok_or_else(|| format!("{host} resolves to nothing"))?;
    let mut best = None::<Duration>;
    for _ in 0..HANDSHAKES {
        let start = Instant::now();
        match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => {
                let took = start.elapsed();
                best = Some(best.map_or(took, |b| b.min(took)));
            }
            Ok(Err(e)) => return Err(format!("connecting to {addr}: {e}")),
            Err(_) => {
                return Err(format!(
                    "connecting to {addr}: no answer in {PROBE_TIMEOUT:?}"
                ));
            }
        }
    }
    best.ok_or_else(|| "no handshake".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    #[test]
    fn the_round_trip_moves_only_past_the_hysteresis() {
        assert_eq!(settled_rtt(None, Some(ms(3.0))), Some(ms(3.0)));
        assert_eq!(
            settled_rtt(Some(ms(3.0)), Some(ms(3.2))),
            Some(ms(3.0)),
            "inside the 0.5 ms floor"
        );
        assert_eq!(
            settled_rtt(Some(ms(40.0)), Some(ms(43.9))),
            Some(ms(40.0)),
            "inside 10%"
        );
        assert_eq!(settled_rtt(Some(ms(40.0)), Some(ms(44.5))), Some(ms(44.5)));
        assert_eq!(
            settled_rtt(Some(ms(40.0)), None),
            None,
            "the home cluster has none"
        );
    }

    #[test]
    fn an_unchanged_cluster_writes_the_same_status_and_a_failure_keeps_the_figures() {
        let reached = Probe::Reached {
            rtt: Some(ms(2.0)),
            version: "v1.30.14".into(),
        };
        let first = status(None, &reached, Some(1));
        let again = status(
            Some(&first),
            &Probe::Reached {
                rtt: Some(ms(2.1)),
                version: "v1.30.14".into(),
            },
            Some(1),
        );
        assert_eq!(
            first, again,
            "a probe within the hysteresis changes nothing"
        );
        let down = status(
            Some(&first),
            &failed("Unreachable", "API server https://x: refused".into()),
            Some(1),
        );
        let c = &down.conditions[0];
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::False, "Unreachable")
        );
        assert_eq!(down.rtt, first.rtt, "delays hold while the cluster is away");
        assert_eq!(down.server_version.as_deref(), Some("v1.30.14"));
    }
}

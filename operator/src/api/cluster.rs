//! The `MemberCluster` kind: a Kubernetes cluster that can host a topology's nodes, with
//! its region, how to reach its API server and how its agents are reached.

use super::common::{Condition, DNS_LABEL_PATTERN};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A cluster that may run a topology's nodes. Cluster-scoped: every namespace's
/// topologies may place nodes in it.
///
/// One without `kubeconfigSecretRef` is the operator's own cluster, given a region
/// so that topologies can name it like any other.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "nextmini.io",
    version = "v1alpha1",
    kind = "MemberCluster",
    status = "MemberClusterStatus",
    derive = "PartialEq",
    shortname = "mc",
    category = "nextmini",
    doc = "A Kubernetes cluster that can host Nextmini nodes.",
    printcolumn = r#"{"name": "Region", "type": "string", "jsonPath": ".spec.region"}"#,
    printcolumn = r#"{"name": "Zone", "type": "string", "jsonPath": ".spec.zone"}"#,
    printcolumn = r#"{"name": "Reachable", "type": "string", "description": "Reachable condition", "jsonPath": ".status.conditions[?(@.type==\"Reachable\")].status"}"#,
    printcolumn = r#"{"name": "RTT", "type": "string", "description": "Round trip from the operator to the cluster's API server", "jsonPath": ".status.rtt"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("!has(self.exposure) || (self.exposure.type == 'NodePort') == has(self.exposure.address)").message("exposure.address is required for NodePort and only for it (LoadBalancer dials the load balancer's address, Address the pods' own)"))]
pub struct MemberClusterSpec {
    /// The region the cluster is in, e.g. `eu-west` (a DNS label). Topologies place
    /// nodes by region and give links between regions their own defaults.
    #[schemars(pattern(DNS_LABEL_PATTERN), length(min = 1, max = 63))]
    pub region: String,
    /// The zone inside the region (a label on the cluster's pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DNS_LABEL_PATTERN), length(min = 1, max = 63))]
    pub zone: Option<String>,
    /// A Secret holding a kubeconfig for the cluster's API server. Unset: the
    /// operator's own cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<SecretKeySelector>,
    /// The namespace the cluster's pods go into (default: the topology's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DNS_LABEL_PATTERN), length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// How agents in other clusters reach this cluster's agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposure: Option<ExposureSpec>,
    /// `host:port` at which this cluster's agents reach the operator's hub
    /// (default: the hub Service, which only the operator's own cluster resolves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub hub_address: Option<String>,
    /// Round-trip times to other member clusters, as you measured them. The operator
    /// subtracts half of it from the delay of every link between the two clusters;
    /// without it, it uses what it measures itself (`status.rtt` of both).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub rtt: Vec<PeerRttSpec>,
}

/// A key of a Secret in a given namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeySelector {
    /// The Secret's namespace.
    #[schemars(pattern(DNS_LABEL_PATTERN), length(min = 1, max = 63))]
    pub namespace: String,
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key holding the kubeconfig (default `kubeconfig`).
    #[serde(default = "default_kubeconfig_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_kubeconfig_key() -> String {
    "kubeconfig".to_owned()
}

/// How a cluster's agents are exposed to other clusters.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExposureSpec {
    /// `NodePort` (a Service per exposed node, dialed at `address` and its
    /// node port, the same for TCP and UDP), `LoadBalancer` (a Service per
    /// exposed node, dialed at the address the cluster's load balancer gives
    /// it) or `Address` (pod IPs are routed between the clusters, e.g. by
    /// Submariner, Cilium ClusterMesh or one flat network: a node's pod IP).
    #[serde(rename = "type")]
    pub kind: ExposureKind,
    /// For `NodePort`: an address of the cluster's nodes that the other
    /// clusters' pods reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub address: Option<String>,
}

/// How a cluster's agents are exposed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ExposureKind {
    NodePort,
    LoadBalancer,
    Address,
}

/// A round-trip time to another member cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeerRttSpec {
    /// The other MemberCluster's name.
    #[schemars(length(min = 1, max = 253))]
    pub cluster: String,
    /// The round trip between the two clusters' pods, e.g. `42ms`.
    pub rtt: crate::units::Duration,
}

/// What the operator last saw of a member cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberClusterStatus {
    /// The `metadata.generation` the status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Reachable`: the operator reached the API server with the kubeconfig.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The smallest of a few TCP handshake times from the operator to the API
    /// server, e.g. `1.234ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt: Option<crate::units::Duration>,
    /// The API server's version, e.g. `v1.30.14`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
}

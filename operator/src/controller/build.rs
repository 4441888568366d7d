//! Phase 3 (pure): the Kubernetes objects a planned topology needs — one agent
//! pod per node, a headless Service giving each pod a DNS name for the links,
//! and a Secret with the nodes' credentials — all owned by the Topology, so
//! deleting it removes them.

use super::validate::Validated;
use super::{MANAGED_BY, NODE_LABEL, Settings, TOPOLOGY_LABEL};
use crate::api::Topology;
use crate::pki::{Credentials, files};
use crate::plan::{LINK_PORT, PlannedNode};
use crate::runtime::pods;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, HostAlias, HostPathVolumeSource, KeyToPath, Pod, PodSpec,
    ResourceRequirements, SecretVolumeSource, SecurityContext, Service, ServicePort, ServiceSpec,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Annotation holding a hash of the pod's desired spec: a pod whose hash
/// differs is replaced (pod specs are mostly immutable).
pub const SPEC_HASH: &str = "nextmini.io/spec-hash";
const CREDENTIAL_DIR: &str = "/var/run/nextmini";

fn labels(topology: &str, node: Option<&str>) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "nextmini-agent".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            MANAGED_BY.to_string(),
        ),
        (TOPOLOGY_LABEL.to_string(), topology.to_string()),
    ]);
    if let Some(n) = node {
        l.insert(NODE_LABEL.to_string(), n.to_string());
    }
    l
}

fn owned_meta(owner: &Topology, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: owner.namespace(),
        labels: Some(labels),
        owner_references: owner.controller_owner_ref(&()).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

/// The headless Service: `<node>.<service>.<namespace>.svc` resolves to the
/// node's pod, also before it is ready (links dial while agents start).
pub fn service(owner: &Topology, topology: &str) -> Service {
    Service {
        metadata: owned_meta(owner, pods::service_name(topology), labels(topology, None)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(BTreeMap::from([(
                TOPOLOGY_LABEL.to_string(),
                topology.to_string(),
            )])),
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("link".into()),
                port: i32::from(LINK_PORT),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The credentials Secret: per node its token, certificate and key, and the
/// control CA's certificate.
pub fn credentials(
    owner: &Topology,
    topology: &str,
    credentials: &Credentials,
) -> k8s_openapi::api::core::v1::Secret {
    k8s_openapi::api::core::v1::Secret {
        metadata: owned_meta(
            owner,
            pods::credentials_secret(topology),
            labels(topology, None),
        ),
        data: Some(
            credentials
                .files()
                .into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// One agent pod per node, each with its spec hash annotated.
pub fn agent_pods(owner: &Topology, validated: &Validated, settings: &Settings) -> Vec<Pod> {
    let plan = &validated.plan;
    // Node names resolve to overlay addresses inside every pod, as in local mode.
    let aliases: Vec<HostAlias> = plan
        .nodes
        .iter()
        .map(|n| HostAlias {
            ip: n.overlay.to_string(),
            hostnames: Some(vec![n.name.clone()]),
        })
        .collect();
    plan.nodes
        .iter()
        .map(|node| {
            let user = validated
                .containers
                .get(&node.name)
                .cloned()
                .unwrap_or_default();
            agent_pod(owner, &plan.topology, node, &aliases, user, settings)
        })
        .collect()
}

/// The agent's command line; SOCKS servers listen inside the pod, where the
/// node's own containers reach them.
fn agent_args(topology: &str, node: &PlannedNode, settings: &Settings) -> Vec<String> {
    let mut args = vec![
        "--hub".into(),
        settings.hub_address.clone(),
        "--topology".into(),
        topology.to_string(),
        "--node".into(),
        node.name.clone(),
        "--credential-file".into(),
        format!("{CREDENTIAL_DIR}/credential"),
    ];
    for socks in &node.socks {
        args.push("--socks-listen".into());
        args.push(socks.listen.to_string());
    }
    args
}

fn agent_pod(
    owner: &Topology,
    topology: &str,
    node: &PlannedNode,
    aliases: &[HostAlias],
    user_containers: Vec<Container>,
    settings: &Settings,
) -> Pod {
    let agent = Container {
        name: "agent".into(),
        image: Some(settings.agent_image.clone()),
        image_pull_policy: Some(settings.agent_image_pull_policy.clone()),
        command: Some(vec!["nextmini-agent".into()]),
        args: Some(agent_args(topology, node, settings)),
        env: Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: "RUST_LOG".into(),
            value: Some(settings.agent_log.clone()),
            ..Default::default()
        }]),
        // The TUN device needs NET_ADMIN and nothing else.
        security_context: Some(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into()]),
                drop: Some(vec!["ALL".into()]),
            }),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            ..SecurityContext::default()
        }),
        resources: resources(node),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "tun".into(),
                mount_path: "/dev/net/tun".into(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "credential".into(),
                mount_path: CREDENTIAL_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    };
    let mut containers = vec![agent];
    containers.extend(user_containers);
    let spec = PodSpec {
        hostname: Some(node.name.clone()),
        subdomain: Some(pods::service_name(topology)),
        host_aliases: Some(aliases.to_vec()),
        containers,
        volumes: Some(vec![
            Volume {
                name: "tun".into(),
                host_path: Some(HostPathVolumeSource {
                    path: "/dev/net/tun".into(),
                    type_: Some("CharDevice".into()),
                }),
                ..Volume::default()
            },
            Volume {
                name: "credential".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(pods::credentials_secret(topology)),
                    // Only this node's files, named as the agent expects
                    // them beside its credential file.
                    items: Some(
                        [
                            (files::token(&node.name), "credential"),
                            (files::cert(&node.name), "credential.crt"),
                            (files::key(&node.name), "credential.key"),
                            (files::CA.to_string(), files::CA),
                        ]
                        .into_iter()
                        .map(|(key, path)| KeyToPath {
                            key,
                            path: path.into(),
                            mode: Some(0o400),
                        })
                        .collect(),
                    ),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            },
        ]),
        restart_policy: Some("Always".into()),
        termination_grace_period_seconds: Some(5),
        enable_service_links: Some(false),
        automount_service_account_token: Some(false),
        ..PodSpec::default()
    };
    let hash = spec_hash(&spec);
    let mut metadata = owned_meta(
        owner,
        pods::pod_name(topology, &node.name),
        labels(topology, Some(&node.name)),
    );
    metadata.annotations = Some(BTreeMap::from([(SPEC_HASH.to_string(), hash)]));
    Pod {
        metadata,
        spec: Some(spec),
        ..Pod::default()
    }
}

fn resources(node: &PlannedNode) -> Option<ResourceRequirements> {
    let mut limits = BTreeMap::new();
    if let Some(cpu) = node.resources.cpu_millis {
        limits.insert("cpu".to_string(), Quantity(format!("{cpu}m")));
    }
    if let Some(memory) = node.resources.memory_bytes {
        limits.insert("memory".to_string(), Quantity(memory.to_string()));
    }
    (!limits.is_empty()).then(|| ResourceRequirements {
        // Requests equal to limits: the scheduler reserves what the node may use,
        // so emulated nodes do not compete for CPU they were promised.
        requests: Some(limits.clone()),
        limits: Some(limits),
        ..ResourceRequirements::default()
    })
}

/// Host aliases are left out: they list every node, and adding a node must not
/// restart every pod (a pod made earlier reaches new nodes by address).
fn spec_hash(spec: &PodSpec) -> String {
    let mut spec = spec.clone();
    spec.host_aliases = None;
    let json = serde_json::to_vec(&spec).unwrap_or_default();
    hex::encode(&Sha256::digest(&json)[..8])
}

/// The spec hash a live pod was made with.
pub fn hash_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(SPEC_HASH)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fetch::assemble;
    use crate::controller::validate::validate;

    fn settings() -> Settings {
        Settings {
            hub_address: "https://nextmini-hub.nextmini.svc:50051".into(),
            agent_image: "docker.io/nextmini/nextmini:dev".into(),
            agent_image_pull_policy: "Never".into(),
            agent_log: "info".into(),
        }
    }

    fn topology(yaml: &str) -> Topology {
        let mut t: Topology = serde_norway::from_str(yaml).expect("fixture parses");
        t.metadata.namespace = Some("lab".into());
        t.metadata.uid = Some("0000-uid".into());
        t
    }

    const SHAPED: &str = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: line3}\nspec:\n  nodes:\n  - {name: a}\n  - name: b\n    resources: {cpu: 500m, memory: 64Mi}\n  - name: c\n    containers: [{name: web, image: 'docker.io/nextmini/tools:dev', command: [python3, -m, http.server]}]\n  links: [{endpoints: [a, b]}, {endpoints: [b, c]}]\n";

    fn built(yaml: &str) -> (Topology, Vec<Pod>) {
        let t = topology(yaml);
        let v = validate(&assemble(&t, vec![], vec![]), "lab", None).expect("valid");
        let pods = agent_pods(&t, &v, &settings());
        (t, pods)
    }

    #[test]
    fn one_pod_per_node_owned_by_the_topology_with_tun_and_net_admin() {
        let (_, pods) = built(SHAPED);
        assert_eq!(pods.len(), 3);
        let a = &pods[0];
        assert_eq!(a.name_any(), "line3-a");
        let owner = &a.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Topology", "line3")
        );
        assert_eq!(owner.controller, Some(true));
        let spec = a.spec.as_ref().expect("spec");
        assert_eq!(spec.hostname.as_deref(), Some("a"));
        assert_eq!(spec.subdomain.as_deref(), Some("nm-line3"));
        let agent = &spec.containers[0];
        let caps = agent
            .security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref());
        assert_eq!(
            caps.and_then(|c| c.add.clone()),
            Some(vec!["NET_ADMIN".to_string()])
        );
        assert!(
            agent
                .args
                .as_ref()
                .expect("args")
                .windows(2)
                .any(|w| w[0] == "--node" && w[1] == "a")
        );
        let tun = spec
            .volumes
            .as_ref()
            .expect("volumes")
            .iter()
            .find(|v| v.name == "tun")
            .expect("tun volume");
        assert_eq!(
            tun.host_path.as_ref().and_then(|h| h.type_.as_deref()),
            Some("CharDevice")
        );
        let aliases = spec.host_aliases.as_ref().expect("aliases");
        assert_eq!(aliases.len(), 3, "every node name resolves in every pod");
    }

    #[test]
    fn socks_servers_become_agent_listeners_in_the_pod() {
        let yaml = SHAPED.replace(
            "  - {name: a}\n",
            "  - name: a\n    socks: [{listen: '127.0.0.1:1080'}, {listen: '0.0.0.0:1081', mode: max}]\n",
        );
        let (_, pods) = built(&yaml);
        let args = pods[0].spec.as_ref().expect("spec").containers[0]
            .args
            .clone()
            .expect("args");
        let listens: Vec<&str> = args
            .windows(2)
            .filter(|w| w[0] == "--socks-listen")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(listens, ["127.0.0.1:1080", "0.0.0.0:1081"]);
        let b = pods[1].spec.as_ref().expect("spec").containers[0]
            .args
            .clone()
            .expect("args");
        assert!(!b.iter().any(|a| a == "--socks-listen"));
    }

    #[test]
    fn node_resources_become_pod_resources_and_user_containers_join_the_pod() {
        let (_, pods) = built(SHAPED);
        let b = pods[1].spec.as_ref().expect("spec");
        let limits = b.containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits["cpu"].0, "500m");
        assert_eq!(limits["memory"].0, (64u64 << 20).to_string());
        assert!(
            pods[0].spec.as_ref().expect("spec").containers[0]
                .resources
                .is_none()
        );
        let c = pods[2].spec.as_ref().expect("spec");
        assert_eq!(
            c.containers
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["agent", "web"]
        );
    }

    #[test]
    fn spec_hash_changes_only_with_the_spec() {
        let (_, first) = built(SHAPED);
        let (_, again) = built(SHAPED);
        assert_eq!(hash_of(&first[0]), hash_of(&again[0]));
        let (_, changed) = built(&SHAPED.replace("cpu: 500m", "cpu: 250m"));
        assert_eq!(
            hash_of(&first[0]),
            hash_of(&changed[0]),
            "a's pod is untouched"
        );
        assert_ne!(
            hash_of(&first[1]),
            hash_of(&changed[1]),
            "b's limits changed"
        );
        let grown = SHAPED.replace("  - {name: a}\n", "  - {name: a}\n  - {name: d}\n");
        let (_, grown) = built(&grown);
        assert_eq!(grown.len(), 4);
        assert_eq!(
            hash_of(&first[0]),
            hash_of(&grown[0]),
            "a new node restarts no pod"
        );
    }

    #[test]
    fn headless_service_and_secret_are_owned_and_named() {
        let t = topology(SHAPED);
        let s = service(&t, "line3");
        let spec = s.spec.as_ref().expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert!(s.metadata.owner_references.is_some());
        let ca = crate::pki::ControlCa::generate().expect("ca");
        let issued =
            Credentials::issue(&ca, "line3", ["a".to_string()].iter()).expect("credentials");
        let secret = credentials(&t, "line3", &issued);
        assert_eq!(secret.name_any(), "nm-line3-credentials");
        assert!(secret.metadata.owner_references.is_some());
        let keys: Vec<&String> = secret.data.as_ref().expect("data").keys().collect();
        assert_eq!(keys, ["a", "a.crt", "a.key", "ca.crt"]);
    }

    #[test]
    fn a_pod_mounts_only_its_own_node_credential() {
        let (_, pods) = built(SHAPED);
        let pod = pods
            .iter()
            .find(|p| p.labels().get(NODE_LABEL).map(String::as_str) == Some("b"))
            .expect("pod of b");
        let secret = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .and_then(|v| v.iter().find(|v| v.name == "credential"))
            .and_then(|v| v.secret.as_ref())
            .expect("credential volume");
        let items: Vec<(&str, &str)> = secret
            .items
            .as_ref()
            .expect("items")
            .iter()
            .map(|i| (i.key.as_str(), i.path.as_str()))
            .collect();
        assert_eq!(
            items,
            [
                ("b", "credential"),
                ("b.crt", "credential.crt"),
                ("b.key", "credential.key"),
                ("ca.crt", "ca.crt")
            ]
        );
    }
}

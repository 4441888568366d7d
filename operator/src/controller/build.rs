//! Phase 3 (pure): the Kubernetes objects a planned topology needs — one agent
//! pod per node (or one worker pod per share of nodes), a headless Service
//! giving each pod a DNS name for the links, and what the pods mount
//! ([`super::pod_files`]) — all owned by the Topology, so deleting it removes
//! them.

use super::pod_files::{HOSTS_DIR, hosts_volume};
use super::validate::Validated;
use super::{MANAGED_BY, NODE_LABEL, Settings, TOPOLOGY_LABEL};
use crate::api::Topology;
use crate::pki::files;
use crate::plan::{LINK_PORT, Plan, PlannedNode};
use crate::runtime::{packed, pods};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, HostAlias, HostPathVolumeSource,
    KeyToPath, Pod, PodSecurityContext, PodSpec, ResourceRequirements, SecretVolumeSource,
    SecurityContext, Service, ServicePort, ServiceSpec, Sysctl, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use nextmini_proto::topology_key::name_of;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Annotation holding a hash of the pod's desired spec: a pod whose hash
/// differs is replaced (pod specs are mostly immutable).
pub const SPEC_HASH: &str = "nextmini.io/spec-hash";
/// Annotation of a worker pod: the nodes it hosts, comma-separated, so users
/// find where a node runs (`kubectl get pods -o custom-columns=…`).
pub const NODES_ANNOTATION: &str = "nextmini.io/nodes";
/// Label of a worker pod: its worker number.
pub const WORKER_LABEL: &str = "nextmini.io/worker";
const WORKER_CONTAINER: &str = "worker";
const CREDENTIAL_DIR: &str = "/var/run/nextmini";
/// Scratch for the agents' sockets (metrics, captures), at
/// `observe::sockets::POD_STATE_DIR`.
const STATE_VOLUME: &str = "state";

pub(super) fn labels(topology: &str, node: Option<&str>) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "nextmini-agent".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            MANAGED_BY.to_string(),
        ),
        (TOPOLOGY_LABEL.to_string(), name_of(topology).to_string()),
    ]);
    if let Some(n) = node {
        l.insert(NODE_LABEL.to_string(), n.to_string());
    }
    l
}

pub(super) fn owned_meta(
    owner: &Topology,
    name: String,
    labels: BTreeMap<String, String>,
) -> ObjectMeta {
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
                name_of(topology).to_string(),
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

/// The topology's pods, each with its spec hash annotated: one agent pod per
/// node, or for packed placement, one pod per worker.
pub fn agent_pods(owner: &Topology, validated: &Validated, settings: &Settings) -> Vec<Pod> {
    let plan = &validated.plan;
    if let Some(packing) = plan.packing() {
        return packed::workers(plan, packing)
            .into_iter()
            .map(|(worker, nodes)| worker_pod(owner, validated, worker, &nodes, settings))
            .collect();
    }
    // Node names resolve to overlay addresses inside every pod, as in local
    // mode. (A worker's nodes read them from the hosts ConfigMaps instead:
    // validation caps pod-per-node topologies where this list stays small.)
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
            let remote = validated.remote_of(node);
            let hub = remote.map_or(settings.hub_address.as_str(), |r| r.hub_address.as_str());
            let mut pod = agent_pod(owner, &plan.topology, node, &aliases, user, settings, hub);
            if let Some(r) = remote {
                let cluster = node.cluster.as_deref().unwrap_or_default();
                let uid = owner.metadata.uid.as_deref();
                super::remote::move_into(&mut pod.metadata, cluster, &r.namespace, uid);
            }
            pod
        })
        .collect()
}

/// The agent's command line; SOCKS servers listen inside the pod, where the
/// node's own containers reach them.
fn agent_args(topology: &str, node: &PlannedNode, hub: &str) -> Vec<String> {
    let mut args = vec![
        "--hub".into(),
        hub.to_owned(),
        "--topology".into(),
        topology.to_string(),
        "--node".into(),
        node.name.clone(),
        "--credential-file".into(),
        format!("{CREDENTIAL_DIR}/credential"),
        // `nextmini capture --node <node>` run in the pod finds it there.
        "--metrics-socket".into(),
        crate::observe::sockets::agent_socket(
            std::path::Path::new(crate::observe::sockets::POD_STATE_DIR),
            topology,
            &node.name,
        )
        .display()
        .to_string(),
    ];
    for socks in &node.socks {
        args.push("--socks-listen".into());
        args.push(socks.listen.to_string());
    }
    args
}

/// The environment of agent and worker containers: their log filter, and the
/// topology, so that `nextmini exec` and `nextmini capture` run in the pod
/// find it.
fn pod_env(topology: &str, settings: &Settings) -> Vec<EnvVar> {
    vec![
        EnvVar {
            name: "RUST_LOG".into(),
            value: Some(settings.agent_log.clone()),
            ..Default::default()
        },
        EnvVar {
            name: "NEXTMINI_TOPOLOGY".into(),
            value: Some(topology.to_string()),
            ..Default::default()
        },
    ]
}

fn agent_pod(
    owner: &Topology,
    topology: &str,
    node: &PlannedNode,
    aliases: &[HostAlias],
    user_containers: Vec<Container>,
    settings: &Settings,
    hub: &str,
) -> Pod {
    let agent = Container {
        name: "agent".into(),
        image: Some(settings.agent_image.clone()),
        image_pull_policy: Some(settings.agent_image_pull_policy.clone()),
        command: Some(vec!["nextmini-agent".into()]),
        args: Some(agent_args(topology, node, hub)),
        env: Some(pod_env(topology, settings)),
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
            VolumeMount {
                name: STATE_VOLUME.into(),
                mount_path: crate::observe::sockets::POD_STATE_DIR.into(),
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
            tun_volume(),
            Volume {
                name: STATE_VOLUME.into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            },
            // Only this node's files, named as the agent expects them
            // beside its credential file.
            credential_volume(
                &pods::credentials_secret(&pods::pod_name(topology, &node.name)),
                [
                    (files::token(&node.name), "credential"),
                    (files::cert(&node.name), "credential.crt"),
                    (files::key(&node.name), "credential.key"),
                    (files::CA.to_string(), files::CA),
                ]
                .map(|(key, path)| (key, path.to_string())),
            ),
        ]),
        // ping without CAP_NET_RAW (a safe sysctl: namespaced, allowed by default).
        security_context: Some(PodSecurityContext {
            sysctls: Some(vec![Sysctl {
                name: "net.ipv4.ping_group_range".into(),
                value: crate::runtime::netlink::PING_GROUP_RANGE.into(),
            }]),
            ..PodSecurityContext::default()
        }),
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

/// The pods that run `nodes`' agents, by name.
pub fn pods_hosting(plan: &Plan, nodes: &[&String]) -> Vec<String> {
    let mut pods: Vec<String> = plan
        .nodes
        .iter()
        .filter(|n| nodes.contains(&&n.name))
        .map(|n| match plan.packing() {
            Some(packing) => pods::worker_pod_name(&plan.topology, packing.seat(n.index).worker),
            None => pods::pod_name(&plan.topology, &n.name),
        })
        .collect();
    pods.sort();
    pods.dedup();
    pods
}

/// Where a worker keeps its nodes' namespaces (`ip netns` finds them there).
const NETNS_DIR: &str = "/run/netns";
/// Where `ip netns exec` finds per-namespace files such as `hosts`.
const ETC_NETNS_DIR: &str = "/etc/netns";

/// A packed topology's worker pod: `nextmini worker` makes a network namespace
/// per node, starts and supervises the nodes' agents. The agents stay in the
/// pod's namespace (hub, peers and DNS are reachable there, no NAT needed) and
/// put only their TUN device into the node's namespace.
fn worker_pod(
    owner: &Topology,
    validated: &Validated,
    worker: u32,
    nodes: &[&PlannedNode],
    settings: &Settings,
) -> Pod {
    let topology = &validated.plan.topology;
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    let scratch = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    };
    let container = Container {
        name: WORKER_CONTAINER.into(),
        image: Some(
            validated
                .worker_image
                .clone()
                .unwrap_or_else(|| settings.agent_image.clone()),
        ),
        image_pull_policy: Some(settings.agent_image_pull_policy.clone()),
        command: Some(vec!["nextmini".into(), "worker".into()]),
        args: Some(vec![
            "--hub".into(),
            settings.hub_address.clone(),
            "--topology".into(),
            topology.clone(),
            "--credential-dir".into(),
            CREDENTIAL_DIR.into(),
            "--nodes".into(),
            packed::nodes_arg(nodes),
            "--hosts-dir".into(),
            HOSTS_DIR.into(),
        ]),
        env: Some(pod_env(topology, settings)),
        // NET_ADMIN for the TUN devices; SYS_ADMIN to make network namespaces
        // and mount them under /run/netns, and to give each node a cgroup.
        security_context: Some(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into(), "SYS_ADMIN".into()]),
                drop: Some(vec!["ALL".into()]),
            }),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            ..SecurityContext::default()
        }),
        resources: worker_resources(nodes),
        volume_mounts: Some(vec![
            mount("tun", "/dev/net/tun", false),
            mount("credential", CREDENTIAL_DIR, true),
            mount("netns", NETNS_DIR, false),
            mount("tmp", "/tmp", false),
            mount(STATE_VOLUME, crate::observe::sockets::POD_STATE_DIR, false),
            mount("hosts", HOSTS_DIR, true),
            // Each node's hosts file, which `ip netns exec` (and so
            // `nextmini exec`) puts over /etc/hosts.
            mount("etc-netns", ETC_NETNS_DIR, false),
        ]),
        ..Container::default()
    };
    let spec = PodSpec {
        hostname: Some(pods::worker_hostname(worker)),
        subdomain: Some(pods::service_name(topology)),
        containers: vec![container],
        volumes: Some(vec![
            tun_volume(),
            // Only this worker's nodes' files, named as in the Secret: an
            // agent finds `<node>.crt`, `<node>.key` and `ca.crt` beside its
            // credential file `<node>`.
            credential_volume(
                &pods::credentials_secret(&pods::worker_pod_name(topology, worker)),
                names
                    .iter()
                    .flat_map(|n| [files::token(n), files::cert(n), files::key(n)])
                    .chain([files::CA.to_string()])
                    .map(|key| (key.clone(), key)),
            ),
            scratch("netns"),
            scratch("tmp"),
            scratch(STATE_VOLUME),
            scratch("etc-netns"),
            hosts_volume(&validated.plan),
        ]),
        restart_policy: Some("Always".into()),
        // Agents first, then every namespace: a few seconds for 50 nodes.
        termination_grace_period_seconds: Some(30),
        // The pause process is PID 1 and reaps what `kubectl exec` leaves
        // running in the nodes; the worker reaps only its agents.
        share_process_namespace: Some(true),
        enable_service_links: Some(false),
        automount_service_account_token: Some(false),
        ..PodSpec::default()
    };
    let hash = spec_hash(&spec);
    let mut labels = labels(topology, None);
    labels.insert(WORKER_LABEL.to_string(), worker.to_string());
    let mut metadata = owned_meta(owner, pods::worker_pod_name(topology, worker), labels);
    metadata.annotations = Some(BTreeMap::from([
        (SPEC_HASH.to_string(), hash),
        (NODES_ANNOTATION.to_string(), names.join(",")),
    ]));
    Pod {
        metadata,
        spec: Some(spec),
        ..Pod::default()
    }
}

/// What the worker itself needs besides its nodes, added when the nodes set
/// resources (the worker process, and commands run in the pod outside any node).
const WORKER_CPU_MILLIS: u64 = 100;
const WORKER_MEMORY_BYTES: u64 = 64 << 20;

/// The sum of the nodes' resources, as requests; as limits only for the
/// resources every node limits (a node without a limit must not be bounded by
/// the others' sum). Each node's own limit is its cgroup inside the pod.
fn worker_resources(nodes: &[&PlannedNode]) -> Option<ResourceRequirements> {
    let cpu: Vec<Option<u64>> = nodes
        .iter()
        .map(|n| n.resources.cpu_millis.map(u64::from))
        .collect();
    let memory: Vec<Option<u64>> = nodes.iter().map(|n| n.resources.memory_bytes).collect();
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    for (key, values, overhead, unit) in [
        ("cpu", &cpu, WORKER_CPU_MILLIS, "m"),
        ("memory", &memory, WORKER_MEMORY_BYTES, ""),
    ] {
        let sum: u64 = values.iter().flatten().sum();
        if sum == 0 {
            continue;
        }
        let quantity = Quantity(format!("{}{unit}", sum + overhead));
        requests.insert(key.to_string(), quantity.clone());
        if values.iter().all(Option::is_some) {
            limits.insert(key.to_string(), quantity);
        }
    }
    (!requests.is_empty()).then(|| ResourceRequirements {
        requests: Some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..ResourceRequirements::default()
    })
}

/// The `credential` volume: the given keys of the pod's Secret, each at its
/// path, readable by the owner only.
fn credential_volume(secret: &str, items: impl IntoIterator<Item = (String, String)>) -> Volume {
    Volume {
        name: "credential".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_string()),
            items: Some(
                items
                    .into_iter()
                    .map(|(key, path)| KeyToPath {
                        key,
                        path,
                        mode: Some(0o400),
                    })
                    .collect(),
            ),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn tun_volume() -> Volume {
    Volume {
        name: "tun".into(),
        host_path: Some(HostPathVolumeSource {
            path: "/dev/net/tun".into(),
            type_: Some("CharDevice".into()),
        }),
        ..Volume::default()
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
pub(crate) mod tests {
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

    const WAN: &str = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: wan}\nspec:\n  nodes: [{name: a}, {name: b, cluster: eu}]\n  links: [{endpoints: [a, b]}]\n";

    /// A manifest of `topology` beside the member cluster `eu` (YAML spec).
    pub(crate) fn with_member(t: &Topology, member_spec: &str) -> crate::plan::Manifest {
        let mut m = assemble(t, vec![], vec![]);
        let member: crate::api::MemberCluster = serde_norway::from_str(&format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: MemberCluster\nmetadata: {{name: eu}}\nspec: {member_spec}\n"
        ))
        .expect("member fixture parses");
        m.member_clusters.push(crate::plan::Doc {
            origin: "membercluster/eu".into(),
            object: member,
        });
        m
    }

    #[test]
    fn a_node_in_a_member_cluster_gets_a_pod_there_dialing_its_hub_address() {
        let t = topology(WAN);
        let m = with_member(
            &t,
            "{region: eu-west, namespace: far, hubAddress: '203.0.113.7:30051', kubeconfigSecretRef: {namespace: nextmini, name: eu}, exposure: {type: Address}}",
        );
        let v = validate(&m, "lab", None).expect("valid");
        let pods = agent_pods(&t, &v, &settings());
        let (a, b) = (&pods[0], &pods[1]);
        let hub = |p: &Pod| {
            let args = p.spec.as_ref().expect("spec").containers[0]
                .args
                .clone()
                .expect("args");
            args.windows(2)
                .find(|w| w[0] == "--hub")
                .map(|w| w[1].clone())
        };
        assert_eq!(hub(a), Some(settings().hub_address));
        assert!(
            a.labels()
                .get(crate::controller::remote::CLUSTER_LABEL)
                .is_none()
        );
        assert!(a.metadata.owner_references.is_some());
        assert_eq!(hub(b).as_deref(), Some("https://203.0.113.7:30051"));
        assert_eq!(b.namespace().as_deref(), Some("far"));
        assert_eq!(
            b.labels()
                .get(crate::controller::remote::CLUSTER_LABEL)
                .map(String::as_str),
            Some("eu")
        );
        assert_eq!(
            b.labels()
                .get(crate::controller::remote::OWNER_UID_LABEL)
                .map(String::as_str),
            Some("0000-uid")
        );
        // An owner in another cluster would have the member's garbage
        // collector delete the pod at once.
        assert!(b.metadata.owner_references.is_none());
    }

    #[test]
    fn nodes_in_a_member_cluster_need_its_hub_address_and_pods_of_their_own() {
        let t = topology(WAN);
        let secret = "kubeconfigSecretRef: {namespace: nextmini, name: eu}";
        let no_hub = validate(
            &with_member(&t, &format!("{{region: eu-west, {secret}}}")),
            "lab",
            None,
        )
        .expect_err("must be refused");
        assert_eq!(no_hub.reason, "InvalidPlacement");
        assert!(
            no_hub.message.contains("membercluster/eu spec.hubAddress")
                && no_hub.message.contains("b"),
            "{}",
            no_hub.message
        );
        let packed = topology(&WAN.replace("spec:\n", "spec:\n  placement: packed\n"));
        let refused = validate(
            &with_member(
                &packed,
                &format!("{{region: eu-west, hubAddress: 'h:1', {secret}}}"),
            ),
            "lab",
            None,
        )
        .expect_err("must be refused");
        assert!(
            refused.message.contains("spec.placement"),
            "{}",
            refused.message
        );
        // The operator's own cluster, named: no hub address needed.
        let home = validate(&with_member(&t, "{region: eu-west}"), "lab", None).expect("valid");
        assert!(home.remote.is_empty());
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
    fn node_pods_let_their_users_ping_without_raw_sockets() {
        let (_, pods) = built(SHAPED);
        for pod in &pods {
            let sysctls = pod
                .spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|c| c.sysctls.as_ref())
                .expect("sysctls");
            assert_eq!(sysctls.len(), 1);
            assert_eq!(sysctls[0].name, "net.ipv4.ping_group_range");
            assert_eq!(sysctls[0].value, "0 2147483647");
        }
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

    const PACKED6: &str = include_str!("../../tests/fixtures/packed6.yaml");

    fn worker_container(pod: &Pod) -> &Container {
        &pod.spec.as_ref().expect("spec").containers[0]
    }

    fn arg<'a>(c: &'a Container, flag: &str) -> &'a str {
        let args = c.args.as_ref().expect("args");
        let at = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("no {flag}"));
        &args[at + 1]
    }

    #[test]
    fn packed_topologies_get_one_worker_pod_per_share_of_nodes() {
        let (_, pods) = built(PACKED6);
        let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["packed6-worker-0", "packed6-worker-1"]);
        for (w, pod) in pods.iter().enumerate() {
            let owner = &pod.metadata.owner_references.as_ref().expect("owned")[0];
            assert_eq!(
                (owner.kind.as_str(), owner.controller),
                ("Topology", Some(true))
            );
            assert_eq!(pod.labels()[TOPOLOGY_LABEL], "packed6");
            assert_eq!(pod.labels()[WORKER_LABEL], w.to_string());
            assert!(
                !pod.labels().contains_key(NODE_LABEL),
                "a worker is no node"
            );
            let spec = pod.spec.as_ref().expect("spec");
            assert_eq!(
                spec.hostname.as_deref(),
                Some(format!("worker-{w}").as_str())
            );
            assert_eq!(spec.subdomain.as_deref(), Some("nm-packed6"));
            assert_eq!(spec.host_aliases, None, "names come from ConfigMaps");
            let hosts = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == "hosts")
                .and_then(|v| v.projected.as_ref())
                .and_then(|p| p.sources.as_ref())
                .expect("hosts volume");
            let maps: Vec<&str> = hosts
                .iter()
                .filter_map(|s| s.config_map.as_ref())
                .map(|c| c.name.as_str())
                .collect();
            assert_eq!(maps, ["nm-packed6-hosts-0"]);
            assert_eq!(spec.containers.len(), 1, "no user containers in a worker");
        }
        assert_eq!(
            pods[0].annotations()[NODES_ANNOTATION],
            "a,b,c",
            "users find a node's worker"
        );
        assert_eq!(pods[1].annotations()[NODES_ANNOTATION], "d,e,f");
        let c = worker_container(&pods[1]);
        assert_eq!(
            c.command.as_deref(),
            Some(["nextmini".to_string(), "worker".to_string()].as_slice())
        );
        // Agents speak for the namespace's topology; the pods carry its name.
        assert_eq!(arg(c, "--topology"), "lab/packed6");
        assert_eq!(pods[1].labels()[TOPOLOGY_LABEL], "packed6");
        assert!(
            pods[1].name_any().starts_with("packed6-"),
            "{}",
            pods[1].name_any()
        );
        assert_eq!(arg(c, "--hosts-dir"), super::super::pod_files::HOSTS_DIR);
        assert_eq!(arg(c, "--hub"), settings().hub_address);
        let nodes = crate::runtime::packed::parse_nodes(arg(c, "--nodes")).expect("nodes");
        let listed: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(listed, ["d", "e", "f"]);
        assert_eq!(nodes[0].socks, ["0.0.0.0:1080".parse().expect("addr")]);
        assert_eq!(nodes[1].cpu_millis, Some(250));
        assert_eq!(c.image.as_deref(), Some(settings().agent_image.as_str()));
    }

    #[test]
    fn worker_pods_get_sys_admin_beside_net_admin_and_drop_everything_else() {
        let (_, pods) = built(PACKED6);
        let c = worker_container(&pods[0]);
        let security = c.security_context.as_ref().expect("security context");
        let caps = security.capabilities.as_ref().expect("capabilities");
        assert_eq!(
            caps.add.clone().unwrap_or_default(),
            ["NET_ADMIN", "SYS_ADMIN"]
        );
        assert_eq!(caps.drop.clone().unwrap_or_default(), ["ALL"]);
        assert_eq!(security.privileged, None, "not privileged");
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(security.read_only_root_filesystem, Some(true));
        let mounts: Vec<&str> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        for path in [
            "/dev/net/tun",
            "/var/run/nextmini",
            "/run/netns",
            "/tmp",
            "/etc/nextmini/hosts.d",
            "/etc/netns",
        ] {
            assert!(mounts.contains(&path), "{path} is mounted: {mounts:?}");
        }
        // Only the worker's own nodes' credentials.
        let spec = pods[0].spec.as_ref().expect("spec");
        let secret = spec
            .volumes
            .iter()
            .flatten()
            .find_map(|v| v.secret.as_ref())
            .expect("credentials volume");
        assert_eq!(
            secret.secret_name.as_deref(),
            Some("packed6-worker-0-credentials")
        );
        let items: Vec<(&str, &str)> = secret
            .items
            .iter()
            .flatten()
            .map(|i| (i.key.as_str(), i.path.as_str()))
            .collect();
        assert_eq!(
            items,
            [
                ("a", "a"),
                ("a.crt", "a.crt"),
                ("a.key", "a.key"),
                ("b", "b"),
                ("b.crt", "b.crt"),
                ("b.key", "b.key"),
                ("c", "c"),
                ("c.crt", "c.crt"),
                ("c.key", "c.key"),
                ("ca.crt", "ca.crt")
            ]
        );
    }

    #[test]
    fn worker_resources_are_the_sum_of_their_nodes() {
        let (_, pods) = built(PACKED6);
        // Worker 0: only b sets resources, so a and c must not be bounded by
        // b's limits: requests only.
        let r0 = worker_container(&pods[0])
            .resources
            .clone()
            .expect("resources");
        let requests = r0.requests.expect("requests");
        assert_eq!(requests["cpu"].0, format!("{}m", 500 + WORKER_CPU_MILLIS));
        assert_eq!(
            requests["memory"].0,
            ((64u64 << 20) + WORKER_MEMORY_BYTES).to_string()
        );
        assert!(r0.limits.is_none());
        // Worker 1: e and f limit cpu, d does not; only e limits memory.
        let r1 = worker_container(&pods[1])
            .resources
            .clone()
            .expect("resources");
        assert_eq!(
            r1.requests.expect("requests")["cpu"].0,
            format!("{}m", 500 + WORKER_CPU_MILLIS)
        );
        assert!(r1.limits.is_none());
        // Every node limits its cpu: the pod's limit is the sum.
        let all = PACKED6.replace(
            "    - name: d
",
            "    - name: d
      resources: {cpu: 100m}
",
        );
        let (_, pods) = built(&all);
        let r1 = worker_container(&pods[1])
            .resources
            .clone()
            .expect("resources");
        let limits = r1.limits.expect("limits");
        assert_eq!(limits["cpu"].0, format!("{}m", 600 + WORKER_CPU_MILLIS));
        assert!(!limits.contains_key("memory"), "f has no memory limit");
        // No node sets resources: none for the pod either.
        let none = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: p}\nspec:\n  placement: packed\n  generator: {line: {nodes: 3}}\n";
        let (_, pods) = built(none);
        assert!(worker_container(&pods[0]).resources.is_none());
    }

    #[test]
    fn a_node_added_at_the_end_restarts_only_its_worker() {
        let (_, before) = built(PACKED6);
        let grown = PACKED6.replace(
            "  links:
",
            "    - name: g
  links:
",
        );
        let (_, after) = built(&grown);
        assert_eq!(after.len(), 3, "g opens worker 2");
        assert_eq!(hash_of(&before[0]), hash_of(&after[0]));
        assert_eq!(hash_of(&before[1]), hash_of(&after[1]));
        assert_eq!(after[2].annotations()[NODES_ANNOTATION], "g");
        // A changed node's worker is replaced, the other is not.
        let (_, changed) = built(&PACKED6.replace("cpu: 500m", "cpu: 400m"));
        assert_ne!(hash_of(&before[0]), hash_of(&changed[0]));
        assert_eq!(hash_of(&before[1]), hash_of(&changed[1]));
        // The pods to delete for restarted nodes are their workers.
        let t = topology(PACKED6);
        let v = validate(&assemble(&t, vec![], vec![]), "lab", None).expect("valid");
        let (b, e) = ("b".to_string(), "e".to_string());
        assert_eq!(
            pods_hosting(&v.plan, &[&b, &e]),
            ["packed6-worker-0", "packed6-worker-1"]
        );
        assert_eq!(pods_hosting(&v.plan, &[&b]), ["packed6-worker-0"]);
        let (_, per_node) = built(SHAPED);
        assert_eq!(per_node.len(), 3);
        let v = validate(&assemble(&topology(SHAPED), vec![], vec![]), "lab", None).expect("valid");
        assert_eq!(pods_hosting(&v.plan, &[&b]), ["line3-b"]);
    }

    #[test]
    fn a_worker_image_in_the_spec_wins() {
        let yaml = PACKED6.replace(
            "  nodesPerWorker: 3
",
            "  nodesPerWorker: 3
  workerImage: example.org/lab/worker:7
",
        );
        let (_, pods) = built(&yaml);
        assert_eq!(
            worker_container(&pods[0]).image.as_deref(),
            Some("example.org/lab/worker:7")
        );
    }

    #[test]
    fn headless_service_is_owned_and_named() {
        let t = topology(SHAPED);
        let s = service(&t, "line3");
        assert_eq!(s.metadata.name.as_deref(), Some("nm-line3"));
        let spec = s.spec.as_ref().expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert!(s.metadata.owner_references.is_some());
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
        assert_eq!(secret.secret_name.as_deref(), Some("line3-b-credentials"));
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

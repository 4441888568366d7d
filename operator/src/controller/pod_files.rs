//! Phase 3 (pure): what the pods mount besides the TUN device. Each pod gets a
//! Secret of its own with only its nodes' credentials, and a packed topology's
//! node names go into ConfigMaps of at most [`HOSTS_PER_CONFIG_MAP`] names
//! each. No object grows with the whole topology: one Secret for all nodes
//! passes the API server's 1 MiB limit at about 1,400 nodes, and a pod listing
//! every name as a host alias passes it at about 8,000.

use super::build::{labels, owned_meta};
use crate::api::Topology;
use crate::pki::{Credentials, files};
use crate::plan::{Plan, PlannedNode};
use crate::runtime::{packed, pods};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapProjection, KeyToPath, ProjectedVolumeSource, Secret, Volume,
    VolumeProjection,
};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Label telling the operator's Secrets and ConfigMaps apart by what they hold.
pub const PART_LABEL: &str = "nextmini.io/part";
pub const CREDENTIALS_PART: &str = "credentials";
pub const HOSTS_PART: &str = "hosts";
/// Annotation with a hash of the object's data, so an unchanged object is
/// recognised from a metadata-only list and not written again.
pub const CONTENT_HASH: &str = "nextmini.io/content-hash";
/// Names per hosts ConfigMap: a line is at most 39 (IPv6) + 1 + 63 (a DNS
/// label) + 1 bytes, so a full one stays under 512 KiB.
pub const HOSTS_PER_CONFIG_MAP: usize = 4096;
/// The key of a hosts ConfigMap, in `/etc/hosts` format.
pub const HOSTS_KEY: &str = "hosts";
/// Where a worker finds the hosts ConfigMaps, one file per ConfigMap.
pub const HOSTS_DIR: &str = "/etc/nextmini/hosts.d";

/// The pods of a topology and the nodes each hosts, in pod name order.
pub fn pod_shares(plan: &Plan) -> Vec<(String, Vec<&PlannedNode>)> {
    let mut shares: Vec<(String, Vec<&PlannedNode>)> = match plan.packing() {
        Some(packing) => packed::workers(plan, packing)
            .into_iter()
            .map(|(w, nodes)| (pods::worker_pod_name(&plan.topology, w), nodes))
            .collect(),
        None => plan
            .nodes
            .iter()
            .map(|n| (pods::pod_name(&plan.topology, &n.name), vec![n]))
            .collect(),
    };
    shares.sort_by(|a, b| a.0.cmp(&b.0));
    shares
}

fn content_hash<'a>(data: impl Iterator<Item = (&'a String, &'a [u8])>) -> String {
    let mut hash = Sha256::new();
    for (key, value) in data {
        hash.update((key.len() as u64).to_le_bytes());
        hash.update(key.as_bytes());
        hash.update((value.len() as u64).to_le_bytes());
        hash.update(value);
    }
    hex::encode(&hash.finalize()[..16])
}

fn part_meta(
    owner: &Topology,
    topology: &str,
    name: String,
    part: &str,
    hash: String,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    let mut l = labels(topology, None);
    l.insert(PART_LABEL.to_string(), part.to_string());
    let mut meta = owned_meta(owner, name, l);
    meta.annotations = Some(BTreeMap::from([(CONTENT_HASH.to_string(), hash)]));
    meta
}

/// Each pod's Secret: its nodes' tokens, certificates and keys, and the CA.
pub fn credential_secrets(owner: &Topology, plan: &Plan, credentials: &Credentials) -> Vec<Secret> {
    pod_shares(plan)
        .into_iter()
        .map(|(pod, nodes)| {
            let mut data = BTreeMap::from([(
                files::CA.to_string(),
                ByteString(credentials.ca_pem.clone().into_bytes()),
            )]);
            for node in nodes {
                if let Some(c) = credentials.nodes.get(&node.name) {
                    for (key, value) in [
                        (files::token(&node.name), &c.token),
                        (files::cert(&node.name), &c.cert.cert_pem),
                        (files::key(&node.name), &c.cert.key_pem),
                    ] {
                        data.insert(key, ByteString(value.clone().into_bytes()));
                    }
                }
            }
            let hash = content_hash(data.iter().map(|(k, v)| (k, v.0.as_slice())));
            Secret {
                metadata: part_meta(
                    owner,
                    &plan.topology,
                    pods::credentials_secret(&pod),
                    CREDENTIALS_PART,
                    hash,
                ),
                data: Some(data),
                type_: Some("Opaque".into()),
                ..Secret::default()
            }
        })
        .collect()
}

/// A packed topology's node names as hosts files, [`HOSTS_PER_CONFIG_MAP`]
/// per ConfigMap; none for pods of one node, which list the names as host
/// aliases.
pub fn hosts_config_maps(owner: &Topology, plan: &Plan) -> Vec<ConfigMap> {
    if plan.packing().is_none() {
        return Vec::new();
    }
    plan.nodes
        .chunks(HOSTS_PER_CONFIG_MAP)
        .enumerate()
        .map(|(part, nodes)| {
            let text: String = nodes
                .iter()
                .map(|n| format!("{}\t{}\n", n.overlay, n.name))
                .collect();
            let data = BTreeMap::from([(HOSTS_KEY.to_string(), text)]);
            let hash = content_hash(data.iter().map(|(k, v)| (k, v.as_bytes())));
            ConfigMap {
                metadata: part_meta(
                    owner,
                    &plan.topology,
                    pods::hosts_config_map(&plan.topology, part),
                    HOSTS_PART,
                    hash,
                ),
                data: Some(data),
                ..ConfigMap::default()
            }
        })
        .collect()
}

/// The `hosts` volume of a worker pod: every hosts ConfigMap, one file each.
pub fn hosts_volume(plan: &Plan) -> Volume {
    let parts = plan.nodes.len().div_ceil(HOSTS_PER_CONFIG_MAP);
    Volume {
        name: "hosts".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(
                (0..parts)
                    .map(|part| VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: pods::hosts_config_map(&plan.topology, part),
                            items: Some(vec![KeyToPath {
                                key: HOSTS_KEY.into(),
                                path: format!("part-{part:04}"),
                                mode: None,
                            }]),
                            optional: Some(false),
                        }),
                        ..VolumeProjection::default()
                    })
                    .collect(),
            ),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The content hash an object of ours carries.
pub fn hash_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(CONTENT_HASH)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::Settings;
    use crate::controller::build::{agent_pods, service};
    use crate::controller::status::summarize;
    use crate::controller::validate::{Validated, validate};
    use crate::pki::{Issued, NodeCredential};
    use crate::plan::{Manifest, parse_manifest};
    use kube::ResourceExt;

    /// Objects the operator makes stay under this, half the API server's limit.
    const LIMIT: usize = 512 * 1024;

    fn validated(yaml: &str) -> (Topology, Validated) {
        let manifest: Manifest = parse_manifest("t.yaml", yaml).expect("parses");
        let mut topology = manifest.topologies[0].object.clone();
        topology.metadata.uid = Some("0d6a5c3e-1111-4222-8333-944455556666".into());
        let v = validate(&manifest, "lab", None).expect("valid");
        (topology, v)
    }

    /// Credentials of the sizes a real CA issues (checked against one below),
    /// without signing thousands of certificates in a unit test.
    fn credentials_like_real_ones(plan: &Plan) -> Credentials {
        let ca = crate::pki::ControlCa::generate().expect("ca");
        let real =
            Credentials::issue(&ca, &plan.topology, ["n0".to_string()].iter()).expect("issue");
        let one = real.nodes["n0"].clone();
        Credentials {
            ca_pem: real.ca_pem.clone(),
            nodes: plan
                .nodes
                .iter()
                .map(|n| {
                    (
                        n.name.clone(),
                        NodeCredential {
                            token: one.token.clone(),
                            cert: Issued {
                                cert_pem: one.cert.cert_pem.clone(),
                                key_pem: one.cert.key_pem.clone(),
                            },
                        },
                    )
                })
                .collect(),
        }
    }

    fn size(object: &impl serde::Serialize) -> usize {
        serde_json::to_vec(object).expect("serializes").len()
    }

    const PACKED6: &str = include_str!("../../tests/fixtures/packed6.yaml");

    #[test]
    fn each_pod_gets_a_secret_with_only_its_nodes() {
        let (t, v) = validated(PACKED6);
        let credentials = credentials_like_real_ones(&v.plan);
        let secrets = credential_secrets(&t, &v.plan, &credentials);
        let names: Vec<String> = secrets.iter().map(|s| s.name_any()).collect();
        assert_eq!(
            names,
            [
                "packed6-worker-0-credentials",
                "packed6-worker-1-credentials"
            ]
        );
        let keys: Vec<&String> = secrets[1].data.as_ref().expect("data").keys().collect();
        assert_eq!(
            keys,
            [
                "ca.crt", "d", "d.crt", "d.key", "e", "e.crt", "e.key", "f", "f.crt", "f.key"
            ]
        );
        assert_eq!(secrets[0].labels()[PART_LABEL], CREDENTIALS_PART);
        assert!(secrets[0].metadata.owner_references.is_some());
        // The hash changes with the content and only with it.
        let again = credential_secrets(&t, &v.plan, &credentials.clone());
        assert_eq!(hash_of(&again[0].metadata), hash_of(&secrets[0].metadata));
        let mut other = credentials.clone();
        other.nodes.get_mut("a").expect("a").token = "0".repeat(64);
        let changed = credential_secrets(&t, &v.plan, &other);
        assert_ne!(hash_of(&changed[0].metadata), hash_of(&secrets[0].metadata));
        assert_eq!(hash_of(&changed[1].metadata), hash_of(&secrets[1].metadata));

        let (t, v) = validated(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: line3}\nspec:\n  generator: {line: {nodes: 3}}\n",
        );
        let secrets = credential_secrets(&t, &v.plan, &credentials_like_real_ones(&v.plan));
        let names: Vec<String> = secrets.iter().map(|s| s.name_any()).collect();
        assert_eq!(
            names,
            [
                "line3-n0-credentials",
                "line3-n1-credentials",
                "line3-n2-credentials"
            ]
        );
        assert!(
            hosts_config_maps(&t, &v.plan).is_empty(),
            "pods of one node use host aliases"
        );
    }

    /// Issue 20.4: nothing the operator writes for a 10,000-node packed
    /// topology comes near the API server's limit, and the names of all
    /// nodes reach every worker.
    fn ring(nodes: usize) -> (Topology, Validated) {
        validated(&format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: ring}}\nspec:\n  placement: packed\n  nodesPerWorker: 50\n  generator: {{ring: {{nodes: {nodes}}}}}\n"
        ))
    }

    fn settings() -> Settings {
        Settings {
            hub_address: "https://nextmini-hub.nextmini.svc:50051".into(),
            agent_image: "nextmini/agent:dev".into(),
            agent_image_pull_policy: "IfNotPresent".into(),
            agent_log: "info".into(),
        }
    }

    /// The largest pod and Secret of a packed ring.
    fn largest_pod_and_secret(nodes: usize) -> (usize, usize) {
        let (t, v) = ring(nodes);
        let pods = agent_pods(&t, &v, &settings());
        let secrets = credential_secrets(&t, &v.plan, &credentials_like_real_ones(&v.plan));
        (
            pods.iter().map(size).max().unwrap_or(0),
            secrets.iter().map(size).max().unwrap_or(0),
        )
    }

    /// What a worker pod and its Secret hold depends on its own nodes, not
    /// on how many the topology has (bar the one ConfigMap reference per
    /// 4096 names).
    #[test]
    fn a_workers_objects_do_not_grow_with_the_topology() {
        let (pod_1k, secret_1k) = largest_pod_and_secret(1_000);
        let (pod_10k, secret_10k) = largest_pod_and_secret(10_000);
        println!(
            "worker pod {pod_1k} -> {pod_10k} bytes, Secret {secret_1k} -> {secret_10k} bytes (1,000 -> 10,000 nodes)"
        );
        assert!(pod_10k * 10 <= pod_1k * 11, "{pod_1k} -> {pod_10k}");
        assert!(
            secret_10k * 10 <= secret_1k * 11,
            "{secret_1k} -> {secret_10k}"
        );
    }

    #[test]
    fn every_object_of_a_10000_node_packed_topology_stays_under_512_kib() {
        let (t, v) = ring(10_000);
        let plan = &v.plan;
        let pods = agent_pods(&t, &v, &settings());
        let secrets = credential_secrets(&t, plan, &credentials_like_real_ones(plan));
        let maps = hosts_config_maps(&t, plan);
        assert_eq!(pods.len(), 200);
        assert_eq!(secrets.len(), 200);
        assert_eq!(maps.len(), 3, "4096 names per ConfigMap");
        let mut sizes: Vec<(String, usize)> = Vec::new();
        sizes.extend(
            pods.iter()
                .map(|p| (format!("pod {}", p.name_any()), size(p))),
        );
        sizes.extend(
            secrets
                .iter()
                .map(|s| (format!("secret {}", s.name_any()), size(s))),
        );
        sizes.extend(
            maps.iter()
                .map(|m| (format!("configmap {}", m.name_any()), size(m))),
        );
        sizes.push(("service".into(), size(&service(&t, &plan.topology))));
        let problems: Vec<String> = pods
            .iter()
            .map(|p| format!("{} container worker: CrashLoopBackOff: back-off 5m0s restarting failed container", p.name_any()))
            .collect();
        sizes.push((
            "a condition naming every failing pod".into(),
            summarize(&problems).len(),
        ));
        let (name, largest) = sizes.iter().max_by_key(|(_, s)| *s).expect("objects");
        println!("largest object of 10,000 nodes: {name}, {largest} bytes");
        for (name, bytes) in &sizes {
            assert!(*bytes < LIMIT, "{name} is {bytes} bytes");
        }
        // Every name, once, in the ConfigMaps every worker mounts.
        let names: usize = maps
            .iter()
            .map(|m| m.data.as_ref().expect("data")[HOSTS_KEY].lines().count())
            .sum();
        assert_eq!(names, 10_000);
        let volume = hosts_volume(plan);
        let sources = volume.projected.and_then(|p| p.sources).expect("sources");
        assert_eq!(sources.len(), 3);
        assert!(maps[2].data.as_ref().expect("data")[HOSTS_KEY].contains("\tn9999\n"));
    }
}

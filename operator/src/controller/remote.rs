//! Member clusters as places to put objects: a client for each one's API
//! server from the kubeconfig its MemberCluster's Secret holds, kept while
//! the kubeconfig stays the same, and what the operator needs to know to run
//! a topology's nodes there.
//!
//! Objects in a member carry no owner reference (an owner in another cluster
//! would make the member's garbage collector delete them at once); they carry
//! the topology's label, the member's name in [`CLUSTER_LABEL`] and the
//! topology's UID in [`OWNER_UID_LABEL`], and the operator deletes them by
//! label when the topology or its nodes there go.

use crate::api::{MemberCluster, SecretKeySelector};
use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::time::Duration;

/// The MemberCluster an object in a member cluster was made for. Objects of
/// the operator's own cluster have none, so a member that is the operator's
/// own cluster under another kubeconfig never sees its objects taken for
/// the home's, nor the other way round.
pub const CLUSTER_LABEL: &str = "nextmini.io/cluster";
/// The UID of the Topology an object in a member cluster belongs to (it
/// cannot carry an owner reference there).
pub const OWNER_UID_LABEL: &str = "nextmini.io/owner-uid";

/// Every request to a member gives up after this: an unreachable member
/// must not hold up the reconcile of the nodes that run elsewhere.
pub const MEMBER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a member cluster could not be reached, in the words of what failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable {
    /// `SecretNotFound`, `KeyNotFound`, `InvalidKubeconfig`, ...
    pub reason: &'static str,
    pub message: String,
}

fn unreachable(reason: &'static str, message: String) -> Unreachable {
    Unreachable { reason, message }
}

/// The client configuration of the kubeconfig at `secret_ref`, with the
/// member's timeouts.
pub async fn config_from_secret(
    client: &Client,
    secret_ref: &SecretKeySelector,
    timeout: Duration,
) -> Result<(kube::Config, String), Unreachable> {
    let text = kubeconfig_text(client, secret_ref).await?;
    let config = config_of(&text, secret_ref, timeout).await?;
    Ok((config, text))
}

async fn kubeconfig_text(
    client: &Client,
    secret_ref: &SecretKeySelector,
) -> Result<String, Unreachable> {
    let at = format!(
        "secret {}/{} key {:?}",
        secret_ref.namespace, secret_ref.name, secret_ref.key
    );
    let secret = match Api::<Secret>::namespaced(client.clone(), &secret_ref.namespace)
        .get_opt(&secret_ref.name)
        .await
    {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(unreachable(
                "SecretNotFound",
                format!("spec.kubeconfigSecretRef: {at}: no such Secret"),
            ));
        }
        Err(e) => {
            return Err(unreachable(
                "SecretUnreadable",
                format!("spec.kubeconfigSecretRef: {at}: {e}"),
            ));
        }
    };
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(&secret_ref.key)) else {
        return Err(unreachable(
            "KeyNotFound",
            format!("spec.kubeconfigSecretRef.key: {at}: the Secret has no such key"),
        ));
    };
    String::from_utf8(bytes.0.clone()).map_err(|_| {
        unreachable(
            "InvalidKubeconfig",
            format!("spec.kubeconfigSecretRef: {at}: not UTF-8"),
        )
    })
}

async fn config_of(
    text: &str,
    secret_ref: &SecretKeySelector,
    timeout: Duration,
) -> Result<kube::Config, Unreachable> {
    let at = format!(
        "secret {}/{} key {:?}",
        secret_ref.namespace, secret_ref.name, secret_ref.key
    );
    let config = match Kubeconfig::from_yaml(text) {
        Ok(k) => kube::Config::from_custom_kubeconfig(k, &KubeConfigOptions::default()).await,
        Err(e) => Err(e),
    };
    let mut config = config.map_err(|e| {
        unreachable(
            "InvalidKubeconfig",
            format!("spec.kubeconfigSecretRef: {at}: {e}"),
        )
    })?;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Ok(config)
}

/// Clients of the member clusters, by MemberCluster name, each with a hash
/// of the kubeconfig it was made from: a rotated kubeconfig makes a new one.
#[derive(Default)]
pub struct Clients {
    by_member: tokio::sync::Mutex<HashMap<String, (Vec<u8>, Member)>>,
}

/// A member cluster's client and its API server's URL (for messages).
#[derive(Clone)]
pub struct Member {
    pub client: Client,
    pub server: String,
}

impl Clients {
    /// A client for the member's API server (the Secret is read each time:
    /// one small GET in the operator's own cluster).
    pub async fn of(&self, home: &Client, member: &MemberCluster) -> Result<Member, Unreachable> {
        let name = member.metadata.name.clone().unwrap_or_default();
        let Some(secret_ref) = &member.spec.kubeconfig_secret_ref else {
            return Ok(Member {
                client: home.clone(),
                server: "the operator's own API server".into(),
            });
        };
        let text = kubeconfig_text(home, secret_ref).await?;
        let hash = Sha256::digest(text.as_bytes()).to_vec();
        if let Some((h, member)) = self.by_member.lock().await.get(&name)
            && *h == hash
        {
            return Ok(member.clone());
        }
        let config = config_of(&text, secret_ref, MEMBER_TIMEOUT).await?;
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config)
            .map_err(|e| unreachable("InvalidKubeconfig", format!("API server {server}: {e}")))?;
        let member = Member { client, server };
        self.by_member
            .lock()
            .await
            .insert(name, (hash, member.clone()));
        Ok(member)
    }
}

/// What the operator keeps per (topology key, member cluster) between
/// reconciles; a deleted topology's entries go with [`PerMember::forget`].
pub struct PerMember<V>(std::sync::Mutex<HashMap<(String, String), V>>);

impl<V> Default for PerMember<V> {
    fn default() -> Self {
        PerMember(std::sync::Mutex::new(HashMap::new()))
    }
}

impl<V> PerMember<V> {
    /// Removes and returns what was kept for `slot`.
    pub fn take(&self, slot: &(String, String)) -> Option<V> {
        self.0.lock().ok().and_then(|mut all| all.remove(slot))
    }

    /// Replaces what is kept for `slot` with what `next` makes of it, under
    /// one lock; returns what `next` gave back beside it.
    pub fn update<R>(
        &self,
        slot: (String, String),
        next: impl FnOnce(Option<V>) -> (V, R),
    ) -> Option<R> {
        let mut all = self.0.lock().ok()?;
        let before = all.remove(&slot);
        let (kept, out) = next(before);
        all.insert(slot, kept);
        Some(out)
    }

    /// Forgets everything kept for the topology `key`.
    pub fn forget(&self, key: &str) {
        if let Ok(mut all) = self.0.lock() {
            all.retain(|(k, _), _| k != key);
        }
    }
}

/// Makes an object built for the operator's own cluster one for `cluster`:
/// its namespace there, no owner reference, the member's and the owner's
/// labels.
pub fn move_into(
    meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    cluster: &str,
    namespace: &str,
    owner_uid: Option<&str>,
) {
    meta.namespace = Some(namespace.to_owned());
    meta.owner_references = None;
    let labels = meta.labels.get_or_insert_with(Default::default);
    labels.insert(CLUSTER_LABEL.to_owned(), cluster.to_owned());
    if let Some(uid) = owner_uid {
        labels.insert(OWNER_UID_LABEL.to_owned(), uid.to_owned());
    }
}

//! One fake agent's identity and control session, and the topology whose nodes
//! the fleet plays.

use anyhow::Context;
use hyper_util::rt::TokioIo;
use nextmini_operator::plan;
use nextmini_operator::store::Store;
use nextmini_proto::v1 as pb;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Endpoint, Uri};

/// One node as an agent proves it to the hub: what `nextmini` gave it.
#[derive(Debug, Clone)]
pub struct Identity {
    pub topology: String,
    pub node: String,
    pub credential_file: PathBuf,
}

/// An open control session: what the agent sends, and what the hub sends it.
pub struct Session {
    pub tx: mpsc::Sender<pb::AgentMessage>,
    pub inbound: tonic::Streaming<pb::ControllerMessage>,
}

/// Opens one agent's control session over the hub's Unix socket and says Hello
/// with the node's credential. Everything that connection set-up needs is here,
/// so a change of it (client certificates on the control stream, which will sit
/// beside the credential file) is made in one place.
pub async fn open_session(hub_socket: &Path, id: &Identity) -> anyhow::Result<Session> {
    let credential = std::fs::read_to_string(&id.credential_file)
        .with_context(|| format!("reading {}", id.credential_file.display()))?;
    let path = hub_socket.to_path_buf();
    // The URI is required but unused: the connector picks the socket.
    let channel = Endpoint::from_static("http://hub.local")
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await?;
    let mut client = pb::control_client::ControlClient::new(channel);
    let (tx, rx) = mpsc::channel(64);
    tx.send(message(pb::agent_message::Msg::Hello(pb::Hello {
        topology: id.topology.clone(),
        node: id.node.clone(),
        credential: credential.trim().to_string(),
        protocol_version: nextmini_proto::PROTOCOL_VERSION,
        capabilities: vec!["tcp".into()],
        running_generation: 0,
        pid: std::process::id(),
    })))
    .await?;
    let inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Session { tx, inbound })
}

pub(super) fn message(msg: pb::agent_message::Msg) -> pb::AgentMessage {
    pb::AgentMessage { msg: Some(msg) }
}

/// Plans `text` with the planner `nextmini up` uses and stores it with the store
/// code `up` uses, giving each node a fresh credential: its SHA-256 goes to the
/// store, the credential itself to `<state>/credentials/<topology>/<node>`
/// (0600), where `nextmini up` keeps it and `nextmini down` removes it. No node
/// is started: the fleet plays the agents.
pub async fn store_topology(
    state_dir: &Path,
    database_url: &str,
    text: &str,
) -> anyhow::Result<(plan::Plan, Vec<Identity>)> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let manifest = plan::parse_manifest("load.yaml", text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let plan = plan::plan_manifest(&manifest)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .into_iter()
        .next()
        .context("no topology")?;
    let dir = state_dir.join("credentials").join(&plan.topology);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let mut hashes = BTreeMap::new();
    let mut identities = Vec::new();
    for node in &plan.nodes {
        let credential = hex::encode(rand::random::<[u8; 32]>());
        hashes.insert(
            node.name.clone(),
            hex::encode(Sha256::digest(credential.as_bytes())),
        );
        let file = dir.join(&node.name);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&file)?;
        std::io::Write::write_all(&mut f, credential.as_bytes())?;
        identities.push(Identity {
            topology: plan.topology.clone(),
            node: node.name.clone(),
            credential_file: file,
        });
    }
    let store = Store::connect(database_url).await?;
    store.apply_plan(&plan, "netns", text, &hashes).await?;
    store.ensure_link_identity(&plan.topology).await?;
    Ok((plan, identities))
}

//! One fake agent's identity and control session, and the topology whose nodes
//! the fleet plays.

use anyhow::Context;
use hyper_util::rt::TokioIo;
use nextmini_operator::pki::{Credentials, files};
use nextmini_operator::plan;
use nextmini_operator::store::Store;
use nextmini_proto::tls::{HUB_SERVER_NAME, client_config};
use nextmini_proto::v1 as pb;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// One node as an agent proves it to the hub: the files `nextmini` keeps for it
/// in `<state>/credentials/<topology>/` (token, certificate, key, and the
/// control CA it trusts).
#[derive(Debug, Clone)]
pub struct Identity {
    pub topology: String,
    pub node: String,
    pub dir: PathBuf,
}

impl Identity {
    fn read(&self, name: &str) -> anyhow::Result<Vec<u8>> {
        let path = self.dir.join(name);
        std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
    }
}

/// Where the fleet dials the hub: its Unix socket in local mode, or a TCP
/// address (the operator's hub in a cluster).
#[derive(Debug, Clone)]
pub enum HubAddress {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// An open control session: what the agent sends, and what the hub sends it.
pub struct Session {
    pub tx: mpsc::Sender<pb::AgentMessage>,
    pub inbound: tonic::Streaming<pb::ControllerMessage>,
}

/// Opens one agent's control session as `nextmini-agent` does: TLS with the
/// node's client certificate, trusting only the control CA and the hub's fixed
/// name, then Hello with the node's token. Everything that connection set-up
/// needs is here, in one place.
pub async fn open_session(hub: &HubAddress, id: &Identity) -> anyhow::Result<Session> {
    let token = String::from_utf8(id.read(&files::token(&id.node))?)?;
    let tls = client_config(
        &id.read(files::CA)?,
        &id.read(&files::cert(&id.node))?,
        &id.read(&files::key(&id.node))?,
    )?;
    let connector = TlsConnector::from(Arc::new(tls));
    let channel = match hub.clone() {
        HubAddress::Unix(path) => {
            tls_channel(connector, move || {
                tokio::net::UnixStream::connect(path.clone())
            })
            .await?
        }
        HubAddress::Tcp(addr) => {
            tls_channel(connector, move || tokio::net::TcpStream::connect(addr)).await?
        }
    };
    let mut client = pb::control_client::ControlClient::new(channel);
    let (tx, rx) = mpsc::channel(64);
    tx.send(message(pb::agent_message::Msg::Hello(pb::Hello {
        topology: id.topology.clone(),
        node: id.node.clone(),
        credential: token.trim().to_string(),
        protocol_version: nextmini_proto::PROTOCOL_VERSION,
        capabilities: vec!["tcp".into()],
        running_generation: 0,
        pid: std::process::id(),
    })))
    .await?;
    let inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Session { tx, inbound })
}

/// A gRPC channel over TLS on whatever stream `dial` opens. The URI is
/// required but unused: the connector dials and does TLS itself.
async fn tls_channel<S, D, F>(connector: TlsConnector, dial: D) -> anyhow::Result<Channel>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    D: Fn() -> F + Clone + Send + 'static,
    F: Future<Output = std::io::Result<S>> + Send,
{
    Ok(Endpoint::from_static("http://hub.nextmini.internal")
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let dial = dial.clone();
            let connector = connector.clone();
            async move {
                let stream = dial().await?;
                let name = ServerName::try_from(HUB_SERVER_NAME).map_err(std::io::Error::other)?;
                Ok::<_, std::io::Error>(TokioIo::new(connector.connect(name, stream).await?))
            }
        }))
        .await?)
}

pub(super) fn message(msg: pb::agent_message::Msg) -> pb::AgentMessage {
    pb::AgentMessage { msg: Some(msg) }
}

/// Plans `text` with the planner `nextmini up` uses and stores it with the store
/// code `up` uses. Each node gets what `up` gives it: a token (its SHA-256 goes to
/// the store) and a client certificate of the store's control CA, written with
/// the CA's certificate to `<state>/credentials/<topology>/` (0600), where `up`
/// keeps them and `nextmini down` removes them. No node is started: the fleet
/// plays the agents.
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
    let store = Store::connect(database_url).await?;
    let names: Vec<String> = plan.nodes.iter().map(|n| n.name.clone()).collect();
    let credentials = Credentials::issue(&store.control_ca().await?, &plan.topology, names.iter())?;
    let dir = state_dir.join("credentials").join(&plan.topology);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    for (name, content) in credentials.files() {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(dir.join(&name))?;
        std::io::Write::write_all(&mut f, content.as_bytes())?;
    }
    store
        .apply_plan(
            &plan,
            "netns",
            text,
            &credentials.token_hashes(names.iter()),
        )
        .await?;
    store.ensure_link_identity(&plan.topology).await?;
    let identities = names
        .into_iter()
        .map(|node| Identity {
            topology: plan.topology.clone(),
            node,
            dir: dir.clone(),
        })
        .collect();
    Ok((plan, identities))
}

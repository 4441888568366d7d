//! Accepts link connections from peers that dial this node (TCP, and QUIC on
//! the same port over UDP), reads their handshake and hands each connection to
//! the link it names.

use crate::conn::Conn;
use crate::frame::{self, FrameKind, LinkHello};
use crate::link::LinkHandle;
use crate::link_auth::LinkKey;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

/// Links by name, swapped whole when the config changes.
pub type LinkMap = Arc<ArcSwap<HashMap<String, Arc<LinkHandle>>>>;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_HELLO: usize = 1024;

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    // The underlay address may still be settling right after the namespace was
    // made; retry briefly rather than fail the agent.
    let mut last = None;
    for _ in 0..50 {
        match TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("bind failed")))
}

pub async fn run_tcp(
    listener: TcpListener,
    topology: String,
    links: LinkMap,
    auth: Option<LinkKey>,
) {
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "set_nodelay failed");
        }
        crate::congestion::apply_to_link(&stream);
        spawn_handshake(
            Conn::tcp(stream),
            from,
            topology.clone(),
            links.clone(),
            auth.clone(),
        );
    }
}

pub async fn run_quic(
    endpoint: quinn::Endpoint,
    topology: String,
    links: LinkMap,
    auth: Option<LinkKey>,
) {
    while let Some(incoming) = endpoint.accept().await {
        let topology = topology.clone();
        let links = links.clone();
        let auth = auth.clone();
        tokio::spawn(async move {
            let from = incoming.remote_address();
            let accepted = async {
                let connection = incoming.await.map_err(|e| e.to_string())?;
                let (send, recv) = connection.accept_bi().await.map_err(|e| e.to_string())?;
                Ok::<_, String>(Conn::quic(connection, send, recv))
            };
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, accepted).await {
                Ok(Ok(conn)) => spawn_handshake(conn, from, topology, links, auth),
                Ok(Err(e)) => tracing::warn!(%from, error = %e, "QUIC link refused"),
                Err(_) => tracing::warn!(%from, "QUIC link handshake timed out"),
            }
        });
    }
}

fn spawn_handshake(
    conn: Conn,
    from: SocketAddr,
    topology: String,
    links: LinkMap,
    auth: Option<LinkKey>,
) {
    tokio::spawn(async move {
        match tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            handshake(conn, &topology, &links, auth.as_ref()),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(%from, error = %e, "link handshake refused"),
            Err(_) => tracing::warn!(%from, "link handshake timed out"),
        }
    });
}

async fn handshake(
    mut conn: Conn,
    topology: &str,
    links: &LinkMap,
    auth: Option<&LinkKey>,
) -> Result<(), String> {
    // Read exactly one frame, so no byte of the data that follows is consumed here.
    let mut buf = vec![0u8; 4];
    conn.reader
        .read_exact(&mut buf)
        .await
        .map_err(|e| e.to_string())?;
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_HELLO {
        return Err(format!("handshake frame of {len} bytes is too long"));
    }
    buf.resize(4 + len, 0);
    conn.reader
        .read_exact(&mut buf[4..])
        .await
        .map_err(|e| e.to_string())?;
    let (header, _) = frame::decode(&buf)
        .map_err(|e| e.to_string())?
        .ok_or("incomplete handshake frame")?;
    if header.kind != FrameKind::Hello {
        return Err("first frame is not a handshake".into());
    }
    let payload = &buf[frame::HEADER_LEN..];
    let hello = LinkHello::decode(payload).map_err(|e| e.to_string())?;
    if let Some(key) = auth {
        // The hello's own bytes are re-encoded to find where the tag starts.
        let signed = hello.encode();
        let tag = payload.get(signed.len()..).unwrap_or_default();
        key.verify(&signed, tag, crate::link_auth::unix_ms())
            .map_err(|e| format!("link {} from {}: {e}", hello.link, hello.node))?;
    }
    if hello.topology != topology {
        return Err(format!("peer belongs to topology {}", hello.topology));
    }
    let link = links
        .load()
        .get(&hello.link)
        .cloned()
        .ok_or_else(|| format!("no link {}", hello.link))?;
    if link.spec.peer_node != hello.node {
        return Err(format!(
            "link {} connects to {}, not {}",
            hello.link, link.spec.peer_node, hello.node
        ));
    }
    link.attach(conn).await;
    Ok(())
}

//! Accepts link connections from peers that dial this node, reads their handshake
//! and hands each connection to the link it names.

use crate::frame::{self, FrameKind, LinkHello};
use crate::link::LinkHandle;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

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

pub async fn run(listener: TcpListener, topology: String, links: LinkMap) {
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let links = links.clone();
        let topology = topology.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(stream, &topology, &links))
                .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(%from, error = %e, "link handshake refused"),
                Err(_) => tracing::warn!(%from, "link handshake timed out"),
            }
        });
    }
}

async fn handshake(mut stream: TcpStream, topology: &str, links: &LinkMap) -> Result<(), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    // Read exactly one frame, so no byte of the data that follows is consumed here.
    let mut buf = vec![0u8; 4];
    stream
        .read_exact(&mut buf)
        .await
        .map_err(|e| e.to_string())?;
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_HELLO {
        return Err(format!("handshake frame of {len} bytes is too long"));
    }
    buf.resize(4 + len, 0);
    stream
        .read_exact(&mut buf[4..])
        .await
        .map_err(|e| e.to_string())?;
    let (header, _) = frame::decode(&buf)
        .map_err(|e| e.to_string())?
        .ok_or("incomplete handshake frame")?;
    if header.kind != FrameKind::Hello {
        return Err("first frame is not a handshake".into());
    }
    let hello = LinkHello::decode(&buf[frame::HEADER_LEN..]).map_err(|e| e.to_string())?;
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
    link.attach(stream).await;
    Ok(())
}

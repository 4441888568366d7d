//! Max mode: a connection relayed hop by hop over TCP connections of its own,
//! spliced at every agent, past TUN, processors and the emulated links.
//!
//! The source agent (a SOCKS server in max mode) asks the routing table for the
//! connection's next hop, connects to that neighbour's relay (its underlay address,
//! port `max_port`) and sends a [`header::MaxHeader`]. The neighbour checks the
//! header's tag, asks its own routing table, and either connects onward the same
//! way or, at the destination, connects to the target locally. Every hop answers
//! its predecessor with one status byte (a SOCKS5 reply code) once the rest of the
//! path is open, then splices bytes between its two sockets.
//!
//! A connection to the destination's port [`SINK_PORT`] (the synthetic flows'
//! sink port) ends in the destination agent itself: it reads everything, then
//! answers the number of bytes it read (u64, big-endian). Max-mode `Flow`s use it.

pub mod header;
pub mod splice;

use crate::relay::{NextHop, Relay};
use crate::socks::handshake::Reply;
use header::{HEADER_LEN, MaxHeader};
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Max-mode connections to this port of their destination are sunk by its agent.
pub const SINK_PORT: u16 = crate::synth::stack::LISTEN_PORT;

/// For connecting, sending or reading a header, and waiting for the status.
const HOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts hop connections from neighbours' relays.
pub async fn serve(listener: TcpListener, relay: Arc<Relay>) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                crate::congestion::apply_to_link(&stream);
                let relay = relay.clone();
                tokio::spawn(async move {
                    if let Err(e) = hop(stream, &relay).await {
                        relay.counters.max_refused.fetch_add(1, Relaxed);
                        tracing::warn!(%from, error = %e, "max-mode hop refused");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "max-mode accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One connection arriving from the previous hop.
async fn hop(mut upstream: TcpStream, relay: &Relay) -> Result<(), String> {
    let mut buf = [0u8; HEADER_LEN];
    tokio::time::timeout(HOP_TIMEOUT, upstream.read_exact(&mut buf))
        .await
        .map_err(|_| "no header in time".to_string())?
        .map_err(|e| format!("reading the header: {e}"))?;
    let key = relay
        .view
        .load()
        .key
        .clone()
        .ok_or("this node has no link key yet")?;
    let header = MaxHeader::open(&buf, &key, crate::link_auth::unix_ms())
        .map_err(|e| format!("header: {e}"))?;
    let onward = connect_onward(relay, &header).await;
    let status = match &onward {
        Ok(_) => Reply::Succeeded,
        Err((reply, _)) => *reply,
    };
    // The predecessor may have given up; then there is nothing to relay.
    let _ = upstream.write_all(&[status as u8]).await;
    match onward.map_err(|(_, why)| format!("to {}: {why}", header.dst))? {
        Onward::Stream(downstream) => {
            let _ = upstream.set_nodelay(true);
            relay_max(relay, &upstream, &downstream).await;
        }
        Onward::Sink => {
            if let Err(e) = sink(relay, upstream).await {
                tracing::debug!(error = %e, "max-mode sink ended with an error");
            }
        }
    }
    Ok(())
}

/// Reads a connection to its end, then answers how many bytes it read.
async fn sink(relay: &Relay, mut upstream: TcpStream) -> std::io::Result<()> {
    let _active = relay.counters.connection(true);
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = upstream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total += n as u64;
        relay.counters.bytes(true).fetch_add(n as u64, Relaxed);
    }
    upstream.write_all(&total.to_be_bytes()).await?;
    upstream.shutdown().await
}

/// Where a hop's connection goes on to.
enum Onward {
    Stream(TcpStream),
    /// This agent is the destination and sinks the bytes.
    Sink,
}

/// Opens the rest of a max-mode path from the source node: what the SOCKS server
/// calls for a connection from `src` (this node's overlay address and the client's
/// port) to `dst`.
/// `label` is the route id of an explicit path to follow (0: none).
pub async fn open(
    relay: &Relay,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    label: u32,
) -> Result<TcpStream, (Reply, String)> {
    let header = MaxHeader {
        hops: 0,
        label,
        src,
        dst,
    };
    match connect_onward(relay, &header).await? {
        Onward::Stream(s) => Ok(s),
        Onward::Sink => Err((
            Reply::NotAllowed,
            format!("{dst} is this node's own sink port"),
        )),
    }
}

/// Connects to the destination when it is this node, else to the next relay,
/// whose status byte says whether the rest of the path opened.
async fn connect_onward(relay: &Relay, header: &MaxHeader) -> Result<Onward, (Reply, String)> {
    let next = relay
        .next_hop(header.src, header.dst, header.label)
        .map_err(|why| (Reply::NetworkUnreachable, why.to_string()))?;
    match next {
        NextHop::Here if header.dst.port() == SINK_PORT => Ok(Onward::Sink),
        NextHop::Here => connect_here(relay, header.dst).await.map(Onward::Stream),
        NextHop::Relay { addr, label } => {
            let Some(hops) = relay.hop_limit().next(header.hops) else {
                return Err((
                    Reply::TtlExpired,
                    format!(
                        "{} relays crossed, the topology's hop limit: a routing loop",
                        header.hops
                    ),
                ));
            };
            let key = relay.view.load().key.clone().ok_or((
                Reply::GeneralFailure,
                "this node has no link key yet".to_string(),
            ))?;
            let mut stream = connect(addr.as_str()).await?;
            let next = MaxHeader {
                hops,
                label,
                ..*header
            };
            let sealed = next.seal(&key, crate::link_auth::unix_ms());
            let status = tokio::time::timeout(HOP_TIMEOUT, async {
                stream.write_all(&sealed).await?;
                stream.read_u8().await
            })
            .await
            .map_err(|_| {
                (
                    Reply::HostUnreachable,
                    format!("relay {addr} did not answer"),
                )
            })?
            .map_err(|e| (Reply::GeneralFailure, format!("relay {addr}: {e}")))?;
            match Reply::from_code(status) {
                Reply::Succeeded => Ok(Onward::Stream(stream)),
                reply => Err((reply, format!("relay {addr} answered {reply:?}"))),
            }
        }
    }
}

/// The destination is this node: the connection starts in its namespace, where
/// its applications listen.
async fn connect_here(relay: &Relay, dst: SocketAddrV4) -> Result<TcpStream, (Reply, String)> {
    tokio::time::timeout(HOP_TIMEOUT, relay.node.connect(SocketAddr::V4(dst)))
        .await
        .map_err(|_| {
            (
                Reply::HostUnreachable,
                format!("connecting to {dst} timed out"),
            )
        })?
        .map_err(|e| (Reply::from_io(&e), format!("connecting to {dst}: {e}")))
}

/// `addr` is `host:port`; a host name is resolved here.
async fn connect(addr: &str) -> Result<TcpStream, (Reply, String)> {
    let stream = tokio::time::timeout(HOP_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| {
            (
                Reply::HostUnreachable,
                format!("connecting to {addr} timed out"),
            )
        })?
        .map_err(|e| (Reply::from_io(&e), format!("connecting to {addr}: {e}")))?;
    let _ = stream.set_nodelay(true);
    crate::congestion::apply_to_link(&stream);
    Ok(stream)
}

/// Splices a max-mode connection until both directions end, counting it.
pub async fn relay_max(relay: &Relay, a: &TcpStream, b: &TcpStream) {
    let counters = &relay.counters;
    let _active = counters.connection(true);
    let meter = splice::Meter {
        bytes: counters.bytes(true),
        fallbacks: &counters.splice_fallbacks,
    };
    match splice::relay(a, b, &meter).await {
        Ok(moved) => tracing::debug!(?moved, "max-mode connection done"),
        Err(e) => tracing::debug!(error = %e, "max-mode connection ended with an error"),
    }
}

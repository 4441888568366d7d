//! TLS on the hub's listeners (TCP in a cluster, the Unix socket locally): every
//! agent must present a client certificate of the control CA. The node it names
//! travels with the connection to the session, which holds Hello to it.

use crate::observe::{HubMetrics, Refusal};
use futures::{Stream, StreamExt};
use nextmini_proto::tls::{NodeIdentity, identity_of};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

/// A slow or stalled handshake must not hold a task for long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Handshakes in flight at once. Unbounded, thousands of agents reconnecting
/// together all slow down at once past `HANDSHAKE_TIMEOUT`, retry and slow
/// the next round too: 10,000 agents at an operator's hub fell from 115
/// connects a second to 6 (BENCHMARKS.md, "Operator memory with every agent
/// connected"). Bounded, the rest wait in the kernel's accept queue and every
/// accepted handshake finishes in its time. Large enough that a few stalled
/// clients cannot hold up the rest for long.
const HANDSHAKES_IN_FLIGHT: usize = 256;

/// The node a connection's certificate names; tonic puts it in every request's
/// extensions.
#[derive(Debug, Clone)]
pub struct PeerNode(pub NodeIdentity);

/// An accepted, authenticated TLS connection.
pub struct TlsConnection<IO> {
    stream: TlsStream<IO>,
    peer: NodeIdentity,
}

impl<IO> Connected for TlsConnection<IO> {
    type ConnectInfo = PeerNode;

    fn connect_info(&self) -> PeerNode {
        PeerNode(self.peer.clone())
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsConnection<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsConnection<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Handshakes every connection `listener` accepts, each in its own task so one
/// slow client holds up no other, and yields those whose certificate verified
/// and names a node. Refusals are logged and counted.
pub fn authenticated<S, IO>(
    listener: S,
    config: Arc<rustls::ServerConfig>,
    metrics: Arc<HubMetrics>,
) -> ReceiverStream<io::Result<TlsConnection<IO>>>
where
    S: Stream<Item = io::Result<IO>> + Send + Unpin + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        let mut listener = listener;
        let permits = Arc::new(Semaphore::new(HANDSHAKES_IN_FLIGHT));
        loop {
            let permit = tokio::select! {
                _ = tx.closed() => return,
                permit = permits.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            let io = tokio::select! {
                // The server stopped taking connections: stop listening too.
                _ = tx.closed() => return,
                next = listener.next() => match next {
                    Some(Ok(io)) => io,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "accepting a control connection failed");
                        continue;
                    }
                    None => return,
                },
            };
            let (acceptor, tx, metrics) = (acceptor.clone(), tx.clone(), metrics.clone());
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await;
                drop(permit);
                let stream = match handshake {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        metrics.refused(Refusal::TlsHandshake);
                        tracing::warn!(error = %e, "refused a control connection: TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        metrics.refused(Refusal::TlsHandshake);
                        tracing::warn!("refused a control connection: no TLS handshake within 5 s");
                        return;
                    }
                };
                let peer = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(identity_of);
                let Some(peer) = peer else {
                    metrics.refused(Refusal::NoIdentity);
                    tracing::warn!("refused a control connection: its certificate names no node");
                    return;
                };
                let _ = tx.send(Ok(TlsConnection { stream, peer })).await;
            });
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::ControlCa;

    #[tokio::test]
    async fn handshakes_in_flight_are_bounded() {
        let ca = ControlCa::generate().expect("a CA");
        let hub = ca.issue_hub().expect("a hub certificate");
        let config = nextmini_proto::tls::server_config(
            ca.cert_pem().as_bytes(),
            hub.cert_pem.as_bytes(),
            hub.key_pem.as_bytes(),
        )
        .expect("a server config");
        // Clients that connected and never speak: each holds a handshake.
        let total = HANDSHAKES_IN_FLIGHT + 50;
        let (connections, listener) = mpsc::channel(total);
        let mut clients = Vec::new();
        for _ in 0..total {
            let (client, server) = tokio::io::duplex(1024);
            clients.push(client);
            connections.send(Ok(server)).await.expect("queued");
        }
        let _incoming = authenticated(
            ReceiverStream::new(listener),
            Arc::new(config),
            Arc::new(HubMetrics::new()),
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        // What the hub took off the accept queue.
        let taken = connections.capacity();
        assert_eq!(taken, HANDSHAKES_IN_FLIGHT, "{taken} of {total} taken");
    }
}

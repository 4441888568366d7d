//! A virtual link: one persistent TCP connection to the peer agent, carrying
//! length-prefixed frames. The dialing side reconnects with backoff; the accepting
//! side takes whatever connection the listener hands it. Packets queued while the
//! link is down wait in the queue and are tail-dropped when it is full.

use crate::counters::LinkCounters;
use crate::frame::{Frame, FrameCodec, FrameHeader, FrameKind, LinkHello};
use crate::packet::Packet;
use crate::processor::Processors;
use futures::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::{FramedRead, FramedWrite};

const LINK_QUEUE: usize = 1024;
/// Frames written before the writer flushes, so a burst costs one syscall.
const WRITE_BATCH: usize = 64;
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Dial { peer: SocketAddr },
    Accept,
}

/// Identity carried in the link handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub topology: String,
    pub name: String,
    pub local_node: String,
    pub peer_node: String,
    pub role: Role,
}

/// Handle to a running link; dropping the last one stops its task.
pub struct LinkHandle {
    pub spec: LinkSpec,
    pub counters: Arc<LinkCounters>,
    queue: mpsc::Sender<Packet>,
    attach: mpsc::Sender<TcpStream>,
    _stop: watch::Sender<()>,
}

impl std::fmt::Debug for LinkHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkHandle")
            .field("spec", &self.spec)
            .finish()
    }
}

impl LinkHandle {
    pub fn spawn(spec: LinkSpec, processors: Processors) -> Arc<LinkHandle> {
        let (queue, queue_rx) = mpsc::channel(LINK_QUEUE);
        let (attach, attach_rx) = mpsc::channel(4);
        let (stop, stop_rx) = watch::channel(());
        let counters = Arc::new(LinkCounters::default());
        let task = LinkTask {
            spec: spec.clone(),
            counters: counters.clone(),
            processors,
            queue: queue_rx,
            attach: attach_rx,
            stop: stop_rx,
        };
        tokio::spawn(task.run());
        Arc::new(LinkHandle {
            spec,
            counters,
            queue,
            attach,
            _stop: stop,
        })
    }

    /// Queues a packet for the peer; a full queue drops it (tail drop).
    pub fn enqueue(&self, packet: Packet) {
        if self.queue.try_send(packet).is_err() {
            self.counters.count_drop();
        }
    }

    /// Gives an accepted connection (handshake already read) to this link.
    pub async fn attach(&self, stream: TcpStream) {
        if self.attach.send(stream).await.is_err() {
            tracing::debug!(link = %self.spec.name, "link stopped; connection dropped");
        }
    }
}

struct LinkTask {
    spec: LinkSpec,
    counters: Arc<LinkCounters>,
    processors: Processors,
    queue: mpsc::Receiver<Packet>,
    attach: mpsc::Receiver<TcpStream>,
    stop: watch::Receiver<()>,
}

impl LinkTask {
    async fn run(mut self) {
        let mut next: Option<TcpStream> = None;
        loop {
            let stream = match next.take() {
                Some(s) => s,
                None => match self.connect().await {
                    Some(s) => s,
                    None => return,
                },
            };
            self.counters.connected.store(true, Relaxed);
            self.counters.connects.fetch_add(1, Relaxed);
            tracing::info!(link = %self.spec.name, peer = %self.spec.peer_node, "link up");
            let outcome = self.carry(stream).await;
            self.counters.connected.store(false, Relaxed);
            match outcome {
                Outcome::Stopped => return,
                Outcome::Replaced(s) => next = Some(s),
                Outcome::Broken(reason) => {
                    tracing::warn!(link = %self.spec.name, %reason, "link down")
                }
            }
        }
    }

    /// A fresh connection: dialed with backoff, or handed over by the listener.
    /// `None` when the link is being removed.
    async fn connect(&mut self) -> Option<TcpStream> {
        match self.spec.role.clone() {
            Role::Accept => tokio::select! {
                s = self.attach.recv() => s,
                _ = self.stop.changed() => None,
            },
            Role::Dial { peer } => {
                let mut backoff = BACKOFF_MIN;
                loop {
                    match self.dial(peer).await {
                        Ok(s) => return Some(s),
                        Err(e) => {
                            tracing::debug!(link = %self.spec.name, %peer, error = %e, "dial failed")
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.stop.changed() => return None,
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    async fn dial(&self, peer: SocketAddr) -> std::io::Result<TcpStream> {
        let stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(peer))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
        stream.set_nodelay(true)?;
        let hello = LinkHello {
            topology: self.spec.topology.clone(),
            link: self.spec.name.clone(),
            node: self.spec.local_node.clone(),
        };
        let mut writer = FramedWrite::new(stream, FrameCodec);
        writer
            .send(control_frame(FrameKind::Hello, hello.encode()))
            .await
            .map_err(std::io::Error::other)?;
        Ok(writer.into_inner())
    }

    /// Moves frames both ways until the connection breaks, the link is removed,
    /// or the peer reconnects.
    async fn carry(&mut self, stream: TcpStream) -> Outcome {
        let (read_half, write_half) = stream.into_split();
        let mut reader = FramedRead::new(read_half, FrameCodec);
        let mut writer = FramedWrite::new(write_half, FrameCodec);
        let counters = self.counters.clone();
        let processors = self.processors.clone();
        let link = self.spec.name.clone();
        let mut inbound = tokio::spawn(async move {
            while let Some(frame) = reader.next().await {
                let frame = frame.map_err(|e| e.to_string())?;
                if frame.header.kind != FrameKind::Data {
                    continue;
                }
                counters.count_rx(frame.payload.len());
                processors
                    .dispatch(Packet {
                        data: frame.payload,
                        label: frame.header.label,
                        hops: frame.header.hops,
                    })
                    .await;
            }
            Err::<(), String>(format!("peer of {link} closed the connection"))
        });
        let outcome = loop {
            tokio::select! {
                packet = self.queue.recv() => {
                    let Some(packet) = packet else { break Outcome::Stopped };
                    if let Err(e) = self.write_burst(&mut writer, packet).await {
                        break Outcome::Broken(e);
                    }
                }
                replacement = self.attach.recv() => match replacement {
                    Some(s) => break Outcome::Replaced(s),
                    None => break Outcome::Stopped,
                },
                ended = &mut inbound => {
                    break Outcome::Broken(match ended {
                        Ok(Err(e)) => e,
                        Ok(Ok(())) => "connection closed".into(),
                        Err(e) => e.to_string(),
                    });
                }
                _ = self.stop.changed() => break Outcome::Stopped,
            }
        };
        inbound.abort();
        outcome
    }

    async fn write_burst(
        &mut self,
        writer: &mut FramedWrite<tokio::net::tcp::OwnedWriteHalf, FrameCodec>,
        first: Packet,
    ) -> Result<(), String> {
        let mut next = Some(first);
        let mut written = 0;
        while let Some(packet) = next.take() {
            let len = packet.data.len();
            writer
                .feed(data_frame(packet))
                .await
                .map_err(|e| e.to_string())?;
            self.counters.count_tx(len);
            written += 1;
            if written < WRITE_BATCH {
                next = self.queue.try_recv().ok();
            }
        }
        writer.flush().await.map_err(|e| e.to_string())
    }
}

enum Outcome {
    Stopped,
    Replaced(TcpStream),
    Broken(String),
}

fn data_frame(packet: Packet) -> Frame {
    Frame {
        header: FrameHeader {
            kind: FrameKind::Data,
            hops: packet.hops,
            flags: 0,
            label: packet.label,
            payload_len: packet.data.len() as u32,
        },
        payload: packet.data,
    }
}

fn control_frame(kind: FrameKind, payload: bytes::Bytes) -> Frame {
    Frame {
        header: FrameHeader {
            kind,
            hops: 0,
            flags: 0,
            label: 0,
            payload_len: payload.len() as u32,
        },
        payload,
    }
}
